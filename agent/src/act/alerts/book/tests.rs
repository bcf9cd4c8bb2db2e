use super::*;
use crate::act::alerts::{
    Alert, AlertBook, ClientInput, ClientLabels, EndpointInput, Status, DEFAULT_SETTLE,
};

/// A fake wall clock: seconds after a fixed origin.
fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn book() -> AlertBook {
    AlertBook::new("node-a", DEFAULT_SETTLE)
}

fn client(pid: u32, state: State, since: u64) -> ClientInput {
    ClientInput {
        key: (pid, 1000 + u64::from(pid)),
        is_client: true,
        state,
        since: at(since),
        reason: format!("{state} since {since}"),
        labels: ClientLabels {
            namespace: Some("kube-system".into()),
            pod: Some(format!("ctl-{pid}")),
            container: Some("ctl".into()),
            comm: format!("ctl{pid}"),
            resource: String::new(),
        },
        endpoint: Some("10.0.0.1:6443".into()),
    }
}

fn healthy(pid: u32) -> ClientInput {
    client(pid, State::Healthy, 0)
}

/// (alertname, pod, status) of each alert, in order.
fn brief(alerts: &[Alert]) -> Vec<(String, String, Status)> {
    alerts
        .iter()
        .map(|a| {
            (
                a.name().to_owned(),
                a.labels.get("pod").cloned().unwrap_or_default(),
                a.status(),
            )
        })
        .collect()
}

fn fire(name: &str, pod: &str) -> (String, String, Status) {
    (name.to_owned(), pod.to_owned(), Status::Firing)
}

fn resolve(name: &str, pod: &str) -> (String, String, Status) {
    (name.to_owned(), pod.to_owned(), Status::Resolved)
}

const DISC: &str = "LifelineClientDisconnected";
const STALE: &str = "LifelineClientStale";
const BLACK: &str = "LifelineClientBlackholed";
const UNREACH: &str = "LifelineClientUnreachable";

/// Endpoint 10.0.0.1:6443 unreachable since `since`, its outage due or not.
fn down(since: u64, outage: bool) -> EndpointInput {
    EndpointInput {
        endpoint: "10.0.0.1:6443".into(),
        since: at(since),
        reason: "the agent's probe was refused".into(),
        outage,
    }
}

#[test]
fn an_unhealthy_client_fires_after_settle_with_labels_and_annotations() {
    let mut b = book();
    let c = client(7, State::Disconnected, 10);
    assert!(b.tick(at(10), std::slice::from_ref(&c), &[]).is_empty(), "held");
    assert!(
        b.tick(at(12), std::slice::from_ref(&c), &[]).is_empty(),
        "still held at 2 s"
    );
    let out = b.tick(at(13), std::slice::from_ref(&c), &[]);
    assert_eq!(brief(&out), [fire(DISC, "ctl-7")]);
    let a = &out[0];
    let labels: Vec<(&str, &str)> = a.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        labels,
        [
            ("alertname", DISC),
            ("comm", "ctl7"),
            ("container", "ctl"),
            ("endpoint", "10.0.0.1:6443"),
            ("namespace", "kube-system"),
            ("node", "node-a"),
            ("pod", "ctl-7"),
            ("resource", ""),
            ("severity", "critical"),
        ]
    );
    assert_eq!(a.annotations["description"], "disconnected since 10");
    let summary = &a.annotations["summary"];
    assert!(
        summary.contains("ctl7") && summary.contains("kube-system/ctl-7") && summary.contains("disconnected"),
        "{summary}"
    );
    assert_eq!(
        (a.starts_at, a.ends_at),
        (at(10), None),
        "starts when the state began"
    );
    assert!(b.tick(at(14), &[c], &[]).is_empty(), "fires once, not every tick");
}

#[test]
fn each_unhealthy_state_has_its_alert_and_severity() {
    for (state, name, severity) in [
        (State::Disconnected, DISC, "critical"),
        (State::Stale, STALE, "warning"),
        (State::Blackholed, BLACK, "critical"),
        (State::Unreachable, "LifelineClientUnreachable", "critical"),
    ] {
        let mut b = book();
        let out = b.tick(at(10), &[client(1, state, 0)], &[]);
        assert_eq!(brief(&out), [fire(name, "ctl-1")], "{state}");
        assert_eq!(out[0].labels["severity"], severity, "{state}");
    }
}

