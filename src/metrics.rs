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

/// One metric family: its name, type, help text and, for a histogram, its buckets.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    buckets: &'static [f64],
}

const FAMILIES: &[Family] = &[
    Family {
        name: "toolnexus_requests_pending",
        kind: "gauge",
        help: "Requests waiting for an answer.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_requests_created_total",
        kind: "counter",
        help: "Requests raised by upstreams.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_requests_rejected_total",
        kind: "counter",
        help: "Elicitations answered `cancel` at once because the pending Requests were at their cap.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_requests_resolved_total",
        kind: "counter",
        help: "Requests resolved, by outcome (accept, decline, cancel, expired, cancelled).",
        buckets: &[],
    },
    Family {
        name: "toolnexus_request_resolution_seconds",
        kind: "histogram",
        help: "Time from a Request's creation to its resolution.",
        buckets: RESOLUTION_BUCKETS,
    },
    Family {
        name: "toolnexus_calls",
        kind: "gauge",
        help: "Calls currently held, by status.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_calls_started_total",
        kind: "counter",
        help: "Tool calls started.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_calls_finished_total",
        kind: "counter",
        help: "Tool calls ended, by status.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_sessions",
        kind: "gauge",
        help: "Upstream sessions open, by server and state.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_server_restarts_total",
        kind: "counter",
        help: "Times a server's shared session was re-opened.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_http_requests_total",
        kind: "counter",
        help: "HTTP requests served, by route, method and status.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_http_request_duration_seconds",
        kind: "histogram",
        help: "HTTP request latency by route (long-polls included).",
        buckets: LATENCY_BUCKETS,
    },
    Family {
        name: "toolnexus_event_streams",
        kind: "gauge",
        help: "Open GET /events streams.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_long_polls",
        kind: "gauge",
        help: "Requests held open by wait=, waiting for a change.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_long_poll_checks_total",
        kind: "counter",
        help: "Times a request held by wait= checked again after a change that may concern it.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_connections",
        kind: "gauge",
        help: "Open connections to the API.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_connections_evicted_total",
        kind: "counter",
        help: "Idle connections closed to make room for a new one at http.max_connections.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_connections_refused_total",
        kind: "counter",
        help: "Connections closed at once because every open one had a request in progress at http.max_connections.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_connections_timed_out_total",
        kind: "counter",
        help: "Connections closed because a request's headers did not arrive within http.header_timeout.",
        buckets: &[],
    },
    Family {
        name: "toolnexus_store_bytes",
        kind: "gauge",
        help: "Size of the SQLite store's database file (absent for the memory store).",
        buckets: &[],
    },
    Family {
        name: "toolnexus_webhook_deliveries_total",
        kind: "counter",
        help: "Webhook delivery attempts, by webhook and outcome (delivered, failed, dropped).",
        buckets: &[],
    },
];

/// A label set: pairs of name and value.
pub type Labels<'a> = &'a [(&'static str, &'a str)];

/// A series' identity: the family name and its owned labels.
type SeriesKey = (&'static str, Vec<(&'static str, String)>);

/// A gauge value read at scrape time.
#[derive(Debug, Clone)]
pub struct Gauge {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
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
    pub fn inc(&self, name: &'static str, labels: Labels<'_>) {
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if let Series::Counter(value) = series.entry(key(name, labels)).or_insert(Series::Counter(0)) {
            *value += 1;
        }
    }

    /// Records one observation in a histogram.
    pub fn observe(&self, name: &'static str, labels: Labels<'_>, value: f64) {
        let buckets = family(name).map_or(&[][..], |family| family.buckets);
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let entry = series.entry(key(name, labels)).or_insert_with(|| Series::Histogram {
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

    /// The Prometheus text exposition of every series plus the given gauges.
    pub fn render(&self, gauges: &[Gauge]) -> String {
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for family in FAMILIES {
            let _ = writeln!(
                out,
                "# HELP {} {}\n# TYPE {} {}",
                family.name, family.help, family.name, family.kind
            );
            for gauge in gauges.iter().filter(|gauge| gauge.name == family.name) {
                let _ = writeln!(
                    out,
                    "{}{} {}",
                    family.name,
                    render_labels(&gauge.labels, None),
                    gauge.value
                );
            }
            for ((_, labels), value) in series
                .range((family.name, Vec::new())..)
                .take_while(|((n, _), _)| *n == family.name)
            {
                match value {
                    Series::Counter(value) => {
                        let _ = writeln!(out, "{}{} {value}", family.name, render_labels(labels, None));
                    }
                    Series::Histogram { counts, sum, count } => {
                        for (bound, bucket) in family.buckets.iter().zip(counts) {
                            let le = bound.to_string();
                            let _ = writeln!(
                                out,
                                "{}_bucket{} {bucket}",
                                family.name,
                                render_labels(labels, Some(&le))
                            );
                        }
                        let _ = writeln!(
                            out,
                            "{}_bucket{} {count}",
                            family.name,
                            render_labels(labels, Some("+Inf"))
                        );
                        let _ = writeln!(out, "{}_sum{} {sum}", family.name, render_labels(labels, None));
                        let _ = writeln!(out, "{}_count{} {count}", family.name, render_labels(labels, None));
                    }
                }
            }
        }
        out
    }
}

fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|family| family.name == name)
}

fn key(name: &'static str, labels: Labels<'_>) -> SeriesKey {
    (
        name,
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
        metrics.inc("toolnexus_requests_created_total", &[("server", "demo")]);
        metrics.inc("toolnexus_requests_created_total", &[("server", "demo")]);
        metrics.observe("toolnexus_request_resolution_seconds", &[("server", "demo")], 3.0);
        let gauge = Gauge {
            name: "toolnexus_requests_pending",
            labels: vec![],
            value: 2.0,
        };
        let text = metrics.render(&[gauge]);
        assert!(text.contains("# TYPE toolnexus_requests_created_total counter\n"));
        assert!(text.contains("toolnexus_requests_created_total{server=\"demo\"} 2\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_bucket{server=\"demo\",le=\"1\"} 0\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_bucket{server=\"demo\",le=\"5\"} 1\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_bucket{server=\"demo\",le=\"+Inf\"} 1\n"));
        assert!(text.contains("toolnexus_request_resolution_seconds_count{server=\"demo\"} 1\n"));
        assert!(text.contains("toolnexus_requests_pending 2\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::default();
        metrics.inc("toolnexus_calls_started_total", &[("server", "a\"b")]);
        assert!(metrics.render(&[]).contains("server=\"a\\\"b\""));
    }
}
