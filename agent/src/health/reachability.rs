//! Is an apiserver endpoint reachable from this node? The outage verdict of SPEC.md, decided
//! per endpoint from reachability evidence only — never from a count of unhealthy clients
//! (a client that does not re-dial while others succeed is `disconnected`, not an outage).
//! Pure: no I/O and no clock of its own.
//!
//! Evidence, newest wins:
//!
//! - the agent's own probe of the endpoint ([`crate::host::prober`]): TCP connect, TLS handshake,
//!   `GET /readyz`. Refused, timed out or unroutable, a TLS handshake that gets no answer in
//!   time (a stopped, deadlocked or overloaded apiserver: its kernel still accepts), or a 5xx
//!   answer: failure. Connected and answered below 500, or answered something that is not TLS:
//!   success. TLS up but no HTTP answer in time says nothing (a gateway may hold the request).
//!   A probe's failures count only once a probe has reached the endpoint (a TCP connection
//!   accepted): an agent that never could (its network namespace has no path that its clients
//!   have) measures itself, not the endpoint;
//! - processes on the node: a new connection answered (its first payload, the TLS handshake's
//!   as a rule) is success — established is not (a stopped apiserver's kernel still completes
//!   TCP handshakes), and payload on an old one is not (a draining apiserver whose listener is
//!   closed still sends on its watches); failed
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

use crate::{endpoint::Endpoint, host::prober::Probe};

/// Failed connects of this many different processes are failure evidence without a probe.
pub const FAILING_PROCESSES: usize = 2;
/// A probe result older than this is no evidence (the probe itself is stuck or stopped).
pub const PROBE_MAX_AGE: Duration = Duration::from_secs(20);

/// What the node's processes showed about one endpoint, from the connection table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessEvidence {
    /// The last new connection to it that was answered.
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
                if probe.is_some_and(|p| p.outcome.connected()) {
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
mod tests;
