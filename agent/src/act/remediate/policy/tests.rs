use std::net::SocketAddr;

use super::*;
use crate::{
    act::remediate::model::{Client, PodRef},
    table::Tuple,
};

/// A fake clock: instants relative to a fixed origin.
struct Clock(Instant);
impl Clock {
    fn at(&self, secs: u64) -> Instant {
        self.0 + Duration::from_secs(secs)
    }
}

const MIN: u64 = 60;

fn setup(mode: RemediationMode) -> (Remediator, Clock) {
    let settings = Settings {
        mode,
        dry_run: false,
        cooldown: Duration::from_secs(10 * MIN),
        budget_per_hour: 3,
    };
    (Remediator::new(settings), Clock(Instant::now()))
}

fn tuple(port: u16) -> Tuple {
    let local: SocketAddr = format!("10.0.0.2:{port}").parse().unwrap();
    Tuple {
        netns: 4026531840,
        local,
        remote: "10.0.0.1:6443".parse().unwrap(),
    }
}

/// A host process; `comm` + `cmdline` make its identity.
fn host(pid: u32, comm: &str) -> Client {
    Client {
        pid,
        start_time: 1000 + u64::from(pid),
        comm: comm.into(),
        cmdline: format!("/usr/bin/{comm} --leader-elect"),
        pod: None,
    }
}

fn pod(pid: u32, name: &str) -> Client {
    Client {
        pod: Some(PodRef {
            namespace: "kube-system".into(),
            name: name.into(),
            uid: format!("uid-{pid}"),
        }),
        ..host(pid, "manager")
    }
}

/// Opted in, in `state` since `since`; stale and blackholed clients have one socket.
fn facts(client: &Client, state: State, since: Instant) -> ClientFacts {
    let suspect = match state {
        State::Stale | State::Blackholed => vec![tuple(40000 + client.pid as u16)],
        _ => vec![],
    };
    ClientFacts {
        client: client.clone(),
        opted_in: true,
        state,
        since,
        reason: format!("judged {state}"),
        suspect,
        endpoint_down: None,
    }
}

/// (pid, action, disposition) of each decision.
fn summary(plan: &Plan) -> Vec<(u32, ActionKind, Disposition)> {
    plan.decisions
        .iter()
        .map(|d| (d.client.pid, d.action.kind(), d.disposition.clone()))
        .collect()
}

fn one(plan: &Plan) -> &Decision {
    assert_eq!(plan.decisions.len(), 1, "{plan:#?}");
    &plan.decisions[0]
}

/// Reports `decision` as executed with `result`.
fn settle(r: &mut Remediator, now: Instant, decision: &Decision, result: Resolution) -> bool {
    r.settle(now, &decision.clone().into_outcome(result))
}

#[test]
fn mode_none_decides_nothing_not_even_skips() {
    let (mut r, c) = setup(RemediationMode::None);
    let kcm = host(7, "kcm");
    let mut unopted = facts(&host(8, "op"), State::Disconnected, c.at(0));
    unopted.opted_in = false;
    let clients = [
        facts(&kcm, State::Stale, c.at(0)),
        facts(&host(9, "gw"), State::Unreachable, c.at(0)),
        unopted,
    ];
    assert_eq!(r.plan(c.at(1), &clients, None), Plan::default());
}

#[test]
fn reset_mode_resets_stale_and_blackholed_sockets() {
    for state in [State::Stale, State::Blackholed] {
        let (mut r, c) = setup(RemediationMode::Reset);
        let kcm = host(7, "kcm");
        let plan = r.plan(c.at(100), &[facts(&kcm, state, c.at(95))], None);
        let d = one(&plan);
        assert_eq!(d.disposition, Disposition::Act);
        assert_eq!(
            d.action,
            Action::Reset {
                tuples: vec![tuple(40007)]
            }
        );
        assert_eq!(d.at, c.at(100));
        assert!(
            d.reason.starts_with(&format!("{state}: judged {state}")),
            "{}",
            d.reason
        );
    }
}

#[test]
fn healthy_clients_and_stale_ones_without_sockets_are_left_alone() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let mut gone = facts(&host(8, "op"), State::Stale, c.at(0));
    gone.suspect.clear(); // closed its socket; inside the disconnect grace
    let clients = [facts(&host(7, "kcm"), State::Healthy, c.at(0)), gone];
    assert_eq!(r.plan(c.at(1), &clients, None), Plan::default());
}