#[test]
fn recovery_resolves_at_the_recovery_time() {
    let mut b = book();
    b.tick(at(10), &[client(1, State::Stale, 0)], &[]);
    let out = b.tick(at(20), &[healthy(1)], &[]);
    assert_eq!(brief(&out), [resolve(STALE, "ctl-1")]);
    assert_eq!((out[0].starts_at, out[0].ends_at), (at(0), Some(at(20))));
    assert!(b.tick(at(21), &[healthy(1)], &[]).is_empty());
}

#[test]
fn a_new_state_resolves_the_old_alert_and_fires_its_own_after_settle() {
    let mut b = book();
    b.tick(at(10), &[client(1, State::Stale, 0)], &[]);
    let out = b.tick(at(20), &[client(1, State::Blackholed, 20)], &[]);
    assert_eq!(brief(&out), [resolve(STALE, "ctl-1")]);
    assert!(b
        .tick(at(22), &[client(1, State::Blackholed, 20)], &[])
        .is_empty());
    let out = b.tick(at(23), &[client(1, State::Blackholed, 20)], &[]);
    assert_eq!(brief(&out), [fire(BLACK, "ctl-1")]);
}

#[test]
fn a_client_that_recovers_within_settle_never_alerts() {
    let mut b = book();
    assert!(b
        .tick(at(10), &[client(1, State::Disconnected, 10)], &[])
        .is_empty());
    assert!(b.tick(at(12), &[healthy(1)], &[]).is_empty());
    for t in 13..20 {
        assert!(b.tick(at(t), &[healthy(1)], &[]).is_empty(), "t={t}");
    }
    // A state change while held starts a new hold.
    assert!(b.tick(at(20), &[client(1, State::Stale, 20)], &[]).is_empty());
    assert!(b
        .tick(at(22), &[client(1, State::Blackholed, 22)], &[])
        .is_empty());
    assert!(b
        .tick(at(24), &[client(1, State::Blackholed, 22)], &[])
        .is_empty());
    assert_eq!(
        brief(&b.tick(at(25), &[client(1, State::Blackholed, 22)], &[])),
        [fire(BLACK, "ctl-1")]
    );
}

#[test]
fn an_exited_client_has_its_alert_resolved_and_a_held_one_dropped() {
    let mut b = book();
    b.tick(
        at(10),
        &[client(1, State::Stale, 0), client(2, State::Stale, 9)],
        &[],
    );
    let out = b.tick(at(11), &[], &[]);
    assert_eq!(brief(&out), [resolve(STALE, "ctl-1")], "2 was still held");
    assert_eq!(out[0].ends_at, Some(at(11)));
    assert!(b.tick(at(20), &[], &[]).is_empty());
}

#[test]
fn processes_that_are_not_clients_never_alert() {
    let mut b = book();
    let mut c = client(1, State::Disconnected, 0);
    c.is_client = false;
    assert!(b.tick(at(10), std::slice::from_ref(&c), &[]).is_empty());
    assert!(b.tick(at(100), &[c], &[]).is_empty());
}

#[test]
fn an_outage_fires_one_alert_per_endpoint_instead_of_one_per_client() {
    let mut b = book();
    let all =
        |since| -> Vec<ClientInput> { (1..=4).map(|p| client(p, State::Disconnected, since)).collect() };
    // Unreachable from 10 s: the client alerts are held, not replaced yet.
    for t in 10..40 {
        assert!(
            b.tick(at(t), &all(10), &[down(10, false)]).is_empty(),
            "t={t}: held"
        );
    }
    let out = b.tick(at(40), &all(10), &[down(10, true)]);
    assert_eq!(brief(&out), [fire(OUTAGE_ALERT, "")]);
    let labels: Vec<&str> = out[0].labels.keys().map(String::as_str).collect();
    assert_eq!(labels, ["alertname", "endpoint", "node", "severity"]);
    assert_eq!(out[0].labels["endpoint"], "10.0.0.1:6443");
    assert_eq!(out[0].labels["severity"], "critical");
    assert_eq!(out[0].annotations["description"], "the agent's probe was refused");
    assert_eq!(
        out[0].starts_at,
        at(10),
        "it began when the endpoint was first unreachable"
    );
    for t in 41..60 {
        assert!(
            b.tick(at(t), &all(10), &[down(10, true)]).is_empty(),
            "t={t}: suppressed"
        );
    }
    // The endpoint comes back while all are recovering: they re-dial within settle.
    let out = b.tick(at(60), &all(10), &[]);
    assert_eq!(brief(&out), [resolve(OUTAGE_ALERT, "")]);
    assert_eq!(out[0].ends_at, Some(at(60)));
    let mut mixed = all(10);
    for c in &mut mixed[..3] {
        c.state = State::Healthy;
    }
    assert!(b.tick(at(61), &mixed, &[]).is_empty());
    assert!(b.tick(at(62), &mixed, &[]).is_empty());
    // The one still unhealthy settle after the end gets its alert.
    assert_eq!(brief(&b.tick(at(63), &mixed, &[])), [fire(DISC, "ctl-4")]);
    assert_eq!(b.tick(at(64), &mixed, &[]), []);
}

