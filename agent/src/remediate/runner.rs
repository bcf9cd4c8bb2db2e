//! The glue between the run loop and remediation: [`ClientFacts`] built from the connection
//! table and the judge's verdicts, and [`Remediation`], which plans once per tick (under the
//! run loop's locks, without I/O), hands the actions to a tokio task and records every outcome
//! (one log line, one `lifeline_remediations_total` increment) when it is known.
use std::{
    collections::HashMap,
    sync::{mpsc as std_mpsc, Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use lifeline_common::tcp_state;
use prometheus::IntCounterVec;
use tokio::{sync::mpsc, task::JoinHandle};

use super::{
    act::Actuator,
    evict::Evictor,
    model::{Client, ClientFacts, Decision, Disposition, Outcome, PodRef, Resolution},
    policy::{Remediator, Settings},
};
use crate::{
    health::{assess_outage, Thresholds, Verdict},
    metrics::Metrics,
    process::ProcessInfo,
    table::{Connection, ConnectionTable},
    views::ClientKey,
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
    /// `workload` says, per client process, its pod and whether it is opted in;
    /// `apiserver_reachable` is the agent's own apiserver check (`None`: unknown).
    pub fn tick(
        &self,
        table: &ConnectionTable,
        verdicts: &HashMap<ClientKey, Verdict>,
        thresholds: &Thresholds,
        apiserver_reachable: Option<bool>,
        workload: impl FnMut(&ProcessInfo) -> Workload,
        now: Instant,
    ) -> Vec<Outcome> {
        let clients = facts(table, verdicts, thresholds, now, workload);
        let outage = assess_outage(verdicts.values());
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut outcomes = Vec::new();
        while let Ok(outcome) = inner.done.try_recv() {
            if inner.policy.settle(now, &outcome) {
                outcomes.push(outcome);
            }
        }
        let plan = inner
            .policy
            .plan(now, &clients, outage.as_ref(), apiserver_reachable);
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

/// The policy's view of every judged client still in the table, with its suspect sockets.
/// The agent itself is never remediated (it may well be a client of the apiserver).
pub fn facts(
    table: &ConnectionTable,
    verdicts: &HashMap<ClientKey, Verdict>,
    thresholds: &Thresholds,
    now: Instant,
    mut workload: impl FnMut(&ProcessInfo) -> Workload,
) -> Vec<ClientFacts> {
    let me = std::process::id();
    let mut out: Vec<ClientFacts> = verdicts
        .iter()
        .filter(|(key, verdict)| verdict.is_client && key.0 != me)
        .filter_map(|(key, verdict)| {
            let record = table
                .process(key.0)
                .filter(|r| r.info.start_time_ticks == key.1)?;
            let info = &record.info;
            let Workload { pod, opted_in } = workload(info);
            let mut suspect: Vec<_> = table
                .connections_of(key.0)
                .filter(|c| is_suspect(c, thresholds, now))
                .map(|c| c.tuple)
                .collect();
            suspect.sort_by_key(|t| (t.netns, t.local, t.remote));
            Some(ClientFacts {
                client: Client {
                    pid: info.pid,
                    start_time: info.start_time_ticks,
                    comm: info.comm.clone(),
                    cmdline: info.cmdline.clone(),
                    pod,
                },
                opted_in,
                state: verdict.state,
                since: verdict.since,
                reason: verdict.reason.clone(),
                suspect,
            })
        })
        .collect();
    out.sort_by_key(|f| f.client.key());
    out
}

/// An established connection that is blackholed (retransmitting without ACK progress for
/// `blackhole_after`) or stale (no payload for `stale_after`).
fn is_suspect(c: &Connection, t: &Thresholds, now: Instant) -> bool {
    let stalled = c
        .stalled_since
        .is_some_and(|since| now.saturating_duration_since(since) >= t.blackhole_after);
    let quiet = now.saturating_duration_since(c.last_payload.unwrap_or(c.first_seen)) >= t.stale_after;
    c.tcp_state == tcp_state::ESTABLISHED && c.tuple.local.port() != 0 && (stalled || quiet)
}

#[cfg(test)]
mod tests {
    use std::{io, time::Duration};

    use super::*;
    use crate::{
        config::RemediationMode,
        endpoint::{Endpoint, EndpointSet, Source},
        health::State,
        kernel::events::{Change, KernelEvent},
        remediate::{
            evict::EvictOutcome,
            model::{Action, Skip, Target},
            Actuator, NoCluster, Remediation, Settings, Workload,
        },
        table::Tuple,
    };

    const NETNS: u64 = 4026531840;

    /// A table in which each `(pid, start time)` holds one established connection since `t0`
    /// (local port 40000 + pid % 20000) that never received payload.
    fn table(processes: &[(u32, u64)], t0: Instant) -> ConnectionTable {
        let mut set = EndpointSet::default();
        for e in Endpoint::parse_all("10.0.0.1:6443").unwrap() {
            set.insert(e, Source::Flag);
        }
        let mut table = ConnectionTable::new(set);
        for &(pid, start) in processes {
            let ev = |local: String, old, new, tgid| KernelEvent {
                at: t0,
                sk: u64::from(pid),
                netns: NETNS,
                change: Change::State { old, new },
                local: local.parse().unwrap(),
                remote: "10.0.0.1:6443".parse().unwrap(),
                owner_tgid: tgid,
                thread_comm: "worker".into(),
                sk_err: 0,
                bytes_received: 0,
            };
            let info = ProcessInfo {
                pid,
                comm: format!("ctl{pid}"),
                cmdline: format!("/bin/ctl{pid} --v=2"),
                cgroup: "/".into(),
                container: None,
                netns: Some(NETNS),
                start_time_ticks: start,
            };
            table.apply_event(
                &ev(
                    "10.0.0.2:0".into(),
                    tcp_state::CLOSE,
                    tcp_state::SYN_SENT,
                    Some(pid),
                ),
                Some(info),
            );
            table.apply_event(
                &ev(
                    format!("10.0.0.2:{}", 40000 + pid % 20000),
                    tcp_state::SYN_SENT,
                    tcp_state::ESTABLISHED,
                    None,
                ),
                None,
            );
        }
        table
    }

    fn verdict(state: State, since: Instant) -> Verdict {
        Verdict {
            state,
            since,
            reason: format!("judged {state}"),
            is_client: true,
        }
    }

    fn op_pod() -> PodRef {
        PodRef {
            namespace: "kube-system".into(),
            name: "op-0".into(),
            uid: "uid-7".into(),
        }
    }

    /// pid 7 runs in pod kube-system/op-0 (opted in); the others are host processes, not
    /// opted in.
    fn workload(info: &ProcessInfo) -> Workload {
        match info.pid {
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

    #[test]
    fn facts_carry_the_workload_and_the_suspect_sockets() {
        let t0 = Instant::now();
        let table = table(&[(7, 42), (8, 43)], t0);
        let thresholds = Thresholds::default();
        let verdicts = HashMap::from([
            ((7, 42), verdict(State::Stale, t0)),
            ((8, 43), verdict(State::Healthy, t0)),
            ((8, 1), verdict(State::Stale, t0)), // an older process with that pid: gone
            ((9, 1), verdict(State::Stale, t0)), // not in the table
        ]);
        let tuple = |pid: u32| Tuple {
            netns: NETNS,
            local: format!("10.0.0.2:{}", 40000 + pid).parse().unwrap(),
            remote: "10.0.0.1:6443".parse().unwrap(),
        };
        // 89 s without payload: not stale yet.
        let early = facts(
            &table,
            &verdicts,
            &thresholds,
            t0 + Duration::from_secs(89),
            workload,
        );
        assert_eq!(
            early
                .iter()
                .map(|f| (f.client.key(), f.suspect.len()))
                .collect::<Vec<_>>(),
            [((7, 42), 0), ((8, 43), 0)]
        );
        let got = facts(
            &table,
            &verdicts,
            &thresholds,
            t0 + Duration::from_secs(90),
            workload,
        );
        assert_eq!(
            got[0],
            ClientFacts {
                client: Client {
                    pid: 7,
                    start_time: 42,
                    comm: "ctl7".into(),
                    cmdline: "/bin/ctl7 --v=2".into(),
                    pod: Some(op_pod()),
                },
                opted_in: true,
                state: State::Stale,
                since: t0,
                reason: "judged stale".into(),
                suspect: vec![tuple(7)],
            }
        );
        assert_eq!((got[1].client.pod.as_ref(), got[1].opted_in), (None, false));
        assert_eq!(
            got[1].suspect,
            [tuple(8)],
            "quiet sockets are suspect whatever the verdict"
        );
        // Non-clients are not the policy's business.
        let mut not_client = verdict(State::Healthy, t0);
        not_client.is_client = false;
        let verdicts = HashMap::from([((7, 42), not_client)]);
        assert!(facts(&table, &verdicts, &thresholds, t0, workload).is_empty());
    }

    #[test]
    fn the_agent_itself_is_never_a_candidate() {
        let t0 = Instant::now();
        let me = std::process::id();
        let table = table(&[(me, 1)], t0);
        let verdicts = HashMap::from([((me, 1), verdict(State::Disconnected, t0))]);
        assert!(table.process(me).is_some());
        assert!(facts(&table, &verdicts, &Thresholds::default(), t0, workload).is_empty());
    }

    #[test]
    fn blackholed_sockets_are_suspect_before_they_are_quiet() {
        let t0 = Instant::now();
        let mut table = table(&[(7, 42)], t0);
        let retransmit = KernelEvent {
            at: t0 + Duration::from_secs(5),
            sk: 7,
            netns: NETNS,
            change: Change::Retransmit {
                state: tcp_state::ESTABLISHED,
            },
            local: "10.0.0.2:40007".parse().unwrap(),
            remote: "10.0.0.1:6443".parse().unwrap(),
            owner_tgid: None,
            thread_comm: String::new(),
            sk_err: 0,
            bytes_received: 0,
        };
        table.apply_event(&retransmit, None);
        let verdicts = HashMap::from([((7, 42), verdict(State::Blackholed, t0))]);
        let at = |s| t0 + Duration::from_secs(s);
        let thresholds = Thresholds::default();
        assert!(facts(&table, &verdicts, &thresholds, at(24), workload)[0]
            .suspect
            .is_empty());
        assert_eq!(
            facts(&table, &verdicts, &thresholds, at(25), workload)[0]
                .suspect
                .len(),
            1
        );
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
        // Two healthy clients besides: not a node-level outage, which would hold restarts back.
        let table = table(&[(7, 42), (8, 43), (9, 44), (10, 45)], t0);
        let verdicts = HashMap::from([
            ((7, 42), verdict(State::Disconnected, t0)),
            ((8, 43), verdict(State::Stale, t0)),
            ((9, 44), verdict(State::Healthy, t0)),
            ((10, 45), verdict(State::Healthy, t0)),
        ]);
        let thresholds = Thresholds::default();
        let tick = |secs: u64| {
            remediation.tick(
                &table,
                &verdicts,
                &thresholds,
                Some(true),
                workload,
                t0 + Duration::from_secs(100 + secs),
            )
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
                "pod kube-system/op-0 (ctl7 pid 7): restart (eviction) of pod kube-system/op-0: done (pod kube-system/op-0 evicted); reason: disconnected: judged disconnected"
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
        let table = table(&[(7, 42)], t0);
        let verdicts = HashMap::from([((7, 42), verdict(State::Stale, t0))]);
        let now = t0 + Duration::from_secs(100);
        let tick = |now| remediation.tick(&table, &verdicts, &Thresholds::default(), None, workload, now);
        assert!(tick(now).is_empty());
        remediation.reconfigure(settings(RemediationMode::Reset, true));
        let got = tick(now);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (&got[0].action, &got[0].result),
            (
                &Action::Reset {
                    tuples: vec![Tuple {
                        netns: NETNS,
                        local: "10.0.0.2:40007".parse().unwrap(),
                        remote: "10.0.0.1:6443".parse().unwrap(),
                    }]
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
        let table = table(&[(7, 42)], t0);
        let verdicts = HashMap::from([((7, 42), verdict(State::Disconnected, t0))]);
        let got = remediation.tick(&table, &verdicts, &Thresholds::default(), None, workload, t0);
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].result,
            Resolution::Failed("remediation is shutting down".into())
        );
        assert!(got[0].is_failure());
        assert_eq!(count(&metrics, "restart", "failed"), 1);
    }
}