#[test]
fn clients_not_opted_in_are_skipped_once_per_episode() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let kcm = host(7, "kcm");
    let mut stale = facts(&kcm, State::Stale, c.at(0));
    stale.opted_in = false;
    let plan = r.plan(c.at(1), std::slice::from_ref(&stale), None);
    assert_eq!(
        summary(&plan),
        [(7, ActionKind::Reset, Disposition::Skip(Skip::NotOptedIn))]
    );
    assert!(plan.decisions[0].reason.contains("judged stale"));
    for t in 2..100 {
        assert_eq!(
            r.plan(c.at(t), std::slice::from_ref(&stale), None),
            Plan::default(),
            "reported once"
        );
    }
    // Healthy, then stale again: a new episode, reported again.
    r.plan(c.at(100), &[facts(&kcm, State::Healthy, c.at(100))], None);
    stale.since = c.at(200);
    assert_eq!(
        summary(&r.plan(c.at(200), &[stale], None)),
        [(7, ActionKind::Reset, Disposition::Skip(Skip::NotOptedIn))]
    );
}

#[test]
fn unreachable_is_never_remediated() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let gw = host(9, "gw");
    let clients = [facts(&gw, State::Unreachable, c.at(0))];
    let plan = r.plan(c.at(1), &clients, None);
    assert_eq!(
        summary(&plan),
        [(9, ActionKind::Restart, Disposition::Skip(Skip::Unreachable))]
    );
    for t in 2..(2 * 3600) {
        assert_eq!(r.plan(c.at(t), &clients, None), Plan::default());
    }
}

#[test]
fn disconnected_is_restarted_directly_in_restart_mode_only() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let kcm = host(7, "kcm");
    let plan = r.plan(c.at(20), &[facts(&kcm, State::Disconnected, c.at(15))], None);
    let d = one(&plan);
    assert_eq!(d.disposition, Disposition::Act);
    assert_eq!(
        d.action,
        Action::Restart {
            target: Target::Process {
                pid: 7,
                start_time: 1007
            }
        }
    );
    assert!(
        d.reason.starts_with("disconnected: judged disconnected"),
        "{}",
        d.reason
    );
    let op = pod(8, "operator-0");
    let plan = r.plan(c.at(21), &[facts(&op, State::Disconnected, c.at(15))], None);
    assert_eq!(
        one(&plan).action,
        Action::Restart {
            target: Target::Pod(PodRef {
                namespace: "kube-system".into(),
                name: "operator-0".into(),
                uid: "uid-8".into(),
            })
        }
    );

    let (mut r, c) = setup(RemediationMode::Reset);
    let plan = r.plan(c.at(20), &[facts(&kcm, State::Disconnected, c.at(15))], None);
    assert_eq!(
        summary(&plan),
        [(7, ActionKind::Restart, Disposition::Skip(Skip::ResetOnly))]
    );
}

#[test]
fn dry_run_reports_and_remembers_without_acting() {
    let (mut r, c) = setup(RemediationMode::Restart);
    r.set_settings(Settings {
        dry_run: true,
        ..*r.settings()
    });
    let kcm = host(7, "kcm");
    let stale = [facts(&kcm, State::Stale, c.at(0))];
    assert_eq!(
        summary(&r.plan(c.at(1), &stale, None)),
        [(7, ActionKind::Reset, Disposition::DryRun)]
    );
    // Nothing was done, so it is still stale: the dry run escalates like a real run.
    assert_eq!(r.plan(c.at(60), &stale, None), Plan::default());
    assert_eq!(
        summary(&r.plan(c.at(61), &stale, None)),
        [(7, ActionKind::Restart, Disposition::DryRun)]
    );
}

#[test]
fn cooldown_holds_a_second_reset_back() {
    let (mut r, c) = setup(RemediationMode::Reset);
    let kcm = host(7, "kcm");
    let first = r.plan(c.at(0), &[facts(&kcm, State::Stale, c.at(0))], None);
    assert_eq!(one(&first).disposition, Disposition::Act);
    assert!(settle(
        &mut r,
        c.at(1),
        one(&first),
        Resolution::Done("1 socket".into())
    ));
    // It re-dialed, recovered, and went stale again 3 min later.
    r.plan(c.at(5), &[facts(&kcm, State::Healthy, c.at(5))], None);
    let again = [facts(&kcm, State::Stale, c.at(180))];
    let plan = r.plan(c.at(180), &again, None);
    assert_eq!(
        summary(&plan),
        [(
            7,
            ActionKind::Reset,
            Disposition::Skip(Skip::Cooldown {
                remaining: Duration::from_secs(420)
            })
        )]
    );
    assert_eq!(r.plan(c.at(300), &again, None), Plan::default(), "reported once");
    assert_eq!(
        summary(&r.plan(c.at(600), &again, None)),
        [(7, ActionKind::Reset, Disposition::Act)],
        "cooldown over"
    );
}

