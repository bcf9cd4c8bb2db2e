//! The HTTP/2 streams of one connection, from the frame headers a Go client wrote and read
//! (`kernel/` uprobes): which request each stream carries, when its response headers came,
//! its last frame, the deadline it declared, and whether it ended.
//!
//! A stream is learned from the client's HEADERS frame, paired with the `:method` and `:path`
//! its goroutine encoded just before. Streams opened before the agent (or before its probes
//! reached the binary) are learned from their first frame afterwards: their request is not
//! known, so they are listed but never judged.
//!
//! Bounded: at most [`MAX_OPEN`] open streams per connection (the oldest unknown ones go
//! first), [`MAX_OPEN_PER_PROCESS`] per process and [`MAX_OPEN_PER_NODE`] on the node
//! (`requests.rs`), requests waiting for their HEADERS frame at most
//! [`MAX_PENDING_PER_PROCESS`] a process and [`MAX_PENDING`] in all (see `requests.rs`).
pub mod request;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use lifeline_common::protocol::HTTP1_CHUNKED;
use request::{Kind, Request};

/// HTTP/2 frame types and flags the table reads (RFC 9113 §6).
pub mod frame {
    pub const HEADERS: u8 = 1;
    pub const RST_STREAM: u8 = 3;
    pub const GOAWAY: u8 = 7;
    pub const END_STREAM: u8 = 1;
    /// Not a frame: the kernel lost its place in what the client wrote (see `ebpf/src/gotls.rs`);
    /// frames may have gone unseen.
    pub const LOST_PLACE: u8 = 0xff;
    /// Not a frame: a goroutine of the client began reading this connection; every frame it
    /// reads from now on is seen. The kernel says it once per reader; said again for the same
    /// connection, the kernel had forgotten its reader (its map evicted the entry, or the
    /// socket was briefly not found), and frames read meanwhile may have gone unseen.
    pub const READING: u8 = 0xfe;
    /// Not a frame: the connection began (its preface was written) under the probes; its
    /// reader's first read precedes its first frame, so every frame of it is seen, whatever
    /// order the kernel's records of the first request and of that read arrive in.
    pub const FRESH: u8 = 0xfd;
}

/// Open streams kept per connection.
pub const MAX_OPEN: usize = 512;
/// Open streams kept per process, all its connections together (four connections at
/// [`MAX_OPEN`]; kube-controller-manager holds some hundred). Past it the process's own
/// streams are forgotten to make room, said as a gap in its evidence (see `requests.rs`).
pub const MAX_OPEN_PER_PROCESS: usize = 2048;
/// Open streams kept on the node, all processes together: four processes at
/// [`MAX_OPEN_PER_PROCESS`], some four times what a node's clients hold (a hundred clients,
/// kube-controller-manager's hundred streams the most). Past it the process holding the most
/// forgets one of its own, as at its own bound (see `requests.rs`). The agent's RSS at it:
/// ~65 MiB (the `neighbours` suite; ~2 KiB a stream with its request and connection).
pub const MAX_OPEN_PER_NODE: usize = 8_192;
/// Requests encoded but not yet matched to a HEADERS frame, per table (the node).
pub const MAX_PENDING: usize = 4096;
/// The same, per process: a client-go process has one in flight per goroutine writing a
/// request, a few at a time (kube-controller-manager's informers start some forty at once).
pub const MAX_PENDING_PER_PROCESS: usize = 256;
/// A request encoded this long ago without its HEADERS frame is dropped.
pub const PENDING_TTL: Duration = Duration::from_secs(10);

/// What the judgement knows of one open stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    pub id: u32,
    /// None for a stream opened before lifeline saw the connection's requests.
    pub request: Option<Request>,
    /// When the client sent its HEADERS (or when lifeline first saw it).
    pub started: Instant,
    /// When the response's HEADERS came.
    pub response_at: Option<Instant>,
    /// The last frame either way.
    pub last_frame: Instant,
    /// The last frame the client read (its HEADERS time until one comes).
    pub last_received: Instant,
    /// The client ended its side (END_STREAM sent): the request is complete.
    pub request_sent: bool,
    /// Every frame of it can have been seen: it began after the connection's reads were
    /// followed, and no evidence was lost since. Only such streams are judged.
    pub whole: bool,
    /// Its response's end would be seen: always on HTTP/2 (END_STREAM); on HTTP/1.1 only
    /// when the response is chunked (its terminator), not when it has a `Content-Length`.
    /// A response begun and unfinished is evidence only then.
    pub end_visible: bool,
}