#[test]
fn a_routine_restart_pages_nobody() {
    // The apiserver restarts: unreachable for 12 s, clients re-dial.
    let mut b = book();
    let lost: Vec<ClientInput> = (1..=3).map(|p| client(p, State::Unreachable, 16)).collect();
    for t in 5..17 {
        assert!(b
            .tick(at(t), &[healthy(1), healthy(2), healthy(3)], &[down(5, false)])
            .is_empty());
    }
    assert!(b.tick(at(17), &lost, &[down(5, false)]).is_empty(), "held");
    let back: Vec<ClientInput> = (1..=3).map(healthy).collect();
    for t in 18..40 {
        assert!(b.tick(at(t), &back, &[]).is_empty(), "t={t}");
    }
}

#[test]
fn a_client_backing_off_after_an_outage_gets_the_recovery_hold() {
    // The real cluster's kube-scheduler: restarted during a 60 s outage, its failed connects
    // keep it `unreachable` after the apiserver is back until its next retry (client-go
    // backs off for up to 30 s). A never-redialing client is `disconnected` and alerts after
    // `settle` as usual.
    let mut b = book();
    b.set_recovery_hold(Duration::from_secs(60));
    let backing_off = client(1, State::Unreachable, 10);
    let stuck = client(2, State::Disconnected, 10);
    let both = [backing_off.clone(), stuck.clone()];
    for t in 10..40 {
        assert!(b.tick(at(t), &both, &[down(5, false)]).is_empty(), "t={t}: held");
    }
    // Back at 40 (before outage_after): the stuck one alerts `settle` later.
    for t in 40..43 {
        assert!(b.tick(at(t), &both, &[]).is_empty(), "t={t}");
    }
    assert_eq!(brief(&b.tick(at(43), &both, &[])), [fire(DISC, "ctl-2")]);
    for t in 44..100 {
        assert!(b.tick(at(t), &both, &[]).is_empty(), "t={t}: still backing off");
    }
    // Still unreachable a whole hold after the recovery: its own failures now.
    assert_eq!(brief(&b.tick(at(100), &both, &[])), [fire(UNREACH, "ctl-1")]);

    // Had it re-dialed within the hold, nothing would have been sent.
    let mut b = book();
    b.set_recovery_hold(Duration::from_secs(60));
    for t in 10..40 {
        assert!(b
            .tick(at(t), std::slice::from_ref(&backing_off), &[down(5, false)])
            .is_empty());
    }
    for t in 40..70 {
        assert!(
            b.tick(at(t), std::slice::from_ref(&backing_off), &[]).is_empty(),
            "t={t}"
        );
    }
    for t in 70..130 {
        assert!(b.tick(at(t), &[healthy(1)], &[]).is_empty(), "t={t}");
    }
}

#[test]
fn clients_of_a_reachable_endpoint_alert_however_many_are_unhealthy() {
    // Seeds 000/004 after an upgrade: three old controllers never re-dial, others did; the
    // endpoint is reachable.
    let mut b = book();
    let clients = [
        client(1, State::Disconnected, 10),
        client(2, State::Disconnected, 10),
        client(3, State::Disconnected, 10),
        healthy(4),
    ];
    let out = b.tick(at(13), &clients, &[]);
    assert_eq!(
        brief(&out),
        [fire(DISC, "ctl-1"), fire(DISC, "ctl-2"), fire(DISC, "ctl-3")]
    );
}