#[test]
fn an_action_gets_time_to_take_effect() {
    let (mut r, c) = setup(RemediationMode::Reset);
    let kcm = host(7, "kcm");
    let stale = [facts(&kcm, State::Stale, c.at(0))];
    assert_eq!(one(&r.plan(c.at(0), &stale, None)).disposition, Disposition::Act);
    // The judge still says stale while the client re-dials (disconnect grace).
    for t in 1..60 {
        assert_eq!(r.plan(c.at(t), &stale, None), Plan::default(), "at {t}s");
    }
    // A minute later it is still stale: the reset did not help; mode reset cannot escalate.
    assert_eq!(
        summary(&r.plan(c.at(60), &stale, None)),
        [(
            7,
            ActionKind::Reset,
            Disposition::Skip(Skip::Cooldown {
                remaining: Duration::from_secs(540)
            })
        )]
    );
}

#[test]
fn restart_mode_escalates_when_the_reset_did_not_help() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let op = pod(8, "operator-0");
    let stale = [facts(&op, State::Stale, c.at(0))];
    assert_eq!(
        summary(&r.plan(c.at(0), &stale, None)),
        [(8, ActionKind::Reset, Disposition::Act)],
        "reset first"
    );
    assert_eq!(r.plan(c.at(59), &stale, None), Plan::default());
    let plan = r.plan(c.at(60), &stale, None);
    let d = one(&plan);
    assert_eq!(
        (d.action.kind(), &d.disposition),
        (ActionKind::Restart, &Disposition::Act),
        "the cooldown lets the escalation through"
    );
    assert!(
        d.reason
            .starts_with("still stale 60s after its connections were reset"),
        "{}",
        d.reason
    );
    // It stays stale: nothing more within the cooldown (reported once, after the
    // restart had its time).
    assert_eq!(r.plan(c.at(100), &stale, None), Plan::default());
    assert_eq!(
        summary(&r.plan(c.at(120), &stale, None)),
        [(
            8,
            ActionKind::Reset,
            Disposition::Skip(Skip::Cooldown {
                remaining: Duration::from_secs(540)
            })
        )]
    );
    assert_eq!(r.plan(c.at(500), &stale, None), Plan::default());
}

#[test]
fn restart_mode_escalates_at_once_when_unhealthy_again_after_the_reset() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let kcm = host(7, "kcm");
    r.plan(c.at(0), &[facts(&kcm, State::Stale, c.at(0))], None);
    // It did not re-dial (seed 000 after a reset): disconnected after the grace.
    let plan = r.plan(c.at(16), &[facts(&kcm, State::Disconnected, c.at(16))], None);
    let d = one(&plan);
    assert_eq!(
        (d.action.kind(), &d.disposition),
        (ActionKind::Restart, &Disposition::Act)
    );
    assert!(
        d.reason
            .starts_with("disconnected again after its connections were reset 16s ago"),
        "{}",
        d.reason
    );

    // Or it re-dialed, was healthy, and its new connection went stale too.
    let (mut r, c) = setup(RemediationMode::Restart);
    r.plan(c.at(0), &[facts(&kcm, State::Stale, c.at(0))], None);
    r.plan(c.at(2), &[facts(&kcm, State::Healthy, c.at(2))], None);
    let plan = r.plan(c.at(95), &[facts(&kcm, State::Stale, c.at(95))], None);
    assert_eq!(summary(&plan), [(7, ActionKind::Restart, Disposition::Act)]);
}

#[test]
fn after_the_escalation_window_a_new_episode_starts_with_a_reset() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let kcm = host(7, "kcm");
    r.plan(c.at(0), &[facts(&kcm, State::Stale, c.at(0))], None);
    r.plan(c.at(2), &[facts(&kcm, State::Healthy, c.at(2))], None);
    let later = [facts(&kcm, State::Stale, c.at(11 * MIN))];
    assert_eq!(
        summary(&r.plan(c.at(11 * MIN), &later, None)),
        [(7, ActionKind::Reset, Disposition::Act)]
    );
}

