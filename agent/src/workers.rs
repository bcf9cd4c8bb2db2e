//! The agent's workers, in the order of the data flow:
//!
//! - `kernel::pump`: kernel events → connection table (a thread of its own, as they arrive);
//! - [`SampleLoop`]: once per tick, sock_diag samples → connection table → client health →
//!   actions (logs, metrics, alerts, Kubernetes Events, remediation). A thread of its own: the
//!   sampling is blocking netlink I/O.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use crate::{
    alerts::{self, Alerter},
    cluster::{self, Cluster, EventTarget, EventType, PodRef},
    health::State,
    judge::Judge,
    kernel::programs::Probes,
    metrics::Metrics,
    process::ProcessInfo,
    remediate::{self, Remediation},
    sampler::{Sampler, SharedTable},
    views,
};

/// How often tracked sockets are sampled and clients judged.
pub const TICK: Duration = Duration::from_secs(1);

/// What the sampler thread is told.
pub enum Command {
    /// Scan every namespace for existing connections again (the endpoint set changed).
    Rescan,
    Stop,
}

/// The pod a process runs in, from the cluster's pod index by container id.
pub fn pod_of(cluster: Option<&Cluster>, info: &ProcessInfo) -> Option<PodRef> {
    cluster.and_then(|c| info.container.as_ref().and_then(|k| c.pod_of(&k.id)))
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
    pub ready: Arc<AtomicBool>,
}

impl SampleLoop {
    /// First scan (then ready), then once per TICK: sample, judge, act.
    pub fn run(mut self) {
        let found = self.sampler.scan(&self.table);
        tracing::info!(found, "start-up scan done");
        self.ready.store(true, Ordering::Release);
        let mut lost_seen = 0;
        loop {
            match self.commands.recv_timeout(TICK) {
                Ok(Command::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Ok(Command::Rescan) => {
                    let found = self.sampler.scan(&self.table);
                    tracing::info!(found, "rescan after an endpoint change done");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            self.sampler.sample(&self.table);
            let clients = self.judge_and_act(Instant::now());
            self.metrics.update_clients(&clients);
            if let Ok(counters) = self.probes.lock().expect("probes lock").counters() {
                self.metrics
                    .ebpf_events_lost
                    .inc_by(counters.lost.saturating_sub(lost_seen));
                lost_seen = counters.lost;
            }
        }
    }

    fn judge_and_act(&mut self, now: Instant) -> Vec<views::ClientView> {
        let cluster = self.cluster.clone();
        let pods = |info: &ProcessInfo| pod_of(cluster.as_ref(), info);
        let mut judge = self.judge.lock().expect("judge lock");
        let table = self.table.lock().expect("table lock");
        let findings = judge.tick(&table, now, &pods);
        match &findings.outage_change {
            Some(Some(o)) => tracing::error!(
                affected = o.affected,
                clients = o.clients,
                "apiserver outage: most clients on this node lost the apiserver at once"
            ),
            Some(None) => tracing::warn!("apiserver outage over"),
            None => {}
        }
        for t in &findings.transitions {
            let tr = &t.transition;
            tracing::warn!(
                pid = t.process.pid, comm = %t.process.comm, endpoint = ?t.endpoint,
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
            let pod = pods(&t.process).map(|p| (p.namespace, p.pod, p.uid));
            self.event(pod, reason, &tr.reason, type_);
        }
        self.alerter.tick(&table, judge.verdicts(), now, &pods);
        let select = judge.select().clone();
        let outcomes = self.remediation.tick(
            &table,
            judge.verdicts(),
            judge.thresholds(),
            self.cluster.as_ref().and_then(Cluster::apiserver_reachable),
            |info| {
                let pod = pods(info);
                // Opt-in: the pod's annotation; for host processes, the config's selector.
                let opted_in = match &pod {
                    Some(p) => p.remediate,
                    None => select.matches(&info.comm, &info.cmdline),
                };
                let pod = pod.map(|p| remediate::model::PodRef {
                    namespace: p.namespace,
                    name: p.pod,
                    uid: p.uid,
                });
                remediate::Workload { pod, opted_in }
            },
            now,
        );
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
        views::clients(
            &table,
            judge.verdicts(),
            judge.thresholds().connect_window,
            now,
            &pods,
        )
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
