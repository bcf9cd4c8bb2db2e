use super::*;

/// A connection's segments on a fake clock: `seg(ms, len, sent)` is a segment arriving at
/// `ms` with `len` bytes of payload after the client has sent `sent` bytes in all.
struct Conn {
    t0: Instant,
    ordered: Ordered,
}

const RTT: Duration = Duration::from_millis(1);

impl Conn {
    fn new() -> Self {
        let mut c = Self {
            t0: Instant::now(),
            ordered: Ordered::default(),
        };
        // The handshake is over: 500 bytes sent (ClientHello, Finished), answered.
        c.seg(0, 1400, 500);
        c
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn seg(&mut self, ms: u64, len: u16, sent: u32) -> Option<Instant> {
        let seg = Segment {
            at: self.at(ms),
            len,
            // Any initial sequence number: arithmetic wraps.
            snd_nxt: 0xffff_ff00_u32.wrapping_add(sent),
            snd_una: 0xffff_ff00_u32.wrapping_add(sent),
            srtt: RTT,
        };
        self.ordered.apply(seg)
    }

    fn waiting(&mut self, ms: u64) -> Option<Duration> {
        self.ordered.settle(self.at(ms));
        self.ordered.waiting().map(|w| w - self.t0)
    }
}

#[test]
fn an_answer_then_the_clients_flow_control_reply_is_not_a_wait() {
    // The JVM watch of issue 15: request, the initial ADDED event 4 ms later (3.4 kB), and a
    // small record 4 ms after that; all inside one second, where summed counters read "a send
    // after the last receive".
    let mut c = Conn::new();
    assert!(c.seg(10_000, 0, 800).is_some(), "the watch request, acknowledged");
    assert_eq!(c.waiting(10_001), Some(Duration::from_millis(9_999)));
    c.seg(10_004, 3400, 800);
    c.seg(10_009, 0, 840); // its WINDOW_UPDATE, acknowledged
    assert_eq!(c.waiting(100_000), None, "answered; the reply asks nothing");
    assert!(c.ordered.settled());
}

#[test]
fn a_request_nothing_answers_waits_from_when_it_was_sent() {
    let mut c = Conn::new();
    // Acknowledged by the peer's TCP (an ACK without payload), never answered.
    assert_eq!(c.seg(20_000, 0, 900), Some(c.at(19_999)));
    assert_eq!(c.waiting(200_000), Some(Duration::from_millis(19_999)));
    // More requests (leader-election renewals every 2 s) do not move the start of the wait.
    c.seg(22_000, 0, 1300);
    c.seg(24_000, 0, 1700);
    assert_eq!(c.waiting(200_000), Some(Duration::from_millis(19_999)));
    // Payload answers it.
    c.seg(25_000, 600, 1700);
    assert_eq!(c.waiting(200_000), None);
}

#[test]
fn a_peers_pings_that_the_client_acks_are_no_answer() {
    // Seed 002 behind a gateway with HTTP/2 keepalive: a request every 3 s, and from then on
    // only the gateway's own PINGs (every 4 s), each acked by the client at once.
    let mut c = Conn::new();
    let mut sent = 500;
    let mut pings = 0;
    for ms in (10_000..100_000).step_by(1000) {
        if ms % 3000 == 1000 {
            sent += 200;
            c.seg(ms, 0, sent); // the request, acknowledged
        }
        if ms % 4000 == 0 {
            c.seg(ms, 38, sent); // the gateway's PING
            sent += 38;
            c.seg(ms + 40, 0, sent); // the client's PING ack, acknowledged
            pings += 1;
        }
    }
    assert!(pings > 20);
    let waited = c.waiting(100_500).expect("still waiting");
    assert_eq!(waited, Duration::from_millis(9_999), "since the first request");
}

#[test]
fn a_small_answer_nothing_replies_to_is_an_answer() {
    // A watch answered with HEADERS only (~50 bytes): nothing replies to it.
    let mut c = Conn::new();
    c.seg(5_000, 0, 700);
    c.seg(5_002, 45, 700);
    assert!(c.waiting(5_500).is_some(), "not told apart yet");
    assert_eq!(c.waiting(6_100), None, "no reply within a second: an answer");
    // A later segment settles it too, whatever the clock of the judge.
    let mut c = Conn::new();
    c.seg(5_000, 0, 700);
    c.seg(5_002, 45, 700);
    c.seg(60_000, 0, 700);
    assert_eq!(c.waiting(60_000), None);
}

#[test]
fn small_answers_in_a_row_are_answers() {
    let mut c = Conn::new();
    c.seg(5_000, 0, 700);
    c.seg(5_002, 45, 700);
    c.seg(5_003, 30, 700);
    assert!(
        c.ordered.waiting_since.is_none(),
        "the first small record answered"
    );
}

#[test]
fn a_standby_leader_election_behind_a_dead_gateway_waits_from_its_first_get() {
    // The real-cluster seed-002 case: a standby kube-scheduler asks for its lease every 2 s
    // (a GET of ~41 bytes once HPACK indexed everything). The gateway's upstream dies after
    // one answer: the next GET, 2 s after that answer, is no flow control; it times out after
    // 10 s, is cancelled (RST_STREAM, 35 bytes) and asked again.
    let mut c = Conn::new();
    c.seg(10_000, 0, 541); // a GET, acknowledged
    c.seg(10_003, 600, 541); // its answer
    c.seg(12_000, 0, 582); // the next GET: nothing answers it
    assert_eq!(c.waiting(20_000), None, "one small record is not yet a wait");
    c.seg(22_000, 0, 617); // RST_STREAM
    c.seg(22_001, 0, 658); // the GET again
    assert_eq!(c.waiting(40_000), Some(Duration::from_millis(11_999)));
}

#[test]
fn the_clients_own_pings_acked_are_fine_two_unmatched_are_a_wait() {
    let mut c = Conn::new();
    // client-go's HTTP/2 health check: a PING after 30 s without a frame, acked at once.
    c.seg(30_001, 38, 538);
    assert_eq!(c.waiting(40_000), None);
    assert!(c.ordered.settled());
    // Two small records of its own that nothing follows: a request HPACK made tiny. (Long
    // after the handshake's payload: no flow control for it.)
    let mut c = Conn::new();
    c.seg(30_000, 0, 540);
    assert_eq!(c.waiting(40_000), None, "one is not yet a wait");
    c.seg(32_000, 0, 580);
    assert_eq!(c.waiting(40_000), Some(Duration::from_millis(29_999)));
}

#[test]
fn a_steady_answer_every_ten_seconds_is_never_a_wait() {
    // kube-scheduler's picked connection of issue 15: ~128 bytes every 10 s, with its
    // requests and the client's acknowledgements in between.
    let mut c = Conn::new();
    let mut sent = 500;
    for round in 1..60u64 {
        let ms = round * 10_000;
        sent += 300;
        c.seg(ms, 0, sent);
        c.seg(ms + 3, 128, sent);
        assert_eq!(c.waiting(ms + 5), None, "round {round}");
    }
}

#[test]
fn an_upload_waits_from_when_it_stops_sending() {
    let mut c = Conn::new();
    let mut sent = 500;
    for ms in (10_000..20_000).step_by(50) {
        sent += 1400;
        c.seg(ms, 0, sent);
    }
    assert_eq!(c.waiting(20_000), Some(Duration::from_millis(19_949)));
}

#[test]
fn lost_events_drop_waits_and_restart_the_sequence() {
    let mut c = Conn::new();
    c.seg(10_000, 0, 900);
    assert!(c.waiting(10_001).is_some());
    c.ordered.lost_evidence();
    assert_eq!(c.waiting(10_002), None, "the answer may have come unseen");
    assert_eq!(c.seg(11_000, 0, 5000), None, "no base to count sends from");
    assert!(c.seg(12_000, 0, 5400).is_some());
}

#[test]
fn the_first_segment_seen_times_what_it_acknowledges() {
    // A connection that received nothing yet (or older than the agent, or after lost
    // events): its first segment is the acknowledgement of a request.
    let mut o = Ordered::default();
    let t0 = Instant::now();
    let seg = Segment {
        at: t0 + Duration::from_secs(30),
        len: 0,
        snd_nxt: 1300,
        snd_una: 1000,
        srtt: RTT,
    };
    assert_eq!(o.apply(seg), Some(seg.at - RTT));
    assert_eq!(o.waiting(), Some(seg.at - RTT));
}

#[test]
fn what_the_first_segment_finds_is_no_request_if_it_fits_flow_control() {
    // A go1.24 informer started just before the agent, reading its LIST's answer in 4 kB
    // steps: a WINDOW_UPDATE record (48 bytes) after each. The first segment the agent sees is
    // the peer's delayed acknowledgement of two of them, for payload that came before it
    // looked; the quiet watches that follow answer nothing for minutes.
    let mut o = Ordered::default();
    let t0 = Instant::now();
    let seg = |ms: u64, nxt: u32| Segment {
        at: t0 + Duration::from_millis(ms),
        len: 0,
        snd_nxt: nxt,
        snd_una: 1000,
        srtt: RTT,
    };
    assert_eq!(o.apply(seg(2_000, 1096)), None);
    assert_eq!(o.waiting(), None);
    assert!(o.settled());
    // What it sends next is counted from there.
    assert!(o.apply(seg(5_000, 1096 + 200)).is_some(), "a request");
}

#[test]
fn a_first_segment_that_acks_the_clients_ping_is_no_answer() {
    // The agent's first look at a quiet client-go connection: the peer's PING ack (39 bytes)
    // acknowledges the client's PING. Keepalives both ways, no answer, nothing pending.
    let mut o = Ordered::default();
    let at = Instant::now();
    let seg = Segment {
        at,
        len: 39,
        snd_nxt: 1039,
        snd_una: 1000,
        srtt: RTT,
    };
    assert_eq!(o.apply(seg), None);
    o.settle(at + Duration::from_secs(5));
    assert_eq!(o.last_answer(), None);
    assert!(o.settled());
}

#[test]
fn flow_control_a_loaded_client_sends_late_is_no_request() {
    // Two WINDOW_UPDATE records (96 bytes) of a client whose reading goroutine waited for a
    // CPU, acknowledged together 800 ms after the payload they are for. The same bytes 1.2 s
    // after payload are a request.
    let mut c = Conn::new();
    c.seg(10_000, 1200, 500);
    assert_eq!(c.seg(10_800, 0, 596), None);
    assert_eq!(c.waiting(100_000), None);
    c.seg(110_000, 1200, 596);
    assert!(c.seg(111_200, 0, 692).is_some());
    assert_eq!(c.waiting(120_000), Some(Duration::from_millis(111_199)));
}

#[test]
fn a_segment_reported_late_is_no_send() {
    let mut c = Conn::new();
    c.seg(10_000, 0, 900);
    c.seg(10_001, 600, 900);
    // An older snd_nxt (another CPU's event, reported after): nothing was sent.
    assert_eq!(c.seg(10_002, 0, 880), None);
    assert_eq!(c.waiting(10_003), None);
}

#[test]
fn flow_control_for_a_list_read_after_the_watch_was_asked_is_no_request() {
    // A go1.24 informer on a loaded node (the real-cluster soak): its LISTs' answers arrive,
    // it asks for its watches at once, the watches' HEADERS come back (a 13-byte frame once
    // HPACK indexed every header: 35 bytes), and only then does its reading goroutine hand
    // back the LISTs' flow-control credit: WINDOW_UPDATEs for the connection and the stream
    // (48 bytes), or for the connection alone (35 bytes, the HEADERS' size) once the stream
    // has ended. Nothing else comes for minutes on a quiet cluster. Sent 200 ms after the
    // answers; or, 48 bytes, 1.2 s after them, the HEADERS having come 500 ms after them (a
    // reading goroutine that waited for a CPU, an apiserver slow to start the watch): too
    // late for flow control, and by its size no ack of a PING.
    for (update, headers, sent) in [(48, 10_011, 10_203), (35, 10_011, 10_203), (48, 10_500, 11_203)] {
        let mut c = Conn::new();
        c.seg(10_000, 0, 800); // the LISTs, acknowledged
        c.seg(10_003, 4137, 800); // their answers (the rest of them coalesced)
        c.seg(headers - 1, 0, 1000); // the watches, acknowledged
        c.seg(headers, 35, 1000); // their HEADERS
        let case = format!("{update} bytes {} ms after the answers", sent - 10_003);
        assert_eq!(c.seg(sent, 0, 1000 + update), None, "{case}");
        assert_eq!(c.waiting(100_000), None, "{case}: the watches were answered");
    }
}

#[test]
fn a_reply_of_another_size_is_no_ping_ack() {
    // Long after any payload: a watch's HEADERS (44 bytes), then, before it settled, the
    // client's own small record of another size (a WINDOW_UPDATE, 35 bytes). The HEADERS
    // answered the watch.
    let mut c = Conn::new();
    c.seg(10_000, 0, 800); // the watch, acknowledged
    c.seg(10_004, 44, 800); // its HEADERS
    c.seg(10_500, 0, 835); // the client's 35 bytes, acknowledged within the second
    assert_eq!(c.waiting(100_000), None, "the watch was answered");
    // The peer's PING (39 bytes) and the client's ack of the same size: no answer.
    let mut c = Conn::new();
    c.seg(10_000, 0, 800);
    c.seg(10_004, 39, 800);
    c.seg(10_045, 0, 839);
    assert_eq!(c.waiting(100_000), Some(Duration::from_millis(9_999)));
}
