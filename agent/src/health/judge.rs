//! Applies the health engine and the endpoint reachability to the connection table once per
//! tick, and returns what it found as one immutable [`Snapshot`]: per client its identity,
//! pod, verdict (state, reason, endpoint, suspect sockets) and connections; the state changes;
//! every endpoint's reachability. Every action after the tick reads that snapshot.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::SocketAddr,
    time::{Instant, SystemTime},
};

use lifeline_common::tcp_state;

use crate::{
    endpoint::Endpoint,
    health::reachability::{ProcessEvidence, Reachability},
    health::snapshot::{
        ClientKey, ClientSnapshot, ClientTransition, ConnectionSnapshot, PodOf, Snapshot, StreamSnapshot,
        VisibilityOf,
    },
    health::{Attempt, ConnectionFacts, Failure, HealthEngine, Loss, Observation, Thresholds, MAX_WATCH},
    host::prober::Probe,
    host::prober::Targets,
    table::streams::Stuck,
    table::{Connection, ConnectionTable, ProcessRecord},
};

pub struct Judge {
    engine: HealthEngine<ClientKey>,
    reachability: Reachability,
    select: Select,
}

impl Judge {
    pub fn new(thresholds: Thresholds, select: Select) -> Self {
        Self {
            engine: HealthEngine::new(thresholds),
            reachability: Reachability::default(),
            select,
        }
    }

    pub fn reconfigure(&mut self, thresholds: Thresholds, select: Select) {
        self.engine.set_thresholds(thresholds);
        self.select = select;
    }

    /// Judges every process in the table and every endpoint; forgets processes the table
    /// forgot. `pod_of` names a process's pod (whose `lifeline.dev/monitor` annotation selects
    /// it); `probes` are the agent's own latest probes of the endpoints.
    pub fn tick(
        &mut self,
        table: &ConnectionTable,
        probes: &BTreeMap<Endpoint, Probe>,
        pod_of: PodOf<'_>,
        visibility: VisibilityOf<'_>,
        now: Instant,
    ) -> Snapshot {
        let t = *self.engine.thresholds();
        let mut clients = Vec::new();
        let mut transitions = Vec::new();
        let mut seen = HashSet::new();
        let mut groups = group_by_owner(table, &t, now);
        for record in table.processes() {
            let key = (record.info.pid, record.info.start_time_ticks);
            let pod = pod_of(&record.info);
            let selected = self.select.matches(&record.info.comm, &record.info.cmdline);
            let group = groups.remove(&record.info.pid).unwrap_or_default();
            let obs = observe(
                record,
                selected || pod.as_ref().is_some_and(|p| p.monitor),
                group.facts,
                group.attempts,
            );
            let (verdict, transition) = self.engine.evaluate(&key, &obs, now);
            seen.insert(key);
            if let Some(transition) = transition {
                transitions.push(ClientTransition {
                    key,
                    transition,
                    endpoint: verdict.endpoint.clone(),
                });
            }
            clients.push(ClientSnapshot {
                key,
                process: record.info.clone(),
                pod,
                recent_failures: obs
                    .failures
                    .iter()
                    .filter(|f| now.saturating_duration_since(f.at) <= t.connect_window)
                    .count() as u32,
                verdict,
                connections: group.connections,
                selected,
                visibility: visibility(key),
                streams_judged: group.judged,
            });
        }
        self.engine.retain(|k| seen.contains(k));
        clients.sort_by_key(|c| c.key);
        let endpoints: BTreeSet<Endpoint> = table.endpoints().iter().map(|(e, _)| *e).collect();
        let evidence = process_evidence(table, &t, now);
        let endpoints = self
            .reachability
            .assess(&endpoints, probes, &evidence, t.outage_after, now);
        Snapshot {
            at: now,
            wall: SystemTime::now(),
            clients,
            transitions,
            endpoint_set: table.endpoints().clone(),
            endpoints,
            thresholds: t,
        }
    }
}

/// One owner's connections as the tick sees them.
#[derive(Default)]
struct Group {
    /// Its streams are judged: a response to a request it made was seen on one of its
    /// connections, proving the probes live both ways on the HTTP/2 code it uses (a binary
    /// with two copies of it, one probed on the write side only, would otherwise pair its
    /// requests with frames never read).
    judged: bool,
    /// In local-address order.
    connections: Vec<ConnectionSnapshot>,
    facts: Vec<ConnectionFacts>,
    attempts: Vec<Attempt>,
}

