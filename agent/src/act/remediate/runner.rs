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
    metrics::Metrics,
    snapshot::{ClientSnapshot, Snapshot},
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
mod tests {
    use std::{
        io,
        time::{Duration, Instant},
    };

    use super::*;
    use crate::{
        config::RemediationMode,
        health::State,
        remediate::{
            evict::EvictOutcome,
            model::{Action, Skip, Target},
            Actuator, NoCluster, Remediation, Settings, Workload,
        },
        table::Tuple,
        testkit::{client_snapshot, snapshot, NETNS},
    };

    fn op_pod() -> PodRef {
        PodRef {
            namespace: "kube-system".into(),
            name: "op-0".into(),
            uid: "uid-7".into(),
        }
    }

    /// pid 7 runs in pod kube-system/op-0 (opted in); the others are host processes, not
    /// opted in.
    fn workload(c: &ClientSnapshot) -> Workload {
        match c.key.0 {
            7 => Workload {
                pod: Some(op_pod()),
                opted_in: true,
            },
            _ => Workload::host(false),
        }
    }

    fn settings(mode: RemediationMode, dry_run: bool) -> Settings {
        Settings {
            mode,
            dry_run,
            cooldown: Duration::from_secs(600),
            budget_per_hour: 3,
        }
    }

    fn tuple(pid: u32) -> Tuple {
        Tuple {
            netns: NETNS,
            local: format!("10.0.0.2:{}", 40000 + pid).parse().unwrap(),
            remote: "10.0.0.1:6443".parse().unwrap(),
        }
    }

    #[test]
    fn facts_carry_the_workload_the_suspect_sockets_and_the_endpoint() {
        let t0 = Instant::now();
        let mut snap = snapshot(
            t0,
            vec![
                client_snapshot(7, 42, State::Stale, t0),
                client_snapshot(8, 43, State::Healthy, t0),
            ],
        );
        let got = facts(&snap, workload);
        assert_eq!(
            got[0],
            ClientFacts {
                client: Client {
                    pid: 7,
                    start_time: 42,
                    comm: "proc-7".into(),
                    cmdline: "/usr/bin/proc-7 --serve".into(),
                    pod: Some(op_pod()),
                },
                opted_in: true,
                state: State::Stale,
                since: t0,
                reason: "judged stale".into(),
                suspect: vec![tuple(7)],
                endpoint_down: None,
            }
        );
        assert_eq!((got[1].client.pod.as_ref(), got[1].opted_in), (None, false));
        assert!(got[1].suspect.is_empty(), "a healthy verdict names no suspect");
        // Its endpoint unreachable: said.
        snap.endpoints = vec![crate::reachability::EndpointStatus {
            endpoint: crate::testkit::endpoint("10.0.0.1:6443"),
            status: crate::reachability::Status::Unreachable {
                since: t0,
                reason: "refused".into(),
            },
            outage: false,
        }];
        assert_eq!(
            facts(&snap, workload)[0].endpoint_down.as_deref(),
            Some("10.0.0.1:6443")
        );
        // Non-clients are not the policy's business.
        snap.clients[0].verdict.is_client = false;
        assert_eq!(facts(&snap, workload).len(), 1);
    }

    #[test]
    fn the_agent_itself_is_never_a_candidate() {
        let t0 = Instant::now();
        let me = std::process::id();
        let snap = snapshot(t0, vec![client_snapshot(me, 1, State::Disconnected, t0)]);
        assert!(facts(&snap, workload).is_empty());
    }

    /// Evicts every pod, after telling the test.
    struct Evicting(tokio::sync::mpsc::UnboundedSender<String>);

    impl Evictor for Evicting {
        type Error = io::Error;

        async fn evict(&self, namespace: &str, name: &str) -> Result<EvictOutcome, io::Error> {
            let _ = self.0.send(format!("{namespace}/{name}"));
            Ok(EvictOutcome::Evicted)
        }
    }

    fn count(metrics: &Metrics, action: &str, result: &str) -> u64 {
        metrics.remediations.with_label_values(&[action, result]).get()
    }

