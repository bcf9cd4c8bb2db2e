//! Client health: the states of SPEC.md, judged per process from what the connection table
//! observed. Pure logic: no sockets, no eBPF, no clock of its own (every call gets `now`).
//!
//! | state          | rule (thresholds configurable)                                                  |
//! |----------------|---------------------------------------------------------------------------------|
//! | `healthy`      | connected and not waiting for an answer (a quiet watch is healthy)              |
//! | `blackholed`   | a connection retransmits with no ACK progress for `blackhole_after`             |
//! | `stale`        | A: a request unanswered for `stale_after`; B: silence beyond the client's rhythm |
//! | `disconnected` | the peer or the network ended its connection, none for `disconnect_grace`, no attempt since |
//! | `unreachable`  | not connected and trying: `connect_failures` failures in `connect_window`, or attempts failing/in flight after a loss, or in flight for a whole `connect_window` |
//!
//! Rule A (*request unanswered*): the table marks a connection as waiting from the first
//! outbound payload (a request, more than keepalive-sized records) that no inbound payload has
//! answered yet. The apiserver answers every request within its 60 s request timeout, and a
//! long-running one (watch, logs) at once with headers, so `stale_after` (90 s) is crossed only
//! by a path where nothing answers (seed 002: a gateway that answers PINGs, not requests).
//!
//! Rule B (*silence beyond the rhythm*): a watch that hangs sends no request at all. Every
//! client restarts its watches: client-go within 10 min (server-side `timeoutSeconds`, random
//! in 5–10 min), the kube crate after 290 s, a watch without timeout within twice the
//! apiserver's `--min-request-timeout` (30–60 min). Those lifetimes are random in `[T, 2T]`, so
//! twice the longest interval between the client's requests seen so far bounds the next one.
//! A client that has sent no request and received no payload for that long (never less than
//! `silence_floor`; `silence_max` until two intervals were seen) is stale.
//!
//! Only *clients* are judged: a process becomes one when it has held a connection for
//! `min_client_age`, failed `connect_failures` times within `connect_window`, tried without
//! success for a whole `connect_window`, lost a connection the start-up scan found closed by
//! the peer, or was selected by configuration. Until then it is listed as `healthy` with a
//! reason saying it is not judged yet, so short-lived tools (`kubectl get`) never alarm.
use std::{
    collections::HashMap,
    fmt,
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::endpoint::Endpoint;
use crate::table::{
    facts::{LossCause, Rhythm},
    streams::Stuck,
};

/// An attempt in flight this long has retransmitted its SYN (the first SYN timeout is 1 s): no
/// answer from the endpoint.
pub const SYN_RETRANSMITTED_AFTER: Duration = Duration::from_secs(1);

/// The thresholds of SPEC.md, with their defaults (docs/configuration.md says why each, and
/// which healthy client is nearest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub disconnect_grace: Duration,
    /// Rule A: a request unanswered this long.
    pub stale_after: Duration,
    /// Rule B never fires sooner than this (client-go restarts every watch within 10 min).
    pub silence_floor: Duration,
    /// Rule B before the client's rhythm is known (2 × the apiserver's default 30 min
    /// `--min-request-timeout`, plus 5 min).
    pub silence_max: Duration,
    pub blackhole_after: Duration,
    pub connect_failures: u32,
    pub connect_window: Duration,
    pub min_client_age: Duration,
    /// How long an endpoint is unreachable before `LifelineApiserverOutage` fires.
    pub outage_after: Duration,
    /// How long past its own deadline a watch may stay open with nothing since before it is
    /// stuck (streams only).
    pub watch_grace: Duration,
}

