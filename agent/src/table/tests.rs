use lifeline_common::tcp_state;

use super::*;
use crate::kernel::events::Change;
use crate::testkit::{counters, endpoint, endpoints, process, state, Lab, APISERVER, NETNS};

fn loss(lab: &Lab, pid: u32) -> Option<(LossCause, Instant)> {
    lab.table
        .process(pid)
        .and_then(|p| p.loss)
        .map(|l| (l.cause, l.at))
}

#[test]
fn connect_then_establish_is_one_connection_owned_by_the_connecting_process() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    let conns: Vec<&Connection> = lab.table.connections().collect();
    assert_eq!(conns.len(), 1);
    assert_eq!(
        conns[0].tuple,
        lab.tuple(40000),
        "the port from the softirq event fills the tuple"
    );
    assert_eq!(
        conns[0].owner,
        Some(7),
        "the softirq event's bystander (999) is not the owner"
    );
    assert_eq!(conns[0].tcp_state, tcp_state::ESTABLISHED);
    assert!(conns[0].established_at.is_some());
    let p = lab.table.process(7).unwrap();
    assert_eq!(p.connected_since, Some(lab.at(0)));
    assert_eq!(p.trying_since, None, "connected: not trying any more");
}

#[test]
fn scanned_connection_and_later_events_do_not_duplicate() {
    let mut lab = Lab::new();
    let t = lab.tuple(40000);
    assert!(lab.table.insert_scanned(t, 77, tcp_state::ESTABLISHED, lab.at(0)));
    assert!(
        !lab.table.insert_scanned(t, 77, tcp_state::ESTABLISHED, lab.at(0)),
        "rescan"
    );
    // A retransmit on a scanned socket is matched by its tuple.
    let retrans = lab.ev(5, 0xb, 40000, Change::Retransmit { state: 1 }, None);
    assert!(matches!(
        lab.table.apply_event(&retrans, None),
        Some(Applied::Retransmit { pid: None, .. })
    ));
    lab.peer_close(6, 0xb, 40000);
    assert_eq!(
        lab.table.connections().count(),
        1,
        "the event found the scanned entry by tuple"
    );
    assert_eq!(lab.table.connections().next().unwrap().sk, Some(0xb));
    // The owner comes from the inode, later.
    assert_eq!(lab.table.ownerless(), vec![(t, Some(77))]);
    lab.table.set_owner(&t, process(8, 1), lab.at(8));
    assert!(lab.table.ownerless().is_empty());
}

#[test]
fn closing_its_own_idle_connection_is_not_a_loss_but_a_peer_close_is() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.connect(10, 0xb, 40001, 7);
    lab.close(20, 0xa, 40000);
    assert_eq!(lab.table.connections().count(), 1);
    assert!(
        lab.table.process(7).unwrap().connected_since.is_some(),
        "still has one"
    );
    // Go's IdleConnTimeout: the client closes its last connection itself.
    lab.close(30, 0xb, 40001);
    let p = lab.table.process(7).unwrap();
    assert_eq!(
        (p.connected_since, p.loss),
        (None, None),
        "an idle close is not a loss"
    );
    assert_eq!(p.closed_idle_at, Some(lab.at(30)));
    assert_eq!(p.last_endpoint, Some(endpoint(APISERVER)));
    // The apiserver side closes a connection: a loss, listed until the process closes it.
    lab.connect(40, 0xc, 40002, 7);
    lab.peer_close(50, 0xc, 40002);
    assert_eq!(loss(&lab, 7), Some((LossCause::PeerClosed, lab.at(50))));
    assert_eq!(lab.table.connections().count(), 1, "CLOSE_WAIT is still held");
    lab.apply(
        60,
        0xc,
        40002,
        state(tcp_state::CLOSE_WAIT, tcp_state::LAST_ACK),
        0,
    );
    assert_eq!(lab.table.connections().count(), 0);
    assert_eq!(
        loss(&lab, 7),
        Some((LossCause::PeerClosed, lab.at(50))),
        "the loss stays"
    );
    // A re-dial clears it.
    lab.connect(70, 0xd, 40003, 7);
    assert_eq!(loss(&lab, 7), None);
}

#[test]
fn resets_timeouts_and_aborts_are_losses_with_their_cause() {
    for (sk_err, cause) in [
        (libc::ECONNRESET, LossCause::Reset),
        (libc::ETIMEDOUT, LossCause::TimedOut),
        (libc::ECONNABORTED, LossCause::Aborted),
    ] {
        let mut lab = Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        lab.sample(500, 40000, counters(2000, 3, 300, 2));
        lab.apply(
            1000,
            0xa,
            40000,
            state(tcp_state::ESTABLISHED, tcp_state::CLOSE),
            sk_err,
        );
        assert_eq!(loss(&lab, 7), Some((cause, lab.at(1000))), "sk_err {sk_err}");
        assert!(
            lab.table.process(7).unwrap().connect_failures.is_empty(),
            "it had received payload"
        );
    }
    // An abort with no error recorded is the client's own (SO_LINGER 0): not a loss.
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.apply(
        1000,
        0xa,
        40000,
        state(tcp_state::ESTABLISHED, tcp_state::CLOSE),
        0,
    );
    assert_eq!(loss(&lab, 7), None);
}

#[test]
fn a_close_of_its_own_while_the_endpoint_goes_away_is_a_loss() {
    // A graceful apiserver shutdown: GOAWAY, some clients close first, others see the server
    // close their connection; re-dials are refused.
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.connect(0, 0xb, 40001, 8);
    lab.connect(0, 0xc, 40002, 9);
    lab.close(10_000, 0xa, 40000);
    assert_eq!(loss(&lab, 7), None, "nothing says the endpoint is going away yet");
    lab.peer_close(11_000, 0xb, 40001);
    assert_eq!(loss(&lab, 8), Some((LossCause::PeerClosed, lab.at(11_000))));
    assert_eq!(
        loss(&lab, 7),
        Some((LossCause::Prompted, lab.at(10_000))),
        "the close 1 s before the peer's was prompted by the apiserver side"
    );
    lab.close(12_000, 0xc, 40002);
    assert_eq!(
        loss(&lab, 9),
        Some((LossCause::Prompted, lab.at(12_000))),
        "and the one 1 s after"
    );
    // Long after, a close is idle again.
    lab.connect(30_000, 0xd, 40003, 9);
    lab.close(40_000, 0xd, 40003);
    assert_eq!(loss(&lab, 9), None);
}

#[test]
fn a_close_of_its_own_is_not_promoted_by_probes_the_server_closes() {
    // Issue 15: on a real node, the agent's own probe (GET /readyz, Connection: close) and the
    // kubelet's probes of the apiserver are closed by the server every few seconds. A client's
    // idle close next to them lost nothing.
    let mut lab = Lab::new();
    lab.table = std::mem::take(&mut lab.table).ignoring(99);
    lab.connect(0, 0xa, 40000, 7);
    // The agent's probe: its connect names the agent; what follows runs in softirq.
    let probe = lab.ev(
        9_000,
        0xe,
        0,
        state(tcp_state::CLOSE, tcp_state::SYN_SENT),
        Some(99),
    );
    lab.table.apply_event(&probe, Some(process(99, 1)));
    lab.apply(
        9_001,
        0xe,
        41000,
        state(tcp_state::SYN_SENT, tcp_state::ESTABLISHED),
        0,
    );
    lab.peer_close(9_050, 0xe, 41000);
    assert!(lab.table.connections().all(|c| c.sk != Some(0xe)), "not listed");
    // Another process's request-and-close connection, closed by the server at once.
    lab.connect(9_100, 0xf, 41001, 8);
    lab.peer_close(9_300, 0xf, 41001);
    lab.close(10_000, 0xa, 40000);
    assert_eq!(
        loss(&lab, 7),
        None,
        "its own close, whatever the server closed nearby"
    );
    // The agent's socket address, freed and taken by a client's connect, is the client's.
    lab.apply(
        11_000,
        0xe,
        41000,
        state(tcp_state::ESTABLISHED, tcp_state::CLOSE),
        0,
    );
    lab.connect(12_000, 0xe, 41002, 9);
    assert!(lab.table.connections().any(|c| c.sk == Some(0xe)));
}

