//! The glue between the tick and remediation: [`ClientFacts`] taken from the tick's snapshot,
//! and [`Remediation`], which plans once per tick (without I/O), hands the actions to a tokio
//! task and records every outcome (one log line, one `lifeline_remediations_total` increment)
//! when it is known.
use std::{
    sync::{mpsc as std_mpsc, Arc, Mutex, PoisonError},
    time::Duration,
};

use prometheus::IntCounterVec;
use tokio::{sync::mpsc, task::JoinHandle};

use super::{
    act::Actuator,
    evict::Evictor,
    model::{Client, ClientFacts, Decision, Disposition, Outcome, PodRef, Resolution},
    policy::{Remediator, Settings},
};
use crate::{
    act::metrics::Metrics,
    health::snapshot::{ClientSnapshot, Snapshot},
};

/// Where a client process runs and whether it may be remediated, as the caller knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    /// Its pod; `None` for a host process.
    pub pod: Option<PodRef>,
    /// Opted in: the pod annotation `lifeline.dev/remediate: "true"`, or a selector.
    pub opted_in: bool,
}

impl Workload {
    /// A host process.
    #[cfg(test)]
    pub fn host(opted_in: bool) -> Self {
        Self { pod: None, opted_in }
    }
}

/// Remediation for the run loop. Clones share one policy and one worker task.
#[derive(Clone)]
pub struct Remediation {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    policy: Remediator,
    /// Actions for the worker; `None` after shutdown.
    jobs: Option<mpsc::UnboundedSender<Decision>>,
    /// Outcomes of the worker's actions, settled and recorded at the next tick.
    done: std_mpsc::Receiver<Outcome>,
    worker: Option<JoinHandle<()>>,
    counter: IntCounterVec,
}

impl Remediation {
    /// Starts the worker task (call inside the tokio runtime). Outcomes are counted in
    /// `lifeline_remediations_total{action,result}`.
    pub fn start<E: Evictor>(settings: Settings, actuator: Actuator<E>, metrics: &Metrics) -> Self {
        let (jobs, job_rx) = mpsc::unbounded_channel();
        let (done_tx, done) = std_mpsc::channel();
        let worker = tokio::spawn(work(actuator, job_rx, done_tx));
        Self {
            inner: Arc::new(Mutex::new(Inner {
                policy: Remediator::new(settings),
                jobs: Some(jobs),
                done,
                worker: Some(worker),
                counter: metrics.remediations.clone(),
            })),
        }
    }

    /// New settings (config reload); cooldowns, escalations and the budget carry over.
    pub fn reconfigure(&self, settings: Settings) {
        self.lock().policy.set_settings(settings);
    }

    /// One tick: settles and records the outcomes of actions finished since the last tick,
    /// plans this tick's decisions, records the skips and dry runs at once and hands the
    /// actions to the worker. Returns every outcome recorded now (for Kubernetes Events).
    /// Never blocks on I/O.
    ///
    /// `workload` says, per client, its pod and whether it is opted in;
    /// `apiserver_reachable` is the agent's own apiserver check (`None`: unknown).
    pub fn tick(
        &self,
        snap: &Snapshot,
        apiserver_reachable: Option<bool>,
        workload: impl FnMut(&ClientSnapshot) -> Workload,
    ) -> Vec<Outcome> {
        let now = snap.at;
        let clients = facts(snap, workload);
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut outcomes = Vec::new();
        while let Ok(outcome) = inner.done.try_recv() {
            if inner.policy.settle(now, &outcome) {
                outcomes.push(outcome);
            }
        }
        let plan = inner.policy.plan(now, &clients, apiserver_reachable);
        for decision in plan.decisions {
            match decision.disposition.clone() {
                Disposition::Act => {
                    let sent = match &inner.jobs {
                        Some(jobs) => jobs.send(decision).map_err(|e| e.0),
                        None => Err(decision),
                    };
                    if let Err(decision) = sent {
                        let outcome =
                            decision.into_outcome(Resolution::Failed("remediation is shutting down".into()));
                        inner.policy.settle(now, &outcome);
                        outcomes.push(outcome);
                    }
                }
                Disposition::DryRun => outcomes.push(decision.into_outcome(Resolution::DryRun)),
                Disposition::Skip(skip) => {
                    outcomes.push(decision.into_outcome(Resolution::Skipped(skip)));
                }
            }
        }
        for outcome in &outcomes {
            record(outcome, &inner.counter);
        }
        outcomes
    }

    /// Stops taking actions, waits up to `grace` for those under way and records their
    /// outcomes.
    pub async fn shutdown(&self, grace: Duration) {
        let worker = {
            let mut inner = self.lock();
            inner.jobs = None;
            inner.worker.take()
        };
        if let Some(worker) = worker {
            if tokio::time::timeout(grace, worker).await.is_err() {
                tracing::warn!(
                    "remediation actions still under way at shutdown; their outcomes are not known"
                );
            }
        }
        let inner = self.lock();
        while let Ok(outcome) = inner.done.try_recv() {
            record(&outcome, &inner.counter);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes the actions one after the other, in the order decided.
async fn work<E: Evictor>(
    actuator: Actuator<E>,
    mut jobs: mpsc::UnboundedReceiver<Decision>,
    done: std_mpsc::Sender<Outcome>,
) {
    while let Some(decision) = jobs.recv().await {
        let outcome = actuator.execute(decision).await;
        if done.send(outcome).is_err() {
            return;
        }
    }
}

/// One log line and one metric increment.
fn record(outcome: &Outcome, counter: &IntCounterVec) {
    let action = outcome.action.kind().as_str();
    let result = outcome.result.label();
    counter.with_label_values(&[action, result]).inc();
    let (namespace, pod) = outcome
        .client
        .pod
        .as_ref()
        .map_or(("", ""), |p| (p.namespace.as_str(), p.name.as_str()));
    let why = match &outcome.result {
        Resolution::Skipped(skip) => skip.label(),
        _ => "",
    };
    let (pid, comm, summary) = (outcome.client.pid, &outcome.client.comm, outcome.summary());
    match outcome.result {
        Resolution::Done(_) | Resolution::Failed(_) => tracing::warn!(
            action, result, why, pid, comm = %comm, namespace, pod, "remediation: {summary}"
        ),
        Resolution::DryRun | Resolution::Skipped(_) => tracing::info!(
            action, result, why, pid, comm = %comm, namespace, pod, "remediation: {summary}"
        ),
    }
}

/// The policy's view of every judged client of the snapshot, with its suspect sockets and
/// whether its endpoint is unreachable. The agent itself is never remediated.
pub fn facts(snap: &Snapshot, mut workload: impl FnMut(&ClientSnapshot) -> Workload) -> Vec<ClientFacts> {
    let me = std::process::id();
    snap.clients
        .iter()
        .filter(|c| c.verdict.is_client && c.key.0 != me)
        .map(|c| {
            let Workload { pod, opted_in } = workload(c);
            let endpoint_down = c
                .verdict
                .endpoint
                .as_deref()
                .filter(|e| snap.unreachable(e).is_some())
                .map(str::to_owned);
            ClientFacts {
                client: Client {
                    pid: c.process.pid,
                    start_time: c.process.start_time_ticks,
                    comm: c.process.comm.clone(),
                    cmdline: c.process.cmdline.clone(),
                    pod,
                },
                opted_in,
                state: c.verdict.state,
                since: c.verdict.since,
                reason: c.verdict.reason.clone(),
                suspect: c.suspect_tuples(),
                endpoint_down,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