#[test]
fn a_short_cooldown_does_not_cut_the_escalation_short() {
    let (mut r, c) = setup(RemediationMode::Restart);
    r.set_settings(Settings {
        cooldown: Duration::from_secs(30),
        ..*r.settings()
    });
    assert_eq!(r.settings().escalation_window(), Duration::from_secs(120));
    let kcm = host(7, "kcm");
    let stale = [facts(&kcm, State::Stale, c.at(0))];
    r.plan(c.at(0), &stale, None);
    assert_eq!(
        summary(&r.plan(c.at(60), &stale, None)),
        [(7, ActionKind::Restart, Disposition::Act)]
    );
}

#[test]
fn a_restarted_host_process_back_with_a_new_pid_is_in_cooldown() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let old = host(7, "kcm");
    let plan = r.plan(c.at(0), &[facts(&old, State::Disconnected, c.at(0))], None);
    assert_eq!(summary(&plan), [(7, ActionKind::Restart, Disposition::Act)]);
    settle(&mut r, c.at(1), one(&plan), Resolution::Done("SIGTERM".into()));
    // Its supervisor started it again (same name and command line, new pid); it connects,
    // then loses the apiserver again 2 min later.
    let new = host(70, "kcm");
    let plan = r.plan(c.at(120), &[facts(&new, State::Disconnected, c.at(120))], None);
    assert!(
        matches!(
            summary(&plan)[..],
            [(70, ActionKind::Restart, Disposition::Skip(Skip::Cooldown { .. }))]
        ),
        "{plan:#?}"
    );
    // No reset either, and a different program is not affected.
    let plan = r.plan(c.at(130), &[facts(&new, State::Stale, c.at(130))], None);
    assert!(matches!(
        summary(&plan)[..],
        [(70, ActionKind::Reset, Disposition::Skip(Skip::Cooldown { .. }))]
    ));
    let other = host(71, "scheduler");
    let plan = r.plan(c.at(130), &[facts(&other, State::Disconnected, c.at(120))], None);
    assert_eq!(summary(&plan), [(71, ActionKind::Restart, Disposition::Act)]);
    // After the cooldown the new process may be restarted.
    let plan = r.plan(c.at(600), &[facts(&new, State::Disconnected, c.at(590))], None);
    assert_eq!(summary(&plan), [(70, ActionKind::Restart, Disposition::Act)]);
}

#[test]
fn a_pod_is_remembered_by_namespace_and_name() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let plan = r.plan(
        c.at(0),
        &[facts(&pod(8, "op-0"), State::Disconnected, c.at(0))],
        None,
    );
    assert_eq!(summary(&plan), [(8, ActionKind::Restart, Disposition::Act)]);
    // The evicted pod's replacement under the same name (a StatefulSet): in cooldown.
    let plan = r.plan(
        c.at(200),
        &[facts(&pod(80, "op-0"), State::Disconnected, c.at(200))],
        None,
    );
    assert!(matches!(
        summary(&plan)[..],
        [(80, ActionKind::Restart, Disposition::Skip(Skip::Cooldown { .. }))]
    ));
    let plan = r.plan(
        c.at(200),
        &[facts(&pod(81, "op-1"), State::Disconnected, c.at(200))],
        None,
    );
    assert_eq!(summary(&plan), [(81, ActionKind::Restart, Disposition::Act)]);
}

#[test]
fn processes_of_one_pod_are_one_step() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let (a, b) = (pod(8, "op-0"), pod(9, "op-0"));
    let stale = [facts(&a, State::Stale, c.at(0)), facts(&b, State::Stale, c.at(0))];
    assert_eq!(
        summary(&r.plan(c.at(0), &stale, None)),
        [
            (8, ActionKind::Reset, Disposition::Act),
            (9, ActionKind::Reset, Disposition::Act)
        ],
        "both processes' sockets are reset"
    );
    let (mut r, c) = setup(RemediationMode::Restart);
    let gone = [
        facts(&a, State::Disconnected, c.at(0)),
        facts(&b, State::Disconnected, c.at(0)),
    ];
    assert_eq!(
        summary(&r.plan(c.at(0), &gone, None)),
        [(8, ActionKind::Restart, Disposition::Act)],
        "one eviction for the pod"
    );
}