#[test]
fn failed_connects_carry_the_reason_the_kernel_recorded() {
    let mut lab = Lab::new();
    let cases = [
        (libc::ECONNREFUSED, FailureReason::Refused),
        (libc::ETIMEDOUT, FailureReason::Timeout),
        (libc::EHOSTUNREACH, FailureReason::Unreachable),
        (libc::ENETUNREACH, FailureReason::Unreachable),
        (0, FailureReason::Timeout),
    ];
    for (i, (sk_err, reason)) in cases.into_iter().enumerate() {
        let (ms, sk) = (1000 * i as u64, 0x10 + i as u64);
        lab.syn(ms, sk, 7);
        let mut gave_up = lab.ev(
            ms + 500,
            sk,
            40000 + i as u16,
            state(tcp_state::SYN_SENT, tcp_state::CLOSE),
            None,
        );
        gave_up.sk_err = sk_err;
        assert_eq!(
            lab.table.apply_event(&gave_up, None),
            Some(Applied::ConnectFailed {
                pid: 7,
                endpoint: endpoint(APISERVER),
                reason
            }),
            "sk_err {sk_err}"
        );
    }
    let p = lab.table.process(7).unwrap();
    assert_eq!(p.connect_failures.len(), cases.len());
    assert_eq!(p.connected_since, None);
    assert_eq!(p.trying_since, Some(lab.at(0)), "trying since its first connect");
    assert_eq!(lab.table.connections().count(), 0);
}

#[test]
fn a_connection_reset_before_anything_arrived_is_a_failed_connect() {
    // A proxy that accepts and resets at once (no upstream).
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    let mut rst = lab.ev(
        5,
        0xa,
        40000,
        state(tcp_state::ESTABLISHED, tcp_state::CLOSE),
        None,
    );
    rst.sk_err = libc::ECONNRESET;
    assert_eq!(
        lab.table.apply_event(&rst, None),
        Some(Applied::ConnectFailed {
            pid: 7,
            endpoint: endpoint(APISERVER),
            reason: FailureReason::Reset
        })
    );
    assert_eq!(loss(&lab, 7), Some((LossCause::Reset, lab.at(5))));
}

#[test]
fn the_failure_history_is_bounded() {
    // A tight refused-connect loop: memory and per-tick work stay bounded.
    let mut lab = Lab::new();
    for i in 0..10_000u64 {
        lab.syn(i, 0x1000 + i, 7);
        lab.apply(
            i,
            0x1000 + i,
            40000,
            state(tcp_state::SYN_SENT, tcp_state::CLOSE),
            libc::ECONNREFUSED,
        );
    }
    lab.table.record_connect_failures(
        7,
        endpoint(APISERVER),
        FailureReason::Refused,
        1_000_000,
        lab.at(20_000),
    );
    let p = lab.table.process(7).unwrap();
    assert_eq!(p.connect_failures.len(), FAILURES_KEPT);
    assert_eq!(p.connect_failures.back().unwrap().at, lab.at(20_000));
    assert_eq!(lab.table.connections().count(), 0);
}

#[test]
fn removing_an_endpoint_forgets_its_connections_without_a_loss() {
    let mut lab = Lab::watching(&["10.0.0.1:6443", "10.0.0.9:6443"], APISERVER);
    lab.connect(0, 0xa, 40000, 7);
    lab.table
        .set_endpoints(endpoints(&["10.0.0.0/8:6443"]), lab.at(5));
    assert_eq!(
        lab.table.connections().next().unwrap().endpoint.to_string(),
        "10.0.0.0/8:6443",
        "re-matched"
    );
    // An aged-out kubeconfig address, a SIGHUP dropping it: the client did nothing.
    lab.table.set_endpoints(endpoints(&["10.0.0.9:6443"]), lab.at(6));
    assert_eq!(lab.table.connections().count(), 0);
    assert!(
        lab.table.process(7).is_none(),
        "no longer an apiserver client as far as we know"
    );
    // Events for other destinations are ignored.
    lab.syn(7, 0xb, 8);
    assert!(lab.table.process(8).is_none());
}

/// One connection (port 40000), sampled at 1 s and again, unchanged, once it is quiet: the
/// lab, its counters, and that moment (ms).
fn quiet_lab() -> (Lab, TcpInfo, u64) {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    let tcp = counters(2000, 4, 600, 3);
    lab.sample(1000, 40000, tcp);
    let quiet_from = 1000 + QUIET_AFTER.as_millis() as u64;
    lab.sample(quiet_from, 40000, tcp);
    (lab, tcp, quiet_from)
}

/// Whether a round at `ms` reads the connection of port 40000.
fn due(lab: &mut Lab, ms: u64) -> bool {
    let at = lab.at(ms);
    lab.table
        .sample_targets(at)
        .is_some_and(|t| t.contains(&lab.tuple(40000)))
}

/// A segment arriving on socket `sk`: `len` bytes of payload after the client sent `sent`.
fn segment(len: u16, sent: u32) -> Change {
    Change::Segment {
        len,
        snd_nxt: 1_000_000 + sent,
        snd_una: 1_000_000 + sent,
        write_seq: 1_000_000 + sent,
        srtt_us: 1000,
    }
}

fn waiting(lab: &Lab, ms: u64) -> Option<Instant> {
    lab.table.connections().next().unwrap().waiting(lab.at(ms), false)
}

#[test]
fn requests_and_answers_come_from_segments_in_their_order() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.apply(100, 0xa, 40000, segment(1400, 500), 0); // the handshake answered
                                                       // The JVM watch of issue 15: request (acknowledged), the answer, its flow-control reply.
    lab.apply(10_000, 0xa, 40000, segment(0, 800), 0);
    assert_eq!(waiting(&lab, 10_001), Some(lab.at(9_999)));
    lab.apply(10_004, 0xa, 40000, segment(3400, 800), 0);
    lab.apply(10_009, 0xa, 40000, segment(0, 840), 0);
    assert_eq!(waiting(&lab, 200_000), None);
    let c = lab.table.connections().next().unwrap();
    assert_eq!(c.last_payload, Some(lab.at(10_004)));
    assert_eq!(c.last_request, Some(lab.at(9_999)));
    // Sampled counters that sum all three into one interval (a send later than the last
    // receive) make no wait: they are no evidence of requests any more.
    let mut tcp = counters(4800, 3, 840, 3);
    tcp.last_data_recv_ms = 5;
    tcp.last_data_sent_ms = 0;
    lab.sample(10_010, 40000, tcp);
    assert_eq!(waiting(&lab, 200_000), None);
    // The request is in the process's rhythm (rule B).
    assert_eq!(
        lab.table.process(7).unwrap().rhythm.last_request,
        Some(lab.at(9_999))
    );
}

