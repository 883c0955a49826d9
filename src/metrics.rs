//! Prometheus metrics: counters and histograms recorded as things happen, gauges read at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

/// Request resolutions: from a second to the default TTL and beyond.
const RESOLUTION_BUCKETS: &[f64] = &[1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];
/// HTTP handler latencies, from 100 µs (long-polls land in the top buckets).
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0, 5.0, 30.0,
];

/// What a metric is, as Prometheus names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Declares every metric once: its variant of [`Metric`], kind, exported name, help text and, for a
/// histogram, its buckets. A metric is named by its variant, so a misspelt one does not compile, and
/// `/metrics` renders each one declared here.
macro_rules! metrics {
    ($($variant:ident: $kind:ident $name:literal $help:literal $(, $buckets:expr)?;)*) => {
        /// A metric the gateway exports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        pub enum Metric {
            $($variant),*
        }

        impl Metric {
            /// Every metric, in the order `/metrics` renders them.
            pub const ALL: &[Metric] = &[$(Metric::$variant),*];

            pub fn kind(self) -> Kind {
                match self {
                    $(Metric::$variant => Kind::$kind),*
                }
            }

            pub fn name(self) -> &'static str {
                match self {
                    $(Metric::$variant => $name),*
                }
            }

            fn help(self) -> &'static str {
                match self {
                    $(Metric::$variant => $help),*
                }
            }

            fn buckets(self) -> &'static [f64] {
                match self {
                    $(Metric::$variant => metrics!(@buckets $($buckets)?)),*
                }
            }
        }
    };
    (@buckets) => { &[] };
    (@buckets $buckets:expr) => { $buckets };
}

metrics! {
    RequestsPending: Gauge "toolnexus_requests_pending" "Requests waiting for an answer.";
    RequestsCreated: Counter "toolnexus_requests_created_total" "Requests raised by upstreams.";
    RequestsRejected: Counter "toolnexus_requests_rejected_total"
        "Elicitations answered `cancel` at once because the pending Requests were at their cap.";
    RequestsResolved: Counter "toolnexus_requests_resolved_total"
        "Requests resolved, by outcome (accept, decline, cancel, expired, cancelled).";
    RequestResolution: Histogram "toolnexus_request_resolution_seconds"
        "Time from a Request's creation to its resolution.", RESOLUTION_BUCKETS;
    Calls: Gauge "toolnexus_calls" "Calls currently held, by status.";
    CallsStarted: Counter "toolnexus_calls_started_total" "Tool calls started.";
    CallsFinished: Counter "toolnexus_calls_finished_total" "Tool calls ended, by status.";
    Sessions: Gauge "toolnexus_sessions" "Upstream sessions open, by server and state.";
    ServerRestarts: Counter "toolnexus_server_restarts_total" "Times a server's shared session was re-opened.";
    ReplicaInfo: Gauge "toolnexus_replica_info" "This gateway's replica id, as a label; always 1.";
    HttpRequests: Counter "toolnexus_http_requests_total" "HTTP requests served, by route, method and status.";
    HttpRequestDuration: Histogram "toolnexus_http_request_duration_seconds"
        "HTTP request latency by route (long-polls included).", LATENCY_BUCKETS;
    EventStreams: Gauge "toolnexus_event_streams" "Open GET /events streams.";
    LongPolls: Gauge "toolnexus_long_polls" "Requests held open by wait=, waiting for a change.";
    LongPollChecks: Counter "toolnexus_long_poll_checks_total"
        "Times a request held by wait= checked again after a change that may concern it.";
    Connections: Gauge "toolnexus_connections" "Open connections to the API.";
    ConnectionsEvicted: Counter "toolnexus_connections_evicted_total"
        "Idle connections closed to make room for a new one at http.max_connections.";
    ConnectionsRefused: Counter "toolnexus_connections_refused_total"
        "Connections closed at once because every open one had a request in progress at http.max_connections.";
    ConnectionsTimedOut: Counter "toolnexus_connections_timed_out_total"
        "Connections closed because a request's headers did not arrive within http.header_timeout.";
    StoreBytes: Gauge "toolnexus_store_bytes"
        "Size of the SQLite store's database file (absent for the memory store).";
    WebhookDeliveries: Counter "toolnexus_webhook_deliveries_total"
        "Webhook delivery attempts, by webhook and outcome (delivered, failed, dropped).";
    NotificationDeliveries: Counter "toolnexus_notification_deliveries_total"
        "Notification delivery attempts, by channel and outcome (delivered, skipped, failed, dropped).";
}

/// A label set: pairs of name and value.
pub type Labels<'a> = &'a [(&'static str, &'a str)];