#[test]
fn the_budget_is_per_node_per_sliding_hour() {
    let (mut r, c) = setup(RemediationMode::Reset);
    let clients: Vec<Client> = (1..=4).map(|i| host(i, &format!("ctl{i}"))).collect();
    let at = [0, 10 * MIN, 20 * MIN];
    for (client, t) in clients.iter().zip(at) {
        let plan = r.plan(c.at(t), &[facts(client, State::Stale, c.at(t))], None);
        assert_eq!(one(&plan).disposition, Disposition::Act);
    }
    let fourth = [facts(&clients[3], State::Stale, c.at(30 * MIN))];
    assert_eq!(
        summary(&r.plan(c.at(30 * MIN), &fourth, None)),
        [(4, ActionKind::Reset, Disposition::Skip(Skip::Budget { limit: 3 }))]
    );
    assert_eq!(r.plan(c.at(59 * MIN), &fourth, None), Plan::default());
    // The first action leaves the window an hour after it was taken.
    assert_eq!(
        summary(&r.plan(c.at(60 * MIN), &fourth, None)),
        [(4, ActionKind::Reset, Disposition::Act)]
    );
    let fifth = [facts(&host(5, "ctl5"), State::Stale, c.at(61 * MIN))];
    assert!(matches!(
        summary(&r.plan(c.at(61 * MIN), &fifth, None))[..],
        [(5, ActionKind::Reset, Disposition::Skip(Skip::Budget { .. }))]
    ));
}

#[test]
fn a_zero_budget_allows_nothing() {
    let (mut r, c) = setup(RemediationMode::Restart);
    r.set_settings(Settings {
        budget_per_hour: 0,
        ..*r.settings()
    });
    let plan = r.plan(c.at(0), &[facts(&host(7, "kcm"), State::Stale, c.at(0))], None);
    assert_eq!(
        summary(&plan),
        [(7, ActionKind::Reset, Disposition::Skip(Skip::Budget { limit: 0 }))]
    );
}

#[test]
fn no_action_on_a_client_whose_endpoint_is_unreachable() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let kcm = host(7, "kcm");
    let mut gone = [facts(&kcm, State::Disconnected, c.at(0))];
    gone[0].endpoint_down = Some("10.0.0.1:6443".into());
    assert_eq!(
        summary(&r.plan(c.at(1), &gone, Some(true))),
        [(
            7,
            ActionKind::Restart,
            Disposition::Skip(Skip::Outage(OutageCause::Endpoint {
                endpoint: "10.0.0.1:6443".into()
            }))
        )]
    );
    assert_eq!(r.plan(c.at(2), &gone, None), Plan::default(), "reported once");
    // The endpoint is back: the restart goes ahead.
    gone[0].endpoint_down = None;
    assert_eq!(
        summary(&r.plan(c.at(3), &gone, Some(true))),
        [(7, ActionKind::Restart, Disposition::Act)]
    );
    // A reset cannot help either while the endpoint is unreachable.
    let (mut r, c) = setup(RemediationMode::Reset);
    let mut stale = [facts(&kcm, State::Stale, c.at(0))];
    stale[0].endpoint_down = Some("10.0.0.1:6443".into());
    assert_eq!(
        summary(&r.plan(c.at(1), &stale, None)),
        [(
            7,
            ActionKind::Reset,
            Disposition::Skip(Skip::Outage(OutageCause::Endpoint {
                endpoint: "10.0.0.1:6443".into()
            }))
        )]
    );
    let (mut r, c) = setup(RemediationMode::Restart);
    assert_eq!(
        summary(&r.plan(c.at(1), &gone, Some(false))),
        [(
            7,
            ActionKind::Restart,
            Disposition::Skip(Skip::Outage(OutageCause::ApiserverCheck))
        )]
    );
}

#[test]
fn many_clients_unhealthy_at_once_is_no_reason_to_hold_back() {
    // Seed 002 on a whole node: everyone stale behind the proxy, the endpoint reachable;
    // seeds 000/004: every old controller disconnected after an upgrade.
    let (mut r, c) = setup(RemediationMode::Restart);
    let (a, b) = (host(7, "kcm"), host(8, "op"));
    let stale = [facts(&a, State::Stale, c.at(0)), facts(&b, State::Stale, c.at(0))];
    assert_eq!(
        summary(&r.plan(c.at(1), &stale, None)),
        [
            (7, ActionKind::Reset, Disposition::Act),
            (8, ActionKind::Reset, Disposition::Act)
        ]
    );
    let (mut r, c) = setup(RemediationMode::Restart);
    let gone = [
        facts(&a, State::Disconnected, c.at(0)),
        facts(&b, State::Disconnected, c.at(0)),
    ];
    assert_eq!(
        summary(&r.plan(c.at(1), &gone, Some(true))),
        [
            (7, ActionKind::Restart, Disposition::Act),
            (8, ActionKind::Restart, Disposition::Act)
        ]
    );
    let (mut r, c) = setup(RemediationMode::Reset);
    assert_eq!(
        summary(&r.plan(c.at(1), &stale[..1], Some(false))),
        [(
            7,
            ActionKind::Reset,
            Disposition::Skip(Skip::Outage(OutageCause::ApiserverCheck))
        )]
    );
}