/// Every owned connection's snapshot and facts, grouped by owner. References are sorted by
/// (owner, local address), an integer key copied beside each (a comparison that read it
/// through the reference would miss the cache: the table is touched once a second), rather
/// than ~200-byte snapshots; each owner's connections come as one run, so that a connection
/// costs no hash lookup (a busy controller holds thousands, judged every second).
fn group_by_owner(table: &ConnectionTable, t: &Thresholds, now: Instant) -> HashMap<u32, Group> {
    // Sized once: grown by doubling, a busy controller's thousands would be copied again and
    // again each second.
    let mut ordered: Vec<(OwnerKey, bool, &Connection)> = Vec::with_capacity(table.connection_count());
    ordered.extend(
        table
            .connections()
            .filter_map(|c| Some((owner_key(c.owner?, c.tuple.local), c.streams.responded, c))),
    );
    ordered.sort_unstable_by_key(|&(key, _, _)| key);
    let mut groups = HashMap::new();
    for run in ordered.chunk_by(|a, b| owner_of(a.0) == owner_of(b.0)) {
        let judged = run.iter().any(|&(_, responded, _)| responded);
        let mut group = Group {
            judged,
            connections: Vec::with_capacity(run.len()),
            facts: Vec::with_capacity(run.len()),
            attempts: Vec::new(),
        };
        for (i, &(_, _, c)) in run.iter().enumerate() {
            // Visited in address order, not memory order: fetched a few ahead, their misses
            // overlap (the tick at 3,000 connections: ~470 -> ~320 us).
            if let Some(&(_, _, ahead)) = run.get(i + PREFETCH_AHEAD) {
                ahead.prefetch();
            }
            let stuck = if judged {
                c.streams.stuck(now, t.stale_after, t.watch_grace, MAX_WATCH)
            } else {
                Vec::new()
            };
            group.connections.push(ConnectionSnapshot {
                tuple: c.tuple,
                endpoint: c.endpoint,
                tcp_state: c.tcp_state,
                established_at: c.established_at,
                last_payload: c.last_payload,
                bytes_received: c.bytes_received,
                retransmits: c.retransmits,
                streams: stream_snapshots(c, &stuck, judged),
                gap: c.gap.filter(|g| g.current(now)),
            });
            match c.tcp_state {
                tcp_state::ESTABLISHED => group.facts.push(ConnectionFacts {
                    local: c.tuple.local,
                    endpoint: c.endpoint,
                    last_payload: c.last_payload.unwrap_or(c.first_seen),
                    // Byte order stays the evidence of rule A on every connection: a client
                    // that gives up each request at its own timeout (a lease GET with
                    // timeout=10s behind a dead gateway) leaves no single stream unanswered for
                    // stale_after, but its connection answers nothing for that long.
                    waiting_since: c.waiting(now, judged),
                    stuck,
                    stalled_since: c.stalled_since,
                    unreadable: !c.readable(now)
                        && now.saturating_duration_since(c.first_seen) > crate::table::SAMPLE_MAX_AGE,
                }),
                tcp_state::SYN_SENT => group.attempts.push(Attempt {
                    since: c.first_seen,
                    endpoint: c.endpoint.to_string(),
                }),
                _ => {}
            }
        }
        groups.insert(owner_of(run[0].0), group);
    }
    groups
}

/// How many connections ahead of the one judged are fetched.
const PREFETCH_AHEAD: usize = 6;

/// (owner and address family, address, port): in the order of `(pid, SocketAddr)`.
type OwnerKey = (u64, u128, u16);

fn owner_key(pid: u32, local: SocketAddr) -> OwnerKey {
    match local {
        SocketAddr::V4(a) => (u64::from(pid) << 1, u128::from(a.ip().to_bits()), a.port()),
        SocketAddr::V6(a) => (u64::from(pid) << 1 | 1, a.ip().to_bits(), a.port()),
    }
}

fn owner_of(key: OwnerKey) -> u32 {
    (key.0 >> 1) as u32
}

