//! Requests and answers from *ordered* evidence: the segments that arrive on a connection, in
//! order, each with how far the client had sent when it arrived (`tcp/tcp_probe`, see
//! `lifeline_common::SegmentEvent`).
//!
//! Bytes the client sent between two arriving segments were sent after the first and before
//! the second, so "answered after the request" and "a reply to what came in" are facts, not
//! guesses from counters summed over a sample interval (where a request, its answer and the
//! client's flow-control reply to the answer fall into one sum whose last send is later than
//! its last receive). Sizes still tell records apart: a TLS record of an HTTP/2 PING, PING
//! ack, SETTINGS ack, WINDOW_UPDATE or RST_STREAM is 35–46 bytes
//! ([`KEEPALIVE_RECORD_BYTES`]); headers, events and bookmarks are 100 bytes and more.
//!
//! - Inbound payload (a segment beyond keepalive size) answers everything sent before it.
//! - An inbound keepalive-sized record that the client replies to at once with one of its own
//!   size (a PING and its ack: the same frame in the same cipher) is no answer; one that
//!   nothing replies to is (a HEADERS-only response), once [`SETTLE_AFTER`] has shown that no
//!   reply came. A reply of another size (a WINDOW_UPDATE, 35 or 48 bytes, after a watch's
//!   HEADERS) is no PING ack.
//! - Outbound bytes that fit two keepalive records and follow inbound payload within
//!   [`REPLY_WITHIN`] are flow control (WINDOW_UPDATEs for what was received), whatever the
//!   client asked in between: it hands credit back as it reads, and it may ask its next
//!   request before it has read the last answer. Other outbound bytes beyond keepalive size
//!   are a request. The first segment seen (a connection older than the agent, or after lost
//!   events) may follow payload unseen: what it finds sent beyond one keepalive record is a
//!   request only beyond two.
//! - Small records the client initiates (its own PINGs, a request HPACK made tiny) are matched
//!   by small inbound ones (PING acks); two that nothing matched are a wait.
use std::time::{Duration, Instant};

/// See the module docs.
pub const KEEPALIVE_RECORD_BYTES: u32 = lifeline_common::KEEPALIVE_RECORD_BYTES;

/// A small inbound record the client has not replied to within this long is an answer. A
/// reply shows when the peer acknowledges it: within its delayed-ACK time (at most 200 ms on
/// Linux) and a round trip.
pub const SETTLE_AFTER: Duration = Duration::from_secs(1);

/// A small record sent this soon after inbound payload is flow control for it (WINDOW_UPDATEs
/// as the client reads), not something it asks. The send is timed by the peer's
/// acknowledgement less a round trip, which the peer may delay (Linux: 40–200 ms), and it
/// comes when the client's goroutine has read the payload, which a loaded node delays too (at
/// 300 ms, a go1.24 informer's WINDOW_UPDATEs on a loaded 2-core node could be taken for a
/// request its quiet watch never answers). Below the 2 s at which a standby leader asks for
/// its lease again, a request HPACK made small enough to look like flow control.
pub const REPLY_WITHIN: Duration = Duration::from_secs(1);

/// Requests closer together than this are one upload (streaming), not a new request each: the
/// wait for an answer starts when the client stops sending.
pub const STREAMING_GAP: Duration = Duration::from_millis(250);

/// One segment that arrived, as the kernel reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub at: Instant,
    /// Payload bytes.
    pub len: u16,
    /// The client's `snd_nxt` on arrival.
    pub snd_nxt: u32,
    /// The client's `snd_una` on arrival: for the first segment seen, bytes between it and
    /// `snd_nxt` were sent since the last acknowledgement (a request this segment acknowledges).
    pub snd_una: u32,
    /// Smoothed round-trip time: a request acknowledged by this segment was sent about this
    /// long before it arrived.
    pub srtt: Duration,
}

/// The ordered evidence of one connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ordered {
    /// Arrival and `snd_nxt` of the last segment.
    last: Option<(Instant, u32)>,
    /// When payload last arrived (flow control for it may follow, see [`REPLY_WITHIN`]).
    payload_in: Option<Instant>,
    /// A small inbound record not told apart yet (a PING, or a small answer): when, and its
    /// size.
    small_in: Option<(Instant, u32)>,
    /// Small records the client initiated that no small inbound record matched yet.
    own_small: u32,
    first_own_small: Option<Instant>,
    /// The first request nothing answered yet.
    waiting_since: Option<Instant>,
    /// The last request.
    last_request: Option<Instant>,
    /// The last answer (payload, or a small record nothing replied to).
    last_answer: Option<Instant>,
}

