//! The Prometheus metrics of SPEC.md, in one registry created at start-up and handed to every
//! part that records something. Client series carry `namespace`, `pod`, `container`, `comm`
//! (never `pid`), and are rebuilt from the live client list each tick, so a client that goes
//! away loses its series.
use std::{
    collections::{HashMap, HashSet},
    sync::PoisonError,
};

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::{
    endpoint::Endpoint, health::reachability::Status, health::snapshot::Snapshot, health::State,
    kernel::probed::Inspections,
};

const CLIENT_LABELS: [&str; 4] = ["namespace", "pod", "container", "comm"];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("metric {name}: {source}")]
    Register {
        name: &'static str,
        source: prometheus::Error,
    },
    #[error("encoding metrics: {0}")]
    Encode(#[source] prometheus::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub struct Metrics {
    registry: Registry,
    pub client_state: IntGaugeVec,
    pub client_connections: IntGaugeVec,
    pub client_last_receive_age: GaugeVec,
    pub client_connect_failures: IntCounterVec,
    pub client_retransmits: IntCounterVec,
    pub client_watches: IntGaugeVec,
    pub client_stream_stuck: IntGaugeVec,
    pub remediations: IntCounterVec,
    pub alerts_sent: IntCounterVec,
    pub ebpf_events: IntCounterVec,
    pub ebpf_events_lost: IntCounter,
    /// Kernel records not sent, by cause and by the scope the kernel could charge them to.
    pub ebpf_records_dropped: IntCounterVec,
    pub detection: Histogram,
    /// New files (Go binaries, libssl) the agent met, by kind and what it did:
    /// probed, failed, passed (at start), refused_rate, refused_bound; evicted counts probes taken
    /// off at the bound.
    pub probe_inspections: IntCounterVec,
    /// Files by kind and state: probed, refused (not inspected for a bound).
    pub probed_files: IntGaugeVec,
    /// 1 while an endpoint is reachable from the node, 0 while it is unreachable (no series
    /// before there is evidence either way).
    pub endpoint_reachable: IntGaugeVec,
    /// Label sets of client counters currently exported, to remove those of gone clients.
    counter_labels: std::sync::Mutex<HashSet<Vec<String>>>,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &'static str,
    metric: std::result::Result<T, prometheus::Error>,
) -> Result<T> {
    let metric = metric.map_err(|source| Error::Register { name, source })?;
    registry
        .register(Box::new(metric.clone()))
        .map_err(|source| Error::Register { name, source })?;
    Ok(metric)
}

/// Resource label values per client (see `Metrics::update_streams`).
pub const RESOURCES_PER_CLIENT: usize = 32;
/// Resource label values of all clients of the node together, per tick: 64 clients at the
/// per-client bound. Past it, a client's resources not named yet count as `other`, so many
/// processes each requesting made-up paths cannot multiply the series either.
pub const RESOURCES_PER_NODE: usize = 2048;

/// The `resource` label values of one tick: what the node still allows.
struct ResourceLabels {
    node_left: usize,
}

impl ResourceLabels {
    fn new() -> Self {
        Self {
            node_left: RESOURCES_PER_NODE,
        }
    }

    /// The chooser for one client's streams.
    fn client(&mut self) -> ClientResources<'_> {
        ClientResources {
            node_left: &mut self.node_left,
            named: HashSet::new(),
        }
    }
}

/// The `resource` label values of one client in one tick.
struct ClientResources<'a> {
    node_left: &'a mut usize,
    named: HashSet<String>,
}

impl ClientResources<'_> {
    /// `resource` itself while the client's and the node's bounds allow a new value (or it is
    /// named already), else `other`.
    fn label<'r>(&mut self, resource: &'r str) -> &'r str {
        if self.named.contains(resource) {
            return resource;
        }
        if self.named.len() < RESOURCES_PER_CLIENT && *self.node_left > 0 {
            *self.node_left -= 1;
            self.named.insert(resource.to_owned());
            return resource;
        }
        "other"
    }
}

