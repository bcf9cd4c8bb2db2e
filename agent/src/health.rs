//! Client health: the states of SPEC.md, judged per process from what the connection table
//! observed. Pure logic: no sockets, no eBPF, no clock of its own (every call gets `now`).
//!
//! | state          | rule (thresholds configurable)                                            |
//! |----------------|---------------------------------------------------------------------------|
//! | `healthy`      | an established connection with payload within `stale_after`              |
//! | `stale`        | established, but no payload on any connection for `stale_after`          |
//! | `blackholed`   | established, retransmitting with no ACK progress for `blackhole_after`   |
//! | `disconnected` | had a connection, has none for `disconnect_grace`, no successful reconnect |
//! | `unreachable`  | `connect_failures` failed connects within `connect_window`, none established |
//!
//! Only *clients* are judged: a process becomes one when it has held a connection for
//! `min_client_age`, failed `connect_failures` times within `connect_window`, or was selected
//! by configuration. Until then it is listed as `healthy` with a reason saying it is not
//! judged yet, so short-lived tools (`kubectl get`) never raise an alarm.
use std::{
    collections::HashMap,
    fmt,
    time::{Duration, Instant},
};

use serde::Serialize;

/// The thresholds of SPEC.md, with its defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub disconnect_grace: Duration,
    pub stale_after: Duration,
    pub blackhole_after: Duration,
    pub connect_failures: u32,
    pub connect_window: Duration,
    pub min_client_age: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            disconnect_grace: Duration::from_secs(15),
            stale_after: Duration::from_secs(90),
            blackhole_after: Duration::from_secs(20),
            connect_failures: 3,
            connect_window: Duration::from_secs(60),
            min_client_age: Duration::from_secs(10),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
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
    pub endpoint: String,
    /// Last inbound payload, or when the connection was first seen if none arrived yet.
    pub last_payload: Instant,
    /// First retransmit since the last ACK progress.
    pub stalled_since: Option<Instant>,
}

