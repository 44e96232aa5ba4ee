//! The `/metrics` exposition: one snapshot of the engine's [`Metrics`] as OpenMetrics text
//! (`felix_broker_*`), encoded by the prometheus-client text encoder. The endpoint that
//! serves it is [`super::http`].

use std::fmt;

use felix_engine::{Histogram, Metrics};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The snapshot as OpenMetrics text.
pub fn render(metrics: Metrics, ready: bool) -> Result<String, fmt::Error> {
    let mut registry = Registry::with_prefix("felix_broker");
    registry.register_collector(Box::new(Snapshot { metrics, ready }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// One scrape's values, encoded by the prometheus-client text encoder.
#[derive(Debug)]
struct Snapshot {
    metrics: Metrics,
    ready: bool,
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter family with one label.
fn counters<'k>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = (&'k str, u64)>,
) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in values {
        let labels = [(label, value)];
        ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn histogram(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &Histogram,
    divisor: f64,
) -> fmt::Result {
    let mut buckets: Vec<(f64, u64)> = h
        .bounds
        .iter()
        .zip(&h.counts)
        .map(|(&b, &n)| (b as f64 / divisor, n))
        .collect();
    // The encoder writes `+Inf` for `f64::MAX`.
    buckets.push((f64::MAX, h.counts[h.bounds.len()]));
    e.encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            h.sum as f64 / divisor,
            h.count,
            &buckets,
            None,
        )
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let m = &self.metrics;
        let e = &mut e;
        gauge(
            e,
            "ready",
            "1 once recovery finished and the listener is bound",
            self.ready.into(),
        )?;
        gauge(
            e,
            "connections_open",
            "QUIC connections open or draining",
            m.connections_open,
        )?;
        counter(
            e,
            "connections_accepted",
            "connections accepted",
            m.connections_accepted,
        )?;
        counter(
            e,
            "connections_refused",
            "connection attempts refused",
            m.connections_refused,
        )?;
        gauge(e, "streams_open", "client streams open", m.streams_open)?;
        counter(
            e,
            "streams_accepted",
            "client streams accepted",
            m.streams_accepted,
        )?;
        gauge(
            e,
            "subscriptions_open",
            "subscriptions open",
            m.subscriptions_open,
        )?;
        counter(e, "subscriptions", "subscriptions granted", m.subscriptions)?;
        counters(
            e,
            "auth",
            "auth outcomes by code (ok or the refusal code)",
            "code",
            m.auth.iter().map(|(k, v)| (k.as_str(), *v)),
        )?;
        counters(
            e,
            "published_records",
            "records published, by frame encoding",
            "encoding",
            [
                ("binary", m.published_binary_records),
                ("json", m.published_json_records),
            ],
        )?;
        counters(
            e,
            "published_bytes",
            "payload bytes published, by frame encoding",
            "encoding",
            [
                ("binary", m.published_binary_bytes),
                ("json", m.published_json_bytes),
            ],
        )?;
        counters(
            e,
            "json_publishes",
            "JSON publish frames received, by frame",
            "frame",
            ["publish", "publish_batch"]
                .map(|f| (f, m.json_publishes.get(f).copied().unwrap_or(0))),
        )?;
        counter(
            e,
            "publishes_refused",
            "publish requests refused",
            m.publishes_refused,
        )?;
        counter(
            e,
            "deliveries",
            "event batches queued to subscribers",
            m.deliveries,
        )?;
        counter(
            e,
            "subscriber_dropped_batches",
            "event batches dropped for full subscriber queues",
            m.subscriber_dropped_batches,
        )?;
        counter(
            e,
            "subscriber_dropped_records",
            "records in dropped event batches",
            m.subscriber_dropped_records,
        )?;
        counter(
            e,
            "subscriptions_lagged",
            "subscriptions ended with subscription_lagged",
            m.subscriptions_lagged,
        )?;
        gauge(
            e,
            "subscriber_queue_depth_max",
            "frames queued for the deepest subscriber",
            m.subscriber_queue_depth_max,
        )?;
        counters(
            e,
            "cache_operations",
            "cache operations by outcome",
            "op",
            m.cache_ops.iter().map(|(k, v)| (*k, *v)),
        )?;
        gauge(e, "cache_entries", "cache entries held", m.cache_entries)?;
        gauge(
            e,
            "cache_bytes",
            "cache key and value bytes held",
            m.cache_bytes,
        )?;
        counters(
            e,
            "group_operations",
            "consumer-group operations by name",
            "op",
            m.group_ops.iter().map(|(k, v)| (*k, *v)),
        )?;
        histogram(
            e,
            "fsync_seconds",
            "time from issuing a log fsync to its completion",
            &m.fsync_micros,
            1e6,
        )?;
        histogram(
            e,
            "group_commit_batch",
            "answers released by one durability advance of a log",
            &m.group_commit_batch,
            1.0,
        )?;
        gauge(
            e,
            "log_bytes",
            "bytes in every log segment file",
            m.log_bytes,
        )?;
        counter(
            e,
            "file_operations",
            "file operations handed to the executor",
            m.file_ops,
        )?;
        counters(
            e,
            "errors",
            "error answers sent, by code",
            "code",
            m.errors.iter().map(|(k, v)| (k.as_str(), *v)),
        )?;
        Ok(())
    }
}
