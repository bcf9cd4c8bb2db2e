//! The agent's two workers, in the order of the data flow:
//!
//! - [`pump_events`]: kernel events → connection table (a tokio task, as they arrive);
//! - [`SampleLoop`]: once per tick, sock_diag samples → connection table → client health →
//!   actions (logs, metrics, alerts, Kubernetes Events, remediation). A thread of its own: the
//!   sampling is blocking netlink I/O.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use tokio::sync::watch;

use aya::maps::{MapData, RingBuf};

use crate::{
    alerts::{self, Alerter},
    cluster::{self, Cluster, EventTarget, EventType, PodRef},
    health::State,
    judge::{self, Judge},
    kernel::{
        events::{self, MonotonicClock},
        programs::Probes,
    },
    metrics::Metrics,
    prober,
    process::{ProcessInfo, Procfs},
    remediate::{self, Remediation},
    sampler::{Sampler, SharedTable},
    snapshot::{Latest, Snapshot},
    table::Applied,
};

/// How often tracked sockets are sampled and clients judged.
pub const TICK: Duration = Duration::from_secs(1);
/// Kernel events make the tick thread judge at once, but not more often than this (an event
/// storm must not turn into a judging storm).
pub const REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(200);
/// How often every network namespace is scanned again, to heal what lost kernel events left
/// behind (a scan also follows at once whenever the kernel reports lost events).
pub const RESCAN_EVERY: Duration = Duration::from_secs(60);

/// What the sampler thread is told.
pub enum Command {
    /// Scan every namespace for existing connections again (the endpoint set changed).
    Rescan,
    /// Kernel events changed the table: judge and publish now, without waiting for the next
    /// sample (a new connection is listed at once).
    Refresh,
    Stop,
}

/// Asks the tick thread for a [`Command::Refresh`] after kernel events, at most one pending.
#[derive(Clone)]
pub struct Refresher {
    commands: mpsc::Sender<Command>,
    pending: Arc<AtomicBool>,
}

impl Refresher {
    pub fn new(commands: mpsc::Sender<Command>) -> Self {
        Self {
            commands,
            pending: Arc::default(),
        }
    }

    /// Requests a refresh unless one is already pending.
    pub fn request(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            let _ = self.commands.send(Command::Refresh);
        }
    }

    fn taken(&self) {
        self.pending.store(false, Ordering::Release);
    }
}

/// The pod a process runs in, from the cluster's pod index by container id.
pub fn pod_of(cluster: Option<&Cluster>, info: &ProcessInfo) -> Option<PodRef> {
    cluster.and_then(|c| info.container.as_ref().and_then(|k| c.pod_of(&k.id)))
}

/// Metric labels of a process: namespace, pod, container (empty outside Kubernetes), comm.
fn client_labels(cluster: Option<&Cluster>, info: &ProcessInfo) -> [String; 4] {
    match pod_of(cluster, info) {
        Some(p) => [p.namespace, p.pod, p.container, info.comm.clone()],
        None => [String::new(), String::new(), String::new(), info.comm.clone()],
    }
}

/// Kernel events → connection table.
pub async fn pump_events(
    ring: RingBuf<MapData>,
    table: SharedTable,
    metrics: Arc<Metrics>,
    procfs: Procfs,
    cluster: Option<Cluster>,
    refresher: Refresher,
) -> std::io::Result<()> {
    let clock = MonotonicClock::new();
    let mut fd = crate::kernel::readable_fd(ring)?;
    loop {
        let mut guard = fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        let mut applied = false;
        while let Some(item) = ring.next() {
            applied = true;
            let decoded = events::decode(&item, &clock);
            drop(item);
            let ev = match decoded {
                Ok(ev) => ev,
                Err(err) => {
                    tracing::warn!("dropping a kernel event: {err}");
                    continue;
                }
            };
            metrics.ebpf_events.with_label_values(&[ev.kind_label()]).inc();
            let owner = ev.owner_tgid.and_then(|tgid| procfs.process(tgid).ok());
            let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
            let counted = match table.apply_event(&ev, owner) {
                Some(Applied::Retransmit {
                    pid: Some(pid),
                    endpoint,
                }) => Some((pid, endpoint, None)),
                Some(Applied::ConnectFailed {
                    pid,
                    endpoint,
                    reason,
                }) => Some((pid, endpoint, Some(reason))),
                Some(Applied::Retransmit { pid: None, .. }) | None => None,
            };
            let Some((pid, endpoint, failure)) = counted else {
                continue;
            };
            let Some(p) = table.process(pid) else { continue };
            let labels = client_labels(cluster.as_ref(), &p.info);
            match failure {
                None => metrics.count_retransmit(&labels, &endpoint.to_string()),
                Some(reason) => {
                    metrics.count_connect_failure(&labels, &endpoint.to_string(), reason.as_str())
                }
            }
        }
        if applied {
            refresher.request();
        }
        guard.clear_ready();
    }
}

