//! Latency samples, their percentiles, and the units the report prints.

use std::time::Duration;

/// Latencies of one measured operation.
#[derive(Debug, Default, Clone)]
pub struct Samples(Vec<Duration>);

impl Samples {
    /// Records one latency.
    pub fn push(&mut self, latency: Duration) {
        self.0.push(latency);
    }

    /// The `q` quantile (nearest rank), e.g. `0.99`.
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted.get(rank - 1).copied().unwrap_or_default()
    }

    /// The median.
    pub fn p50(&self) -> Duration {
        self.quantile(0.50)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }
}

/// Microseconds, rounded.
pub fn micros(duration: Duration) -> String {
    format!("{:.0}", duration.as_secs_f64() * 1e6)
}

/// Milliseconds with one decimal.
pub fn millis(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1e3)
}

/// `p50 / p99` in microseconds.
pub fn p50_p99(samples: &Samples) -> String {
    format!("{} / {}", micros(samples.p50()), micros(samples.p99()))
}

/// The gateway's p50 over the direct one: the added microseconds and the ratio.
pub fn overhead(direct: &Samples, gateway: &Samples) -> (String, String) {
    let added = gateway.p50().as_secs_f64() - direct.p50().as_secs_f64();
    let ratio = gateway.p50().as_secs_f64() / direct.p50().as_secs_f64().max(1e-9);
    (format!("{:+.0}", added * 1e6), format!("{ratio:.2}"))
}
