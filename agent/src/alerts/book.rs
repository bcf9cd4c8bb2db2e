//! The alert policy: which alerts fire and resolve, given the judged clients of each tick.
//! Pure logic: no I/O and no clock of its own (every tick gets `now`).
//!
//! Rules (SPEC.md "Alerts"):
//!
//! - Only clients alert. A client in an unhealthy state has that state's alert
//!   (`LifelineClientDisconnected`, `…Stale`, `…Blackholed`, `…Unreachable`); leaving the state
//!   (to healthy, to another state, or by exiting) resolves it.
//! - A new client alert is held for `settle` after the state began. A client that recovers
//!   within that delay never alerts (a healthy re-dial is silent).
//! - While a node-level apiserver outage is in force, held alerts are not emitted; the single
//!   `LifelineApiserverOutage` fires instead (seed: every apiserver down → one alert, not one per
//!   client). Client alerts emitted before the outage stay as they are. When the outage ends it
//!   resolves, and clients still unhealthy get their alerts once `settle` has passed after the
//!   end (those that re-dial meanwhile stay silent).
//! - An alert's identity is its label set. Processes that share it (same pod, container and
//!   comm, say two workers of one binary) share one alert: it fires with the first and resolves
//!   with the last. Labels and annotations are frozen when the alert is first emitted, so a
//!   reason that counts seconds does not make a new alert every tick.
use std::{
    collections::{btree_map::Entry, BTreeMap, BTreeSet},
    time::{Duration, SystemTime},
};

use crate::{
    health::{Outage, State},
    views::ClientKey,
};

/// How long a new client alert is held before it is first emitted.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(3);

/// The node-level alert.
pub const OUTAGE_ALERT: &str = "LifelineApiserverOutage";

/// Label name → value; the identity of an alert.
pub type Labels = BTreeMap<String, String>;

/// Whether an alert is in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Firing,
    Resolved,
}

impl Status {
    /// As Alertmanager writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Firing => "firing",
            Status::Resolved => "resolved",
        }
    }
}

/// One state of one alert, as delivered to receivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// `alertname`, `severity`, `node`, and for client alerts `namespace`, `pod`, `container`,
    /// `comm`, `endpoint` (empty when unknown).
    pub labels: Labels,
    /// `summary` (one short line) and `description` (the client's reason).
    pub annotations: BTreeMap<String, String>,
    /// When the condition began (the client's state `since`; the tick an outage was seen).
    pub starts_at: SystemTime,
    /// `None` while firing; the resolve time once resolved.
    pub ends_at: Option<SystemTime>,
}

impl Alert {
    pub fn status(&self) -> Status {
        match self.ends_at {
            None => Status::Firing,
            Some(_) => Status::Resolved,
        }
    }

    /// The `alertname` label.
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }

    fn resolved(mut self, at: SystemTime) -> Self {
        self.ends_at = Some(at);
        self
    }
}

/// Who a client is, for alert labels; `None` outside Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientLabels {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub comm: String,
}

/// One judged process, as the policy sees it each tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientInput {
    /// pid and start time: the process across pid reuse.
    pub key: ClientKey,
    /// Judged (may alert); other processes are ignored.
    pub is_client: bool,
    pub state: State,
    /// Wall-clock time the state began.
    pub since: SystemTime,
    /// The judge's sentence for the state.
    pub reason: String,
    pub labels: ClientLabels,
    /// The apiserver endpoint the evidence is about, when known.
    pub endpoint: Option<String>,
}

/// The alert name of an unhealthy state; `None` for healthy.
pub fn alert_name(state: State) -> Option<&'static str> {
    match state {
        State::Healthy => None,
        State::Disconnected => Some("LifelineClientDisconnected"),
        State::Stale => Some("LifelineClientStale"),
        State::Blackholed => Some("LifelineClientBlackholed"),
        State::Unreachable => Some("LifelineClientUnreachable"),
    }
}

fn severity(state: State) -> &'static str {
    match state {
        State::Stale => "warning",
        _ => "critical",
    }
}

/// What a state means, for the summary line.
fn meaning(state: State) -> &'static str {
    match state {
        State::Healthy => "receives from the apiserver",
        State::Disconnected => "lost its apiserver connection and has not re-dialed",
        State::Stale => "is connected to the apiserver but receives nothing",
        State::Blackholed => "is retransmitting to the apiserver without acknowledgement",
        State::Unreachable => "keeps failing to connect to the apiserver",
    }
}

