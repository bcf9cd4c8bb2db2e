//! Is an apiserver endpoint reachable from this node? The outage verdict of SPEC.md, decided
//! per endpoint from reachability evidence only — never from a count of unhealthy clients
//! (a client that does not re-dial while others succeed is `disconnected`, not an outage).
//! Pure: no I/O and no clock of its own.
//!
//! Evidence, newest wins:
//!
//! - the agent's own probe of the endpoint ([`crate::prober`]): TCP connect, TLS handshake,
//!   `GET /readyz`. Refused, timed out or unroutable, or a 5xx answer: failure. Connected (with
//!   or without TLS) and answered below 500, or not speaking TLS at all: success. TLS up but no
//!   HTTP answer in time says nothing (a gateway may hold the request). A probe's failures
//!   count only once a probe has reached the endpoint: an agent that never could (its network
//!   namespace has no path that its clients have) measures itself, not the endpoint;
//! - processes on the node: a connection established to it is success (payload on an old one
//!   is not: a draining apiserver whose listener is closed still sends on its watches); failed
//!   connects by at least [`FAILING_PROCESSES`] different processes within `connect_window`,
//!   none of which then succeeded, is failure.
//!
//! An endpoint is *unreachable* from the newest failure that no success followed; the outage
//! alert fires once it has been so for `outage_after`. Client alerts it explains are held from
//! the first moment (see `alerts::book`).
use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::endpoint::Endpoint;

/// Failed connects of this many different processes are failure evidence without a probe.
pub const FAILING_PROCESSES: usize = 2;
/// A probe result older than this is no evidence (the probe itself is stuck or stopped).
pub const PROBE_MAX_AGE: Duration = Duration::from_secs(20);

/// How one probe of an endpoint ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Connection refused.
    Refused,
    /// No answer to the SYN in time.
    Timeout,
    /// No route (EHOSTUNREACH, ENETUNREACH).
    NoRoute,
    /// Connected, but the endpoint does not speak TLS (a plain TCP service): it is there.
    NoTls,
    /// TLS up, but no HTTP answer in time: no evidence either way (a gateway holding the
    /// request for a dead upstream, or a slow apiserver).
    NoAnswer,
    /// An HTTP answer with this status to `GET /readyz`.
    Answered(u16),
}

impl ProbeOutcome {
    /// `Some(true)`: success evidence, `Some(false)`: failure, `None`: neither.
    pub fn reachable(self) -> Option<bool> {
        match self {
            ProbeOutcome::Refused | ProbeOutcome::Timeout | ProbeOutcome::NoRoute => Some(false),
            ProbeOutcome::NoTls => Some(true),
            ProbeOutcome::NoAnswer => None,
            ProbeOutcome::Answered(code) => Some(code < 500),
        }
    }

    pub fn describe(self) -> String {
        match self {
            ProbeOutcome::Refused => "the agent's probe was refused".into(),
            ProbeOutcome::Timeout => "the agent's probe got no answer to its SYN".into(),
            ProbeOutcome::NoRoute => "the agent's probe found no route".into(),
            ProbeOutcome::NoTls => "the agent's probe connected".into(),
            ProbeOutcome::NoAnswer => "the agent's probe got no HTTP answer".into(),
            ProbeOutcome::Answered(code) => format!("the agent's probe of /readyz got HTTP {code}"),
        }
    }
}

/// The latest probe of one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub at: Instant,
    pub outcome: ProbeOutcome,
}

/// What the node's processes showed about one endpoint, from the connection table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessEvidence {
    /// The last connection established to it.
    pub last_success: Option<Instant>,
    /// Failed connects within `connect_window`: (pid, when), newest per pid.
    pub failures: BTreeMap<u32, Instant>,
}

/// The verdict on one endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "status")]
pub enum Status {
    Reachable,
    Unreachable {
        #[serde(skip)]
        since: Instant,
        /// One sentence: the evidence.
        reason: String,
    },
    /// No evidence yet.
    Unknown,
}

/// One endpoint's status this tick, and whether its outage alert is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    pub endpoint: Endpoint,
    pub status: Status,
    /// Unreachable for `outage_after`: the outage alert fires.
    pub outage: bool,
}

impl EndpointStatus {
    pub fn unreachable_since(&self) -> Option<Instant> {
        match self.status {
            Status::Unreachable { since, .. } => Some(since),
            _ => None,
        }
    }
}

/// Per-endpoint memory: when each became unreachable, and which the probe has reached.
#[derive(Debug, Default)]
pub struct Reachability {
    unreachable_since: BTreeMap<Endpoint, Instant>,
    probe_reached: BTreeSet<Endpoint>,
}