    #[tokio::test]
    async fn a_tick_records_skips_at_once_and_actions_when_done() {
        let metrics = Metrics::new("test", "test").unwrap();
        let (evicted_tx, mut evicted) = tokio::sync::mpsc::unbounded_channel();
        let remediation = Remediation::start(
            settings(RemediationMode::Restart, false),
            Actuator::new(Evicting(evicted_tx)),
            &metrics,
        );
        let t0 = Instant::now();
        let clients = vec![
            client_snapshot(7, 42, State::Disconnected, t0),
            client_snapshot(8, 43, State::Stale, t0),
            client_snapshot(9, 44, State::Healthy, t0),
        ];
        let tick = |secs: u64| {
            let snap = snapshot(t0 + Duration::from_secs(100 + secs), clients.clone());
            remediation.tick(&snap, Some(true), workload)
        };
        let first = tick(0);
        assert_eq!(first.len(), 1, "{first:#?}");
        assert_eq!(
            (first[0].client.pid, &first[0].result),
            (8, &Resolution::Skipped(Skip::NotOptedIn))
        );
        assert_eq!(first[0].event_reason(), "LifelineResetSkipped");
        assert_eq!(count(&metrics, "reset", "skipped"), 1);
        assert_eq!(evicted.recv().await.as_deref(), Some("kube-system/op-0"));
        // The eviction's outcome is recorded at a following tick.
        let mut done = Vec::new();
        for secs in 1..200 {
            done = tick(secs);
            if !done.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(done.len(), 1, "{done:#?}");
        let outcome = &done[0];
        assert_eq!(
            outcome.action,
            Action::Restart {
                target: Target::Pod(op_pod())
            }
        );
        assert_eq!(
            outcome.result,
            Resolution::Done("pod kube-system/op-0 evicted".into())
        );
        assert_eq!(outcome.event_reason(), "LifelineRestart");
        assert!(
            outcome.summary().starts_with(
                "pod kube-system/op-0 (proc-7 pid 7): restart (eviction) of pod kube-system/op-0: done (pod kube-system/op-0 evicted); reason: disconnected: judged disconnected"
            ),
            "{}",
            outcome.summary()
        );
        assert_eq!(count(&metrics, "restart", "done"), 1);
        // Still disconnected once the eviction had its time: the cooldown holds (said once).
        let later = tick(300);
        assert!(
            matches!(
                &later[..],
                [Outcome {
                    result: Resolution::Skipped(Skip::Cooldown { .. }),
                    ..
                }]
            ),
            "{later:#?}"
        );
        assert!(tick(301).is_empty());
        remediation.shutdown(Duration::from_secs(1)).await;
        assert!(evicted.try_recv().is_err(), "evicted once");
    }

    #[tokio::test]
    async fn dry_run_records_without_acting_and_mode_none_records_nothing() {
        let metrics = Metrics::new("test", "test").unwrap();
        let remediation = Remediation::start(
            settings(RemediationMode::None, false),
            Actuator::new(NoCluster),
            &metrics,
        );
        let t0 = Instant::now();
        let snap = snapshot(
            t0 + Duration::from_secs(100),
            vec![client_snapshot(7, 42, State::Stale, t0)],
        );
        assert!(remediation.tick(&snap, None, workload).is_empty());
        remediation.reconfigure(settings(RemediationMode::Reset, true));
        let got = remediation.tick(&snap, None, workload);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (&got[0].action, &got[0].result),
            (
                &Action::Reset {
                    tuples: vec![tuple(7)]
                },
                &Resolution::DryRun
            )
        );
        assert_eq!(count(&metrics, "reset", "dry_run"), 1);
        remediation.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn after_shutdown_actions_fail_and_are_recorded() {
        let metrics = Metrics::new("test", "test").unwrap();
        let remediation = Remediation::start(
            settings(RemediationMode::Restart, false),
            Actuator::new(NoCluster),
            &metrics,
        );
        remediation.shutdown(Duration::from_secs(1)).await;
        let t0 = Instant::now();
        let snap = snapshot(t0, vec![client_snapshot(7, 42, State::Disconnected, t0)]);
        let got = remediation.tick(&snap, None, workload);
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].result,
            Resolution::Failed("remediation is shutting down".into())
        );
        assert!(got[0].is_failure());
        assert_eq!(count(&metrics, "restart", "failed"), 1);
    }
}