#[test]
fn a_connection_older_than_the_agent_learns_its_segments_by_tuple() {
    let mut lab = Lab::new();
    let tuple = lab.tuple(40000);
    assert!(lab
        .table
        .insert_scanned(tuple, 77, tcp_state::ESTABLISHED, lab.at(0)));
    // The first segment only sets where the client's sends stand.
    lab.apply(1000, 0xa, 40000, segment(0, 5000), 0);
    assert_eq!(waiting(&lab, 1001), None);
    lab.apply(3000, 0xa, 40000, segment(0, 5400), 0);
    assert_eq!(waiting(&lab, 3001), Some(lab.at(2999)));
    assert_eq!(lab.table.connections().next().unwrap().sk, Some(0xa));
}

#[test]
fn lost_events_drop_the_waits_they_may_have_answered() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.apply(100, 0xa, 40000, segment(1400, 500), 0);
    lab.apply(10_000, 0xa, 40000, segment(0, 900), 0);
    assert!(waiting(&lab, 10_001).is_some());
    let gap = super::gaps::GapScope::Socket { sk: 0xa, tgid: 0 };
    assert_eq!(
        lab.table
            .evidence_lost(gap, super::gaps::GapCause::RingFull, 2, lab.at(10_002)),
        1
    );
    assert_eq!(waiting(&lab, 200_000), None, "not judged from what was not seen");
    let conn = lab.table.connections().next().unwrap();
    assert_eq!(conn.gap.map(|g| (g.since, g.records)), Some((lab.at(10_002), 2)));
}

#[test]
fn a_loss_costs_only_the_connections_it_concerned() {
    use super::gaps::{GapCause, GapScope};
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.connect(0, 0xb, 40001, 8);
    for (sk, port) in [(0xa, 40000), (0xb, 40001)] {
        lab.apply(100, sk, port, segment(1400, 500), 0);
        lab.apply(10_000, sk, port, segment(0, 900), 0);
    }
    let waits = |lab: &Lab| {
        let now = lab.at(200_000);
        let mut w: Vec<(u16, bool)> = lab
            .table
            .connections()
            .map(|c| (c.tuple.local.port(), c.waiting(now, false).is_some()))
            .collect();
        w.sort();
        w
    };
    assert_eq!(waits(&lab), [(40000, true), (40001, true)]);
    // The flooder's socket, then its process: the other client keeps its wait.
    lab.table.evidence_lost(
        GapScope::Socket { sk: 0xa, tgid: 0 },
        GapCause::RateLimited,
        1,
        lab.at(10_001),
    );
    assert_eq!(waits(&lab), [(40000, false), (40001, true)]);
    lab.table
        .evidence_lost(GapScope::Process(7), GapCause::RateLimited, 1, lab.at(10_002));
    assert_eq!(waits(&lab), [(40000, false), (40001, true)]);
    // The other client's socket, named by a lost connect's process only.
    lab.table.evidence_lost(
        GapScope::Socket { sk: 0xb, tgid: 8 },
        GapCause::RingFull,
        1,
        lab.at(10_003),
    );
    assert_eq!(waits(&lab), [(40000, false), (40001, false)]);
    // A socket the table never met, of a process it never met: nobody's evidence.
    assert_eq!(
        lab.table.evidence_lost(
            GapScope::Socket { sk: 0xdead, tgid: 0 },
            GapCause::RingFull,
            1,
            lab.at(10_004)
        ),
        0
    );
}

#[test]
fn retransmits_without_ack_progress_stall_even_without_the_tracepoint() {
    // iptables OUTPUT DROP on the client's own path: no tcp_retransmit_skb event on this
    // kernel; tcp_info shows the data unsent, the backoff growing, no ACK.
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    let mut tcp = counters(2000, 4, 600, 3);
    lab.sample(1000, 40000, tcp);
    tcp.bytes_sent += 100;
    tcp.data_segs_out += 1;
    tcp.notsent_bytes = 100;
    tcp.last_ack_recv_ms = 400;
    lab.sample(2000, 40000, tcp);
    assert_eq!(
        lab.table.connections().next().unwrap().stalled_since,
        None,
        "not retried yet"
    );
    tcp.backoff = 2;
    tcp.last_ack_recv_ms = 1400;
    lab.sample(3000, 40000, tcp);
    assert_eq!(
        lab.table.connections().next().unwrap().stalled_since,
        Some(lab.at(3000))
    );
    tcp.backoff = 3;
    lab.sample(4000, 40000, tcp);
    assert_eq!(
        lab.table.connections().next().unwrap().stalled_since,
        Some(lab.at(3000))
    );
    // The path heals: the peer acknowledges.
    tcp.bytes_acked += 100;
    tcp.notsent_bytes = 0;
    tcp.backoff = 0;
    lab.sample(5000, 40000, tcp);
    assert_eq!(lab.table.connections().next().unwrap().stalled_since, None);
    // Segments sent and retransmitted with no ACK (dropped further away) stall too.
    tcp.unacked = 1;
    tcp.retransmits = 2;
    tcp.last_ack_recv_ms = 2000;
    lab.sample(6000, 40000, tcp);
    assert_eq!(
        lab.table.connections().next().unwrap().stalled_since,
        Some(lab.at(6000))
    );
}

#[test]
fn a_full_receive_window_is_not_a_blackhole() {
    // A slow reader: data waits, zero-window probes back off, but the peer acknowledges them.
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    let mut tcp = counters(2000, 4, 600, 3);
    lab.sample(1000, 40000, tcp);
    tcp.notsent_bytes = 65536;
    tcp.backoff = 4;
    tcp.probes = 4;
    tcp.last_ack_recv_ms = 200;
    for ms in [2000, 3000, 30_000] {
        lab.sample(ms, 40000, tcp);
        assert_eq!(
            lab.table.connections().next().unwrap().stalled_since,
            None,
            "at {ms}"
        );
    }
}

#[test]
fn a_scan_adds_what_is_missing_heals_lost_events_and_removes_what_is_gone() {
    let mut lab = Lab::new();
    // A connect whose ESTABLISHED event was lost: left in SYN_SENT without a port.
    lab.syn(0, 0xa, 7);
    // An established connection whose close event was lost.
    lab.connect(0, 0xb, 40001, 8);
    // One whose peer close (CLOSE_WAIT) event was lost.
    lab.connect(0, 0xc, 40002, 9);
    let scanned = |port, state| Scanned {
        tuple: lab.tuple(port),
        inode: u64::from(port),
        tcp_state: state,
    };
    let found = [
        scanned(40000, tcp_state::ESTABLISHED),
        scanned(40002, tcp_state::CLOSE_WAIT),
        scanned(40005, tcp_state::ESTABLISHED),
    ];
    let added = lab.table.reconcile_scan(NETNS, &found, lab.at(5000));
    assert_eq!(
        added, 2,
        "40000 (the lost connect's socket) and 40005 (older than the agent)"
    );
    let mut ports: Vec<u16> = lab.table.connections().map(|c| c.tuple.local.port()).collect();
    ports.sort();
    assert_eq!(
        ports,
        [40000, 40002, 40005],
        "the portless SYN_SENT entry and 40001 are gone"
    );
    assert_eq!(
        loss(&lab, 9),
        Some((LossCause::PeerClosed, lab.at(5000))),
        "the lost FIN applied"
    );
    assert_eq!(loss(&lab, 8), None, "who closed 40001 is unknown: not a loss");
    // The found sockets get their owners through their inodes.
    lab.table
        .set_owner(&lab.tuple(40000), process(7, 1), lab.at(5001));
    assert!(lab.table.process(7).unwrap().connected_since.is_some());
}

