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

const EP: &str = "10.0.0.1:6443";

fn conn(last_payload: Instant) -> ConnectionFacts {
    ConnectionFacts {
        local: "10.0.0.2:40000".parse().unwrap(),
        endpoint: {
            let addr: std::net::SocketAddr = EP.parse().unwrap();
            Endpoint::exact(addr.ip(), addr.port())
        },
        last_payload,
        waiting_since: None,
        stalled_since: None,
        unreadable: false,
        stuck: Vec::new(),
    }
}

fn connected(c: &Clock, since: u64, payload: u64) -> Observation {
    Observation {
        connected_since: Some(c.at(since)),
        established: vec![conn(c.at(payload))],
        ..Default::default()
    }
}

fn lost(c: &Clock, at: u64, cause: LossCause) -> Observation {
    Observation {
        loss: Some(Loss {
            at: c.at(at),
            cause,
            endpoint: EP.into(),
        }),
        ..Default::default()
    }
}

fn failures(c: &Clock, at: &[u64]) -> Vec<Failure> {
    at.iter()
        .map(|s| Failure {
            at: c.at(*s),
            endpoint: EP.into(),
        })
        .collect()
}

fn attempt(c: &Clock, since: u64) -> Attempt {
    Attempt {
        since: c.at(since),
        endpoint: EP.into(),
    }
}

/// Makes process 1 a client, healthy, at 20 s.
fn client(e: &mut HealthEngine<u32>, c: &Clock) {
    let (v, _) = e.evaluate(&1, &connected(c, 0, 15), c.at(20));
    assert_eq!((v.state, v.is_client), (State::Healthy, true));
}

#[test]
fn young_process_is_listed_but_not_judged() {
    let (mut e, c) = setup();
    let (v, t) = e.evaluate(&1, &connected(&c, 0, 0), c.at(5));
    assert_eq!((v.state, v.is_client, t), (State::Healthy, false, None));
    assert!(v.reason.contains("not judged yet"), "{}", v.reason);
    // A short-lived tool that disconnects before min_client_age never alerts.
    let (v, t) = e.evaluate(&1, &lost(&c, 6, LossCause::PeerClosed), c.at(60));
    assert_eq!((v.state, v.is_client, t), (State::Healthy, false, None));
}

#[test]
fn a_quiet_watch_is_healthy_however_long_before_its_rhythm_is_known() {
    // kube-proxy on a quiet cluster: nothing received for minutes, nothing asked.
    let (mut e, c) = setup();
    for at in [20, 130, 600, 3000, 65 * 60 - 1] {
        let (v, t) = e.evaluate(&1, &connected(&c, 0, 0), c.at(at));
        assert_eq!((v.state, t), (State::Healthy, None), "at {at}s: {}", v.reason);
    }
    // Past silence_max (65 min) with no rhythm learned: stale (rule B).
    let (v, t) = e.evaluate(&1, &connected(&c, 0, 0), c.at(65 * 60 + 1));
    assert_eq!(v.state, State::Stale);
    assert_eq!(t.unwrap().detection, Duration::from_secs(1));
    assert!(v.reason.contains("silence_max 3900s"), "{}", v.reason);
}

#[test]
fn a_request_unanswered_for_stale_after_is_stale_and_an_answer_heals() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    let mut obs = connected(&c, 0, 15);
    obs.established[0].waiting_since = Some(c.at(30));
    obs.rhythm.last_request = Some(c.at(30));
    let (v, t) = e.evaluate(&1, &obs, c.at(119));
    assert_eq!((v.state, t), (State::Healthy, None), "89 s < stale_after");
    assert!(v.reason.contains("waiting 89s for an answer"), "{}", v.reason);
    let (v, t) = e.evaluate(&1, &obs, c.at(121));
    assert_eq!(v.state, State::Stale);
    let t = t.expect("transition");
    assert_eq!(
        (t.from, t.to, t.detection),
        (State::Healthy, State::Stale, Duration::from_secs(1))
    );
    assert!(
        v.reason.contains("sent a request to 10.0.0.1:6443 91s ago"),
        "{}",
        v.reason
    );
    assert_eq!(v.endpoint.as_deref(), Some(EP));
    assert_eq!(
        v.suspects,
        [obs.established[0].local],
        "the waiting socket is what a reset destroys"
    );
    // The answer arrives.
    obs.established[0].waiting_since = None;
    obs.established[0].last_payload = c.at(122);
    let (v, t) = e.evaluate(&1, &obs, c.at(123));
    assert_eq!(v.state, State::Healthy);
    assert_eq!(
        t.map(|t| (t.from, t.detection)),
        Some((State::Stale, Duration::ZERO))
    );
}

