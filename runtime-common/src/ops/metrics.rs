//! The `/metrics` exposition: one snapshot of the engine's [`Metrics`] as OpenMetrics text
//! (`felix_broker_*`), encoded by the prometheus-client text encoder, and the process's CPU
//! time under its standard name, `process_cpu_seconds_total` (what `felix bench --metrics`
//! divides by the work done). The endpoint that serves it is [`super::http`].

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
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Process));
    registry
        .sub_registry_with_prefix("felix_broker")
        .register_collector(Box::new(Snapshot { metrics, ready }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// User plus system CPU time of the whole process (every thread, ended ones too), in
/// seconds; `None` where it is not read (off Linux).
pub fn process_cpu_seconds() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getrusage only writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return None;
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Some(secs(usage.ru_utime) + secs(usage.ru_stime))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The process metrics, unprefixed as Prometheus names them.
#[derive(Debug)]
struct Process;

impl Collector for Process {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(secs) = process_cpu_seconds() else {
            return Ok(());
        };
        // The encoder adds `_total` to a counter's name.
        ConstCounter::new(secs).encode(e.encode_descriptor(
            "process_cpu_seconds",
            "user and system CPU time spent by the broker process, in seconds",
            None,
            MetricType::Counter,
        )?)
    }
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

/// A gauge family with one label.
fn gauges<'k>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = (&'k str, u64)>,
) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, n) in values {
        let labels = [(label, value)];
        ConstGauge::new(n).encode(family.encode_family(&labels)?)?;
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
        gauge(
            e,
            "cluster_shards_led",
            "stream and cache shards this node leads (0 outside a cluster)",
            m.cluster_shards_led,
        )?;
        gauge(
            e,
            "cluster_shards_followed",
            "shards this node holds a replica of without leading them",
            m.cluster_shards_followed,
        )?;
        gauge(
            e,
            "cluster_metadata_term",
            "the cluster metadata log's raft term as this node knows it",
            m.cluster_metadata_term,
        )?;
        gauge(
            e,
            "cluster_metadata_applied",
            "the last cluster metadata log index applied on this node",
            m.cluster_metadata_applied,
        )?;
        gauges(
            e,
            "replication_lag_records",
            "per replicated shard led here: records its slowest follower lacks durably",
            "shard",
            m.replication_lag_records
                .iter()
                .map(|(s, n)| (s.as_str(), *n)),
        )?;
        counter(
            e,
            "replication_leader_changes",
            "shard leadership changes this node applied",
            m.replication_leader_changes,
        )?;
        counter(
            e,
            "replication_quorum_timeouts",
            "quorum publishes answered quorum_timeout on shards led here",
            m.replication_quorum_timeouts,
        )?;
        counter(
            e,
            "replication_catch_up_bytes",
            "bytes of replicated entries appended here",
            m.replication_catch_up_bytes,
        )?;
        counter(
            e,
            "acknowledged_records_abandoned",
            "records known acknowledged that no surviving copy held when a new leader opened (a lost disk, or an operator's abandon)",
            m.acknowledged_records_abandoned,
        )?;
        counter(
            e,
            "replication_states_refused",
            "replica state writes the log refused (the copy decided again; nonzero is a bug to report)",
            m.replication_states_refused,
        )?;
        gauge(
            e,
            "leader_shards_quiet",
            "leader-consistency shards led here whose quiescence is recorded (a follower may take each over without loss)",
            m.leader_shards_quiet,
        )?;
        gauge(
            e,
            "cluster_shards_awaiting_leader",
            "shards whose leader lapsed that the control plane (led here) keeps for it: no follower is known to hold every record it acknowledged",
            m.cluster_shards_awaiting_leader,
        )?;
        counter(
            e,
            "forwards_sent",
            "requests forwarded to their shard's leader",
            m.forwards_sent,
        )?;
        counter(
            e,
            "forwards_served",
            "forwarded requests run here as the shard's leader",
            m.forwards_served,
        )?;
        gauge(
            e,
            "forwarded_sessions",
            "forward channels open here as a shard leader (one per client session forwarding here)",
            m.forwarded_sessions,
        )?;
        gauge(
            e,
            "forwards_waiting",
            "forwards waiting here for a place in their peer's forward window",
            m.forwards_waiting,
        )?;
        gauge(
            e,
            "peer_links",
            "peer links up (two per peer: the one dialed and the one accepted)",
            m.peer_links,
        )?;
        counter(
            e,
            "peer_messages_dropped",
            "peer messages dropped because a down link's backlog was full",
            m.peer_messages_dropped,
        )?;
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
        counters(
            e,
            "requests",
            "requests run, by type",
            "type",
            m.requests.iter().map(|(k, v)| (*k, *v)),
        )?;
        counter(
            e,
            "redirects",
            "requests answered with not_leader naming the owner",
            m.redirects,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_of(text: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with("process_cpu_seconds_total "))
            .unwrap_or_else(|| panic!("no process_cpu_seconds_total in\n{text}"));
        line["process_cpu_seconds_total ".len()..]
            .parse()
            .unwrap_or_else(|_| panic!("{line:?} does not parse"))
    }

    #[test]
    fn requests_by_type_and_redirects_are_exported_as_the_conformance_fixture_reads_them() {
        let mut m = Metrics::default();
        m.requests.insert("subscribe", 3);
        m.requests.insert("binary_publish", 12);
        m.redirects = 2;
        let text = render(m, true).unwrap();
        for line in [
            "felix_broker_requests_total{type=\"subscribe\"} 3",
            "felix_broker_requests_total{type=\"binary_publish\"} 12",
            "felix_broker_redirects_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_cpu_is_exported_under_its_standard_name_and_grows() {
        let first = render(Metrics::default(), true).unwrap();
        assert!(
            first.contains("# TYPE process_cpu_seconds counter"),
            "{first}"
        );
        assert!(
            first.contains("felix_broker_ready 1"),
            "the engine's metrics keep their prefix"
        );
        let before = cpu_of(&first);
        assert!(before > 0.0, "a running test has used CPU");
        // Work until the counter moves; bounded, and a millisecond of CPU is far below it.
        let mut x = 0u64;
        let mut after = before;
        for round in 0..10_000u64 {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i ^ round);
            }
            std::hint::black_box(x);
            after = cpu_of(&render(Metrics::default(), true).unwrap());
            if after > before {
                break;
            }
        }
        assert!(
            after > before,
            "CPU time did not grow: {before} then {after}"
        );
    }
}
