use super::*;
use crate::host::prober::ProbeOutcome;

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
        ProbeOutcome::TlsTimeout,
    ] {
        assert_eq!(down.reachable(), Some(false));
    }
}

#[test]
fn a_stuck_apiserver_is_unreachable_and_becomes_an_outage() {
    // SIGSTOPped or deadlocked: the kernel accepts the probe's connection, nothing answers
    // its ClientHello. The clients' connections were established before it stopped, and the
    // agent started after: its probe never saw the endpoint answer.
    let c = Clock(Instant::now());
    let mut r = Reachability::default();
    let clients = ProcessEvidence {
        last_success: Some(c.at(0)),
        ..Default::default()
    };
    let mut first = None;
    for t in (5..=40).step_by(5) {
        let s = assess(
            &mut r,
            probe(&c, t, ProbeOutcome::TlsTimeout),
            clients.clone(),
            c.at(t + 3),
        );
        let since = s.unreachable_since().unwrap_or_else(|| panic!("t={t}: {s:?}"));
        assert_eq!(since, *first.get_or_insert(since), "t={t}");
        assert_eq!(s.outage, t + 3 >= 35, "t={t}");
        match s.status {
            Status::Unreachable { reason, .. } => {
                assert!(reason.contains("TLS handshake got no answer"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(first, Some(c.at(5)));
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