/// The longest a watch without `timeoutSeconds` lives: the apiserver ends it within twice
/// its `--min-request-timeout` (default 1800 s).
pub const MAX_WATCH: Duration = Duration::from_secs(2 * 1800);

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            disconnect_grace: Duration::from_secs(15),
            stale_after: Duration::from_secs(90),
            silence_floor: Duration::from_secs(11 * 60),
            silence_max: Duration::from_secs(65 * 60),
            blackhole_after: Duration::from_secs(20),
            connect_failures: 3,
            connect_window: Duration::from_secs(60),
            min_client_age: Duration::from_secs(10),
            outage_after: Duration::from_secs(30),
            watch_grace: Duration::from_secs(120),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Healthy,
    Stale,
    Blackholed,
    Disconnected,
    Unreachable,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Healthy,
        State::Stale,
        State::Blackholed,
        State::Disconnected,
        State::Unreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Stale => "stale",
            State::Blackholed => "blackholed",
            State::Disconnected => "disconnected",
            State::Unreachable => "unreachable",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One established connection, as the engine needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionFacts {
    /// The connection's local address: which socket a reset would destroy.
    pub local: SocketAddr,
    /// Formatted only where a verdict names it: the facts are built for every connection
    /// every second.
    pub endpoint: Endpoint,
    /// Last inbound payload, or when the connection was first seen if none arrived yet.
    pub last_payload: Instant,
    /// The first request (outbound payload) that no inbound payload has answered yet.
    pub waiting_since: Option<Instant>,
    /// First retransmit since the last ACK progress.
    pub stalled_since: Option<Instant>,
    /// The connection's `tcp_info` could not be read lately: its payload and request evidence
    /// is unknown, and no rule is applied from it.
    pub unreadable: bool,
    /// Its stuck streams, oldest evidence first (only where the client's streams are read;
    /// see `table/streams.rs`).
    pub stuck: Vec<Stuck>,
}

/// The end of a client's last established connection, when it was not the client's choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    pub at: Instant,
    pub cause: LossCause,
    pub endpoint: String,
}

/// A connect in flight (SYN_SENT) since `since`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub since: Instant,
    pub endpoint: String,
}

/// A failed connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub at: Instant,
    pub endpoint: String,
}

/// What the table knows about one process at `now`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Selected by configuration (comm/cmdline pattern, pod annotation).
    pub selected: bool,
    /// Since when it has held at least one established connection (None: it holds none).
    pub connected_since: Option<Instant>,
    /// How its last connection was lost, when the peer or the network ended it and it holds
    /// none since (None: it never had one, has one, or closed it itself).
    pub loss: Option<Loss>,
    /// Established connections to apiserver endpoints.
    pub established: Vec<ConnectionFacts>,
    /// Connects in flight.
    pub attempts: Vec<Attempt>,
    /// Failed connects, oldest first (the table keeps a bounded number).
    pub failures: Vec<Failure>,
    /// Start of the current run of attempts without an established connection.
    pub trying_since: Option<Instant>,
    pub rhythm: Rhythm,
}

/// The engine's judgement of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub state: State,
    pub since: Instant,
    /// One human sentence.
    pub reason: String,
    /// Whether the process is a client (judged, may alert).
    pub is_client: bool,
    /// The endpoint the evidence is about, when there is one.
    pub endpoint: Option<String>,
    /// Local addresses of the connections that are the evidence of `stale`/`blackholed` (what
    /// a reset destroys).
    pub suspects: Vec<SocketAddr>,
    /// The resource of the stuck stream that is the evidence (`group/resource`); None when the
    /// evidence is the connection's.
    pub resource: Option<String>,
}

/// A state change of a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub reason: String,
    /// From the moment the kernel evidence crossed the threshold to this judgement
    /// (`lifeline_detection_seconds`); zero for recoveries.
    pub detection: Duration,
}

/// Per-process memory of the engine, keyed by the caller (pid + start time).
pub struct HealthEngine<K> {
    thresholds: Thresholds,
    clients: HashMap<K, Verdict>,
}

/// What the rules decided for a client.
enum Judgement {
    /// This state, with the instant the evidence crossed its threshold.
    State {
        state: State,
        reason: String,
        evidence: Instant,
        endpoint: Option<String>,
        suspects: Vec<SocketAddr>,
        /// The stuck stream's resource, when a stream is the evidence.
        resource: Option<String>,
    },
    /// No new state from this evidence: keep the previous one (a lost connection inside the
    /// grace, or evidence that could not be read), saying why.
    Keep { reason: String },
}