#[test]
fn rule_b_learns_the_rhythm_and_never_goes_below_the_floor() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    // A kube crate watcher: a request every 290 s.
    let mut obs = connected(&c, 0, 600);
    obs.rhythm = Rhythm {
        last_request: Some(c.at(600)),
        longest_gap: Duration::from_secs(290),
        gaps: 2,
    };
    // Twice 290 s is 580 s, under the 11 min floor: 660 s counts.
    let (v, _) = e.evaluate(&1, &obs, c.at(600 + 659));
    assert_eq!(v.state, State::Healthy, "{}", v.reason);
    let (v, t) = e.evaluate(&1, &obs, c.at(600 + 661));
    assert_eq!(v.state, State::Stale);
    assert_eq!(t.unwrap().detection, Duration::from_secs(1));
    assert!(v.reason.contains("silence_floor 660s"), "{}", v.reason);
    // A python watch without timeout: requests 31–58 min apart; twice the longest rules.
    let (mut e, c) = setup();
    client(&mut e, &c);
    obs.rhythm.longest_gap = Duration::from_secs(58 * 60);
    let (v, _) = e.evaluate(&1, &obs, c.at(600 + 115 * 60));
    assert_eq!(v.state, State::Healthy, "115 min < 2 × 58 min: {}", v.reason);
    let (v, _) = e.evaluate(&1, &obs, c.at(600 + 117 * 60));
    assert_eq!(v.state, State::Stale);
    // Inbound payload counts as activity too.
    let (mut e, c) = setup();
    client(&mut e, &c);
    obs.rhythm.longest_gap = Duration::from_secs(290);
    obs.established[0].last_payload = c.at(1200);
    let (v, _) = e.evaluate(&1, &obs, c.at(1200 + 659));
    assert_eq!(v.state, State::Healthy, "{}", v.reason);
}

#[test]
fn blackholed_wins_over_stale_and_clears_with_ack_progress() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    let mut obs = connected(&c, 0, 30);
    obs.established[0].stalled_since = Some(c.at(31));
    obs.established[0].waiting_since = Some(c.at(31));
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
    assert_eq!(e.evaluate(&1, &obs, c.at(200)).0.state, State::Blackholed);
    obs.established[0].stalled_since = None;
    obs.established[0].waiting_since = None;
    obs.established[0].last_payload = c.at(201);
    assert_eq!(e.evaluate(&1, &obs, c.at(202)).0.state, State::Healthy);
}

#[test]
fn evidence_that_could_not_be_read_judges_nothing() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    let mut obs = connected(&c, 0, 15);
    obs.established[0].waiting_since = Some(c.at(16));
    obs.established[0].unreadable = true;
    let (v, t) = e.evaluate(&1, &obs, c.at(4000));
    assert_eq!(
        (v.state, t),
        (State::Healthy, None),
        "no verdict from unread samples"
    );
    assert!(v.reason.contains("could not be read"), "{}", v.reason);
    // A stale client whose statistics become unreadable stays stale, it is not forgiven.
    obs.established[0].unreadable = false;
    assert_eq!(e.evaluate(&1, &obs, c.at(4001)).0.state, State::Stale);
    obs.established[0].unreadable = true;
    assert_eq!(e.evaluate(&1, &obs, c.at(4002)).0.state, State::Stale);
}