fn labels(extra: &[&'static str]) -> Vec<&'static str> {
    CLIENT_LABELS.iter().chain(extra).copied().collect()
}

impl Metrics {
    pub fn new(version: &str, revision: &str) -> Result<Self> {
        let r = Registry::new();
        let build = register(
            &r,
            "lifeline_build_info",
            IntGaugeVec::new(
                Opts::new("lifeline_build_info", "Version and git revision of the agent"),
                &["version", "revision"],
            ),
        )?;
        build.with_label_values(&[version, revision]).set(1);
        Ok(Self {
            client_state: register(
                &r,
                "lifeline_client_state",
                IntGaugeVec::new(
                    Opts::new(
                        "lifeline_client_state",
                        "1 for the client's current state, 0 for the others",
                    ),
                    &labels(&["state"]),
                ),
            )?,
            client_connections: register(
                &r,
                "lifeline_client_connections",
                IntGaugeVec::new(
                    Opts::new("lifeline_client_connections", "Established apiserver connections"),
                    &labels(&["endpoint"]),
                ),
            )?,
            client_last_receive_age: register(
                &r,
                "lifeline_client_last_receive_age_seconds",
                GaugeVec::new(
                    Opts::new(
                        "lifeline_client_last_receive_age_seconds",
                        "Seconds since the client last received apiserver payload",
                    ),
                    &labels(&[]),
                ),
            )?,
            client_connect_failures: register(
                &r,
                "lifeline_client_connect_failures_total",
                IntCounterVec::new(
                    Opts::new(
                        "lifeline_client_connect_failures_total",
                        "Failed connects to apiserver endpoints",
                    ),
                    &labels(&["endpoint", "reason"]),
                ),
            )?,
            client_retransmits: register(
                &r,
                "lifeline_client_retransmits_total",
                IntCounterVec::new(
                    Opts::new(
                        "lifeline_client_retransmits_total",
                        "TCP retransmits on apiserver connections",
                    ),
                    &labels(&["endpoint"]),
                ),
            )?,
            client_watches: register(
                &r,
                "lifeline_client_watches",
                IntGaugeVec::new(
                    Opts::new(
                        "lifeline_client_watches",
                        "Open watches per resource, where the client's streams are read",
                    ),
                    &labels(&["resource"]),
                ),
            )?,
            client_stream_stuck: register(
                &r,
                "lifeline_client_stream_stuck",
                IntGaugeVec::new(
                    Opts::new(
                        "lifeline_client_stream_stuck",
                        "1 while a stream of the client for this resource is stuck",
                    ),
                    &labels(&["resource"]),
                ),
            )?,
            remediations: register(
                &r,
                "lifeline_remediations_total",
                IntCounterVec::new(
                    Opts::new("lifeline_remediations_total", "Remediation actions by outcome"),
                    &["action", "result"],
                ),
            )?,
            alerts_sent: register(
                &r,
                "lifeline_alerts_sent_total",
                IntCounterVec::new(
                    Opts::new(
                        "lifeline_alerts_sent_total",
                        "Alert deliveries by receiver and outcome",
                    ),
                    &["receiver", "result"],
                ),
            )?,
            ebpf_events: register(
                &r,
                "lifeline_ebpf_events_total",
                IntCounterVec::new(
                    Opts::new("lifeline_ebpf_events_total", "Kernel events received, by kind"),
                    &["kind"],
                ),
            )?,
            ebpf_events_lost: register(
                &r,
                "lifeline_ebpf_events_lost_total",
                IntCounter::new(
                    "lifeline_ebpf_events_lost_total",
                    "Kernel events dropped because the ring buffer was full",
                ),
            )?,
            ebpf_records_dropped: register(
                &r,
                "lifeline_ebpf_records_dropped_total",
                IntCounterVec::new(
                    Opts::new(
                        "lifeline_ebpf_records_dropped_total",
                        "Kernel records not sent, by cause (ring_full, rate_limited, unknown; \
                         lost_place and reader_forgotten: one per occurrence) and by whose \
                         evidence they were (socket, process, node)",
                    ),
                    &["cause", "scope"],
                ),
            )?,
            detection: register(
                &r,
                "lifeline_detection_seconds",
                Histogram::with_opts(
                    HistogramOpts::new(
                        "lifeline_detection_seconds",
                        "From fault evidence crossing its threshold in the kernel to the state change",
                    )
                    .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0]),
                ),
            )?,
            probe_inspections: register(
                &r,
                "lifeline_probe_inspections_total",
                IntCounterVec::new(
                    Opts::new(
                        "lifeline_probe_inspections_total",
                        "New probed files (Go binaries, libssl) by kind and result: probed, failed, \
                         passed (at start, not client-go), refused_rate, refused_bound, evicted",
                    ),
                    &["kind", "result"],
                ),
            )?,
            probed_files: register(
                &r,
                "lifeline_probed_files",
                IntGaugeVec::new(
                    Opts::new(
                        "lifeline_probed_files",
                        "Files holding probes (state probed) and files not inspected for a bound \
                         (state refused), by kind",
                    ),
                    &["kind", "state"],
                ),
            )?,
            endpoint_reachable: register(
                &r,
                "lifeline_endpoint_reachable",
                IntGaugeVec::new(
                    Opts::new(
                        "lifeline_endpoint_reachable",
                        "1 while the apiserver endpoint is reachable from the node, 0 while it is not",
                    ),
                    &["endpoint"],
                ),
            )?,
            registry: r,
            counter_labels: Default::default(),
        })
    }

    /// Counts what one reconcile of `kind`'s probed files did, and sets their gauges.
    pub fn count_probed_files(&self, kind: &str, done: Inspections, (probed, refused): (usize, usize)) {
        for (result, n) in [
            ("probed", done.probed),
            ("failed", done.failed),
            ("passed", done.passed),
            ("refused_rate", done.refused_rate),
            ("refused_bound", done.refused_bound),
            ("evicted", done.evicted),
        ] {
            self.probe_inspections
                .with_label_values(&[kind, result])
                .inc_by(n as u64);
        }
        self.probed_files
            .with_label_values(&[kind, "probed"])
            .set(probed as i64);
        self.probed_files
            .with_label_values(&[kind, "refused"])
            .set(refused as i64);
    }

    pub fn render(&self) -> Result<String> {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .map_err(Error::Encode)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The stream gauges of one client: open watches and stuck streams per resource. At most
    /// [`RESOURCES_PER_CLIENT`] resource values per client and [`RESOURCES_PER_NODE`] for all
    /// clients; the rest count as `other`, so clients requesting made-up paths cannot grow
    /// the series without bound.
    fn update_streams(
        &self,
        client: &crate::health::snapshot::ClientSnapshot,
        labels: &[String; 4],
        resources: &mut ClientResources<'_>,
    ) {
        for conn in &client.connections {
            for s in &conn.streams {
                let Some(r) = &s.request else { continue };
                let resource = resources.label(&r.resource);
                let [a, b, c, d] = labels.each_ref().map(String::as_str);
                let l = [a, b, c, d, resource];
                if r.kind == crate::table::streams::request::Kind::Watch {
                    self.client_watches.with_label_values(&l).inc();
                }
                if s.stuck {
                    self.client_stream_stuck.with_label_values(&l).set(1);
                }
            }
        }
    }

    /// Rebuilds the client gauges and the endpoint gauge from a tick's snapshot, and drops
    /// counter series of clients that went away. Processes that share all four labels are
    /// summed (connections) or reported by their worst state.
    pub fn update(&self, snap: &Snapshot) {
        self.client_state.reset();
        self.client_connections.reset();
        self.client_last_receive_age.reset();
        self.client_watches.reset();
        self.client_stream_stuck.reset();
        let mut worst: HashMap<[String; 4], (State, Option<f64>)> = HashMap::new();
        // Counter series stay while the table knows the process; gauges are for listed ones.
        let known: HashSet<[String; 4]> = snap.clients.iter().map(|c| c.labels()).collect();
        let mut resources = ResourceLabels::new();
        for client in snap.clients.iter().filter(|c| c.listed()) {
            let labels = client.labels();
            let state = client.verdict.state;
            // The youngest payload's age: the latest instant, one subtraction.
            let age = client
                .connections
                .iter()
                .filter_map(|c| c.last_payload)
                .max()
                .map(|at| snap.at.saturating_duration_since(at).as_secs_f64());
            let entry = worst.entry(labels.clone()).or_insert((state, age));
            if severity(state) > severity(entry.0) {
                entry.0 = state;
            }
            // Counted per endpoint first: a client with 3,000 connections to one endpoint
            // formats and looks its series up once a second, not 3,000 times. A client has a
            // connection to few endpoints: a short list, searched, costs a connection one or
            // two comparisons where a map hashed every connection's endpoint.
            let mut per_endpoint: Vec<(&Endpoint, i64)> = Vec::new();
            for c in client.established() {
                match per_endpoint.iter_mut().find(|(e, _)| *e == &c.endpoint) {
                    Some((_, n)) => *n += 1,
                    None => per_endpoint.push((&c.endpoint, 1)),
                }
            }
            for (endpoint, n) in per_endpoint {
                let endpoint = endpoint.to_string();
                let l = [&labels[0], &labels[1], &labels[2], &labels[3], &endpoint].map(String::as_str);
                self.client_connections.with_label_values(&l).add(n);
            }
            self.update_streams(client, &labels, &mut resources.client());
        }
        for (labels, (state, age)) in &worst {
            for s in State::ALL {
                let l = [&labels[0], &labels[1], &labels[2], &labels[3]].map(String::as_str);
                let mut with_state = l.to_vec();
                with_state.push(s.as_str());
                self.client_state
                    .with_label_values(&with_state)
                    .set(i64::from(s == *state));
            }
            if let Some(age) = age {
                let l = [&labels[0], &labels[1], &labels[2], &labels[3]].map(String::as_str);
                self.client_last_receive_age.with_label_values(&l).set(*age);
            }
        }
        self.endpoint_reachable.reset();
        for e in &snap.endpoints {
            let value = match e.status {
                Status::Reachable => 1,
                Status::Unreachable { .. } => 0,
                Status::Unknown => continue,
            };
            self.endpoint_reachable
                .with_label_values(&[e.endpoint.to_string().as_str()])
                .set(value);
        }
        let live = known;
        let mut exported = self.counter_labels.lock().unwrap_or_else(PoisonError::into_inner);
        exported.retain(|full| {
            let client: [String; 4] = [full[0].clone(), full[1].clone(), full[2].clone(), full[3].clone()];
            if live.contains(&client) {
                return true;
            }
            let l: Vec<&str> = full.iter().map(String::as_str).collect();
            let _ = match l.len() {
                5 => self.client_retransmits.remove_label_values(&l),
                _ => self.client_connect_failures.remove_label_values(&l),
            };
            false
        });
    }

    /// Counts a retransmit on a client's connection to `endpoint`.
    pub fn count_retransmit(&self, client: &[String; 4], endpoint: &str) {
        let l = self.remember([&client[0], &client[1], &client[2], &client[3], endpoint]);
        self.client_retransmits
            .with_label_values(&l.iter().map(String::as_str).collect::<Vec<_>>())
            .inc();
    }

    /// Counts a failed connect of a client to `endpoint`.
    pub fn count_connect_failure(&self, client: &[String; 4], endpoint: &str, reason: &str) {
        self.count_connect_failures(client, endpoint, reason, 1);
    }

    /// `n` failed connects at once (a storm the kernel counted instead of reporting each).
    pub fn count_connect_failures(&self, client: &[String; 4], endpoint: &str, reason: &str, n: u32) {
        let l = self.remember([&client[0], &client[1], &client[2], &client[3], endpoint, reason]);
        self.client_connect_failures
            .with_label_values(&l.iter().map(String::as_str).collect::<Vec<_>>())
            .inc_by(u64::from(n));
    }

    fn remember<const N: usize>(&self, labels: [&str; N]) -> Vec<String> {
        let owned: Vec<String> = labels.iter().map(|s| (*s).to_owned()).collect();
        self.counter_labels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owned.clone());
        owned
    }
}

