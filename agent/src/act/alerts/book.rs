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
//! - Outages are per endpoint (`crate::health::reachability`). From the moment an endpoint is seen
//!   unreachable, the alerts of unhealthy clients whose evidence is about that endpoint are
//!   held — not sent, not lost. If the endpoint comes back within `outage_after`, they go as
//!   usual (those clients still unhealthy `settle` after it came back; an `unreachable` one
//!   only if still so `recovery_hold` after — its failed connects from the outage count for
//!   `connect_window`, and a client backing off between retries, as client-go does for up to
//!   30 s, has not tried again yet); if it stays
//!   unreachable for `outage_after`, one `LifelineApiserverOutage` for that endpoint fires
//!   instead (every apiserver down → one alert per endpoint, not one per client). Client
//!   alerts emitted before the endpoint became unreachable stay as they are. A client whose
//!   endpoint is reachable alerts normally, however many clients are unhealthy at once
//!   (seeds 000/004 after an upgrade: the old controllers that never re-dial are each
//!   `disconnected` while the others re-dialed).
//! - An alert's identity is its label set. Processes that share it (same pod, container and
//!   comm, say two workers of one binary) share one alert: it fires with the first and resolves
//!   with the last. Labels and annotations are frozen when the alert is first emitted, so a
//!   reason that counts seconds does not make a new alert every tick.
use std::{
    collections::{btree_map::Entry, BTreeMap, BTreeSet},
    time::{Duration, SystemTime},
};

use crate::{health::snapshot::ClientKey, health::State};

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
    /// `comm`, `endpoint`, `resource` (empty when unknown).
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
    /// The resource of the stuck stream that is the evidence; empty for connection-level
    /// evidence (SPEC "Alerts").
    pub resource: String,
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

/// One endpoint that is unreachable from the node, as the policy sees it each tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInput {
    /// As clients' `endpoint` names it.
    pub endpoint: String,
    /// Wall-clock time it was first seen unreachable.
    pub since: SystemTime,
    /// The evidence, one sentence.
    pub reason: String,
    /// Unreachable for `outage_after`: the outage alert is due.
    pub outage: bool,
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
    /// Outage alerts firing, by endpoint.
    outages: BTreeMap<String, Alert>,
    /// How long after an endpoint came back the alert of a client `unreachable` through it
    /// waits (the judge's `connect_window`: by then only failures after the recovery count).
    recovery_hold: Duration,
    /// Per endpoint, no client alert about it is emitted while it is unreachable (`None`), or
    /// for a while after it came back (`Some(when it came back)`).
    quiet: BTreeMap<String, Option<SystemTime>>,
}

impl AlertBook {
    pub fn new(node: impl Into<String>, settle: Duration) -> Self {
        Self {
            node: node.into(),
            settle,
            tracked: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            live: BTreeMap::new(),
            outages: BTreeMap::new(),
            recovery_hold: settle,
            quiet: BTreeMap::new(),
        }
    }

    /// Sets how long, after an endpoint came back, a client still `unreachable` through it
    /// waits before it alerts (at least `settle`).
    pub fn set_recovery_hold(&mut self, hold: Duration) {
        self.recovery_hold = hold.max(self.settle);
    }

    /// Takes this tick's clients (all judged processes; those missing have exited) and the
    /// endpoints unreachable now, and returns the alert changes to deliver: resolved ones
    /// first, then firing ones.
    pub fn tick(
        &mut self,
        now: SystemTime,
        clients: &[ClientInput],
        unreachable: &[EndpointInput],
    ) -> Vec<Alert> {
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

        // Outage alerts: fire those due, resolve those whose endpoint came back.
        let down: BTreeMap<&str, &EndpointInput> =
            unreachable.iter().map(|e| (e.endpoint.as_str(), e)).collect();
        for e in unreachable.iter().filter(|e| e.outage) {
            if !self.outages.contains_key(&e.endpoint) {
                let alert = self.outage_alert(e);
                self.outages.insert(e.endpoint.clone(), alert.clone());
                fired.push(alert);
            }
        }
        let back: Vec<String> = self
            .outages
            .keys()
            .filter(|e| !down.get(e.as_str()).is_some_and(|d| d.outage))
            .cloned()
            .collect();
        for endpoint in back {
            let alert = self.outages.remove(&endpoint).expect("listed");
            resolved.push(alert.resolved(now));
        }
        // While an endpoint is unreachable, and for a while after, client alerts about it
        // wait: `settle`, or `recovery_hold` for clients still unreachable through it.
        for e in down.keys() {
            self.quiet.insert((*e).to_owned(), None);
        }
        for (endpoint, back) in self.quiet.iter_mut() {
            if back.is_none() && !down.contains_key(endpoint.as_str()) {
                *back = Some(now);
            }
        }
        let longest = self.recovery_hold.max(self.settle);
        self.quiet
            .retain(|_, back| back.is_none_or(|b| now < b + longest));

        let due: Vec<ClientKey> = self
            .tracked
            .iter()
            .filter(|(key, t)| {
                let endpoint = self.endpoints.get(key).map(String::as_str).unwrap_or_default();
                let quiet_for = match t.state {
                    State::Unreachable => self.recovery_hold,
                    _ => self.settle,
                };
                let quiet = self
                    .quiet
                    .get(endpoint)
                    .is_some_and(|back| back.is_none_or(|b| now < b + quiet_for));
                t.emitted.is_none() && now >= t.since + self.settle && !quiet
            })
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
            ("resource".to_owned(), l.resource.clone()),
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

    fn outage_alert(&self, e: &EndpointInput) -> Alert {
        let node = &self.node;
        Alert {
            labels: Labels::from([
                ("alertname".to_owned(), OUTAGE_ALERT.to_owned()),
                ("severity".to_owned(), "critical".to_owned()),
                ("node".to_owned(), node.clone()),
                ("endpoint".to_owned(), e.endpoint.clone()),
            ]),
            annotations: BTreeMap::from([
                (
                    "summary".to_owned(),
                    format!(
                        "apiserver endpoint {} is unreachable from node {node}",
                        e.endpoint
                    ),
                ),
                ("description".to_owned(), e.reason.clone()),
            ]),
            starts_at: e.since,
            ends_at: None,
        }
    }
}

#[cfg(test)]
mod tests;