#[test]
fn a_lost_connection_is_disconnected_after_the_grace_unless_it_redials() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    let gone = lost(&c, 30, LossCause::PeerClosed);
    let (v, t) = e.evaluate(&1, &gone, c.at(44));
    assert_eq!((v.state, t), (State::Healthy, None), "inside disconnect_grace");
    assert!(v.reason.contains("re-dialing"), "{}", v.reason);
    let (v, t) = e.evaluate(&1, &gone, c.at(46));
    assert_eq!(v.state, State::Disconnected);
    assert_eq!(t.unwrap().detection, Duration::from_secs(1));
    assert!(
        v.reason.contains("closed by the apiserver side 16s ago"),
        "{}",
        v.reason
    );
    assert_eq!(v.endpoint.as_deref(), Some(EP));
    // A re-dial inside the grace never leaves healthy.
    let (mut e, c) = setup();
    client(&mut e, &c);
    e.evaluate(&1, &lost(&c, 30, LossCause::Reset), c.at(31));
    let (v, t) = e.evaluate(&1, &connected(&c, 32, 32), c.at(33));
    assert_eq!((v.state, t), (State::Healthy, None));
}

#[test]
fn closing_its_own_idle_connection_is_not_a_loss() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    // The table reports no loss for a close the client chose (Go's IdleConnTimeout).
    let idle_closed = Observation::default();
    for at in [31, 60, 600] {
        let (v, t) = e.evaluate(&1, &idle_closed, c.at(at));
        assert_eq!((v.state, t), (State::Healthy, None), "at {at}s");
    }
}

#[test]
fn trying_after_a_loss_is_unreachable_not_disconnected() {
    // Connects refused: one failure within the window after the grace is enough.
    let (mut e, c) = setup();
    client(&mut e, &c);
    let mut obs = lost(&c, 30, LossCause::PeerClosed);
    obs.failures = failures(&c, &[30, 31, 33]);
    let (v, t) = e.evaluate(&1, &obs, c.at(40));
    assert_eq!(
        (v.state, t),
        (State::Healthy, None),
        "quick retries inside the grace"
    );
    obs.failures = failures(&c, &[30, 31, 33, 44]);
    let (v, t) = e.evaluate(&1, &obs, c.at(46));
    assert_eq!(v.state, State::Unreachable);
    assert_eq!(
        t.unwrap().detection,
        Duration::from_secs(1),
        "evidence: lost + grace = 45 s"
    );
    assert!(v.reason.contains("connects keep failing"), "{}", v.reason);
    // SYNs into a blackhole: one connect in flight for a minute is an attempt (seed 003).
    let (mut e, c) = setup();
    client(&mut e, &c);
    let mut obs = lost(&c, 30, LossCause::TimedOut);
    obs.attempts = vec![attempt(&c, 31)];
    let (v, _) = e.evaluate(&1, &obs, c.at(46));
    assert_eq!(v.state, State::Unreachable, "{}", v.reason);
    assert!(v.reason.contains("unanswered for 15s"), "{}", v.reason);
    let (v, _) = e.evaluate(&1, &obs, c.at(100));
    assert_eq!(v.state, State::Unreachable, "still trying: never disconnected");
    // It stops trying: its failures age out of the window and nothing is in flight.
    obs.attempts.clear();
    obs.failures = failures(&c, &[100]);
    assert_eq!(e.evaluate(&1, &obs, c.at(150)).0.state, State::Unreachable);
    assert_eq!(e.evaluate(&1, &obs, c.at(161)).0.state, State::Disconnected);
}

#[test]
fn a_connect_that_just_started_is_neither_unreachable_nor_disconnected() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    let mut obs = lost(&c, 30, LossCause::PeerClosed);
    obs.attempts = vec![attempt(&c, 60)];
    let (v, t) = e.evaluate(&1, &obs, c.at(60));
    assert_eq!((v.state, t), (State::Healthy, None), "{}", v.reason);
    assert!(v.reason.contains("connecting"), "{}", v.reason);
}