/// Order of badness, for reporting several processes behind one label set.
fn severity(state: State) -> u8 {
    match state {
        State::Healthy => 0,
        State::Stale => 1,
        State::Blackholed => 2,
        State::Unreachable => 3,
        State::Disconnected => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `lifeline_*` name the families of this registry expose (histograms add suffixes).
    fn exported_names(metrics: &Metrics) -> HashSet<String> {
        let mut names = HashSet::new();
        for family in metrics.registry.gather() {
            let name = family.name().to_owned();
            for suffix in ["", "_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
        names
    }

    fn referenced_names(text: &str) -> HashSet<String> {
        let mut names = HashSet::new();
        let mut rest = text;
        while let Some(i) = rest.find("lifeline_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
        names
    }

    /// A client's established connections are counted per endpoint, its others not; its
    /// receive age is its youngest payload's.
    #[test]
    fn connections_are_counted_per_endpoint_and_the_age_is_the_youngest_payloads() {
        use crate::health::snapshot::ConnectionSnapshot;
        use crate::testkit::{client_snapshot, endpoint, snapshot, APISERVER};
        use lifeline_common::tcp_state::{ESTABLISHED, SYN_SENT};
        use std::time::{Duration, Instant};
        let now = Instant::now();
        let mut client = client_snapshot(7, 1, State::Healthy, now);
        let other = "10.0.0.9:6443";
        let one = client.connections[0].clone();
        let conn = |e: &str, state: u32, ago: Option<u64>| ConnectionSnapshot {
            endpoint: endpoint(e),
            tcp_state: state,
            last_payload: ago.map(|s| now - Duration::from_secs(s)),
            ..one.clone()
        };
        client.connections = vec![
            conn(APISERVER, ESTABLISHED, Some(40)),
            conn(other, ESTABLISHED, Some(7)),
            conn(APISERVER, ESTABLISHED, None),
            conn(other, SYN_SENT, None),
            conn(APISERVER, ESTABLISHED, Some(12)),
        ];
        let metrics = Metrics::new("test", "test").expect("metrics");
        metrics.update(&snapshot(now, vec![client]));
        let text = metrics.render().expect("rendered");
        let line = |e: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("lifeline_client_connections{") && l.contains(&format!("endpoint=\"{e}\""))
                })
                .map(str::to_owned)
        };
        assert!(line(APISERVER).is_some_and(|l| l.ends_with(" 3")), "{text}");
        assert!(line(other).is_some_and(|l| l.ends_with(" 1")), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("lifeline_client_last_receive_age_seconds{") && l.ends_with(" 7")),
            "{text}"
        );
    }

    /// A client names at most RESOURCES_PER_CLIENT resources, the node at most
    /// RESOURCES_PER_NODE: past either, new ones are `other`; a named one stays named.
    #[test]
    fn resource_labels_are_bounded_per_client_and_per_node() {
        let mut tick = ResourceLabels::new();
        let names: Vec<String> = (0..RESOURCES_PER_CLIENT + 8).map(|i| format!("r{i}")).collect();
        let clients = RESOURCES_PER_NODE / RESOURCES_PER_CLIENT + 3;
        let mut named = 0;
        for c in 0..clients {
            let mut client = tick.client();
            let mut own = HashSet::new();
            for name in &names {
                let label = client.label(name);
                assert!(label == name || label == "other", "{label}");
                if label == name {
                    own.insert(name.clone());
                    // Asked again, the same value.
                    assert_eq!(client.label(name), name);
                }
            }
            assert!(own.len() <= RESOURCES_PER_CLIENT, "client {c}: {}", own.len());
            if c < RESOURCES_PER_NODE / RESOURCES_PER_CLIENT {
                assert_eq!(own.len(), RESOURCES_PER_CLIENT, "client {c}");
            } else {
                assert!(own.is_empty(), "client {c} past the node's bound: {own:?}");
            }
            named += own.len();
        }
        assert_eq!(named, RESOURCES_PER_NODE);
        // The next tick starts afresh.
        assert_eq!(ResourceLabels::new().client().label("pods"), "pods");
    }

    /// The dashboard and the Prometheus rules in deploy/ only use metrics the agent exports.
    #[test]
    fn deploy_artifacts_reference_only_exported_metrics() {
        let metrics = Metrics::new("test", "test").expect("registry");
        // Labelled families appear in gather() only once they have a series.
        metrics
            .client_state
            .with_label_values(&["", "", "", "x", "healthy"])
            .set(1);
        metrics
            .client_connections
            .with_label_values(&["", "", "", "x", "e"])
            .set(1);
        metrics
            .client_last_receive_age
            .with_label_values(&["", "", "", "x"])
            .set(1.0);
        metrics.count_connect_failure(&Default::default(), "e", "refused");
        metrics.count_retransmit(&Default::default(), "e");
        metrics.remediations.with_label_values(&["reset", "done"]).inc();
        metrics.alerts_sent.with_label_values(&["r", "ok"]).inc();
        metrics.ebpf_events.with_label_values(&["state_change"]).inc();
        metrics
            .ebpf_records_dropped
            .with_label_values(&["rate_limited", "process"])
            .inc();
        metrics.endpoint_reachable.with_label_values(&["e"]).set(1);
        metrics.count_probed_files("go", Default::default(), (0, 0));
        metrics
            .client_watches
            .with_label_values(&["", "", "", "x", "pods"])
            .set(1);
        metrics
            .client_stream_stuck
            .with_label_values(&["", "", "", "x", "pods"])
            .set(1);
        let exported = exported_names(&metrics);
        let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/components/monitoring/");
        for file in ["dashboard.json", "prometheus-rules.yaml"] {
            let text = std::fs::read_to_string(format!("{deploy}{file}")).expect("deploy file");
            let referenced = referenced_names(&text);
            assert!(!referenced.is_empty(), "{file} references no lifeline metric");
            let unknown: Vec<&String> = referenced.iter().filter(|n| !exported.contains(*n)).collect();
            assert!(
                unknown.is_empty(),
                "{file} references metrics the agent does not export: {unknown:?}"
            );
        }
        // And the SPEC names are all there.
        for name in [
            "lifeline_client_state",
            "lifeline_client_connections",
            "lifeline_client_last_receive_age_seconds",
            "lifeline_client_connect_failures_total",
            "lifeline_client_retransmits_total",
            "lifeline_remediations_total",
            "lifeline_alerts_sent_total",
            "lifeline_ebpf_events_total",
            "lifeline_ebpf_events_lost_total",
            "lifeline_ebpf_records_dropped_total",
            "lifeline_detection_seconds",
            "lifeline_build_info",
            "lifeline_endpoint_reachable",
            "lifeline_client_watches",
            "lifeline_client_stream_stuck",
        ] {
            assert!(exported.contains(name), "{name} not exported");
        }
    }
}