impl<K: std::hash::Hash + Eq + Clone> HealthEngine<K> {
    pub fn new(thresholds: Thresholds) -> Self {
        Self {
            thresholds,
            clients: HashMap::new(),
        }
    }

    pub fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }

    pub fn set_thresholds(&mut self, thresholds: Thresholds) {
        self.thresholds = thresholds;
    }

    /// Judges one process; returns its verdict and, for clients, the transition if the state
    /// changed.
    pub fn evaluate(&mut self, key: &K, obs: &Observation, now: Instant) -> (Verdict, Option<Transition>) {
        let t = self.thresholds;
        let previous = self.clients.get(key).cloned();
        let was_client = previous.as_ref().is_some_and(|v| v.is_client);
        let recent_failures = recent(&t, obs, now);
        let held = obs
            .connected_since
            .map(|since| now.saturating_duration_since(since));
        let is_client = was_client
            || obs.selected
            || held.is_some_and(|h| h >= t.min_client_age)
            || recent_failures.len() >= t.connect_failures as usize
            || trying_for_a_window(&t, obs, now).is_some()
            || obs
                .loss
                .as_ref()
                .is_some_and(|l| l.cause == LossCause::FoundClosed);

        if !is_client {
            let reason = match held {
                Some(h) => format!(
                    "connected for {}s; not judged yet (a process is judged once it has held a connection for {}s)",
                    h.as_secs(),
                    t.min_client_age.as_secs()
                ),
                None => "not connected; not a client yet".to_owned(),
            };
            let verdict = Verdict {
                state: State::Healthy,
                since: previous.map_or(now, |p| p.since),
                reason,
                is_client: false,
                endpoint: any_endpoint(obs),
                suspects: Vec::new(),
                resource: None,
            };
            self.clients.insert(key.clone(), verdict.clone());
            return (verdict, None);
        }

        let previous_client = previous.filter(|p| p.is_client);
        let (state, reason, evidence, endpoint, suspects, resource) =
            match judge(&t, obs, &recent_failures, now) {
                Judgement::State {
                    state,
                    reason,
                    evidence,
                    endpoint,
                    suspects,
                    resource,
                } => (state, reason, evidence, endpoint, suspects, resource),
                Judgement::Keep { reason } => match &previous_client {
                    Some(p) => (
                        p.state,
                        reason,
                        now,
                        p.endpoint.clone(),
                        p.suspects.clone(),
                        p.resource.clone(),
                    ),
                    None => (State::Healthy, reason, now, any_endpoint(obs), Vec::new(), None),
                },
            };
        let from = previous_client.as_ref().map_or(State::Healthy, |p| p.state);
        let since = match &previous_client {
            Some(p) if p.state == state => p.since,
            _ => now,
        };
        let verdict = Verdict {
            state,
            since,
            reason: reason.clone(),
            is_client: true,
            endpoint,
            suspects,
            resource,
        };
        self.clients.insert(key.clone(), verdict.clone());
        let transition = (from != state).then(|| Transition {
            from,
            to: state,
            reason,
            detection: if state == State::Healthy {
                Duration::ZERO
            } else {
                now.saturating_duration_since(evidence)
            },
        });
        (verdict, transition)
    }

    /// Forgets processes for which `keep` is false (they exited).
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.clients.retain(|k, _| keep(k));
    }
}

/// Some endpoint the process is about: connected to, lost, or connecting to.
fn any_endpoint(obs: &Observation) -> Option<String> {
    obs.established
        .first()
        .map(|c| c.endpoint.to_string())
        .or_else(|| obs.loss.as_ref().map(|l| l.endpoint.clone()))
        .or_else(|| obs.attempts.first().map(|a| a.endpoint.clone()))
}

/// Failed connects within `connect_window`.
fn recent<'a>(t: &Thresholds, obs: &'a Observation, now: Instant) -> Vec<&'a Failure> {
    obs.failures
        .iter()
        .filter(|f| now.saturating_duration_since(f.at) <= t.connect_window)
        .collect()
}