/// What the table knows about one process at `now`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Selected by configuration (comm/cmdline pattern, pod annotation).
    pub selected: bool,
    pub connected_since: Option<Instant>,
    pub connection_lost_at: Option<Instant>,
    /// Established connections to apiserver endpoints.
    pub established: Vec<ConnectionFacts>,
    /// Failed connects (time, endpoint), oldest first.
    pub failures: Vec<(Instant, String)>,
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
        let recent: Vec<&(Instant, String)> = obs
            .failures
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= t.connect_window)
            .collect();
        let held = obs
            .connected_since
            .map(|since| now.saturating_duration_since(since));
        let is_client = was_client
            || obs.selected
            || held.is_some_and(|h| h >= t.min_client_age)
            || recent.len() >= t.connect_failures as usize;

        if !is_client {
            let reason = match held {
                Some(h) => format!(
                    "connected for {}s; not judged yet (a process is judged once it has held a connection for {}s)",
                    h.as_secs(),
                    t.min_client_age.as_secs()
                ),
                None => "not connected; not a client yet".to_owned(),
            };
            let since = previous.map_or(now, |p| p.since);
            let verdict = Verdict {
                state: State::Healthy,
                since,
                reason,
                is_client: false,
            };
            self.clients.insert(key.clone(), verdict.clone());
            return (verdict, None);
        }

        let (state, reason, evidence) = match judge(&t, obs, &recent, now) {
            Some(judged) => judged,
            // In the disconnect grace period: keep the previous state (a re-dial is expected).
            None => match &previous {
                Some(p) if p.is_client => (p.state, p.reason.clone(), now),
                _ => (State::Healthy, "reconnecting".to_owned(), now),
            },
        };
        let changed = previous.as_ref().is_none_or(|p| p.state != state || !p.is_client);
        let since = match &previous {
            Some(p) if !changed => p.since,
            _ => now,
        };
        let verdict = Verdict {
            state,
            since,
            reason: reason.clone(),
            is_client: true,
        };
        self.clients.insert(key.clone(), verdict.clone());
        let from = previous
            .filter(|p| p.is_client)
            .map_or(State::Healthy, |p| p.state);
        let transition = (changed && from != state).then(|| Transition {
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

/// The state of a client and the instant its evidence crossed the threshold; `None` while a
/// lost connection is still inside `disconnect_grace`.
fn judge(
    t: &Thresholds,
    obs: &Observation,
    recent_failures: &[&(Instant, String)],
    now: Instant,
) -> Option<(State, String, Instant)> {
    let secs = |d: Duration| d.as_secs();
    if !obs.established.is_empty() {
        let stalled = obs
            .established
            .iter()
            .filter_map(|c| c.stalled_since.map(|s| (s, c)))
            .min_by_key(|(s, _)| *s)
            .filter(|(s, _)| now.saturating_duration_since(*s) >= t.blackhole_after);
        if let Some((since, conn)) = stalled {
            let reason = format!(
                "retransmitting to {} for {}s with no acknowledgement (blackhole_after {}s)",
                conn.endpoint,
                secs(now.saturating_duration_since(since)),
                secs(t.blackhole_after)
            );
            return Some((State::Blackholed, reason, since + t.blackhole_after));
        }
        let freshest = obs
            .established
            .iter()
            .max_by_key(|c| c.last_payload)
            .expect("non-empty");
        let quiet = now.saturating_duration_since(freshest.last_payload);
        if quiet >= t.stale_after {
            let reason = format!(
                "connected to {} but no payload received for {}s (stale_after {}s)",
                freshest.endpoint,
                secs(quiet),
                secs(t.stale_after)
            );
            return Some((State::Stale, reason, freshest.last_payload + t.stale_after));
        }
        let reason = format!(
            "connected to {}; last payload {}s ago",
            freshest.endpoint,
            secs(quiet)
        );
        return Some((State::Healthy, reason, now));
    }
    // A client that just lost its connection gets the disconnect grace to re-dial: failed
    // attempts inside it (an apiserver restarting, a client library's quick retries) are not
    // yet unreachability.
    let lost_within_grace = obs
        .connection_lost_at
        .is_some_and(|lost| now.saturating_duration_since(lost) < t.disconnect_grace);
    if recent_failures.len() >= t.connect_failures as usize && !lost_within_grace {
        let (_, endpoint) = recent_failures.last().expect("at least connect_failures >= 1");
        let reason = format!(
            "{} failed connects to {} in the last {}s and no established connection",
            recent_failures.len(),
            endpoint,
            secs(t.connect_window)
        );
        let nth = recent_failures[t.connect_failures.max(1) as usize - 1].0;
        let evidence = obs
            .connection_lost_at
            .map_or(nth, |lost| nth.max(lost + t.disconnect_grace));
        return Some((State::Unreachable, reason, evidence));
    }
    match obs.connection_lost_at {
        Some(lost) if now.saturating_duration_since(lost) >= t.disconnect_grace => {
            let reason = format!(
                "lost its apiserver connection {}s ago and has not reconnected (disconnect_grace {}s)",
                secs(now.saturating_duration_since(lost)),
                secs(t.disconnect_grace)
            );
            Some((State::Disconnected, reason, lost + t.disconnect_grace))
        }
        Some(_) => None,
        None => Some((State::Healthy, "no apiserver connection yet".to_owned(), now)),
    }
}

/// Node-level verdict: most clients lost the apiserver at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    pub affected: usize,
    pub clients: usize,
}

/// At least two clients, and more than half of them are not healthy.
pub fn assess_outage<'a>(verdicts: impl IntoIterator<Item = &'a Verdict>) -> Option<Outage> {
    let (mut clients, mut affected) = (0, 0);
    for v in verdicts.into_iter().filter(|v| v.is_client) {
        clients += 1;
        if v.state != State::Healthy {
            affected += 1;
        }
    }
    (clients >= 2 && affected * 2 > clients).then_some(Outage { affected, clients })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake clock: instants relative to a fixed origin.
    struct Clock(Instant);
    impl Clock {
        fn at(&self, secs: u64) -> Instant {
            self.0 + Duration::from_secs(secs)
        }
    }

    fn setup() -> (HealthEngine<u32>, Clock) {
        (HealthEngine::new(Thresholds::default()), Clock(Instant::now()))
    }

    fn conn(last_payload: Instant, stalled_since: Option<Instant>) -> ConnectionFacts {
        ConnectionFacts {
            endpoint: "10.0.0.1:6443".into(),
            last_payload,
            stalled_since,
        }
    }

    fn connected(c: &Clock, since: u64, payload: u64) -> Observation {
        Observation {
            connected_since: Some(c.at(since)),
            established: vec![conn(c.at(payload), None)],
            ..Default::default()
        }
    }

    #[test]
    fn young_process_is_listed_but_not_judged() {
        let (mut e, c) = setup();
        let (v, t) = e.evaluate(&1, &connected(&c, 0, 0), c.at(5));
        assert_eq!((v.state, v.is_client, t), (State::Healthy, false, None));
        assert!(v.reason.contains("not judged yet"), "{}", v.reason);
        // A short-lived tool that disconnects before min_client_age never alerts.
        let gone = Observation {
            connection_lost_at: Some(c.at(6)),
            ..Default::default()
        };
        let (v, t) = e.evaluate(&1, &gone, c.at(60));
        assert_eq!((v.state, v.is_client, t), (State::Healthy, false, None));
    }

    #[test]
    fn becomes_client_after_min_age_and_goes_stale_then_recovers() {
        let (mut e, c) = setup();
        let (v, t) = e.evaluate(&1, &connected(&c, 0, 5), c.at(10));
        assert_eq!((v.state, v.is_client), (State::Healthy, true));
        assert_eq!(t, None, "healthy at qualification is not a transition");
        let (v, t) = e.evaluate(&1, &connected(&c, 0, 5), c.at(94));
        assert_eq!(v.state, State::Healthy, "89 s quiet < stale_after");
        assert_eq!(t, None);
        let (v, t) = e.evaluate(&1, &connected(&c, 0, 5), c.at(96));
        assert_eq!(v.state, State::Stale);
        let t = t.expect("transition to stale");
        assert_eq!((t.from, t.to), (State::Healthy, State::Stale));
        assert_eq!(
            t.detection,
            Duration::from_secs(1),
            "evidence crossed at 95 s, judged at 96 s"
        );
        assert!(v.reason.contains("no payload received for 91s"), "{}", v.reason);
        assert_eq!(v.since, c.at(96));
        let (v, _) = e.evaluate(&1, &connected(&c, 0, 5), c.at(120));
        assert_eq!(v.since, c.at(96), "since does not move while the state holds");
        let (v, t) = e.evaluate(&1, &connected(&c, 0, 121), c.at(122));
        assert_eq!(v.state, State::Healthy);
        assert_eq!(
            t.map(|t| (t.from, t.detection)),
            Some((State::Stale, Duration::ZERO))
        );
    }

    #[test]
    fn blackholed_wins_over_stale_and_clears_with_ack_progress() {
        let (mut e, c) = setup();
        e.evaluate(&1, &connected(&c, 0, 0), c.at(10));
        let mut obs = connected(&c, 0, 30);
        obs.established[0].stalled_since = Some(c.at(31));
        let (v, _) = e.evaluate(&1, &obs, c.at(50));
        assert_eq!(v.state, State::Healthy, "19 s of retransmits < blackhole_after");
        let (v, t) = e.evaluate(&1, &obs, c.at(52));
        assert_eq!(v.state, State::Blackholed);
        assert_eq!(t.unwrap().detection, Duration::from_secs(1));
        assert!(
            v.reason.contains("retransmitting to 10.0.0.1:6443 for 21s"),
            "{}",
            v.reason
        );
        obs.established[0].stalled_since = None;
        obs.established[0].last_payload = c.at(53);
        assert_eq!(e.evaluate(&1, &obs, c.at(54)).0.state, State::Healthy);
    }

    #[test]
    fn disconnected_after_grace_unless_it_redials() {
        let (mut e, c) = setup();
        e.evaluate(&1, &connected(&c, 0, 0), c.at(20));
        let lost = Observation {
            connection_lost_at: Some(c.at(30)),
            ..Default::default()
        };
        let (v, t) = e.evaluate(&1, &lost, c.at(44));
        assert_eq!((v.state, t), (State::Healthy, None), "inside disconnect_grace");
        let (v, t) = e.evaluate(&1, &lost, c.at(46));
        assert_eq!(v.state, State::Disconnected);
        assert_eq!(t.unwrap().detection, Duration::from_secs(1));
        assert!(v.reason.contains("16s ago"), "{}", v.reason);
        // A re-dial inside the grace period never leaves healthy.
        let (mut e, c) = setup();
        e.evaluate(&2, &connected(&c, 0, 0), c.at(20));
        let lost = Observation {
            connection_lost_at: Some(c.at(30)),
            ..Default::default()
        };
        e.evaluate(&2, &lost, c.at(31));
        let (v, t) = e.evaluate(&2, &connected(&c, 32, 32), c.at(33));
        assert_eq!((v.state, t), (State::Healthy, None));
    }

    #[test]
    fn repeated_failures_make_a_never_connected_process_unreachable() {
        let (mut e, c) = setup();
        let mut obs = Observation::default();
        for (i, at) in [1u64, 3].iter().enumerate() {
            obs.failures.push((c.at(*at), "10.0.0.9:6443".into()));
            let (v, t) = e.evaluate(&1, &obs, c.at(*at));
            assert_eq!((v.is_client, t), (false, None), "after {} failures", i + 1);
        }
        obs.failures.push((c.at(5), "10.0.0.9:6443".into()));
        let (v, t) = e.evaluate(&1, &obs, c.at(6));
        assert_eq!((v.state, v.is_client), (State::Unreachable, true));
        assert_eq!(t.unwrap().detection, Duration::from_secs(1));
        assert!(
            v.reason.starts_with("3 failed connects to 10.0.0.9:6443"),
            "{}",
            v.reason
        );
        // Failures older than the window no longer count; it was never connected: healthy
        // again ("no connection yet"), still a client.
        let (v, t) = e.evaluate(&1, &obs, c.at(70));
        assert_eq!((v.state, v.is_client), (State::Healthy, true));
        assert_eq!(t.map(|t| t.from), Some(State::Unreachable));
    }

    #[test]
    fn a_client_that_lost_its_connection_gets_the_grace_before_failures_count() {
        let (mut e, c) = setup();
        e.evaluate(&1, &connected(&c, 0, 0), c.at(20));
        // The apiserver restarts at 30 s; the client library retries three times at once.
        let mut obs = Observation {
            connection_lost_at: Some(c.at(30)),
            ..Default::default()
        };
        obs.failures = [30u64, 30, 31]
            .iter()
            .map(|s| (c.at(*s), "10.0.0.1:6443".to_owned()))
            .collect();
        let (v, t) = e.evaluate(&1, &obs, c.at(32));
        assert_eq!(
            (v.state, t),
            (State::Healthy, None),
            "inside disconnect_grace: re-dialing"
        );
        // Still failing when the grace is over: unreachable (it is trying), not disconnected.
        obs.failures.push((c.at(44), "10.0.0.1:6443".to_owned()));
        let (v, t) = e.evaluate(&1, &obs, c.at(46));
        assert_eq!(v.state, State::Unreachable);
        assert_eq!(
            t.unwrap().detection,
            Duration::from_secs(1),
            "evidence: lost + grace = 45 s"
        );
    }

    #[test]
    fn failures_spread_wider_than_the_window_do_not_qualify() {
        let (mut e, c) = setup();
        let obs = Observation {
            failures: vec![
                (c.at(0), "e".into()),
                (c.at(40), "e".into()),
                (c.at(80), "e".into()),
            ],
            ..Default::default()
        };
        assert!(!e.evaluate(&1, &obs, c.at(81)).0.is_client);
    }

    #[test]
    fn selected_processes_are_clients_from_the_start() {
        let (mut e, c) = setup();
        let obs = Observation {
            selected: true,
            ..connected(&c, 0, 0)
        };
        assert!(e.evaluate(&1, &obs, c.at(1)).0.is_client);
    }

    #[test]
    fn forgotten_processes_start_over() {
        let (mut e, c) = setup();
        e.evaluate(&1, &connected(&c, 0, 0), c.at(20));
        e.retain(|k| *k != 1);
        assert!(!e.evaluate(&1, &connected(&c, 19, 19), c.at(20)).0.is_client);
    }

    #[test]
    fn outage_needs_most_of_at_least_two_clients() {
        let v = |state, is_client| Verdict {
            state,
            since: Instant::now(),
            reason: String::new(),
            is_client,
        };
        assert_eq!(
            assess_outage(&[v(State::Disconnected, true)]),
            None,
            "one client is not a node"
        );
        let two = [v(State::Disconnected, true), v(State::Unreachable, true)];
        assert_eq!(
            assess_outage(&two),
            Some(Outage {
                affected: 2,
                clients: 2
            })
        );
        let half = [v(State::Disconnected, true), v(State::Healthy, true)];
        assert_eq!(assess_outage(&half), None);
        let with_non_clients = [
            v(State::Disconnected, true),
            v(State::Stale, true),
            v(State::Healthy, true),
            v(State::Healthy, false),
        ];
        assert_eq!(
            assess_outage(&with_non_clients),
            Some(Outage {
                affected: 2,
                clients: 3
            })
        );
    }
}