impl Stream {
    /// The end the request declared for itself: a watch's `timeoutSeconds`, else the
    /// apiserver's own bound for a watch without one (`max_watch`); None for other requests
    /// (they get `stale_after` for their response headers) and for unknown streams.
    pub fn deadline(&self, max_watch: Duration) -> Option<Instant> {
        let request = self.request.as_ref()?;
        (request.kind == Kind::Watch).then(|| self.started + request.timeout.unwrap_or(max_watch))
    }
}

/// Why a stream is stuck, for the judgement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    pub stream: u32,
    /// "watch endpointslices (all namespaces): open 11m02s, due to end after 8m14s, nothing
    /// since 10m58s".
    pub description: String,
    /// The request's resource (`group/resource`), empty when unknown.
    pub resource: String,
    /// When the evidence crossed the threshold.
    pub evidence: Instant,
}

/// Frames the kernel said went unseen on a connection whose frames were being followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// It lost its place in what the client writes ([`frame::LOST_PLACE`]).
    LostPlace,
    /// It forgot which connection the client's reader reads ([`frame::READING`] again).
    ReaderForgotten,
}

/// A connection's streams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    open: BTreeMap<u32, Stream>,
    /// The client's reads of this connection are followed (see [`frame::READING`]).
    pub reading: bool,
    /// A reader's [`frame::READING`] came: another one means frames may have gone unseen.
    reader_seen: bool,
    /// Since when every frame of this connection is seen both ways: its first
    /// [`frame::READING`] or [`frame::FRESH`], or the last loss of its evidence after it.
    pub followed_since: Option<Instant>,
    /// The first request (a HEADERS frame written) since the client last read a frame the
    /// kernel reports (HEADERS, DATA, RST_STREAM, GOAWAY): rule A's wait, from frames, where
    /// byte order can only guess a request from sizes and timing (see `Connection::waiting`).
    pub unanswered_since: Option<Instant>,
    /// Frames seen each way.
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Streams that ended (END_STREAM received, or reset either way).
    pub ended: u64,
    /// Streams forgotten because of the bound.
    pub dropped: u64,
    /// An HTTP/1.1 connection (an OpenSSL client's): a response's end is seen only when its
    /// body is chunked (the terminator), not when it has a `Content-Length`, so a response
    /// begun and unfinished is evidence there only when the kernel said it is chunked
    /// ([`Stream::end_visible`]).
    pub http1: bool,
    /// A response to a request lifeline named was seen here: the probes on the HTTP/2 code
    /// this connection uses are proven live both ways (see `health::judge`'s evidence before
    /// judgement).
    pub responded: bool,
}

impl Streams {
    /// Whether the client's frames are read both ways on this connection.
    #[cfg(test)]
    pub fn visible(&self) -> bool {
        self.reading && self.frames_sent > 0
    }

    pub fn open(&self) -> impl Iterator<Item = &Stream> {
        self.open.values()
    }

    /// How many streams are open.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Whether [`apply`](Self::apply) of this frame would add a stream.
    pub fn opens(&self, sent: bool, frame_type: u8, flags: u8, id: u32) -> bool {
        let marker = [frame::READING, frame::FRESH, frame::LOST_PLACE, frame::GOAWAY].contains(&frame_type);
        let ends = frame_type == frame::RST_STREAM || (!sent && flags & frame::END_STREAM != 0);
        !marker && !ends && id != 0 && !self.open.contains_key(&id)
    }

    /// Forgets one open stream to make room: an unknown one first, else the oldest. Whether
    /// there was one.
    pub fn forget_one(&mut self) -> bool {
        let victim = self
            .open
            .values()
            .find(|s| s.request.is_none())
            .or_else(|| self.open.values().next())
            .map(|s| s.id);
        let Some(v) = victim else { return false };
        self.open.remove(&v);
        self.dropped += 1;
        true
    }