/// The oldest attempt in flight that has retransmitted its SYN.
fn slow_attempt(obs: &Observation, now: Instant) -> Option<&Attempt> {
    obs.attempts
        .iter()
        .filter(|a| now.saturating_duration_since(a.since) >= SYN_RETRANSMITTED_AFTER)
        .min_by_key(|a| a.since)
}

/// A process that never held a connection but has been trying, with an unanswered attempt in
/// flight, for a whole `connect_window` (connects into a blackhole take up to 130 s each, so
/// fewer than `connect_failures` of them fit the window). Returns the attempt.
fn trying_for_a_window<'a>(t: &Thresholds, obs: &'a Observation, now: Instant) -> Option<&'a Attempt> {
    let trying_since = obs.trying_since?;
    (obs.established.is_empty() && now.saturating_duration_since(trying_since) >= t.connect_window)
        .then(|| slow_attempt(obs, now))
        .flatten()
}

/// Whether a timer started at `since` has run for `limit` at `now`.
fn overdue(since: Instant, limit: Duration, now: Instant) -> bool {
    now.saturating_duration_since(since) >= limit
}

/// Of `conns`, the one whose `timer` started first, with that start, if it is [`overdue`]:
/// the blackhole rule's oldest unacknowledged retransmission, rule A's oldest unanswered
/// request.
fn first_overdue<'c>(
    conns: impl IntoIterator<Item = &'c ConnectionFacts>,
    timer: fn(&ConnectionFacts) -> Option<Instant>,
    limit: Duration,
    now: Instant,
) -> Option<(Instant, &'c ConnectionFacts)> {
    conns
        .into_iter()
        .filter_map(|c| timer(c).map(|since| (since, c)))
        .min_by_key(|(since, _)| *since)
        .filter(|(since, _)| overdue(*since, limit, now))
}

fn secs(d: Duration) -> u64 {
    d.as_secs()
}

