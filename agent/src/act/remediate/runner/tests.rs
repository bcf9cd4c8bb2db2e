use std::{
    io,
    time::{Duration, Instant},
};

use super::*;
use crate::{
    act::remediate::RemediationMode,
    act::remediate::{
        evict::EvictOutcome,
        model::{Action, Skip, Target},
        Actuator, NoCluster, Remediation, Settings, Workload,
    },
    health::State,
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
    snap.endpoints = vec![crate::health::reachability::EndpointStatus {
        endpoint: crate::testkit::endpoint("10.0.0.1:6443"),
        status: crate::health::reachability::Status::Unreachable {
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