#[test]
fn client_alerts_emitted_before_an_outage_stay_and_resolve_normally() {
    let mut b = book();
    let first = [client(1, State::Stale, 0), healthy(2), healthy(3)];
    assert_eq!(brief(&b.tick(at(10), &first, &[])), [fire(STALE, "ctl-1")]);
    let all = [
        client(1, State::Stale, 0),
        client(2, State::Disconnected, 20),
        client(3, State::Disconnected, 20),
    ];
    assert!(b.tick(at(20), &all, &[down(20, false)]).is_empty());
    assert_eq!(
        brief(&b.tick(at(50), &all, &[down(20, true)])),
        [fire(OUTAGE_ALERT, "")]
    );
    assert!(
        b.tick(at(51), &all, &[down(20, true)]).is_empty(),
        "ctl-1's alert is neither resolved nor resent"
    );
    let back = [healthy(1), healthy(2), healthy(3)];
    assert_eq!(
        brief(&b.tick(at(60), &back, &[])),
        [resolve(OUTAGE_ALERT, ""), resolve(STALE, "ctl-1")]
    );
    assert!(b.tick(at(70), &back, &[]).is_empty());
}

#[test]
fn clients_of_another_endpoint_are_not_held() {
    let mut b = book();
    let mut other = client(1, State::Disconnected, 10);
    other.endpoint = Some("10.0.0.2:6443".into());
    let out = b.tick(at(13), &[other], &[down(0, true)]);
    assert_eq!(brief(&out), [fire(OUTAGE_ALERT, ""), fire(DISC, "ctl-1")]);
}

#[test]
fn processes_with_the_same_labels_share_one_alert() {
    let mut b = book();
    let mut twin = client(2, State::Stale, 0);
    twin.labels = client(1, State::Stale, 0).labels;
    let out = b.tick(at(10), &[client(1, State::Stale, 0), twin.clone()], &[]);
    assert_eq!(brief(&out), [fire(STALE, "ctl-1")], "one alert for both");
    assert!(
        b.tick(at(11), &[healthy(1), twin.clone()], &[]).is_empty(),
        "2 still holds it"
    );
    assert_eq!(
        brief(&b.tick(at(12), &[healthy(1)], &[])),
        [resolve(STALE, "ctl-1")]
    );
}

#[test]
fn labels_are_frozen_at_emission_and_a_lost_endpoint_is_remembered() {
    let mut b = book();
    let mut c = healthy(1);
    c.endpoint = Some("10.0.0.9:6443".into());
    b.tick(at(0), &[c], &[]);
    let mut c = client(1, State::Disconnected, 10);
    c.endpoint = None;
    c.labels.pod = None;
    c.labels.namespace = None;
    b.tick(at(10), std::slice::from_ref(&c), &[]);
    c.labels.pod = Some("late".into());
    c.labels.namespace = Some("ns".into());
    let out = b.tick(at(13), std::slice::from_ref(&c), &[]);
    assert_eq!(out[0].labels["endpoint"], "10.0.0.9:6443", "the endpoint it had");
    assert_eq!(out[0].labels["pod"], "late", "labels learnt while held are used");
    c.labels.pod = Some("later".into());
    c.reason = "changed".into();
    assert!(b.tick(at(14), std::slice::from_ref(&c), &[]).is_empty());
    let out = b.tick(at(15), &[healthy(1)], &[]);
    assert_eq!(
        out[0].labels["pod"], "late",
        "resolved with the labels it fired with"
    );
    assert_eq!(out[0].annotations["description"], "disconnected since 10");
}

#[test]
fn unknown_kubernetes_labels_are_empty_strings() {
    let mut b = book();
    let mut c = client(1, State::Unreachable, 0);
    c.labels = ClientLabels {
        comm: "agent".into(),
        ..Default::default()
    };
    c.endpoint = None;
    let out = b.tick(at(10), &[c], &[]);
    for label in ["namespace", "pod", "container", "endpoint", "resource"] {
        assert_eq!(out[0].labels[label], "", "{label}");
    }
    assert!(
        out[0].annotations["summary"].contains("agent (pid 1"),
        "{:?}",
        out[0].annotations
    );
}

#[test]
fn settle_is_configurable() {
    let mut b = AlertBook::new("n", Duration::ZERO);
    assert_eq!(
        brief(&b.tick(at(5), &[client(1, State::Stale, 5)], &[])),
        [fire(STALE, "ctl-1")]
    );
}