/// Evictions through the cluster when there is one; standalone, every eviction fails.
pub struct ClusterEvictor(pub Option<Cluster>);

#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    #[error(transparent)]
    Standalone(#[from] remediate::Error),
    #[error(transparent)]
    Cluster(#[from] cluster::Error),
}

impl remediate::Evictor for ClusterEvictor {
    type Error = EvictError;

    async fn evict(&self, namespace: &str, name: &str) -> Result<remediate::EvictOutcome, EvictError> {
        let Some(c) = &self.0 else {
            return Ok(remediate::NoCluster.evict(namespace, name).await?);
        };
        Ok(match c.evict(namespace, name).await? {
            cluster::EvictOutcome::Evicted => remediate::EvictOutcome::Evicted,
            cluster::EvictOutcome::Blocked { reason } => remediate::EvictOutcome::Blocked { reason },
            cluster::EvictOutcome::NotFound => remediate::EvictOutcome::NotFound,
        })
    }
}

/// What the sampler thread works on.
pub struct SampleLoop {
    pub commands: mpsc::Receiver<Command>,
    pub sampler: Sampler,
    pub table: SharedTable,
    pub judge: Arc<Mutex<Judge>>,
    pub alerter: Alerter,
    pub remediation: Remediation,
    pub cluster: Option<Cluster>,
    pub node: String,
    pub metrics: Arc<Metrics>,
    pub probes: Arc<Mutex<Probes>>,
    /// The agent's own probes of the endpoints, and where to tell it what to probe.
    pub endpoint_probes: prober::Probes,
    pub probe_targets: watch::Sender<prober::Targets>,
    /// Where the HTTP API reads the latest snapshot.
    pub latest: Latest,
    pub refresher: Refresher,
    pub ready: Arc<AtomicBool>,
}

impl SampleLoop {
    /// First scan (then ready), then once per TICK: sample, judge, act.
    pub fn run(mut self) {
        let found = self.sampler.scan(&self.table);
        tracing::info!(found, "start-up scan done");
        // What the scan found is in the API before the agent says it is ready.
        let first = self.judge(Instant::now());
        self.latest.set(Arc::new(first));
        self.ready.store(true, Ordering::Release);
        let mut lost_seen = 0;
        let mut last_scan = Instant::now();
        let mut next_tick = Instant::now() + TICK;
        let mut last_judged = Instant::now();
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match self.commands.recv_timeout(wait) {
                Ok(Command::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Ok(Command::Rescan) => {
                    let found = self.sampler.scan(&self.table);
                    last_scan = Instant::now();
                    tracing::info!(found, "rescan after an endpoint change done");
                    continue;
                }
                Ok(Command::Refresh) => {
                    if last_judged.elapsed() < REFRESH_MIN_INTERVAL {
                        // Too soon: wait out the interval, then judge what accumulated.
                        std::thread::sleep(REFRESH_MIN_INTERVAL.saturating_sub(last_judged.elapsed()));
                    }
                    self.refresher.taken();
                    let snap = Arc::new(self.judge(Instant::now()));
                    last_judged = Instant::now();
                    self.act(&snap);
                    self.latest.set(snap);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            next_tick = Instant::now().max(next_tick) + TICK;
            self.sampler.sample(&self.table);
            let snap = Arc::new(self.judge(Instant::now()));
            last_judged = Instant::now();
            self.act(&snap);
            self.latest.set(snap);
            let lost = match self
                .probes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .counters()
            {
                Ok(counters) => counters.lost.saturating_sub(lost_seen),
                Err(err) => {
                    tracing::warn!("reading the kernel's event counters: {err}");
                    0
                }
            };
            if lost > 0 {
                self.metrics.ebpf_events_lost.inc_by(lost);
                lost_seen += lost;
                tracing::warn!(
                    lost,
                    "the kernel lost events (ring buffer full); rescanning to heal the table"
                );
            }
            if lost > 0 || last_scan.elapsed() >= RESCAN_EVERY {
                let found = self.sampler.scan(&self.table);
                last_scan = Instant::now();
                if found > 0 {
                    tracing::info!(found, "a rescan found connections no event had reported");
                }
            }
        }
    }

    /// The judge's snapshot of this tick; the table is locked only for this.
    fn judge(&mut self, now: Instant) -> Snapshot {
        let cluster = self.cluster.clone();
        let pods = |info: &ProcessInfo| pod_of(cluster.as_ref(), info);
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let targets = judge::probe_targets(&table);
        self.probe_targets.send_if_modified(|current| {
            let changed = *current != targets;
            if changed {
                *current = targets;
            }
            changed
        });
        let probes = self.endpoint_probes.snapshot();
        let mut judge = self.judge.lock().unwrap_or_else(PoisonError::into_inner);
        judge.tick(&table, &probes, &pods, now)
    }

    /// Everything that follows a tick, from its snapshot: logs, detection times, Events,
    /// alerts, remediation, metrics.
    fn act(&mut self, snap: &Snapshot) {
        for e in &snap.endpoints {
            if let Some(since) = e.unreachable_since().filter(|s| *s == snap.at) {
                tracing::warn!(endpoint = %e.endpoint, ?since, "apiserver endpoint unreachable from this node: {:?}", e.status);
            }
        }
        for t in &snap.transitions {
            let Some(client) = snap.client(t.key) else {
                continue;
            };
            let tr = &t.transition;
            tracing::warn!(
                pid = client.process.pid, comm = %client.process.comm, endpoint = ?t.endpoint,
                from = %tr.from, to = %tr.to, detection_ms = tr.detection.as_millis() as u64,
                "{}", tr.reason
            );
            if tr.to != State::Healthy {
                self.metrics.detection.observe(tr.detection.as_secs_f64());
            }
            let reason = alerts::alert_name(tr.to).unwrap_or("LifelineClientRecovered");
            let type_ = if tr.to == State::Healthy {
                EventType::Normal
            } else {
                EventType::Warning
            };
            let pod = client
                .pod
                .as_ref()
                .map(|p| (p.namespace.clone(), p.pod.clone(), p.uid.clone()));
            self.event(pod, reason, &tr.reason, type_);
        }
        self.alerter.tick(snap);
        let apiserver_reachable = self.cluster.as_ref().and_then(Cluster::apiserver_reachable);
        let outcomes = self.remediation.tick(snap, apiserver_reachable, |c| {
            // Opt-in: the pod's annotation; for host processes, the config's selector.
            let opted_in = match &c.pod {
                Some(p) => p.remediate,
                None => c.selected,
            };
            let pod = c.pod.as_ref().map(|p| remediate::model::PodRef {
                namespace: p.namespace.clone(),
                name: p.pod.clone(),
                uid: p.uid.clone(),
            });
            remediate::Workload { pod, opted_in }
        });
        for o in &outcomes {
            let pod = o
                .client
                .pod
                .as_ref()
                .map(|p| (p.namespace.clone(), p.name.clone(), p.uid.clone()));
            let type_ = if o.is_failure() {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.event(pod, o.event_reason(), &o.summary(), type_);
        }
        self.metrics.update(snap);
    }

    /// A Kubernetes Event on the pod (namespace, name, uid), or on the Node for a host process.
    fn event(&self, pod: Option<(String, String, String)>, reason: &str, message: &str, type_: EventType) {
        let Some(c) = &self.cluster else { return };
        let target = match pod {
            Some((namespace, name, uid)) => EventTarget::Pod { namespace, name, uid },
            None => EventTarget::Node {
                name: self.node.clone(),
            },
        };
        c.emit(target, reason, message, type_);
    }
}