impl Reachability {
    /// Judges every endpoint in `endpoints` from its probe and process evidence at `now`.
    pub fn assess(
        &mut self,
        endpoints: &BTreeSet<Endpoint>,
        probes: &BTreeMap<Endpoint, Probe>,
        processes: &BTreeMap<Endpoint, ProcessEvidence>,
        outage_after: Duration,
        now: Instant,
    ) -> Vec<EndpointStatus> {
        self.unreachable_since.retain(|e, _| endpoints.contains(e));
        self.probe_reached.retain(|e| endpoints.contains(e));
        let none = ProcessEvidence::default();
        endpoints
            .iter()
            .map(|endpoint| {
                let probe = probes
                    .get(endpoint)
                    .filter(|p| now.saturating_duration_since(p.at) <= PROBE_MAX_AGE);
                if probe.is_some_and(|p| p.outcome.reachable() == Some(true)) {
                    self.probe_reached.insert(*endpoint);
                }
                let trusted = self.probe_reached.contains(endpoint);
                let probe = probe.filter(|p| trusted || p.outcome.reachable() != Some(false));
                let evidence = processes.get(endpoint).unwrap_or(&none);
                let status = match judge(probe, evidence) {
                    Some(Verdict::Down { at, reason }) => {
                        let since = *self.unreachable_since.entry(*endpoint).or_insert(at);
                        Status::Unreachable { since, reason }
                    }
                    Some(Verdict::Up) => {
                        self.unreachable_since.remove(endpoint);
                        Status::Reachable
                    }
                    None => match self.unreachable_since.get(endpoint) {
                        // No fresh evidence either way: an unreachable endpoint stays so.
                        Some(since) => Status::Unreachable {
                            since: *since,
                            reason: "no evidence it came back".into(),
                        },
                        None => Status::Unknown,
                    },
                };
                let outage = matches!(&status, Status::Unreachable { since, .. }
                    if now.saturating_duration_since(*since) >= outage_after);
                EndpointStatus {
                    endpoint: *endpoint,
                    status,
                    outage,
                }
            })
            .collect()
    }
}

enum Verdict {
    Up,
    Down { at: Instant, reason: String },
}