/// The state of a client from its evidence.
fn judge(t: &Thresholds, obs: &Observation, recent_failures: &[&Failure], now: Instant) -> Judgement {
    if obs.established.is_empty() {
        return judge_not_connected(t, obs, recent_failures, now);
    }
    // Blackholed: retransmits without ACK progress (kernel events and tcp_info alike).
    let stalled = first_overdue(&obs.established, |c| c.stalled_since, t.blackhole_after, now);
    if let Some((since, conn)) = stalled {
        return Judgement::State {
            resource: None,
            state: State::Blackholed,
            reason: format!(
                "retransmitting to {} for {}s with no acknowledgement (blackhole_after {}s)",
                conn.endpoint,
                secs(now.saturating_duration_since(since)),
                secs(t.blackhole_after)
            ),
            evidence: since + t.blackhole_after,
            endpoint: Some(conn.endpoint.to_string()),
            suspects: vec![conn.local],
        };
    }
    let readable: Vec<&ConnectionFacts> = obs.established.iter().filter(|c| !c.unreadable).collect();
    let Some(freshest) = readable.iter().max_by_key(|c| c.last_payload) else {
        return Judgement::Keep {
            reason: format!(
                "connected to {}, but its connection statistics could not be read: not judged",
                obs.established[0].endpoint
            ),
        };
    };
    // A stuck stream (where the client's streams are read): a watch past its own deadline
    // with nothing since, or a request without response headers.
    let stuck = readable
        .iter()
        .flat_map(|c| c.stuck.iter().map(move |s| (s, *c)))
        .min_by_key(|(s, _)| s.evidence);
    if let Some((s, conn)) = stuck {
        return Judgement::State {
            state: State::Stale,
            reason: format!("{} (stream {} to {})", s.description, s.stream, conn.endpoint),
            evidence: s.evidence,
            endpoint: Some(conn.endpoint.to_string()),
            suspects: readable
                .iter()
                .filter(|c| !c.stuck.is_empty())
                .map(|c| c.local)
                .collect(),
            resource: Some(s.resource.clone()),
        };
    }
    // Rule A: a request left unanswered.
    let waiting = first_overdue(readable.iter().copied(), |c| c.waiting_since, t.stale_after, now);
    if let Some((since, conn)) = waiting {
        return Judgement::State {
            resource: None,
            state: State::Stale,
            reason: format!(
                "sent a request to {} {}s ago and nothing but keepalives came back (stale_after {}s)",
                conn.endpoint,
                secs(now.saturating_duration_since(since)),
                secs(t.stale_after)
            ),
            evidence: since + t.stale_after,
            endpoint: Some(conn.endpoint.to_string()),
            suspects: readable
                .iter()
                .filter(|c| c.waiting_since.is_some_and(|w| overdue(w, t.stale_after, now)))
                .map(|c| c.local)
                .collect(),
        };
    }
    // Rule B: silence beyond the client's own rhythm.
    let last_activity = obs
        .rhythm
        .last_request
        .map_or(freshest.last_payload, |r| r.max(freshest.last_payload));
    let silent = now.saturating_duration_since(last_activity);
    let (limit, basis) = silence_limit(t, &obs.rhythm);
    if silent >= limit {
        return Judgement::State {
            resource: None,
            state: State::Stale,
            reason: format!(
                "connected to {} but has neither sent a request nor received payload for {}s ({basis})",
                freshest.endpoint,
                secs(silent),
            ),
            evidence: last_activity + limit,
            endpoint: Some(freshest.endpoint.to_string()),
            suspects: readable.iter().map(|c| c.local).collect(),
        };
    }
    let quiet = now.saturating_duration_since(freshest.last_payload);
    Judgement::State {
        resource: None,
        state: State::Healthy,
        reason: match readable.iter().filter_map(|c| c.waiting_since).min() {
            Some(w) => format!(
                "connected to {}; waiting {}s for an answer",
                freshest.endpoint,
                secs(now.saturating_duration_since(w))
            ),
            None => format!(
                "connected to {}; last payload {}s ago",
                freshest.endpoint,
                secs(quiet)
            ),
        },
        evidence: now,
        endpoint: Some(freshest.endpoint.to_string()),
        suspects: Vec::new(),
    }
}

/// How long a client may be silent (rule B), and a phrase saying why.
fn silence_limit(t: &Thresholds, rhythm: &Rhythm) -> (Duration, String) {
    if rhythm.gaps >= 2 {
        let learned = rhythm.longest_gap * 2;
        let limit = learned.max(t.silence_floor);
        (
            limit,
            format!(
                "twice its longest interval between requests, {}s, is {}s; silence_floor {}s",
                secs(rhythm.longest_gap),
                secs(learned),
                secs(t.silence_floor)
            ),
        )
    } else {
        (
            t.silence_max,
            format!(
                "its request rhythm is not known yet; silence_max {}s",
                secs(t.silence_max)
            ),
        )
    }
}