#[test]
fn a_socket_found_closed_by_the_peer_at_start_up_is_a_loss() {
    // Seeds 000/004 across an agent restart: the socket sits in CLOSE_WAIT.
    let mut lab = Lab::new();
    let found = [Scanned {
        tuple: lab.tuple(40000),
        inode: 77,
        tcp_state: tcp_state::CLOSE_WAIT,
    }];
    lab.table.reconcile_scan(NETNS, &found, lab.at(0));
    lab.table.set_owner(&lab.tuple(40000), process(7, 1), lab.at(100));
    assert_eq!(loss(&lab, 7), Some((LossCause::FoundClosed, lab.at(0))));
    // A scanned SYN_SENT socket is an attempt in flight.
    let found = [Scanned {
        tuple: lab.tuple(40001),
        inode: 78,
        tcp_state: tcp_state::SYN_SENT,
    }];
    lab.table.reconcile_scan(NETNS, &found, lab.at(200));
    lab.table.set_owner(&lab.tuple(40001), process(8, 1), lab.at(300));
    assert_eq!(lab.table.process(8).unwrap().trying_since, Some(lab.at(200)));
}

/// A table whose scan at 100 ms found port 40000's socket established (inode 77) and its
/// owner, pid 7, while the socket's connect (50 ms) and establishment (51 ms) were still in
/// the ring; and that socket's tuple.
fn scanned_at_100ms_before_its_events() -> (Lab, Tuple) {
    let mut lab = Lab::new();
    let t = lab.tuple(40000);
    let found = [Scanned {
        tuple: t,
        inode: 77,
        tcp_state: tcp_state::ESTABLISHED,
    }];
    lab.table.reconcile_scan(NETNS, &found, lab.at(100));
    lab.table.set_owner(&t, process(7, 1), lab.at(150));
    (lab, t)
}

/// A scan that finds a socket before the pump has applied its connect and establishment (the
/// scan runs on the sampler's thread; the events wait in the ring until the pump's thread next
/// runs) adds it; the events then name the same socket. One entry stays, the one events and samples
/// reach, and the apiserver's reset ends the client's connection. (A second, scanned entry of
/// the tuple got no event and no sample again and kept its client connected for good: the
/// never-redial client of `no_opt_in_means_no_action` was never `disconnected` in CI.)
#[test]
fn a_socket_scanned_before_its_events_are_applied_stays_one_connection() {
    let (mut lab, t) = scanned_at_100ms_before_its_events();
    lab.connect(50, 0xa, 40000, 7);
    let conns: Vec<&Connection> = lab.table.connections().collect();
    assert_eq!(conns.len(), 1, "one socket, one connection: {conns:#?}");
    assert_eq!(conns[0].tuple, t);
    assert_eq!(conns[0].owner, Some(7));
    assert_eq!(conns[0].inode, Some(77), "the scan's inode is kept");
    assert!(conns[0].established_at.is_some(), "its establishment was seen");
    lab.sample(1000, 40000, counters(2000, 3, 300, 2));
    assert!(
        lab.table.connections().all(|c| c.readable(lab.at(1000))),
        "the sample reached it"
    );
    // The apiserver goes: a reset ends the only connection.
    lab.apply(
        3000,
        0xa,
        40000,
        state(tcp_state::ESTABLISHED, tcp_state::CLOSE),
        libc::ECONNRESET,
    );
    assert_eq!(lab.table.connections().count(), 0);
    assert_eq!(loss(&lab, 7), Some((LossCause::Reset, lab.at(3000))));
    assert!(lab.table.process(7).unwrap().connected_since.is_none());
}

/// One connection, of process 7 (connected), with the scan's inode 77.
fn assert_one_connected_of_7_with_inode_77(lab: &Lab) {
    let conns: Vec<&Connection> = lab.table.connections().collect();
    assert_eq!(conns.len(), 1, "{conns:#?}");
    assert_eq!((conns[0].owner, conns[0].inode), (Some(7), Some(77)));
    assert!(lab.table.ownerless().is_empty());
    assert!(lab.table.process(7).unwrap().connected_since.is_some());
}

/// The same for a client whose connect event had no owner (the process was gone from
/// `/proc` when the pump looked): the scanned entry's owner is kept.
#[test]
fn a_scanned_entry_gives_its_owner_to_the_socket_events_name() {
    let (mut lab, _) = scanned_at_100ms_before_its_events();
    let syn = lab.ev(50, 0xa, 0, state(tcp_state::CLOSE, tcp_state::SYN_SENT), Some(7));
    lab.table.apply_event(&syn, None);
    lab.apply(
        51,
        0xa,
        40000,
        state(tcp_state::SYN_SENT, tcp_state::ESTABLISHED),
        0,
    );
    assert_one_connected_of_7_with_inode_77(&lab);
}

#[test]
fn a_vanished_socket_waits_a_moment_for_the_event_that_explains_it() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    let t = lab.tuple(40000);
    lab.table.apply_sample(&t, Sample::Gone, lab.at(1000));
    assert_eq!(
        lab.table.connections().count(),
        1,
        "the close event may be on its way"
    );
    lab.peer_close(1100, 0xa, 40000);
    assert_eq!(
        loss(&lab, 7),
        Some((LossCause::PeerClosed, lab.at(1100))),
        "the event explained it"
    );
    // With no event at all, it goes on the next sample.
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.table.apply_sample(&t, Sample::Gone, lab.at(1000));
    lab.table.apply_sample(&t, Sample::Gone, lab.at(2000));
    assert_eq!(lab.table.connections().count(), 0);
    assert_eq!(loss(&lab, 7), None);
}

#[test]
fn dual_stack_sockets_keep_their_form_and_match_ipv4_endpoints() {
    // A JVM: AF_INET6 socket to ::ffff:10.0.0.1.
    let mut lab = Lab::watching(&[APISERVER], "[::ffff:10.0.0.1]:6443");
    lab.connect(0, 0xa, 40000, 7);
    let c = lab.table.connections().next().unwrap();
    assert_eq!(c.tuple.remote.to_string(), "[::ffff:10.0.0.1]:6443");
    assert_eq!(c.endpoint, endpoint(APISERVER));
    assert_eq!(
        lab.table.sample_targets(lab.at(0)),
        Some(vec![lab.tuple(40000)]),
        "sampled in its own form"
    );
    lab.sample(1000, 40000, counters(2000, 4, 600, 3));
    assert_eq!(lab.table.connections().count(), 1, "its sample found it");
    assert!(lab.table.connections().next().unwrap().readable(lab.at(1000)));
}

#[test]
fn a_forked_child_keeps_the_socket_its_parent_leaves_behind() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.sample(1000, 40000, counters(2000, 4, 600, 3));
    lab.table.forget_process(7, lab.at(2000));
    assert!(lab.table.process(7).is_none());
    assert_eq!(
        lab.table.ownerless(),
        vec![(lab.tuple(40000), Some(5))],
        "kept, owner unknown"
    );
    lab.table
        .set_owner(&lab.tuple(40000), process(70, 3), lab.at(2100));
    let child = lab.table.process(70).unwrap();
    assert!(child.connected_since.is_some());
    assert_eq!(child.loss, None);
}