/// A series' identity: its metric and owned labels.
type SeriesKey = (Metric, Vec<(&'static str, String)>);

/// A value read at scrape time rather than recorded as things happen.
#[derive(Debug, Clone)]
pub struct Reading {
    pub metric: Metric,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

impl Reading {
    pub fn new(metric: Metric, value: f64) -> Self {
        Self {
            metric,
            labels: Vec::new(),
            value,
        }
    }

    pub fn labelled(metric: Metric, labels: Vec<(&'static str, String)>, value: f64) -> Self {
        Self { metric, labels, value }
    }
}

/// The metrics store; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    series: Arc<Mutex<BTreeMap<SeriesKey, Series>>>,
}

#[derive(Debug)]
enum Series {
    Counter(u64),
    Histogram { counts: Vec<u64>, sum: f64, count: u64 },
}

impl Metrics {
    /// Adds one to a counter.
    pub fn inc(&self, metric: Metric, labels: Labels<'_>) {
        debug_assert_eq!(metric.kind(), Kind::Counter, "{metric:?}");
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if let Series::Counter(value) = series.entry(key(metric, labels)).or_insert(Series::Counter(0)) {
            *value += 1;
        }
    }

    /// Records one observation in a histogram.
    pub fn observe(&self, metric: Metric, labels: Labels<'_>, value: f64) {
        debug_assert_eq!(metric.kind(), Kind::Histogram, "{metric:?}");
        let buckets = metric.buckets();
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let entry = series.entry(key(metric, labels)).or_insert_with(|| Series::Histogram {
            counts: vec![0; buckets.len()],
            sum: 0.0,
            count: 0,
        });
        if let Series::Histogram { counts, sum, count } = entry {
            for (bucket, bound) in counts.iter_mut().zip(buckets) {
                if value <= *bound {
                    *bucket += 1;
                }
            }
            *sum += value;
            *count += 1;
        }
    }

    /// The Prometheus text exposition of every series plus the values read at scrape time.
    pub fn render(&self, readings: &[Reading]) -> String {
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for &metric in Metric::ALL {
            let name = metric.name();
            let _ = writeln!(
                out,
                "# HELP {name} {}\n# TYPE {name} {}",
                metric.help(),
                metric.kind().as_str()
            );
            for reading in readings.iter().filter(|reading| reading.metric == metric) {
                let _ = writeln!(out, "{name}{} {}", render_labels(&reading.labels, None), reading.value);
            }
            for ((_, labels), value) in series
                .range((metric, Vec::new())..)
                .take_while(|((m, _), _)| *m == metric)
            {
                match value {
                    Series::Counter(value) => {
                        let _ = writeln!(out, "{name}{} {value}", render_labels(labels, None));
                    }
                    Series::Histogram { counts, sum, count } => {
                        for (bound, bucket) in metric.buckets().iter().zip(counts) {
                            let le = bound.to_string();
                            let _ = writeln!(out, "{}_bucket{} {bucket}", name, render_labels(labels, Some(&le)));
                        }
                        let _ = writeln!(out, "{}_bucket{} {count}", name, render_labels(labels, Some("+Inf")));
                        let _ = writeln!(out, "{}_sum{} {sum}", name, render_labels(labels, None));
                        let _ = writeln!(out, "{}_count{} {count}", name, render_labels(labels, None));
                    }
                }
            }
        }
        out
    }
}

fn key(metric: Metric, labels: Labels<'_>) -> SeriesKey {
    (
        metric,
        labels
            .iter()
            .map(|(label, value)| (*label, (*value).to_owned()))
            .collect(),
    )
}

fn render_labels(labels: &[(&'static str, String)], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_histograms_and_gauges_render_in_text_format() {
        let metrics = Metrics::default();
        metrics.inc(Metric::RequestsCreated, &[("server", "demo")]);
        metrics.inc(Metric::RequestsCreated, &[("server", "demo")]);
        metrics.observe(Metric::RequestResolution, &[("server", "demo")], 3.0);
        let text = metrics.render(&[Reading::new(Metric::RequestsPending, 2.0)]);
        assert!(text.contains("# TYPE toolnexus_requests_created_total counter\n"));
        assert!(text.contains("toolnexus_requests_created_total{server=\"demo\"} 2\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_bucket{server=\"demo\",le=\"1\"} 0\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_bucket{server=\"demo\",le=\"5\"} 1\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_bucket{server=\"demo\",le=\"+Inf\"} 1\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_count{server=\"demo\"} 1\n"));
        assert!(text.contains("toolnexus_requests_pending 2\n"));
    }

    #[test]
    fn every_metric_is_rendered_once_with_its_help_and_type() {
        let text = Metrics::default().render(&[]);
        for metric in Metric::ALL {
            let declared = format!("# TYPE {} {}\n", metric.name(), metric.kind().as_str());
            assert_eq!(text.matches(&declared).count(), 1, "{metric:?}");
        }
        let names: std::collections::BTreeSet<&str> = Metric::ALL.iter().map(|metric| metric.name()).collect();
        assert_eq!(names.len(), Metric::ALL.len(), "names are unique");
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::default();
        metrics.inc(Metric::CallsStarted, &[("server", "a\"b")]);
        assert!(metrics.render(&[]).contains("server=\"a\\\"b\""));
    }
}
