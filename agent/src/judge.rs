//! Applies the health engine and the endpoint reachability to the connection table once per
//! tick, and returns what it found as one immutable [`Snapshot`]: per client its identity,
//! pod, verdict (state, reason, endpoint, suspect sockets) and connections; the state changes;
//! every endpoint's reachability. Every action after the tick reads that snapshot.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::{Instant, SystemTime},
};

use lifeline_common::tcp_state;

use crate::{
    config::Select,
    endpoint::Endpoint,
    health::{Attempt, ConnectionFacts, Failure, HealthEngine, Loss, Observation, Thresholds},
    prober::Targets,
    reachability::{Probe, ProcessEvidence, Reachability},
    snapshot::{ClientKey, ClientSnapshot, ClientTransition, ConnectionSnapshot, PodOf, Snapshot},
    table::{ConnectionTable, ProcessRecord},
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
        now: Instant,
    ) -> Snapshot {
        let t = *self.engine.thresholds();
        let mut clients = Vec::new();
        let mut transitions = Vec::new();
        let mut seen = HashSet::new();
        let mut by_owner: HashMap<u32, Vec<ConnectionSnapshot>> = HashMap::new();
        let mut facts: HashMap<u32, Vec<ConnectionFacts>> = HashMap::new();
        let mut attempts: HashMap<u32, Vec<Attempt>> = HashMap::new();
        for c in table.connections() {
            let Some(pid) = c.owner else { continue };
            by_owner.entry(pid).or_default().push(ConnectionSnapshot {
                tuple: c.tuple,
                endpoint: c.endpoint,
                tcp_state: c.tcp_state,
                established_at: c.established_at,
                last_payload: c.last_payload,
                bytes_received: c.bytes_received,
                retransmits: c.retransmits,
            });
            match c.tcp_state {
                tcp_state::ESTABLISHED => facts.entry(pid).or_default().push(ConnectionFacts {
                    local: c.tuple.local,
                    endpoint: c.endpoint.to_string(),
                    last_payload: c.last_payload.unwrap_or(c.first_seen),
                    waiting_since: c.waiting(),
                    stalled_since: c.stalled_since,
                    unreadable: !c.readable(now)
                        && now.saturating_duration_since(c.first_seen) > crate::table::SAMPLE_MAX_AGE,
                }),
                tcp_state::SYN_SENT => attempts.entry(pid).or_default().push(Attempt {
                    since: c.first_seen,
                    endpoint: c.endpoint.to_string(),
                }),
                _ => {}
            }
        }
        for record in table.processes() {
            let key = (record.info.pid, record.info.start_time_ticks);
            let pod = pod_of(&record.info);
            let selected = self.select.matches(&record.info.comm, &record.info.cmdline);
            let obs = observe(
                record,
                selected || pod.as_ref().is_some_and(|p| p.monitor),
                facts.remove(&record.info.pid).unwrap_or_default(),
                attempts.remove(&record.info.pid).unwrap_or_default(),
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
            let mut connections = by_owner.remove(&record.info.pid).unwrap_or_default();
            connections.sort_by_key(|c| c.tuple.local);
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
                connections,
                selected,
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
        // A connection established is success; payload on an old one is not (an apiserver
        // draining its watches while its listener is closed still sends on them).
        let success = c.first_seen;
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
    for (endpoint, _) in table.endpoints().iter() {
        if let Some(addr) = endpoint.host_addr() {
            targets.entry(*endpoint).or_default().insert(addr);
        }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        health::State,
        reachability::{ProbeOutcome, Status},
        snapshot::no_pod,
        testkit::{counters, endpoint, Lab, APISERVER},
    };

    fn judge() -> Judge {
        Judge::new(Thresholds::default(), Select::default())
    }

    #[test]
    fn the_snapshot_carries_identity_verdict_endpoint_and_connections() {
        let mut lab = Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        lab.sample(19_000, 40000, counters(2000, 4, 600, 3));
        let mut j = judge();
        let snap = j.tick(&lab.table, &BTreeMap::new(), &no_pod, lab.at(20_000));
        assert_eq!(snap.clients.len(), 1);
        let c = &snap.clients[0];
        assert_eq!(c.key, (7, 1));
        assert_eq!((c.verdict.state, c.verdict.is_client), (State::Healthy, true));
        assert_eq!(c.verdict.endpoint.as_deref(), Some(APISERVER));
        assert_eq!(c.connections.len(), 1);
        assert_eq!(c.labels(), ["", "", "", "proc-7"].map(String::from));
        assert_eq!(snap.endpoints.len(), 1);
        assert_eq!(
            snap.endpoints[0].status,
            Status::Reachable,
            "a connection was established to it"
        );
    }

    #[test]
    fn an_endpoint_refusing_the_probe_and_two_processes_is_an_outage_after_outage_after() {
        let mut lab = Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        lab.connect(0, 0xb, 40001, 8);
        let t0 = lab.t0;
        let probe = |ms, outcome| {
            let at = t0 + Duration::from_millis(ms);
            BTreeMap::from([(endpoint(APISERVER), Probe { at, outcome })])
        };
        let mut j = judge();
        // The probe reached it before: its failures count.
        j.tick(
            &lab.table,
            &probe(5_000, ProbeOutcome::Answered(200)),
            &no_pod,
            lab.at(6_000),
        );
        // Both lose their connection (apiserver down) and fail to re-dial.
        lab.peer_close(10_000, 0xa, 40000);
        lab.peer_close(10_000, 0xb, 40001);
        for (pid, sk) in [(7, 0xc), (8, 0xd)] {
            lab.syn(11_000, sk, pid);
            lab.apply(
                11_000,
                sk,
                41000,
                crate::testkit::state(tcp_state::SYN_SENT, tcp_state::CLOSE),
                libc::ECONNREFUSED,
            );
        }
        let probes = probe(11_500, ProbeOutcome::Refused);
        let snap = j.tick(&lab.table, &probes, &no_pod, lab.at(12_000));
        assert_eq!(snap.endpoints[0].unreachable_since(), Some(lab.at(11_500)));
        assert!(!snap.endpoints[0].outage);
        let snap = j.tick(&lab.table, &probes, &no_pod, lab.at(41_499));
        assert!(!snap.endpoints[0].outage);
        let snap = j.tick(
            &lab.table,
            &probe(41_000, ProbeOutcome::Refused),
            &no_pod,
            lab.at(41_500),
        );
        assert!(snap.endpoints[0].outage, "unreachable for outage_after (30 s)");
        assert!(snap.unreachable(APISERVER).is_some());
    }

    #[test]
    fn clients_that_do_not_redial_while_others_do_are_disconnected_not_an_outage() {
        // Seeds 000/004 after an apiserver upgrade: three controllers never re-dial, another
        // one re-dials at once.
        let mut lab = Lab::new();
        for (pid, sk, port) in [
            (7, 0xa, 40000),
            (8, 0xb, 40001),
            (9, 0xc, 40002),
            (10, 0xd, 40003),
        ] {
            lab.connect(0, sk, port, pid);
        }
        let mut j = judge();
        j.tick(&lab.table, &BTreeMap::new(), &no_pod, lab.at(15_000));
        for (sk, port) in [(0xa, 40000), (0xb, 40001), (0xc, 40002), (0xd, 40003)] {
            lab.peer_close(20_000, sk, port);
        }
        lab.connect(21_000, 0xe, 40004, 10);
        let probes = BTreeMap::from([(
            endpoint(APISERVER),
            Probe {
                at: lab.at(22_000),
                outcome: ProbeOutcome::Answered(200),
            },
        )]);
        let snap = j.tick(&lab.table, &probes, &no_pod, lab.at(36_000));
        let states: Vec<(u32, State)> = snap.clients.iter().map(|c| (c.key.0, c.verdict.state)).collect();
        assert_eq!(
            states,
            [
                (7, State::Disconnected),
                (8, State::Disconnected),
                (9, State::Disconnected),
                (10, State::Healthy)
            ]
        );
        assert_eq!(snap.endpoints[0].status, Status::Reachable);
        assert_eq!(snap.transitions.len(), 3);
        assert!(snap
            .transitions
            .iter()
            .all(|t| t.transition.detection <= Duration::from_secs(1)));
    }

    #[test]
    fn a_proxy_failing_on_one_upstream_and_connecting_to_another_is_not_unreachable() {
        // haproxy with a dead upstream: its health checks fail on one, connect to the other
        // every second and close again.
        let mut lab = Lab::watching(&["10.0.0.1:6443", "10.0.0.3:6443"], "10.0.0.3:6443");
        let mut j = judge();
        for s in 0..30u64 {
            let ms = s * 1000;
            let sk = 0x100 + s;
            lab.connect(ms, sk, 40000 + s as u16, 7);
            j.tick(&lab.table, &BTreeMap::new(), &no_pod, lab.at(ms + 10));
            lab.close(ms + 20, sk, 40000 + s as u16);
            lab.remote = "10.0.0.1:6443".parse().unwrap();
            lab.syn(ms + 30, 0x1000 + s, 7);
            lab.apply(
                ms + 500,
                0x1000 + s,
                41000,
                crate::testkit::state(tcp_state::SYN_SENT, tcp_state::CLOSE),
                libc::ETIMEDOUT,
            );
            lab.remote = "10.0.0.3:6443".parse().unwrap();
            let snap = j.tick(&lab.table, &BTreeMap::new(), &no_pod, lab.at(ms + 600));
            let state = snap.clients.first().map(|c| c.verdict.state);
            assert_ne!(state, Some(State::Unreachable), "at {ms} ms");
        }
    }

    #[test]
    fn probe_targets_are_exact_endpoints_and_the_addresses_cidr_clients_use() {
        let mut lab = Lab::watching(&["10.0.0.0/24:6443", "10.9.0.1:443"], "[::ffff:10.0.0.1]:6443");
        lab.connect(0, 0xa, 40000, 7);
        let targets = probe_targets(&lab.table);
        let got: Vec<(String, Vec<String>)> = targets
            .iter()
            .map(|(e, a)| (e.to_string(), a.iter().map(|a| a.to_string()).collect()))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.0/24:6443".to_owned(), vec!["10.0.0.1:6443".to_owned()]),
                ("10.9.0.1:443".to_owned(), vec!["10.9.0.1:443".to_owned()]),
            ]
        );
    }
}