#[test]
fn repeated_failures_make_a_never_connected_process_unreachable() {
    let (mut e, c) = setup();
    let mut obs = Observation::default();
    for (i, at) in [1u64, 3].iter().enumerate() {
        obs.failures = failures(&c, &[1, 3][..=i]);
        let (v, t) = e.evaluate(&1, &obs, c.at(*at));
        assert_eq!((v.is_client, t), (false, None), "after {} failures", i + 1);
    }
    obs.failures = failures(&c, &[1, 3, 5]);
    let (v, t) = e.evaluate(&1, &obs, c.at(6));
    assert_eq!((v.state, v.is_client), (State::Unreachable, true));
    assert_eq!(t.unwrap().detection, Duration::from_secs(1));
    assert!(
        v.reason.starts_with("3 failed connects to 10.0.0.1:6443"),
        "{}",
        v.reason
    );
    // Failures older than the window no longer count: healthy again, still a client.
    let (v, t) = e.evaluate(&1, &obs, c.at(70));
    assert_eq!((v.state, v.is_client), (State::Healthy, true));
    assert_eq!(t.map(|t| t.from), Some(State::Unreachable));
}

#[test]
fn connects_into_a_blackhole_qualify_after_a_window_though_fewer_than_three_fail() {
    // Seed 003 with SYNs dropped: each connect takes 130 s to fail.
    let (mut e, c) = setup();
    let mut obs = Observation {
        trying_since: Some(c.at(0)),
        attempts: vec![attempt(&c, 0)],
        ..Default::default()
    };
    let (v, _) = e.evaluate(&1, &obs, c.at(59));
    assert!(!v.is_client, "not a window of trying yet");
    let (v, t) = e.evaluate(&1, &obs, c.at(61));
    assert_eq!((v.state, v.is_client), (State::Unreachable, true), "{}", v.reason);
    assert_eq!(t.unwrap().detection, Duration::from_secs(1));
    // The connect times out, the next one starts: still unreachable.
    obs.failures = failures(&c, &[130]);
    obs.attempts = vec![attempt(&c, 131)];
    assert_eq!(e.evaluate(&1, &obs, c.at(140)).0.state, State::Unreachable);
}

#[test]
fn a_connection_found_closed_at_start_up_is_a_loss_judged_at_once() {
    // After an agent restart, a socket in CLOSE_WAIT: the peer closed it, the process never
    // did (seeds 000/004). The restart must not forgive it.
    let (mut e, c) = setup();
    let obs = lost(&c, 0, LossCause::FoundClosed);
    let (v, t) = e.evaluate(&1, &obs, c.at(1));
    assert_eq!(
        (v.state, v.is_client, t),
        (State::Healthy, true, None),
        "inside the grace"
    );
    let (v, t) = e.evaluate(&1, &obs, c.at(16));
    assert_eq!(
        (v.state, t.map(|t| t.to)),
        (State::Disconnected, Some(State::Disconnected))
    );
    assert!(v.reason.contains("found closed"), "{}", v.reason);
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
    client(&mut e, &c);
    e.retain(|k| *k != 1);
    assert!(!e.evaluate(&1, &connected(&c, 19, 19), c.at(20)).0.is_client);
}

#[test]
fn a_stuck_stream_makes_its_client_stale_naming_it_and_blackholed_still_wins() {
    let (mut e, c) = setup();
    client(&mut e, &c);
    let mut obs = connected(&c, 0, 600);
    obs.established[0].stuck = vec![crate::table::streams::Stuck {
        stream: 5,
        description:
            "watch endpoints (all namespaces): open 10m14s, due to end after 8m14s, nothing since 10m10s"
                .into(),
        resource: "endpoints".into(),
        evidence: c.at(614),
    }];
    let (v, t) = e.evaluate(&1, &obs, c.at(615));
    assert_eq!(v.state, State::Stale);
    assert_eq!(
        v.reason,
        format!("watch endpoints (all namespaces): open 10m14s, due to end after 8m14s, nothing since 10m10s (stream 5 to {EP})")
    );
    assert_eq!(v.resource.as_deref(), Some("endpoints"));
    assert_eq!(t.expect("a transition").detection, Duration::from_secs(1));
    obs.established[0].stalled_since = Some(c.at(500));
    let (v, _) = e.evaluate(&1, &obs, c.at(616));
    assert_eq!(v.state, State::Blackholed, "a broken path is the bigger news");
    assert_eq!(v.resource, None);
    obs.established[0].stalled_since = None;
    obs.established[0].stuck.clear();
    let (v, _) = e.evaluate(&1, &obs, c.at(617));
    assert_eq!(v.state, State::Healthy);
}