/// The sampler's owner lookup each round reads the table's index of ownerless connections,
/// not the table: the index holds exactly the connections whose owner is unknown, through
/// every way an owner comes and goes, and nothing of a connection that is gone.
#[test]
fn the_index_of_ownerless_connections_follows_every_owner_change() {
    let mut lab = Lab::new();
    let agrees = |table: &ConnectionTable, expected: usize| {
        let mut walked: Vec<(Tuple, Option<u64>)> = table
            .connections()
            .filter(|c| c.owner.is_none())
            .map(|c| (c.tuple, c.inode))
            .collect();
        let mut indexed = table.ownerless();
        walked.sort_by_key(|(t, _)| t.local);
        indexed.sort_by_key(|(t, _)| t.local);
        assert_eq!(indexed, walked);
        assert_eq!(indexed.len(), expected);
        assert_eq!(
            table.ownerless.len(),
            expected,
            "no id of a connection gone or owned"
        );
    };
    // Its connect names its owner.
    lab.connect(0, 0xa, 40000, 7);
    agrees(&lab.table, 0);
    // Found by a scan: owner unknown until its inode is looked up.
    assert!(lab
        .table
        .insert_scanned(lab.tuple(40001), 77, tcp_state::ESTABLISHED, lab.at(0)));
    agrees(&lab.table, 1);
    lab.table.set_owner(&lab.tuple(40001), process(8, 1), lab.at(1));
    agrees(&lab.table, 0);
    // Its owner exits: kept (its inode known from a sample) without an owner.
    lab.sample(1000, 40000, counters(2000, 4, 600, 3));
    lab.table.forget_process(7, lab.at(2000));
    agrees(&lab.table, 1);
    // Gone: closed, then out of the table.
    lab.close(3000, 0xa, 40000);
    lab.apply(3100, 0xa, 40000, state(tcp_state::FIN_WAIT1, tcp_state::CLOSE), 0);
    assert!(lab.table.connections().all(|c| c.tuple != lab.tuple(40000)));
    agrees(&lab.table, 0);
    // An exited owner whose connections have no inode: they go with it.
    lab.connect(4000, 0xc, 40002, 9);
    lab.table.forget_process(9, lab.at(4100));
    agrees(&lab.table, 0);
    assert_eq!(lab.table.connections().count(), 1);
}

#[test]
fn owners_found_for_a_scan_are_set_in_one_batch() {
    let mut lab = Lab::new();
    for (port, ms) in [(40000, 0), (40001, 100), (40002, 200)] {
        assert!(lab.table.insert_scanned(
            lab.tuple(port),
            u64::from(port),
            tcp_state::ESTABLISHED,
            lab.at(ms)
        ));
    }
    let found = vec![
        (lab.tuple(40001), process(7, 1)),
        (lab.tuple(40000), process(7, 1)),
        (lab.tuple(40002), process(8, 1)),
    ];
    lab.table.set_owners(found, lab.at(300));
    let owned = |lab: &Lab, pid| {
        let mut ports: Vec<u16> = lab
            .table
            .connections_of(pid)
            .map(|c| c.tuple.local.port())
            .collect();
        ports.sort_unstable();
        ports
    };
    assert_eq!(owned(&lab, 7), vec![40000, 40001]);
    assert_eq!(owned(&lab, 8), vec![40002]);
    assert_eq!(
        lab.table.process(7).unwrap().connected_since,
        Some(lab.at(0)),
        "connected since its oldest connection, whichever order the owners came in"
    );
    // An exit leaves the socket (an inode to find its next holder by), no longer 8's.
    lab.table.forget_process(8, lab.at(400));
    assert!(owned(&lab, 8).is_empty());
    lab.table.set_owner(&lab.tuple(40002), process(7, 1), lab.at(500));
    assert_eq!(owned(&lab, 7), vec![40000, 40001, 40002]);
    // A connection that ends is no longer its owner's; the owner still holds the others.
    lab.close(600, 0xc, 40000);
    assert_eq!(owned(&lab, 7), vec![40001, 40002]);
    let p = lab.table.process(7).unwrap();
    assert!(p.connected_since.is_some() && p.loss.is_none(), "{p:?}");
}

#[test]
fn the_agents_own_connections_are_not_listed() {
    let mut lab = Lab::new();
    lab.table = ConnectionTable::new(endpoints(&[APISERVER])).ignoring(7);
    lab.connect(0, 0xa, 40000, 7);
    lab.sample(1000, 40000, counters(2000, 4, 600, 3));
    assert!(lab.table.process(7).is_none());
    lab.table
        .set_owner(&lab.tuple(40000), process(7, 1), lab.at(1500));
    assert_eq!(
        lab.table.connections().count(),
        0,
        "found through its inode, then dropped"
    );
}

#[test]
fn a_recycled_pid_is_a_new_process_and_exits_are_forgotten() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.table.forget_process(7, lab.at(10));
    assert!(lab.table.process(7).is_none());
    assert_eq!(
        lab.table.connections().count(),
        0,
        "no inode known: nothing to find it by"
    );
    let syn = lab.ev(20, 0xb, 0, state(tcp_state::CLOSE, tcp_state::SYN_SENT), Some(7));
    lab.table.apply_event(&syn, Some(process(7, 2)));
    assert_eq!(lab.table.process(7).unwrap().info.start_time_ticks, 2);
    assert_eq!(lab.table.process(7).unwrap().first_seen, lab.at(20));
}

