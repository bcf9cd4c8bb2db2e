//! The agent's workers, in the order of the data flow:
//!
//! - `app::pump`: kernel events → connection table (a thread of its own, as they arrive);
//! - [`SampleLoop`]: once per tick, sock_diag samples → connection table → client health →
//!   actions (logs, metrics, alerts, Kubernetes Events, remediation). A thread of its own: the
//!   sampling is blocking netlink I/O.
use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use tokio::sync::watch;

use crate::{
    act::alerts::{self, Alerter},
    act::metrics::Metrics,
    act::remediate::{self, Remediation},
    cluster::{self, Cluster, EventTarget, EventType},
    health::judge::{self, Judge},
    health::snapshot::{Latest, Snapshot},
    health::State,
    host::prober,
    host::process::ProcessInfo,
    kernel::{
        golang::{self, GoTracer},
        openssl::SslTracer,
        probed::Visibility,
        programs::Probes,
    },
    table::sampler::{Sampler, SharedTable},
};

/// How often tracked sockets are sampled and clients judged.
pub const TICK: Duration = Duration::from_secs(1);
/// Kernel events make the tick thread judge at once, but not more often than this (an event
/// storm must not turn into a judging storm).
pub const REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(200);

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
    /// The agent's own probes of the endpoints, and where to tell it what to probe.
    pub endpoint_probes: prober::Probes,
    pub probe_targets: watch::Sender<prober::Targets>,
    /// Where the HTTP API reads the latest snapshot.
    pub latest: Latest,
    pub refresher: Refresher,
    pub ready: Arc<AtomicBool>,
    /// The kernel programs, for the Go-client uprobes that follow clients' binaries.
    pub kernel: Arc<Mutex<Probes>>,
    /// Also told by the pump of processes that start (probed at start).
    pub go: Arc<Mutex<GoTracer>>,
    /// The OpenSSL-client uprobes that follow clients' libssl.
    pub ssl: SslTracer,
    /// False with `--no-go-probes`: neither tracer ever attaches (the connection-only agent).
    pub go_probes: bool,
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
        let mut next_tick = Instant::now() + TICK;
        let mut last_judged = Instant::now();
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match self.commands.recv_timeout(wait) {
                Ok(Command::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Ok(Command::Rescan) => {
                    let found = self.sampler.scan(&self.table);
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
            let round = self.sampler.sample(&self.table);
            if let Some(found) = round.resync_added.filter(|f| *f > 0) {
                tracing::info!(found, "a rescan found connections no event had reported");
            }
            let snap = Arc::new(self.judge(Instant::now()));
            last_judged = Instant::now();
            self.act(&snap);
            self.latest.set(snap);
        }
    }

    /// The judge's snapshot of this tick; the table is locked only for this. First the
    /// Go-client probes follow the processes that hold connections now.
    fn judge(&mut self, now: Instant) -> Snapshot {
        let holding: HashSet<(u32, u64)> = {
            let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
            table
                .processes()
                .filter(|p| p.connected_since.is_some())
                .map(|p| (p.info.pid, p.info.start_time_ticks))
                .collect()
        };
        // Held through the judgement, which asks it each client's visibility (never while the
        // table is locked elsewhere: the pump locks the table and this one apart).
        let mut go = self.go.lock().unwrap_or_else(PoisonError::into_inner);
        if self.go_probes {
            let go_done = go.reconcile(&self.kernel, &holding, now);
            let ssl = self.ssl.reconcile(&self.kernel, &holding, now);
            self.metrics.count_probed_files("go", go_done, go.counts());
            self.metrics.count_probed_files("openssl", ssl, self.ssl.counts());
        }
        let cluster = self.cluster.clone();
        let pods = |info: &ProcessInfo| cluster::pod_of(cluster.as_ref(), info);
        let (go, ssl) = (&*go, &self.ssl);
        let visibility = |key| match golang::visibility(go, key) {
            streams @ Visibility::Streams { .. } => streams,
            connection => ssl.visibility(key).unwrap_or(connection),
        };
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
        judge.tick(&table, &probes, &pods, &visibility, now)
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