impl Ordered {
    /// Applies the next segment; returns when the client sent a request before it, if it did.
    pub fn apply(&mut self, seg: Segment) -> Option<Instant> {
        self.settle(seg.at);
        let mut request = None;
        // The first segment seen (of a connection, or after lost events): what it finds
        // unacknowledged was sent since the last acknowledgement.
        let (prev_at, prev_nxt) = match self.last {
            Some((at, nxt)) => (Some(at), nxt),
            None => (None, seg.snd_una),
        };
        let out = seg.snd_nxt.wrapping_sub(prev_nxt);
        // Beyond half the sequence space: an older segment reported late, not a send.
        if out > 0 && out < 1 << 31 {
            let sent_at = seg.at.checked_sub(seg.srtt).unwrap_or(seg.at);
            if prev_at.is_none() && out > KEEPALIVE_RECORD_BYTES {
                // What came before is unseen: payload may have, and a send that fits flow
                // control for it cannot be told from it. (One keepalive record is counted as
                // before: the client's own PING, whose ack is then no answer.)
                self.payload_in = Some(sent_at);
            }
            request = self.sent(out, prev_at.map_or(sent_at, |p| sent_at.max(p)));
        }
        if seg.len > 0 {
            self.received(u32::from(seg.len), seg.at);
        }
        let at = self.last.map_or(seg.at, |(prev, _)| prev.max(seg.at));
        self.last = Some((at, seg.snd_nxt));
        request
    }

    /// The client sent `out` bytes (new data) at about `at`.
    fn sent(&mut self, out: u32, at: Instant) -> Option<Instant> {
        let after_payload = self
            .payload_in
            .is_some_and(|p| at.saturating_duration_since(p) <= REPLY_WITHIN);
        if after_payload && out <= 2 * KEEPALIVE_RECORD_BYTES {
            // Flow control for what was received (connection and stream WINDOW_UPDATEs),
            // before anything else: a watch's HEADERS can be a 13-byte frame as a
            // WINDOW_UPDATE is, so the size of a small inbound record does not tell them
            // apart. That record stays to be told apart: nothing else replying, an answer.
            return None;
        }
        if self.small_in.is_some_and(|(_, len)| len == out) {
            // A reply the size of a small inbound record: a PING and its ack (the same frame
            // in the same cipher), keepalives both ways.
            self.small_in = None;
            return None;
        }
        if let Some((small, _)) = self.small_in.take() {
            // The client went on to send something else: the small record was an answer.
            self.answer(small);
        }
        if out <= KEEPALIVE_RECORD_BYTES {
            self.own_small += 1;
            self.first_own_small.get_or_insert(at);
            return None;
        }
        let streaming = self
            .last_request
            .is_some_and(|r| at.saturating_duration_since(r) < STREAMING_GAP);
        if self.waiting_since.is_none() || streaming {
            self.waiting_since = Some(at);
        }
        self.last_request = Some(at);
        Some(at)
    }

    fn received(&mut self, len: u32, at: Instant) {
        if len > KEEPALIVE_RECORD_BYTES {
            self.answer(at);
            self.payload_in = Some(at);
            return;
        }
        if self.own_small > 0 {
            // The ack of a PING the client sent.
            self.own_small -= 1;
            if self.own_small == 0 {
                self.first_own_small = None;
            }
            return;
        }
        if let Some((earlier, _)) = self.small_in.replace((at, len)) {
            // Two small records in a row and no reply between them: the first was an answer.
            self.answer(earlier);
        }
    }

    fn answer(&mut self, at: Instant) {
        self.waiting_since = None;
        self.own_small = 0;
        self.first_own_small = None;
        self.last_answer = self.last_answer.max(Some(at));
    }

    /// At `now`: a small inbound record that nothing replied to within [`SETTLE_AFTER`] was an
    /// answer.
    pub fn settle(&mut self, now: Instant) {
        if let Some((small, _)) = self.small_in {
            if now.saturating_duration_since(small) >= SETTLE_AFTER {
                self.small_in = None;
                self.answer(small);
            }
        }
    }

    /// Since when the client has been waiting for an answer: a request nothing answered, or
    /// two small records of its own that nothing matched.
    pub fn waiting(&self) -> Option<Instant> {
        let small = self.first_own_small.filter(|_| self.own_small >= 2);
        match (self.waiting_since, small) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Nothing is pending: no wait, no record left to tell apart.
    pub fn settled(&self) -> bool {
        self.waiting_since.is_none() && self.small_in.is_none() && self.own_small == 0
    }

    pub fn last_answer(&self) -> Option<Instant> {
        self.last_answer
    }

    pub fn last_request(&self) -> Option<Instant> {
        self.last_request
    }

    /// Events were lost: what was pending may have been answered unseen. Waits are dropped (a
    /// request made from now on is timed afresh) and the next segment starts a new sequence;
    /// what was answered stays.
    pub fn lost_evidence(&mut self) {
        *self = Self {
            last_answer: self.last_answer,
            last_request: self.last_request,
            ..Self::default()
        };
    }
}

#[cfg(test)]
mod tests;