#[test]
fn a_quiet_connection_is_sampled_every_few_seconds_anything_pending_every_second() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    // Due: listed as due (None: the table knows that nothing is due yet, without a walk).
    assert!(due(&mut lab, 0), "never sampled yet");
    let mut tcp = counters(2000, 4, 600, 3);
    lab.sample(1000, 40000, tcp);
    // Unchanged for less than QUIET_AFTER: every second.
    let quiet_from = 1000 + QUIET_AFTER.as_millis() as u64;
    let mut last = 1000;
    for at in (2000..quiet_from).step_by(1000) {
        assert!(due(&mut lab, at), "at {at} ms: changed {} ms ago", at - 1000);
        lab.sample(at, 40000, tcp);
        last = at;
    }
    // Quiet now: due again only after QUIET_EVERY (less the slack for rounds' jitter).
    assert!(!lab.table.connections().next().unwrap().quiet(lab.at(last)));
    assert!(lab.table.connections().next().unwrap().quiet(lab.at(quiet_from)));
    assert!(!due(&mut lab, quiet_from));
    assert_eq!(
        lab.table.sample_targets(lab.at(quiet_from + 1)),
        None,
        "nothing due and nothing changed: no walk of the table"
    );
    assert!(!due(&mut lab, last + 3000));
    assert!(due(&mut lab, last + QUIET_EVERY.as_millis() as u64));
    // The first request after the quiet spell comes from the kernel's segments, timed there:
    // the wait starts when it was sent, and the connection is due every second.
    let sampled = last + QUIET_EVERY.as_millis() as u64;
    lab.apply(sampled - 3600, 0xa, 40000, segment(0, 600), 0);
    lab.apply(sampled - 3500, 0xa, 40000, segment(0, 1200), 0);
    assert_eq!(waiting(&lab, sampled), Some(lab.at(sampled - 3501)));
    tcp.bytes_sent += 1200;
    tcp.data_segs_out += 2;
    lab.sample(sampled, 40000, tcp);
    assert!(
        due(&mut lab, sampled + 1000),
        "waiting for an answer: every second"
    );
    // Answered: still every second until it has been quiet for QUIET_AFTER again.
    lab.apply(sampled + 500, 0xa, 40000, segment(900, 1200), 0);
    tcp.bytes_received += 900;
    tcp.data_segs_in += 1;
    lab.sample(sampled + 1000, 40000, tcp);
    assert_eq!(waiting(&lab, sampled + 1000), None);
    assert!(due(&mut lab, sampled + 2000));
    // Data outstanding (a send not acknowledged yet) is never quiet.
    let mut unacked = tcp;
    unacked.unacked = 1;
    lab.sample(sampled + 2000 + QUIET_AFTER.as_millis() as u64, 40000, unacked);
    let c = lab.table.connections().next().unwrap();
    assert!(!c.quiet(lab.at(sampled + 60_000)), "outstanding data");
    // A connection no longer found (its close event may be on its way) is due every second.
    lab.sample(sampled + 70_000, 40000, tcp);
    lab.sample(sampled + 90_000, 40000, tcp);
    assert!(!due(&mut lab, sampled + 91_000), "quiet again");
    assert_eq!(lab.table.sample_targets(lab.at(sampled + 91_500)), None);
    // A new connection is a change: walked and due at once.
    lab.connect(sampled + 92_000, 0xb, 40001, 8);
    let targets = lab
        .table
        .sample_targets(lab.at(sampled + 92_001))
        .expect("walked after the event");
    assert_eq!(targets, vec![lab.tuple(40001)], "the quiet one is not due");
    lab.table
        .apply_sample(&lab.tuple(40000), Sample::Gone, lab.at(sampled + 94_000));
    assert!(due(&mut lab, sampled + 95_000), "vanished: confirm at once");
}

#[test]
fn payload_that_segments_reported_keeps_the_sampling_plan_and_the_connection_quiet() {
    // A watch that receives an event every few seconds, every segment reported by the kernel.
    let (mut lab, mut tcp, quiet_from) = quiet_lab();
    let targets = lab
        .table
        .sample_targets(lab.at(quiet_from + 100))
        .expect("walked");
    assert!(targets.is_empty(), "quiet, sampled just now");
    // An event's payload arrives: the plan stands, the table is not walked for it.
    lab.apply(quiet_from + 2000, 0xa, 40000, segment(900, 600), 0);
    assert_eq!(
        lab.table.sample_targets(lab.at(quiet_from + 2100)),
        None,
        "a segment of a quiet connection kept it quiet: no walk"
    );
    // Its sample, due QUIET_EVERY after the segment (nothing outstanding: a look at it,
    // LOOKED_SAMPLE_EVERY), finds only what the segment reported: still quiet.
    let next = quiet_from + 2000 + QUIET_EVERY.as_millis() as u64;
    assert!(lab
        .table
        .sample_targets(lab.at(next - 100))
        .is_none_or(|t| t.is_empty()));
    let targets = lab.table.sample_targets(lab.at(next)).expect("due");
    assert_eq!(targets, vec![lab.tuple(40000)]);
    tcp.bytes_received += 900;
    tcp.data_segs_in += 1;
    lab.sample(next, 40000, tcp);
    assert!(lab.table.connections().next().unwrap().quiet(lab.at(next + 1000)));
    assert_eq!(lab.table.sample_targets(lab.at(next + 1000)), None);
    let quiet = |lab: &Lab, ms: u64| lab.table.connections().next().unwrap().quiet(lab.at(ms));
    let every = QUIET_EVERY.as_millis() as u64;
    // Payload that arrived 30 ms before a sample, its segment's record still in the ring: no
    // change; the record, applied after the sample, accounts for it.
    tcp.bytes_received += 900;
    tcp.data_segs_in += 1;
    tcp.last_data_recv_ms = 30;
    let early = next + every;
    lab.sample(early, 40000, tcp);
    assert!(quiet(&lab, early + 1000), "its record is on its way");
    lab.apply(early - 32, 0xa, 40000, segment(900, 600), 0);
    lab.sample(early + every, 40000, tcp);
    assert!(quiet(&lab, early + every + 1000), "reported after all");
    // Payload that arrived just before a sample and was never reported: a change at the
    // next sample.
    tcp.bytes_received += 900;
    tcp.data_segs_in += 1;
    let unseen = early + 2 * every;
    lab.sample(unseen, 40000, tcp);
    assert!(quiet(&lab, unseen + 1000), "its record could still come");
    lab.sample(unseen + every, 40000, tcp);
    assert!(!quiet(&lab, unseen + every + 1000), "no record came");
    // Payload no event reported, arrived longer ago than a record waits: a change at once,
    // sampled every second again.
    let later = unseen + every + QUIET_AFTER.as_millis() as u64 + 1000;
    lab.sample(later - 1000, 40000, tcp);
    assert!(quiet(&lab, later - 1000));
    tcp.bytes_received += 900;
    tcp.data_segs_in += 1;
    tcp.last_data_recv_ms = 2000;
    lab.sample(later, 40000, tcp);
    assert!(!quiet(&lab, later + 1000));
    // A request (the client sends) makes it due at once, without a walk being forced.
    lab.apply(later + 1500, 0xa, 40000, segment(0, 1800), 0);
    assert!(lab
        .table
        .sample_targets(lab.at(later + 1600))
        .is_some_and(|t| t == vec![lab.tuple(40000)]));
}