    /// A frame the client wrote or read; `request` is what its goroutine encoded for a
    /// HEADERS frame it wrote. Returns what the kernel said it lost, when this connection's
    /// frames were being followed (a connection with no frame seen yet, such as a Go
    /// HTTP/1.1 one whose writes are no frames, loses nothing it had).
    pub fn apply(
        &mut self,
        at: Instant,
        sent: bool,
        frame_type: u8,
        flags: u8,
        id: u32,
        request: Option<Request>,
    ) -> Option<Loss> {
        let following = self.frames_sent + self.frames_received > 0;
        if ![frame::READING, frame::FRESH, frame::LOST_PLACE].contains(&frame_type) {
            if sent {
                self.frames_sent += 1;
            } else {
                self.frames_received += 1;
                // Anything the server said answers every request before it.
                self.unanswered_since = None;
            }
        }
        if frame_type == frame::READING || frame_type == frame::FRESH {
            let mut lost = None;
            if frame_type == frame::READING {
                if self.reader_seen {
                    self.lost_evidence(at);
                    lost = following.then_some(Loss::ReaderForgotten);
                }
                self.reader_seen = true;
            }
            self.reading = true;
            self.followed_since.get_or_insert(at);
            return lost;
        }
        if frame_type == frame::LOST_PLACE {
            self.lost_evidence(at);
            return following.then_some(Loss::LostPlace);
        }
        if frame_type == frame::GOAWAY {
            // Streams above the last one the server processed are refused; the client retries
            // them elsewhere. The ones below still end normally.
            return None;
        }
        if id == 0 {
            return None;
        }
        if frame_type == frame::RST_STREAM || (!sent && flags & frame::END_STREAM != 0) {
            if let Some(s) = self.open.remove(&id) {
                self.ended += 1;
                self.responded |= !sent && frame_type != frame::RST_STREAM && s.request.is_some();
            }
            return None;
        }
        if sent && frame_type == frame::HEADERS && !self.open.contains_key(&id) {
            self.unanswered_since.get_or_insert(at);
            let whole = self.reading && request.is_some();
            self.insert(Stream {
                id,
                request,
                started: at,
                response_at: None,
                last_frame: at,
                last_received: at,
                request_sent: flags & frame::END_STREAM != 0,
                whole,
                end_visible: false,
            });
            return None;
        }
        let stream = match self.open.get_mut(&id) {
            Some(s) => s,
            None => {
                // A stream older than what lifeline saw: known from now on, never judged.
                self.insert(Stream {
                    id,
                    request: None,
                    started: at,
                    response_at: (!sent).then_some(at),
                    last_frame: at,
                    last_received: at,
                    request_sent: !sent,
                    whole: false,
                    end_visible: false,
                });
                return None;
            }
        };
        stream.last_frame = at;
        if sent {
            stream.request_sent |= flags & frame::END_STREAM != 0;
        } else {
            stream.last_received = at;
            if frame_type == frame::HEADERS && stream.response_at.is_none() {
                stream.response_at = Some(at);
                stream.end_visible = !self.http1 || flags & HTTP1_CHUNKED != 0;
                self.responded |= stream.request.is_some();
            }
        }
        None
    }

    fn insert(&mut self, stream: Stream) {
        if self.open.len() >= MAX_OPEN {
            self.forget_one();
        }
        self.open.insert(stream.id, stream);
    }

    /// Events were lost at `at`, or the kernel lost its place: what is open now may have ended
    /// unseen, so none of it is judged again, and a wait from frames counts from then on.
    pub fn lost_evidence(&mut self, at: Instant) {
        self.unanswered_since = None;
        if self.followed_since.is_some() {
            self.followed_since = self.followed_since.max(Some(at));
        }
        for s in self.open.values_mut() {
            s.whole = false;
        }
    }

    /// Stuck streams at `now`: a watch open `watch_grace` past its deadline with no frame
    /// since the deadline; any other known request without response headers for
    /// `stale_after`, or whose response began, has not ended, and has had nothing come for
    /// `stale_after` (not for responses endless by design, nor for an HTTP/1.1 response whose
    /// end would go unseen, see [`Stream::end_visible`]).
    pub fn stuck(
        &self,
        now: Instant,
        stale_after: Duration,
        watch_grace: Duration,
        max_watch: Duration,
    ) -> Vec<Stuck> {
        let mut found = Vec::new();
        for s in self.open.values() {
            let Some(request) = s.request.as_ref().filter(|_| s.whole) else {
                continue;
            };
            let evidence = match (s.response_at, s.deadline(max_watch)) {
                (None, _) => s.started + stale_after,
                (Some(_), Some(deadline)) if s.last_frame < deadline => deadline + watch_grace,
                (Some(_), None) if s.end_visible && !request.endless => s.last_received + stale_after,
                _ => continue,
            };
            if now < evidence {
                continue;
            }
            let mut description = format!(
                "{request}: open {}",
                clock(now.saturating_duration_since(s.started))
            );
            match (s.response_at, request.timeout) {
                (None, _) => description.push_str(", no response headers"),
                (Some(_), _) if request.kind != Kind::Watch => {
                    description.push_str(", its response begun and unfinished")
                }
                (Some(_), Some(t)) => description.push_str(&format!(", due to end after {}", clock(t))),
                (Some(_), None) => description.push_str(&format!(
                    ", beyond the apiserver's longest watch ({})",
                    clock(max_watch)
                )),
            }
            description.push_str(&format!(
                ", nothing since {}",
                clock(now.saturating_duration_since(s.last_frame))
            ));
            found.push(Stuck {
                stream: s.id,
                description,
                resource: request.resource.clone(),
                evidence,
            });
        }
        found.sort_by_key(|s| s.evidence);
        found
    }
}

/// "11m02s", "45s", "1h05m00s".
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

#[cfg(test)]
mod tests;