/// The newest evidence decides.
fn judge(probe: Option<&Probe>, evidence: &ProcessEvidence) -> Option<Verdict> {
    let mut success = evidence.last_success;
    let mut failure: Option<(Instant, String)> = None;
    if let Some(p) = probe {
        match p.outcome.reachable() {
            Some(true) => success = success.max(Some(p.at)),
            Some(false) => failure = Some((p.at, p.outcome.describe())),
            None => {}
        }
    }
    // Several processes failing, each after the last success.
    let failing: Vec<Instant> = evidence
        .failures
        .values()
        .copied()
        .filter(|at| success.is_none_or(|s| *at > s))
        .collect();
    if failing.len() >= FAILING_PROCESSES {
        let at = *failing.iter().max().expect("non-empty");
        let reason = format!("{} processes on this node failed to connect", failing.len());
        failure = Some(match failure {
            Some((probe_at, probe)) => (probe_at.max(at), format!("{probe}; {reason}")),
            None => (at, reason),
        });
    }
    match (failure, success) {
        (Some((at, reason)), s) if s.is_none_or(|s| at > s) => Some(Verdict::Down { at, reason }),
        (_, Some(_)) => Some(Verdict::Up),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Clock(Instant);
    impl Clock {
        fn at(&self, s: u64) -> Instant {
            self.0 + Duration::from_secs(s)
        }
    }

    fn ep() -> Endpoint {
        Endpoint::parse_all("10.0.0.1:6443").unwrap()[0]
    }

    fn assess(
        r: &mut Reachability,
        probe: Option<Probe>,
        evidence: ProcessEvidence,
        now: Instant,
    ) -> EndpointStatus {
        let endpoints = BTreeSet::from([ep()]);
        let probes = probe.map(|p| BTreeMap::from([(ep(), p)])).unwrap_or_default();
        let processes = BTreeMap::from([(ep(), evidence)]);
        let mut out = r.assess(&endpoints, &probes, &processes, Duration::from_secs(30), now);
        out.remove(0)
    }

    fn probe(c: &Clock, at: u64, outcome: ProbeOutcome) -> Option<Probe> {
        Some(Probe {
            at: c.at(at),
            outcome,
        })
    }

    #[test]
    fn probe_outcomes() {
        assert_eq!(ProbeOutcome::Answered(200).reachable(), Some(true));
        assert_eq!(
            ProbeOutcome::Answered(401).reachable(),
            Some(true),
            "an apiserver that answers"
        );
        assert_eq!(ProbeOutcome::Answered(503).reachable(), Some(false), "not ready");
        assert_eq!(ProbeOutcome::NoTls.reachable(), Some(true));
        assert_eq!(ProbeOutcome::NoAnswer.reachable(), None);
        for down in [
            ProbeOutcome::Refused,
            ProbeOutcome::Timeout,
            ProbeOutcome::NoRoute,
        ] {
            assert_eq!(down.reachable(), Some(false));
        }
    }

    #[test]
    fn a_failing_probe_makes_it_unreachable_and_the_outage_waits_for_outage_after() {
        let c = Clock(Instant::now());
        let mut r = Reachability::default();
        let s = assess(
            &mut r,
            probe(&c, 0, ProbeOutcome::Answered(200)),
            Default::default(),
            c.at(0),
        );
        assert_eq!((s.status, s.outage), (Status::Reachable, false));
        let s = assess(
            &mut r,
            probe(&c, 5, ProbeOutcome::Refused),
            Default::default(),
            c.at(5),
        );
        assert_eq!(s.unreachable_since(), Some(c.at(5)));
        assert!(!s.outage);
        // A routine restart: back within outage_after, no outage.
        let s = assess(
            &mut r,
            probe(&c, 10, ProbeOutcome::Answered(200)),
            Default::default(),
            c.at(10),
        );
        assert_eq!(s.status, Status::Reachable);
        // A real outage.
        assess(
            &mut r,
            probe(&c, 20, ProbeOutcome::Timeout),
            Default::default(),
            c.at(20),
        );
        let s = assess(
            &mut r,
            probe(&c, 45, ProbeOutcome::Refused),
            Default::default(),
            c.at(49),
        );
        assert_eq!((s.unreachable_since(), s.outage), (Some(c.at(20)), false));
        let s = assess(
            &mut r,
            probe(&c, 50, ProbeOutcome::Refused),
            Default::default(),
            c.at(50),
        );
        assert!(s.outage, "unreachable for 30 s");
        match s.status {
            Status::Unreachable { reason, .. } => assert!(reason.contains("refused"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_processes_succeeding_means_reachable_whatever_one_client_does() {
        // Three controllers that never re-dial lost their connections; others re-dialed.
        let c = Clock(Instant::now());
        let mut r = Reachability::default();
        let evidence = ProcessEvidence {
            last_success: Some(c.at(12)),
            failures: BTreeMap::from([(1, c.at(10)), (2, c.at(11))]),
        };
        let s = assess(&mut r, None, evidence, c.at(60));
        assert_eq!(s.status, Status::Reachable);
    }

    #[test]
    fn several_processes_failing_without_a_probe_is_unreachable_one_is_not() {
        let c = Clock(Instant::now());
        let mut r = Reachability::default();
        let one = ProcessEvidence {
            last_success: Some(c.at(0)),
            failures: BTreeMap::from([(1, c.at(10))]),
        };
        assert_eq!(assess(&mut r, None, one, c.at(11)).status, Status::Reachable);
        let two = ProcessEvidence {
            last_success: Some(c.at(0)),
            failures: BTreeMap::from([(1, c.at(10)), (2, c.at(12))]),
        };
        let s = assess(&mut r, None, two.clone(), c.at(13));
        assert_eq!(s.unreachable_since(), Some(c.at(12)));
        // Keeps its start while the failures go on; a success ends it.
        let mut more = two;
        more.failures.insert(3, c.at(20));
        assert_eq!(
            assess(&mut r, None, more.clone(), c.at(21)).unreachable_since(),
            Some(c.at(12))
        );
        more.last_success = Some(c.at(22));
        assert_eq!(assess(&mut r, None, more, c.at(23)).status, Status::Reachable);
    }

    #[test]
    fn a_gateway_that_holds_the_probe_is_no_evidence() {
        let c = Clock(Instant::now());
        let mut r = Reachability::default();
        let s = assess(
            &mut r,
            probe(&c, 0, ProbeOutcome::NoAnswer),
            Default::default(),
            c.at(0),
        );
        assert_eq!(s.status, Status::Unknown);
        // Stale probes are no evidence either.
        let s = assess(
            &mut r,
            probe(&c, 0, ProbeOutcome::Refused),
            Default::default(),
            c.at(21),
        );
        assert_eq!(s.status, Status::Unknown);
    }

    #[test]
    fn a_probe_that_never_reached_the_endpoint_is_no_evidence() {
        // The agent's namespace has no route where its clients have one.
        let c = Clock(Instant::now());
        let mut r = Reachability::default();
        let clients_fine = ProcessEvidence {
            last_success: Some(c.at(0)),
            ..Default::default()
        };
        for t in [5, 10, 15] {
            let s = assess(
                &mut r,
                probe(&c, t, ProbeOutcome::NoRoute),
                clients_fine.clone(),
                c.at(t),
            );
            assert_eq!(s.status, Status::Reachable, "t={t}");
        }
        // Once it has reached it, its failures count.
        assess(
            &mut r,
            probe(&c, 20, ProbeOutcome::Answered(200)),
            clients_fine.clone(),
            c.at(20),
        );
        let s = assess(
            &mut r,
            probe(&c, 25, ProbeOutcome::Refused),
            clients_fine,
            c.at(25),
        );
        assert_eq!(s.unreachable_since(), Some(c.at(25)));
    }
}