/// Issue 26 item 6: a watch that receives an event every few seconds, with nothing unsent and
/// nothing unacknowledged at each, is looked at by its segments' records: read only every
/// LOOKED_SAMPLE_EVERY, its evidence current throughout. A record that shows a write not sent
/// yet (how a stall on the client's own path begins) or one not acknowledged is no look: the
/// sample comes QUIET_EVERY after the last look, as it did before looks.
#[test]
fn a_segment_that_shows_nothing_outstanding_is_a_look_and_postpones_the_sample() {
    let (mut lab, mut tcp, quiet_from) = quiet_lab();
    let readable = |lab: &Lab, ms: u64| lab.table.connections().next().unwrap().readable(lab.at(ms));
    let quiet = |lab: &Lab, ms: u64| lab.table.connections().next().unwrap().quiet(lab.at(ms));
    let (every, cap) = (
        QUIET_EVERY.as_millis() as u64,
        LOOKED_SAMPLE_EVERY.as_millis() as u64,
    );
    assert_eq!(
        lab.table.sample_targets(lab.at(quiet_from + 1)),
        Some(vec![]),
        "the first walk"
    );
    // An event every 4 s: each record a look, the sample not due, the evidence current past
    // SAMPLE_MAX_AGE since the sample ...
    let mut at = quiet_from;
    while at + 4000 + every <= quiet_from + cap {
        at += 4000;
        lab.apply(at, 0xa, 40000, segment(900, 600), 0);
        tcp.bytes_received += 900;
        tcp.data_segs_in += 1;
        assert!(quiet(&lab, at + 3900), "at {at} ms");
        assert_eq!(
            lab.table.sample_targets(lab.at(at + 3900)),
            None,
            "looked at {at} ms: not due, and its time moved without a walk of the table"
        );
        assert!(readable(&lab, at + 3900), "looked at {at} ms");
    }
    assert!(at - quiet_from > SAMPLE_MAX_AGE.as_millis() as u64);
    // ... due QUIET_EVERY after the last look, were no event to come,
    let c = lab.table.connections().next().unwrap();
    assert_eq!(c.sample_due_at(lab.at(at + 1000)), lab.at(at + every));
    // ... and LOOKED_SAMPLE_EVERY after the last sample however often they come.
    lab.apply(quiet_from + cap - 2000, 0xa, 40000, segment(900, 600), 0);
    tcp.bytes_received += 900;
    tcp.data_segs_in += 1;
    assert!(
        due(&mut lab, quiet_from + cap),
        "LOOKED_SAMPLE_EVERY after the sample"
    );
    // The sample finds only what the records reported: still quiet.
    let sampled = quiet_from + cap;
    lab.sample(sampled, 40000, tcp);
    assert!(quiet(&lab, sampled + 1000));

    // A write waits unsent (write_seq ahead of snd_nxt): no look. Due as if no event came.
    let unsent = Change::Segment {
        len: 900,
        snd_nxt: 1_000_600,
        snd_una: 1_000_600,
        write_seq: 1_000_700,
        srtt_us: 1000,
    };
    lab.apply(sampled + 1000, 0xa, 40000, unsent, 0);
    assert!(!due(&mut lab, sampled + 4000));
    assert!(due(&mut lab, sampled + every), "QUIET_EVERY after the sample");
    let sampled = sampled + every;
    lab.sample(sampled, 40000, tcp);
    // Sent and not acknowledged (snd_una behind snd_nxt): no look either; no evidence once
    // the sample is SAMPLE_MAX_AGE old.
    let unacked = Change::Segment {
        len: 900,
        snd_nxt: 1_000_600,
        snd_una: 1_000_500,
        write_seq: 1_000_600,
        srtt_us: 1000,
    };
    lab.apply(sampled + 1000, 0xa, 40000, unacked, 0);
    assert!(due(&mut lab, sampled + every), "QUIET_EVERY after the sample");
    assert!(!readable(&lab, sampled + SAMPLE_MAX_AGE.as_millis() as u64 + 1));
}

/// The plan keeps each look's new time beside the old ones; looks that come much faster than
/// their times (thousands a second on one connection) make the table walked again instead of
/// growing the plan without bound.
#[test]
fn looks_that_outpace_their_times_make_the_plan_walk_again() {
    let (mut lab, _, quiet_from) = quiet_lab();
    assert_eq!(
        lab.table.sample_targets(lab.at(quiet_from + 1)),
        Some(vec![]),
        "the first walk"
    );
    for ms in 0..1100 {
        lab.apply(quiet_from + 2 + ms, 0xa, 40000, segment(900, 600), 0);
    }
    assert!(lab
        .table
        .connections()
        .next()
        .unwrap()
        .quiet(lab.at(quiet_from + 1200)));
    assert_eq!(
        lab.table.sample_targets(lab.at(quiet_from + 1200)),
        Some(vec![]),
        "walked: nothing due"
    );
    assert_eq!(lab.table.sample_targets(lab.at(quiet_from + 1300)), None);
}

/// A connect storm reuses kernel socket addresses: a connection whose socket address changed
/// (a segment named it at a new one) leaves no index entry behind when it ends, and a new
/// socket at the old address is a new connection (this once panicked the event pump).
#[test]
fn a_reused_socket_address_is_a_new_connection_never_a_gone_one() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.apply(10, 0xb, 40000, segment(0, 100), 0);
    assert_eq!(lab.table.connections().next().unwrap().sk, Some(0xb));
    lab.close(20, 0xb, 40000);
    lab.apply(21, 0xb, 40000, state(tcp_state::FIN_WAIT1, tcp_state::CLOSE), 0);
    assert_eq!(lab.table.connections().count(), 0);
    lab.connect(30, 0xa, 40001, 8);
    let conns: Vec<&Connection> = lab.table.connections().collect();
    assert_eq!(conns.len(), 1);
    assert_eq!((conns[0].tuple.local.port(), conns[0].owner), (40001, Some(8)));
}

/// A frame of the Go client on socket 0xa (process 7), at `ms`.
fn h2_frame(
    lab: &Lab,
    ms: u64,
    sent: bool,
    frame_type: u8,
    flags: u8,
    stream_id: u32,
) -> crate::kernel::events::Frame {
    crate::kernel::events::Frame {
        at: lab.at(ms),
        sk: 0xa,
        tgid: 7,
        goroutine: 70,
        stream_id,
        frame_type,
        flags,
        length: 20,
        sent,
        http1: false,
    }
}

/// Rule A where a client's HTTP/2 frames are followed: its requests are the HEADERS it
/// writes. Flow control sent late by a busy client (sized past two keepalive records, over
/// `REPLY_WITHIN` after the payload it is for) is a request to byte order; the frames say no
/// request was sent, so no wait. A HEADERS nothing answered is one; a wait byte order saw
/// begin before the frames were followed stays; after a loss, byte order again until then.
#[test]
fn where_frames_are_followed_a_wait_is_a_headers_frame_nothing_answered() {
    use crate::table::streams::frame;
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.apply(100, 0xa, 40000, segment(1400, 500), 0);
    let waiting_on = |lab: &Lab, ms: u64| {
        let c = lab.table.connections().next().unwrap();
        (c.waiting(lab.at(ms), false), c.waiting(lab.at(ms), true))
    };
    // A request before the probes: byte order's wait, the frames not followed yet.
    lab.apply(1_000, 0xa, 40000, segment(0, 900), 0);
    assert_eq!(waiting_on(&lab, 1_001), (Some(lab.at(999)), Some(lab.at(999))));
    // What the client's goroutine encodes before it writes a request's HEADERS.
    let encode = |lab: &mut Lab, ms: u64, path: &str| {
        use crate::kernel::events::{Header, HeaderField};
        for (field, value) in [(HeaderField::Method, "GET"), (HeaderField::Path, path)] {
            lab.table.apply_header(&Header {
                at: lab.at(ms),
                tgid: 7,
                goroutine: 70,
                field,
                value: value.into(),
                cut: false,
            });
        }
    };
    // The probes come on: the reader is followed, a new watch is written and answered.
    lab.table
        .apply_frame(&h2_frame(&lab, 2_000, false, frame::READING, 0, 0));
    encode(&mut lab, 2_100, "/api/v1/pods?watch=true&timeoutSeconds=300");
    lab.table
        .apply_frame(&h2_frame(&lab, 2_100, true, frame::HEADERS, frame::END_STREAM, 3));
    assert_eq!(
        waiting_on(&lab, 2_101).1,
        Some(lab.at(999)),
        "the wait from before the frames were followed stays"
    );
    lab.apply(2_200, 0xa, 40000, segment(900, 1100), 0);
    lab.table
        .apply_frame(&h2_frame(&lab, 2_200, false, frame::HEADERS, 0, 3));
    assert_eq!(waiting_on(&lab, 2_201), (None, None), "answered");
    // Flow control for it, sent late and coalesced: byte order waits, the frames do not.
    lab.apply(5_000, 0xa, 40000, segment(0, 1100 + 120), 0);
    assert_eq!(waiting_on(&lab, 5_001), (Some(lab.at(4_999)), None));
    // A request nothing answers: a wait either way (the frames' from its HEADERS).
    encode(&mut lab, 6_000, "/api/v1/namespaces/default/configmaps/x");
    lab.table
        .apply_frame(&h2_frame(&lab, 6_000, true, frame::HEADERS, frame::END_STREAM, 5));
    lab.apply(6_001, 0xa, 40000, segment(0, 1220 + 300), 0);
    assert_eq!(waiting_on(&lab, 6_002).1, Some(lab.at(6_000)));
    // A frame read answers it.
    lab.apply(7_000, 0xa, 40000, segment(300, 1520), 0);
    lab.table
        .apply_frame(&h2_frame(&lab, 7_000, false, frame::HEADERS, 0, 5));
    assert_eq!(waiting_on(&lab, 7_001).1, None);
    // The kernel loses its place in the writes at 8 s: a wait byte order saw begin before
    // then is evidence again, the frames' from then on.
    lab.apply(7_500, 0xa, 40000, segment(0, 1520 + 400), 0);
    assert_eq!(waiting_on(&lab, 7_501).1, None);
    lab.table
        .apply_frame(&h2_frame(&lab, 8_000, true, frame::LOST_PLACE, 0, 0));
    assert_eq!(waiting_on(&lab, 8_001).1, Some(lab.at(7_499)));
}