/// A client in an unhealthy state, tracked by the book.
#[derive(Clone, Debug)]
struct Tracked {
    state: State,
    since: SystemTime,
    /// Latest input while held; frozen into the alert at emission.
    reason: String,
    labels: ClientLabels,
    /// The alert's identity once emitted; `None` while held.
    emitted: Option<Labels>,
}

/// A client alert in force, and the processes that hold it.
#[derive(Clone, Debug)]
struct Live {
    alert: Alert,
    members: BTreeSet<ClientKey>,
}

/// The alert policy's memory: held and emitted client alerts and the outage alert.
#[derive(Debug)]
pub struct AlertBook {
    /// The `node` label.
    node: String,
    /// How long a new client alert is held before it is emitted.
    settle: Duration,
    /// Unhealthy clients, held or emitted.
    tracked: BTreeMap<ClientKey, Tracked>,
    /// Last known endpoint of each client (kept while healthy, so a client that lost its
    /// connection is reported with the endpoint it had).
    endpoints: BTreeMap<ClientKey, String>,
    /// Emitted client alerts in force, by identity.
    live: BTreeMap<Labels, Live>,
    /// The outage alert while it fires.
    outage: Option<Alert>,
    /// No client alert is emitted before this (`settle` after an outage ended).
    quiet_until: Option<SystemTime>,
}

impl AlertBook {
    pub fn new(node: impl Into<String>, settle: Duration) -> Self {
        Self {
            node: node.into(),
            settle,
            tracked: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            live: BTreeMap::new(),
            outage: None,
            quiet_until: None,
        }
    }

    /// Takes this tick's clients (all judged processes; those missing have exited) and the
    /// outage in force, and returns the alert changes to deliver: resolved ones first, then
    /// firing ones.
    pub fn tick(&mut self, now: SystemTime, clients: &[ClientInput], outage: Option<&Outage>) -> Vec<Alert> {
        let mut resolved = Vec::new();
        let mut fired = Vec::new();
        // Identities some process left this tick; resolved if nobody holds them afterwards.
        let mut left: Vec<Labels> = Vec::new();

        let mut seen = BTreeSet::new();
        for input in clients.iter().filter(|c| c.is_client) {
            seen.insert(input.key);
            if let Some(endpoint) = &input.endpoint {
                self.endpoints.insert(input.key, endpoint.clone());
            }
            if input.state == State::Healthy {
                if let Some(gone) = self.tracked.remove(&input.key) {
                    left.extend(gone.emitted);
                }
                continue;
            }
            match self.tracked.entry(input.key) {
                Entry::Occupied(mut e) if e.get().state == input.state => {
                    let t = e.get_mut();
                    if t.emitted.is_none() {
                        t.reason.clone_from(&input.reason);
                        t.labels.clone_from(&input.labels);
                    }
                }
                entry => {
                    let fresh = Tracked {
                        state: input.state,
                        since: input.since,
                        reason: input.reason.clone(),
                        labels: input.labels.clone(),
                        emitted: None,
                    };
                    match entry {
                        Entry::Occupied(mut e) => left.extend(e.insert(fresh).emitted),
                        Entry::Vacant(e) => {
                            e.insert(fresh);
                        }
                    }
                }
            }
        }
        let gone: Vec<ClientKey> = self
            .tracked
            .keys()
            .filter(|k| !seen.contains(k))
            .copied()
            .collect();
        for key in gone {
            left.extend(self.tracked.remove(&key).and_then(|t| t.emitted));
        }
        self.endpoints.retain(|k, _| seen.contains(k));

        match (outage, &self.outage) {
            (Some(o), None) => {
                let alert = self.outage_alert(o, now);
                self.outage = Some(alert.clone());
                fired.push(alert);
            }
            (None, Some(_)) => {
                let alert = self.outage.take().expect("checked");
                resolved.push(alert.resolved(now));
                self.quiet_until = Some(now + self.settle);
            }
            _ => {}
        }

        let quiet = outage.is_some() || self.quiet_until.is_some_and(|until| now < until);
        if !quiet {
            let due: Vec<ClientKey> = self
                .tracked
                .iter()
                .filter(|(_, t)| t.emitted.is_none() && now >= t.since + self.settle)
                .map(|(k, _)| *k)
                .collect();
            for key in due {
                let alert = self.client_alert(key, &self.tracked[&key]);
                let identity = alert.labels.clone();
                self.tracked.get_mut(&key).expect("listed key").emitted = Some(identity.clone());
                match self.live.entry(identity) {
                    Entry::Occupied(mut e) => {
                        e.get_mut().members.insert(key);
                    }
                    Entry::Vacant(e) => {
                        fired.push(alert.clone());
                        e.insert(Live {
                            alert,
                            members: BTreeSet::from([key]),
                        });
                    }
                }
            }
        }

        for identity in left {
            let Some(live) = self.live.get_mut(&identity) else {
                continue;
            };
            live.members.retain(|k| {
                self.tracked
                    .get(k)
                    .is_some_and(|t| t.emitted.as_ref() == Some(&identity))
            });
            if live.members.is_empty() {
                let live = self.live.remove(&identity).expect("present");
                resolved.push(live.alert.resolved(now));
            }
        }
        resolved.extend(fired);
        resolved
    }