#[test]
fn a_blocked_eviction_costs_nothing_and_is_retried() {
    let (mut r, c) = setup(RemediationMode::Restart);
    r.set_settings(Settings {
        budget_per_hour: 1,
        ..*r.settings()
    });
    let op = pod(8, "op-0");
    let gone = [facts(&op, State::Disconnected, c.at(0))];
    let plan = r.plan(c.at(0), &gone, None);
    let blocked = Resolution::Skipped(Skip::Blocked("PodDisruptionBudget op-pdb".into()));
    assert!(settle(&mut r, c.at(1), one(&plan), blocked.clone()), "reported");
    for t in 2..31 {
        assert_eq!(
            r.plan(c.at(t), &gone, None),
            Plan::default(),
            "waits for the retry"
        );
    }
    // Tried again: neither cooldown nor budget (of 1) hold it back.
    let plan = r.plan(c.at(31), &gone, None);
    assert_eq!(summary(&plan), [(8, ActionKind::Restart, Disposition::Act)]);
    assert!(
        !settle(&mut r, c.at(31), one(&plan), blocked),
        "blocked again: not reported again"
    );
    let plan = r.plan(c.at(61), &gone, None);
    assert!(settle(
        &mut r,
        c.at(62),
        one(&plan),
        Resolution::Done("evicted".into())
    ));
    // That one counted: the budget of 1 is spent.
    let other = [facts(&pod(9, "op-1"), State::Disconnected, c.at(0))];
    assert!(matches!(
        summary(&r.plan(c.at(70), &other, None))[..],
        [(9, ActionKind::Restart, Disposition::Skip(Skip::Budget { .. }))]
    ));
}

#[test]
fn a_blocked_escalation_is_retried_as_an_escalation() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let op = pod(8, "op-0");
    let stale = [facts(&op, State::Stale, c.at(0))];
    r.plan(c.at(0), &stale, None);
    let plan = r.plan(c.at(60), &stale, None);
    let blocked = Resolution::Skipped(Skip::Blocked("429".into()));
    settle(&mut r, c.at(60), one(&plan), blocked);
    let plan = r.plan(c.at(90), &stale, None);
    assert_eq!(summary(&plan), [(8, ActionKind::Restart, Disposition::Act)]);
    assert!(
        one(&plan).reason.starts_with("still stale 90s"),
        "{}",
        one(&plan).reason
    );
}

#[test]
fn gone_refunds_the_budget_and_failed_does_not() {
    let (mut r, c) = setup(RemediationMode::Reset);
    r.set_settings(Settings {
        budget_per_hour: 1,
        ..*r.settings()
    });
    let plan = r.plan(c.at(0), &[facts(&host(7, "a"), State::Stale, c.at(0))], None);
    let gone = Resolution::Skipped(Skip::Gone("sockets already closed".into()));
    assert!(settle(&mut r, c.at(1), one(&plan), gone));
    let plan = r.plan(c.at(2), &[facts(&host(8, "b"), State::Stale, c.at(0))], None);
    assert_eq!(one(&plan).disposition, Disposition::Act, "budget refunded");
    assert!(settle(
        &mut r,
        c.at(3),
        one(&plan),
        Resolution::Failed("netlink".into())
    ));
    let plan = r.plan(c.at(4), &[facts(&host(9, "c"), State::Stale, c.at(0))], None);
    assert!(matches!(
        one(&plan).disposition,
        Disposition::Skip(Skip::Budget { .. })
    ));
}

#[test]
fn forgotten_clients_are_reported_afresh() {
    let (mut r, c) = setup(RemediationMode::Restart);
    let mut f = facts(&host(7, "kcm"), State::Stale, c.at(0));
    f.opted_in = false;
    assert_eq!(r.plan(c.at(1), std::slice::from_ref(&f), None).decisions.len(), 1);
    r.plan(c.at(2), &[], None);
    assert_eq!(r.plan(c.at(3), &[f], None).decisions.len(), 1);
}