#[test]
fn rounds_between_walks_read_the_busy_connections_and_a_quiet_one_when_due() {
    let mut lab = Lab::new();
    lab.connect(0, 0xa, 40000, 7);
    lab.connect(0, 0xb, 40001, 7);
    let quiet = counters(2000, 4, 600, 3);
    let mut busy = quiet;
    let targets = |lab: &mut Lab, ms: u64| {
        let mut t = lab.table.sample_targets(lab.at(ms)).unwrap_or_default();
        t.sort_by_key(|t| t.local.port());
        t.iter().map(|t| t.local.port()).collect::<Vec<_>>()
    };
    assert_eq!(targets(&mut lab, 1000), vec![40000, 40001], "never sampled");
    // 40001 sends and is answered every second; 40000 is unchanged.
    let quiet_from = 1000 + QUIET_AFTER.as_millis() as u64;
    let mut last_quiet = 0;
    for ms in (1000..quiet_from + 12_000).step_by(1000) {
        let due = targets(&mut lab, ms);
        if ms < quiet_from {
            assert_eq!(due, vec![40000, 40001], "at {ms} ms: both change or are young");
        } else if ms - last_quiet >= QUIET_EVERY.as_millis() as u64 {
            assert_eq!(due, vec![40000, 40001], "at {ms} ms: the quiet one is due again");
        } else {
            assert_eq!(due, vec![40001], "at {ms} ms: only the busy one");
        }
        if due.contains(&40000) {
            lab.sample(ms, 40000, quiet);
            last_quiet = ms;
        }
        busy.bytes_received += 100;
        busy.bytes_sent += 100;
        busy.bytes_acked += 100;
        lab.sample(ms, 40001, busy);
    }
    // The busy one falls quiet: nothing is read until the next quiet one's due time.
    let still = quiet_from + 12_000;
    for ms in (still..still + QUIET_AFTER.as_millis() as u64).step_by(1000) {
        if targets(&mut lab, ms).contains(&40001) {
            lab.sample(ms, 40001, busy);
        }
    }
    let later = still + QUIET_AFTER.as_millis() as u64 + 1;
    let due = lab.table.sample_targets(lab.at(later));
    assert!(
        due.as_ref()
            .is_none_or(|d| !d.iter().any(|t| t.local.port() == 40001)),
        "{due:?}"
    );
}

/// A scan during a connect's SYN_SENT finds the socket with its port, which the connect's
/// entry (port 0 until established) lacks: the connect's failure afterwards is still its
/// process's.
#[test]
fn a_connect_scanned_in_syn_sent_fails_for_its_process() {
    let mut lab = Lab::new();
    lab.syn(0, 0xa, 7);
    let t = lab.tuple(40000);
    let found = [Scanned {
        tuple: t,
        inode: 77,
        tcp_state: tcp_state::SYN_SENT,
    }];
    assert_eq!(
        lab.table.reconcile_scan(NETNS, &found, lab.at(100)),
        0,
        "nothing new"
    );
    let conns: Vec<&Connection> = lab.table.connections().collect();
    assert_eq!(conns.len(), 1, "{conns:#?}");
    assert_eq!(
        (conns[0].tuple, conns[0].owner, conns[0].inode),
        (t, Some(7), Some(77))
    );
    let mut gave_up = lab.ev(
        500,
        0xa,
        40000,
        state(tcp_state::SYN_SENT, tcp_state::CLOSE),
        None,
    );
    gave_up.sk_err = libc::ECONNREFUSED;
    let failed = lab.table.apply_event(&gave_up, None);
    assert!(
        matches!(
            failed,
            Some(Applied::ConnectFailed {
                pid: 7,
                reason: FailureReason::Refused,
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(lab.table.connections().count(), 0);
    assert_eq!(lab.table.process(7).unwrap().connect_failures.len(), 1);
}

/// The same connect established after the scan: one connection, its process's.
#[test]
fn a_connect_scanned_in_syn_sent_is_one_connection_once_established() {
    let mut lab = Lab::new();
    lab.syn(0, 0xa, 7);
    let found = [Scanned {
        tuple: lab.tuple(40000),
        inode: 77,
        tcp_state: tcp_state::SYN_SENT,
    }];
    lab.table.reconcile_scan(NETNS, &found, lab.at(100));
    lab.apply(
        200,
        0xa,
        40000,
        state(tcp_state::SYN_SENT, tcp_state::ESTABLISHED),
        0,
    );
    assert_one_connected_of_7_with_inode_77(&lab);
    assert!(lab.table.connections().all(|c| c.established_at.is_some()));
}

/// Two connects to one remote in flight at a scan: which found socket is which is not
/// known, so neither takes a tuple; the scan's entries stand for the sockets, as before.
#[test]
fn connects_a_scan_cannot_tell_apart_are_not_merged() {
    let mut lab = Lab::new();
    lab.syn(0, 0xa, 7);
    lab.syn(1, 0xb, 7);
    let found = [40000, 40001].map(|port| Scanned {
        tuple: lab.tuple(port),
        inode: u64::from(port),
        tcp_state: tcp_state::SYN_SENT,
    });
    assert_eq!(lab.table.reconcile_scan(NETNS, &found, lab.at(100)), 2);
    let mut tuples: Vec<Tuple> = lab.table.connections().map(|c| c.tuple).collect();
    tuples.sort_by_key(|t| t.local.port());
    assert_eq!(tuples, [lab.tuple(40000), lab.tuple(40001)]);
}

/// A connect in flight and another socket to the same remote, established, both new to the
/// table at a scan (the second's events still on their way): not merged either.
#[test]
fn a_connect_beside_another_new_socket_to_its_remote_is_not_merged() {
    let mut lab = Lab::new();
    lab.syn(0, 0xa, 7);
    let found = [
        Scanned {
            tuple: lab.tuple(40000),
            inode: 77,
            tcp_state: tcp_state::ESTABLISHED,
        },
        Scanned {
            tuple: lab.tuple(40001),
            inode: 78,
            tcp_state: tcp_state::SYN_SENT,
        },
    ];
    assert_eq!(lab.table.reconcile_scan(NETNS, &found, lab.at(100)), 2);
    assert!(
        lab.table.connections().all(|c| c.owner.is_none()),
        "none given an owner by guess"
    );
}