/// A connection's open streams for the snapshot, `stuck` ones marked (none unless `judged`).
fn stream_snapshots(c: &Connection, stuck: &[Stuck], judged: bool) -> Vec<StreamSnapshot> {
    c.streams
        .open()
        .map(|s| StreamSnapshot {
            id: s.id,
            request: s.request.clone(),
            started: s.started,
            response_at: s.response_at,
            last_frame: s.last_frame,
            deadline: s.deadline(MAX_WATCH),
            stuck: stuck.iter().any(|k| k.stream == s.id),
            whole: s.whole && judged,
        })
        .collect()
}

/// What the engine needs to know about one process.
fn observe(
    record: &ProcessRecord,
    selected: bool,
    established: Vec<ConnectionFacts>,
    attempts: Vec<Attempt>,
) -> Observation {
    Observation {
        selected,
        connected_since: record.connected_since,
        loss: record.loss.map(|l| Loss {
            at: l.at,
            cause: l.cause,
            endpoint: l.endpoint.to_string(),
        }),
        established,
        attempts,
        // Failures before its last established connection say nothing about now.
        failures: record
            .connect_failures
            .iter()
            .filter(|f| record.last_established.is_none_or(|e| f.at > e))
            .map(|f| Failure {
                at: f.at,
                endpoint: f.endpoint.to_string(),
            })
            .collect(),
        trying_since: record.trying_since,
        rhythm: record.rhythm,
    }
}

/// Per endpoint, what the node's processes show: the last connection established to it, and
/// each process's newest failed connect within the window.
fn process_evidence(
    table: &ConnectionTable,
    t: &Thresholds,
    now: Instant,
) -> BTreeMap<Endpoint, ProcessEvidence> {
    let mut out: BTreeMap<Endpoint, ProcessEvidence> = BTreeMap::new();
    for c in table.connections() {
        if c.tcp_state != tcp_state::ESTABLISHED || c.owner.is_none() {
            continue;
        }
        // A new connection answered is success: established is not (a stopped apiserver's
        // kernel still completes TCP handshakes), and payload on an old one is not (an
        // apiserver draining its watches while its listener is closed still sends on them).
        let Some(success) = c.first_answer else {
            continue;
        };
        let e = out.entry(c.endpoint).or_default();
        e.last_success = e.last_success.max(Some(success));
    }
    for p in table.processes() {
        for f in p
            .connect_failures
            .iter()
            .filter(|f| now.saturating_duration_since(f.at) <= t.connect_window)
        {
            let e = out.entry(f.endpoint).or_default();
            let newest = e.failures.entry(p.info.pid).or_insert(f.at);
            *newest = (*newest).max(f.at);
        }
    }
    out
}

/// What the agent's probe should try, per endpoint: an exact endpoint's own address, and for
/// a CIDR endpoint the addresses its clients connect to.
pub fn probe_targets(table: &ConnectionTable) -> Targets {
    let mut targets = Targets::new();
    let mut cidr = false;
    for (endpoint, _) in table.endpoints().iter() {
        match endpoint.host_addr() {
            Some(addr) => {
                targets.entry(*endpoint).or_default().insert(addr);
            }
            None => cidr = true,
        }
    }
    // Only a CIDR endpoint's targets come from the connections (walked every second).
    if !cidr {
        return targets;
    }
    for c in table.connections() {
        if c.endpoint.host_addr().is_none() {
            let remote = std::net::SocketAddr::new(
                crate::endpoint::canonical_ip(c.tuple.remote.ip()),
                c.tuple.remote.port(),
            );
            targets.entry(c.endpoint).or_default().insert(remote);
        }
    }
    targets
}

/// Processes that are clients besides auto-detection: patterns matched against the process
/// name (`comm`) or its command line; `*` matches any run of characters, and a pattern without
/// `*` must match the whole value.
#[derive(Clone, Debug, Default, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Select {
    #[serde(default)]
    pub comm: Vec<String>,
    #[serde(default)]
    pub cmdline: Vec<String>,
}

impl Select {
    pub fn matches(&self, comm: &str, cmdline: &str) -> bool {
        self.comm.iter().any(|p| glob(p, comm)) || self.cmdline.iter().any(|p| glob(p, cmdline))
    }
}

/// `*`-only glob: `kube-*`, `*operator*`, `exact`.
pub fn glob(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests;