    fn client_alert(&self, key: ClientKey, t: &Tracked) -> Alert {
        let name = alert_name(t.state).expect("only unhealthy states are tracked");
        let l = &t.labels;
        let endpoint = self.endpoints.get(&key).cloned().unwrap_or_default();
        let labels = Labels::from([
            ("alertname".to_owned(), name.to_owned()),
            ("severity".to_owned(), severity(t.state).to_owned()),
            ("node".to_owned(), self.node.clone()),
            ("namespace".to_owned(), l.namespace.clone().unwrap_or_default()),
            ("pod".to_owned(), l.pod.clone().unwrap_or_default()),
            ("container".to_owned(), l.container.clone().unwrap_or_default()),
            ("comm".to_owned(), l.comm.clone()),
            ("endpoint".to_owned(), endpoint),
        ]);
        let who = match (&l.namespace, &l.pod) {
            (Some(ns), Some(pod)) => format!("{} (pod {ns}/{pod})", l.comm),
            _ => format!("{} (pid {}, node {})", l.comm, key.0, self.node),
        };
        let summary = format!("{who} is {}: it {}", t.state, meaning(t.state));
        Alert {
            labels,
            annotations: BTreeMap::from([
                ("summary".to_owned(), summary),
                ("description".to_owned(), t.reason.clone()),
            ]),
            starts_at: t.since,
            ends_at: None,
        }
    }