fn judge_not_connected(
    t: &Thresholds,
    obs: &Observation,
    recent_failures: &[&Failure],
    now: Instant,
) -> Judgement {
    let slow = slow_attempt(obs, now);
    if let (Some(attempt), None) = (obs.attempts.first(), slow) {
        // A connect just started: it will be established or fail within a second or two.
        return Judgement::Keep {
            reason: format!("connecting to {}", attempt.endpoint),
        };
    }
    if let Some(loss) = &obs.loss {
        let lost_for = now.saturating_duration_since(loss.at);
        let grace_end = loss.at + t.disconnect_grace;
        if lost_for < t.disconnect_grace {
            // A client that just lost its connection gets the grace to re-dial: failed
            // attempts inside it (an apiserver restarting, a library's quick retries) are not
            // unreachability yet.
            return Judgement::Keep {
                reason: format!(
                    "its connection to {} was {} {}s ago; re-dialing (disconnect_grace {}s)",
                    loss.endpoint,
                    loss.cause.describe(),
                    secs(lost_for),
                    secs(t.disconnect_grace)
                ),
            };
        }
        // After the grace: trying (a failed connect within the window, or one in flight with
        // its SYN unanswered) is unreachable; no attempt at all is disconnected (seeds 000/004).
        if let Some(last) = recent_failures.last() {
            return Judgement::State {
                resource: None,
                state: State::Unreachable,
                reason: format!(
                    "lost its connection to {} {}s ago ({}) and its connects keep failing: {} in the last {}s, the last to {}",
                    loss.endpoint,
                    secs(lost_for),
                    loss.cause.describe(),
                    recent_failures.len(),
                    secs(t.connect_window),
                    last.endpoint
                ),
                evidence: grace_end.max(recent_failures[0].at),
                endpoint: Some(last.endpoint.clone()),
                suspects: Vec::new(),
            };
        }
        if let Some(attempt) = slow {
            return Judgement::State {
                resource: None,
                state: State::Unreachable,
                reason: format!(
                    "lost its connection to {} {}s ago ({}) and its connect to {} has been unanswered for {}s",
                    loss.endpoint,
                    secs(lost_for),
                    loss.cause.describe(),
                    attempt.endpoint,
                    secs(now.saturating_duration_since(attempt.since))
                ),
                evidence: grace_end.max(attempt.since + SYN_RETRANSMITTED_AFTER),
                endpoint: Some(attempt.endpoint.clone()),
                suspects: Vec::new(),
            };
        }
        return Judgement::State {
            resource: None,
            state: State::Disconnected,
            reason: format!(
                "its connection to {} was {} {}s ago and it has not dialed again (disconnect_grace {}s)",
                loss.endpoint,
                loss.cause.describe(),
                secs(lost_for),
                secs(t.disconnect_grace)
            ),
            evidence: grace_end,
            endpoint: Some(loss.endpoint.clone()),
            suspects: Vec::new(),
        };
    }
    if recent_failures.len() >= t.connect_failures as usize {
        let last = recent_failures.last().expect("connect_failures >= 1 failures");
        let nth = recent_failures[t.connect_failures.max(1) as usize - 1].at;
        return Judgement::State {
            resource: None,
            state: State::Unreachable,
            reason: format!(
                "{} failed connects to {} in the last {}s and no established connection",
                recent_failures.len(),
                last.endpoint,
                secs(t.connect_window)
            ),
            evidence: nth,
            endpoint: Some(last.endpoint.clone()),
            suspects: Vec::new(),
        };
    }
    if let Some(attempt) = trying_for_a_window(t, obs, now) {
        let trying_since = obs.trying_since.expect("checked by trying_for_a_window");
        return Judgement::State {
            resource: None,
            state: State::Unreachable,
            reason: format!(
                "has been trying to connect to {} for {}s without success; its current connect is unanswered for {}s",
                attempt.endpoint,
                secs(now.saturating_duration_since(trying_since)),
                secs(now.saturating_duration_since(attempt.since))
            ),
            evidence: (trying_since + t.connect_window).max(attempt.since + SYN_RETRANSMITTED_AFTER),
            endpoint: Some(attempt.endpoint.clone()),
            suspects: Vec::new(),
        };
    }
    Judgement::State {
        resource: None,
        state: State::Healthy,
        reason: match (obs.attempts.first(), recent_failures.last()) {
            (Some(a), _) => format!("connecting to {}", a.endpoint),
            (None, Some(f)) => format!(
                "not connected; {} failed connect(s) to {} in the last {}s",
                recent_failures.len(),
                f.endpoint,
                secs(t.connect_window)
            ),
            (None, None) => "not connected (no connection lost to the apiserver side)".to_owned(),
        },
        evidence: now,
        endpoint: obs
            .attempts
            .first()
            .map(|a| a.endpoint.clone())
            .or_else(|| recent_failures.last().map(|f| f.endpoint.clone())),
        suspects: Vec::new(),
    }
}

pub mod judge;
pub mod reachability;
pub mod snapshot;

#[cfg(test)]
mod tests;