    fn outage_alert(&self, outage: &Outage, now: SystemTime) -> Alert {
        let node = &self.node;
        Alert {
            labels: Labels::from([
                ("alertname".to_owned(), OUTAGE_ALERT.to_owned()),
                ("severity".to_owned(), "critical".to_owned()),
                ("node".to_owned(), node.clone()),
            ]),
            annotations: BTreeMap::from([
                (
                    "summary".to_owned(),
                    format!("apiserver outage seen from node {node}"),
                ),
                (
                    "description".to_owned(),
                    format!(
                        "{} of {} clients on node {node} lost the apiserver at once",
                        outage.affected, outage.clients
                    ),
                ),
            ]),
            starts_at: now,
            ends_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::{Alert, AlertBook, ClientInput, ClientLabels, Status, DEFAULT_SETTLE};

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

    fn outage(affected: usize, clients: usize) -> Outage {
        Outage { affected, clients }
    }

    #[test]
    fn an_unhealthy_client_fires_after_settle_with_labels_and_annotations() {
        let mut b = book();
        let c = client(7, State::Disconnected, 10);
        assert!(b.tick(at(10), std::slice::from_ref(&c), None).is_empty(), "held");
        assert!(
            b.tick(at(12), std::slice::from_ref(&c), None).is_empty(),
            "still held at 2 s"
        );
        let out = b.tick(at(13), std::slice::from_ref(&c), None);
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
                ("severity", "critical"),
            ]
        );
        assert_eq!(a.annotations["description"], "disconnected since 10");
        let summary = &a.annotations["summary"];
        assert!(
            summary.contains("ctl7")
                && summary.contains("kube-system/ctl-7")
                && summary.contains("disconnected"),
            "{summary}"
        );
        assert_eq!(
            (a.starts_at, a.ends_at),
            (at(10), None),
            "starts when the state began"
        );
        assert!(
            b.tick(at(14), &[c], None).is_empty(),
            "fires once, not every tick"
        );
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
            let out = b.tick(at(10), &[client(1, state, 0)], None);
            assert_eq!(brief(&out), [fire(name, "ctl-1")], "{state}");
            assert_eq!(out[0].labels["severity"], severity, "{state}");
        }
    }

    #[test]
    fn recovery_resolves_at_the_recovery_time() {
        let mut b = book();
        b.tick(at(10), &[client(1, State::Stale, 0)], None);
        let out = b.tick(at(20), &[healthy(1)], None);
        assert_eq!(brief(&out), [resolve(STALE, "ctl-1")]);
        assert_eq!((out[0].starts_at, out[0].ends_at), (at(0), Some(at(20))));
        assert!(b.tick(at(21), &[healthy(1)], None).is_empty());
    }

    #[test]
    fn a_new_state_resolves_the_old_alert_and_fires_its_own_after_settle() {
        let mut b = book();
        b.tick(at(10), &[client(1, State::Stale, 0)], None);
        let out = b.tick(at(20), &[client(1, State::Blackholed, 20)], None);
        assert_eq!(brief(&out), [resolve(STALE, "ctl-1")]);
        assert!(b
            .tick(at(22), &[client(1, State::Blackholed, 20)], None)
            .is_empty());
        let out = b.tick(at(23), &[client(1, State::Blackholed, 20)], None);
        assert_eq!(brief(&out), [fire(BLACK, "ctl-1")]);
    }

    #[test]
    fn a_client_that_recovers_within_settle_never_alerts() {
        let mut b = book();
        assert!(b
            .tick(at(10), &[client(1, State::Disconnected, 10)], None)
            .is_empty());
        assert!(b.tick(at(12), &[healthy(1)], None).is_empty());
        for t in 13..20 {
            assert!(b.tick(at(t), &[healthy(1)], None).is_empty(), "t={t}");
        }
        // A state change while held starts a new hold.
        assert!(b.tick(at(20), &[client(1, State::Stale, 20)], None).is_empty());
        assert!(b
            .tick(at(22), &[client(1, State::Blackholed, 22)], None)
            .is_empty());
        assert!(b
            .tick(at(24), &[client(1, State::Blackholed, 22)], None)
            .is_empty());
        assert_eq!(
            brief(&b.tick(at(25), &[client(1, State::Blackholed, 22)], None)),
            [fire(BLACK, "ctl-1")]
        );
    }

    #[test]
    fn an_exited_client_has_its_alert_resolved_and_a_held_one_dropped() {
        let mut b = book();
        b.tick(
            at(10),
            &[client(1, State::Stale, 0), client(2, State::Stale, 9)],
            None,
        );
        let out = b.tick(at(11), &[], None);
        assert_eq!(brief(&out), [resolve(STALE, "ctl-1")], "2 was still held");
        assert_eq!(out[0].ends_at, Some(at(11)));
        assert!(b.tick(at(20), &[], None).is_empty());
    }

    #[test]
    fn processes_that_are_not_clients_never_alert() {
        let mut b = book();
        let mut c = client(1, State::Disconnected, 0);
        c.is_client = false;
        assert!(b.tick(at(10), std::slice::from_ref(&c), None).is_empty());
        assert!(b.tick(at(100), &[c], None).is_empty());
    }

    #[test]
    fn an_outage_fires_one_alert_instead_of_one_per_client() {
        let mut b = book();
        let all =
            |since| -> Vec<ClientInput> { (1..=4).map(|p| client(p, State::Disconnected, since)).collect() };
        let o = outage(4, 4);
        let out = b.tick(at(10), &all(10), Some(&o));
        assert_eq!(brief(&out), [fire(OUTAGE_ALERT, "")]);
        let labels: Vec<&str> = out[0].labels.keys().map(String::as_str).collect();
        assert_eq!(labels, ["alertname", "node", "severity"]);
        assert_eq!(out[0].labels["severity"], "critical");
        assert_eq!(
            out[0].annotations["description"],
            "4 of 4 clients on node node-a lost the apiserver at once"
        );
        for t in 11..60 {
            assert!(b.tick(at(t), &all(10), Some(&o)).is_empty(), "t={t}: suppressed");
        }
        // The outage ends while all are recovering: they re-dial within settle, silence.
        let out = b.tick(at(60), &all(10), None);
        assert_eq!(brief(&out), [resolve(OUTAGE_ALERT, "")]);
        assert_eq!(out[0].ends_at, Some(at(60)));
        let mut mixed = all(10);
        for c in &mut mixed[..3] {
            c.state = State::Healthy;
        }
        assert!(b.tick(at(61), &mixed, None).is_empty());
        assert!(b.tick(at(62), &mixed, None).is_empty());
        // The one still unhealthy settle after the end gets its alert.
        assert_eq!(brief(&b.tick(at(63), &mixed, None)), [fire(DISC, "ctl-4")]);
        assert_eq!(b.tick(at(64), &mixed, None), []);
    }

    #[test]
    fn an_outage_that_begins_while_alerts_are_held_suppresses_them() {
        let mut b = book();
        let one = [client(1, State::Disconnected, 10), healthy(2), healthy(3)];
        assert!(b.tick(at(10), &one, None).is_empty());
        let two = [
            client(1, State::Disconnected, 10),
            client(2, State::Disconnected, 11),
            healthy(3),
        ];
        let o = outage(2, 3);
        assert_eq!(brief(&b.tick(at(11), &two, Some(&o))), [fire(OUTAGE_ALERT, "")]);
        for t in 12..30 {
            assert!(b.tick(at(t), &two, Some(&o)).is_empty(), "t={t}");
        }
    }

    #[test]
    fn client_alerts_emitted_before_an_outage_stay_and_resolve_normally() {
        let mut b = book();
        let first = [client(1, State::Stale, 0), healthy(2), healthy(3)];
        assert_eq!(brief(&b.tick(at(10), &first, None)), [fire(STALE, "ctl-1")]);
        let all = [
            client(1, State::Stale, 0),
            client(2, State::Disconnected, 20),
            client(3, State::Disconnected, 20),
        ];
        let o = outage(3, 3);
        assert_eq!(brief(&b.tick(at(20), &all, Some(&o))), [fire(OUTAGE_ALERT, "")]);
        assert!(
            b.tick(at(30), &all, Some(&o)).is_empty(),
            "ctl-1's alert is neither resolved nor resent"
        );
        let back = [healthy(1), healthy(2), healthy(3)];
        assert_eq!(
            brief(&b.tick(at(40), &back, None)),
            [resolve(OUTAGE_ALERT, ""), resolve(STALE, "ctl-1")]
        );
        assert!(b.tick(at(50), &back, None).is_empty());
    }

    #[test]
    fn processes_with_the_same_labels_share_one_alert() {
        let mut b = book();
        let mut twin = client(2, State::Stale, 0);
        twin.labels = client(1, State::Stale, 0).labels;
        let out = b.tick(at(10), &[client(1, State::Stale, 0), twin.clone()], None);
        assert_eq!(brief(&out), [fire(STALE, "ctl-1")], "one alert for both");
        assert!(
            b.tick(at(11), &[healthy(1), twin.clone()], None).is_empty(),
            "2 still holds it"
        );
        assert_eq!(
            brief(&b.tick(at(12), &[healthy(1)], None)),
            [resolve(STALE, "ctl-1")]
        );
    }

    #[test]
    fn labels_are_frozen_at_emission_and_a_lost_endpoint_is_remembered() {
        let mut b = book();
        let mut c = healthy(1);
        c.endpoint = Some("10.0.0.9:6443".into());
        b.tick(at(0), &[c], None);
        let mut c = client(1, State::Disconnected, 10);
        c.endpoint = None;
        c.labels.pod = None;
        c.labels.namespace = None;
        b.tick(at(10), std::slice::from_ref(&c), None);
        c.labels.pod = Some("late".into());
        c.labels.namespace = Some("ns".into());
        let out = b.tick(at(13), std::slice::from_ref(&c), None);
        assert_eq!(out[0].labels["endpoint"], "10.0.0.9:6443", "the endpoint it had");
        assert_eq!(out[0].labels["pod"], "late", "labels learnt while held are used");
        c.labels.pod = Some("later".into());
        c.reason = "changed".into();
        assert!(b.tick(at(14), std::slice::from_ref(&c), None).is_empty());
        let out = b.tick(at(15), &[healthy(1)], None);
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
        let out = b.tick(at(10), &[c], None);
        for label in ["namespace", "pod", "container", "endpoint"] {
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
            brief(&b.tick(at(5), &[client(1, State::Stale, 5)], None)),
            [fire(STALE, "ctl-1")]
        );
    }
}
