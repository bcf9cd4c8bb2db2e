//! The connection table: every TCP connection that a process on this node holds to an
//! apiserver endpoint, with its owner and the evidence the health engine judges from, merged
//! from three sources:
//!
//! - kernel events (connect, establish, close, retransmit), keyed by the socket's kernel
//!   address while it lives;
//! - scans of sock_diag (at start-up, after lost events, periodically), keyed by network
//!   namespace + 4-tuple, so a later event for the same socket finds the same entry and nothing
//!   is listed twice; a scan also heals what lost events left behind;
//! - the sampler (`tcp_info` of tracked sockets only: counters, ACK progress).
//!
//! Evidence kept per connection: requests and answers in their order, from the segments the
//! kernel reports as they arrive (`ordered.rs`: the last answer, the first request not answered
//! yet); retransmits without ACK progress (from the kernel's retransmit events and from
//! `tcp_info`, which also sees segments dropped on the client's own path).
//! Per process: how its last connection ended (a *loss* only when the peer or the network ended
//! it, or a GOAWAY prompted the close — never an idle close of its own), its connects in flight
//! and its recent failures (bounded), and the rhythm of its requests.
//!
//! The table does no I/O: callers resolve owners (`/proc`) and samples (sock_diag) first and
//! hand in the results, so every merge rule here is unit-tested with plain values.
//!
//! This file holds the types, the [`ConnectionTable`] itself and its small accessors; each
//! source has its file, as do the table's parts:
//!
//! - `apply.rs`: kernel events applied (and the table's indexes);
//! - `scan.rs`: sock_diag scans reconciled, owners of scanned connections set;
//! - `plan.rs`: the sampler's plan (which connections a round reads, when a quiet one is due);
//! - `samples.rs`: the sampler's `tcp_info` folded into a connection's evidence;
//! - `process.rs`: per process: owner, connected or trying, how its last connection ended
//!   (losses, prompted and idle closes), its connect failures;
//! - `ordered.rs`, `streams.rs`, `requests.rs`: requests and answers, HTTP/2 streams, request
//!   headers paired with their streams; `gaps.rs`: records the kernel lost; `facts.rs`: the
//!   evidence types; `sampler.rs`: the sampler itself (the I/O the table leaves out).
use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    time::{Duration, Instant, SystemTime},
};

use self::{
    facts::{LossCause, Rhythm},
    gaps::Gap,
    ordered::Ordered,
    process::LocalClose,
    streams::Streams,
};
use crate::{
    endpoint::{Endpoint, EndpointSet},
    host::process::ProcessInfo,
    host::sock_diag::TcpInfo,
};

/// How many failed connects a process keeps (the newest): rules look at `connect_window`
/// only, so a tight refused-connect loop costs a bounded amount of memory and work.
pub const FAILURES_KEPT: usize = 32;

/// Failed connects older than this are dropped even when fewer than [`FAILURES_KEPT`].
pub const FAILURE_MEMORY: Duration = Duration::from_secs(600);

/// A close by the client counts as prompted by the apiserver side (a GOAWAY during a graceful
/// shutdown) when, within this long before or after it, another connection to the same
/// endpoint was closed by the peer or a connect to it failed.
pub const PROMPT_WINDOW: Duration = Duration::from_secs(5);

/// A connection closed by the peer says that its endpoint is going away (see
/// [`PROMPT_WINDOW`]) only if it lived at least this long: request-and-close connections (a
/// health probe's `GET /readyz` answered with `Connection: close`, the kubelet's probes of a
/// static apiserver pod) are closed by the server every few seconds on a healthy node.
pub const PROMPT_MIN_AGE: Duration = Duration::from_secs(5);

/// A tracked socket that a sample no longer finds is removed after this long, unless a kernel
/// event about its end arrives meanwhile (the event knows who ended it; the sample does not).
pub const VANISH_GRACE: Duration = Duration::from_secs(1);

/// A connection whose counters have not changed for this long, and that has nothing pending
/// (no request waiting for an answer, no small record to tell apart, no data unacknowledged,
/// no retransmit), is *quiet*: a watch with nothing to say. Quiet connections are sampled every
/// [`QUIET_EVERY`]; every other connection every second.
pub const QUIET_AFTER: Duration = Duration::from_secs(10);

/// How often a quiet connection is sampled. What it misses meanwhile costs no precision where
/// it matters: requests and answers come from the kernel's segment events, and retransmits
/// from their own; only a stall that no retransmit event reports (segments dropped on the
/// client's own path) is seen up to this much later.
pub const QUIET_EVERY: Duration = Duration::from_secs(5);

/// A connection whose `tcp_info` has not been read for this long, nor looked at by a segment
/// (see [`LOOKED_SAMPLE_EVERY`]), has no readable evidence (a quiet connection is read every
/// [`QUIET_EVERY`]).
pub const SAMPLE_MAX_AGE: Duration = Duration::from_secs(QUIET_EVERY.as_secs() + 2);

/// A segment record that shows the client with nothing unsent and nothing unacknowledged is a
/// *look* at the connection: what a quiet connection is read for, it tells as well as a sample
/// (a stall on the client's own path leaves its request unsent, and a record then shows it).
/// A quiet connection is read [`QUIET_EVERY`] after its last look, sample or segment, and at
/// least this often (its counters, and what only `tcp_info` tells): a watch that receives an
/// event every few seconds costs its segments' records, not a socket read every few seconds.
pub const LOOKED_SAMPLE_EVERY: Duration = Duration::from_secs(30);

/// A socket's identity that userspace can see everywhere: network namespace and 4-tuple, in
/// the socket's own address family (a dual-stack socket keeps its `::ffff:` addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub netns: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// Why a connection attempt failed (SPEC.md `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureReason {
    /// Answered by a reset: nothing listening (ECONNREFUSED).
    Refused,
    /// No answer: the SYN timed out, or the client gave up waiting (ETIMEDOUT, or closed).
    Timeout,
    /// Accepted and then reset before anything was received (ECONNRESET).
    Reset,
    /// The network said there is no route (EHOSTUNREACH, ENETUNREACH, ...).
    Unreachable,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Refused => "refused",
            FailureReason::Timeout => "timeout",
            FailureReason::Reset => "reset",
            FailureReason::Unreachable => "unreachable",
        }
    }

    /// The reason of a connect that ended in CLOSE with this `sk_err` (0: none set).
    pub fn from_errno(sk_err: i32, retransmitted: bool) -> Self {
        match sk_err {
            libc::ECONNREFUSED => FailureReason::Refused,
            libc::ECONNRESET | libc::EPIPE => FailureReason::Reset,
            libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN => {
                FailureReason::Unreachable
            }
            libc::ETIMEDOUT => FailureReason::Timeout,
            // No error recorded: the client closed the socket while connecting (its own
            // connect timeout); after SYN retransmits that is a timeout, before any a refusal
            // is impossible, so still a timeout.
            _ if retransmitted => FailureReason::Timeout,
            _ => FailureReason::Timeout,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectFailure {
    pub at: Instant,
    pub endpoint: Endpoint,
    pub reason: FailureReason,
}

/// Where a connection entry came from first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A kernel event (the agent saw it being made).
    Event,
    /// A scan of sock_diag (older than the agent, or its events were lost).
    Scan,
}

/// One connection to an apiserver endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Connection {
    pub tuple: Tuple,
    /// Kernel address of the socket, once a kernel event named it.
    pub sk: Option<u64>,
    pub endpoint: Endpoint,
    /// Kernel `TCP_*` state.
    pub tcp_state: u32,
    /// Owning process (tgid), once known.
    pub owner: Option<u32>,
    /// Socket inode (from sock_diag), used to find the owner through `/proc/*/fd`.
    pub inode: Option<u64>,
    pub origin: Origin,
    pub first_seen: Instant,
    pub established_at: Option<SystemTime>,
    /// Counters of the last sample (`tcp_info`).
    pub bytes_received: u64,
    pub data_segs_in: u32,
    /// Payload bytes sent, retransmissions excluded.
    pub bytes_sent: u64,
    /// Data segments sent, retransmissions excluded.
    pub data_segs_out: u32,
    pub bytes_acked: u64,
    /// When the last sample was read; `None` before the first.
    pub sampled_at: Option<Instant>,
    /// When a segment record last showed nothing unsent and nothing unacknowledged (a look:
    /// see [`LOOKED_SAMPLE_EVERY`]).
    pub looked_at: Option<Instant>,
    /// When data last arrived at all, keepalives included.
    pub last_receive: Option<Instant>,
    /// When an answer (payload, or a small record nothing replied to) last arrived.
    pub last_payload: Option<Instant>,
    /// When the client last sent a request.
    pub last_request: Option<Instant>,
    /// Requests and answers in their order (see `ordered.rs`).
    pub ordered: Ordered,
    /// Its HTTP/2 streams, where the client's plaintext is read (see `streams.rs`).
    pub streams: Streams,
    /// When the first answer arrived on a connection the agent saw being made (its TLS
    /// handshake's, as a rule): the endpoint answered, not only its kernel (a stopped apiserver
    /// still completes TCP handshakes). None for connections older than the agent.
    pub first_answer: Option<Instant>,
    pub retransmits: u64,
    /// Time of the first retransmit since the peer last acknowledged new data (None while
    /// acknowledgements make progress): how long the connection has been talking into a void.
    pub stalled_since: Option<Instant>,
    /// A sample no longer found the socket at this time (see [`VANISH_GRACE`]).
    pub vanished_at: Option<Instant>,
    /// When a sample last found its counters changed (the first sample counts as a change).
    pub last_change: Option<Instant>,
    /// Payload a sample found arrived moments before, that no segment record had reported
    /// yet: its arrival. The pump applies segment records up to a drain late, so one is as a
    /// rule on its way and clears this; if the next sample still finds it set, the payload
    /// went unreported and counts as a change then (see `samples.rs`, `update_evidence`).
    pub inbound_unreported: Option<Instant>,
    /// The last sample found data unacknowledged or not sent yet.
    pub outstanding: bool,
    /// Records about it the kernel did not send, if any were lost lately (see `gaps.rs`).
    pub gap: Option<Gap>,
}

impl Connection {
    /// Since when the client has been waiting for an answer on this connection, seen at
    /// `now`: a request sized as one unanswered, or two small records it initiated that
    /// nothing matched (see `ordered.rs`). Where its HTTP/2 frames are followed both ways
    /// (`frames`: the client's streams are judged; and a response to a request it named was
    /// read on this very connection, so the copy of the HTTP/2 code it uses is probed for
    /// reads too), a wait that began since they were, and since the last loss of its
    /// evidence, is told by the frames instead: the first HEADERS written since the last frame
    /// read. Flow control a busy client sends late, which byte order cannot tell from a
    /// request or a PING, is then no wait (a healthy client with thousands of quiet watches
    /// crossed it).
    pub fn waiting(&self, now: Instant, frames: bool) -> Option<Instant> {
        let mut ordered = self.ordered.clone();
        ordered.settle(now);
        let by_bytes = ordered.waiting();
        let followed = self
            .streams
            .followed_since
            .filter(|_| frames && !self.streams.http1 && self.streams.responded);
        let Some(since) = followed else {
            return by_bytes;
        };
        // A wait byte order saw begin before the frames were followed stays its evidence.
        match (by_bytes.filter(|w| *w < since), self.streams.unanswered_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Asks the CPU to bring the connection's memory into its cache, for a loop that visits
    /// connections out of memory order (a hint: nothing happens on other architectures). The
    /// table is touched a few times a second: each visit would otherwise wait for memory.
    pub fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let start = std::ptr::from_ref(self).cast::<i8>();
            for line in (0..std::mem::size_of::<Self>()).step_by(64) {
                // SAFETY: a prefetch never faults, and every address is within `self`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(line)) };
            }
        }
    }

    /// Whether its evidence is current at `now`: a sample of its `tcp_info`, or a look by a
    /// segment since one (see [`LOOKED_SAMPLE_EVERY`]), within [`SAMPLE_MAX_AGE`].
    pub fn readable(&self, now: Instant) -> bool {
        self.sampled_at.is_some()
            && self
                .sampled_at
                .max(self.looked_at)
                .is_some_and(|at| now.saturating_duration_since(at) <= SAMPLE_MAX_AGE)
    }
}

/// How a process's last established connection ended, when that is a loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LossRecord {
    pub at: Instant,
    pub cause: LossCause,
    pub endpoint: Endpoint,
}

/// What the agent remembers about a process that holds or held an apiserver connection.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRecord {
    pub info: ProcessInfo,
    pub first_seen: Instant,
    /// Since when it has continuously held at least one established connection (None: now
    /// it holds none).
    pub connected_since: Option<Instant>,
    /// Its last established connection was ended by the peer or the network (None: it never
    /// had one, has one now, or closed it itself).
    pub loss: Option<LossRecord>,
    /// It closed its last connection itself at this time (an idle close), and holds none.
    pub closed_idle_at: Option<Instant>,
    /// The endpoint of its most recent established connection (kept after it is lost, so a
    /// disconnected client still says which apiserver it lost).
    pub last_endpoint: Option<Endpoint>,
    /// Start of its current run of connects without an established connection.
    pub trying_since: Option<Instant>,
    /// When it last had a connection established (failed connects before it say nothing
    /// about now: a proxy that fails on one upstream and connects to another is not trying
    /// in vain).
    pub last_established: Option<Instant>,
    /// The newest failed connects (at most [`FAILURES_KEPT`]).
    pub connect_failures: VecDeque<ConnectFailure>,
    pub rhythm: Rhythm,
}

/// Result of sampling one tracked socket through sock_diag.
#[derive(Clone, Debug, PartialEq)]
pub enum Sample {
    /// The socket exists; its inode and (for full sockets) `tcp_info`.
    Found {
        inode: u64,
        tcp_state: u32,
        tcp: Option<TcpInfo>,
    },
    /// No socket with that tuple exists in that namespace any more.
    Gone,
}

/// A socket a scan found.
#[derive(Clone, Debug, PartialEq)]
pub struct Scanned {
    pub tuple: Tuple,
    pub inode: u64,
    pub tcp_state: u32,
}

type ConnId = u64;

/// What an applied kernel event meant, for the counters of the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A connect to `endpoint` failed.
    ConnectFailed {
        pid: u32,
        endpoint: Endpoint,
        reason: FailureReason,
    },
    /// A segment to `endpoint` was retransmitted.
    Retransmit { pid: Option<u32>, endpoint: Endpoint },
}

/// The table's maps and sets of connections, keyed by what a kernel record or sample names
/// (see `foldhash` in `agent/Cargo.toml`).
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub type Set<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

#[derive(Default)]
pub struct ConnectionTable {
    endpoints: EndpointSet,
    conns: Map<ConnId, Connection>,
    by_sk: Map<u64, ConnId>,
    by_tuple: Map<Tuple, ConnId>,
    processes: HashMap<u32, ProcessRecord>,
    next_id: ConnId,
    /// This agent's own pid: its own connections (apiserver watch, reachability probes) are
    /// not a client's.
    own_pid: Option<u32>,
    /// Kernel addresses of this agent's own sockets, learned from their connects (the only
    /// events that name their process): their later events, in softirq, name nobody, and a
    /// probe's connection that the server closes must not read as the endpoint going away.
    own_sockets: std::collections::HashSet<u64>,
    /// Per endpoint, the last time a connection to it was closed by the peer or a connect to
    /// it failed: the endpoint was going away.
    disruptions: HashMap<Endpoint, Instant>,
    /// Recent closes made by clients themselves (see [`LocalClose`]).
    local_closes: VecDeque<LocalClose>,
    /// Requests Go clients encoded, waiting for the HEADERS frame that carries them.
    pending: requests::Pending,
    /// Open streams per process, counted high (a stream's end is not counted: the count is
    /// made again from the connections when it reaches the bound; see `requests.rs`).
    open_streams: HashMap<u32, requests::OpenCount>,
    /// When the quiet connections' samples are due (the busy ones are in `busy`), earliest
    /// first, as the last walk of the table for the sampler found and the samples and segments
    /// applied since say (None: a connection changed otherwise since, walk again). An entry
    /// whose connection is gone, or due later by now (a segment looked at it and planned its
    /// new time), is dropped when its time comes. Lets a round skip the walk (see `plan.rs`).
    upcoming: Option<plan::Upcoming>,
    /// See [`Self::namespaces`].
    namespaces: Set<u64>,
    /// Connections due at every round (not quiet), as the last walk and the samples and
    /// segments since found them: a round reads these, and the `upcoming` ones whose time
    /// came, without a walk (see `plan.rs`).
    busy: Set<ConnId>,
    /// Connections without an owner, for the sampler's owner lookup each round
    /// ([`Self::ownerless`]): a walk of the table for them touched every connection each
    /// second (a busy controller's thousands) to find none.
    ownerless: Set<ConnId>,
}

impl ConnectionTable {
    pub fn new(endpoints: EndpointSet) -> Self {
        Self {
            endpoints,
            ..Default::default()
        }
    }

    /// Ignores the connections of this process (the agent itself).
    pub fn ignoring(mut self, pid: u32) -> Self {
        self.own_pid = Some(pid);
        self
    }

    pub fn endpoints(&self) -> &EndpointSet {
        &self.endpoints
    }

    /// Replaces the endpoint set; connections to endpoints no longer watched are forgotten
    /// (not lost: the client did nothing), the others are re-matched (a more specific endpoint
    /// may now apply). Processes left with nothing watched are forgotten.
    pub fn set_endpoints(&mut self, endpoints: EndpointSet, now: Instant) {
        self.upcoming = None;
        self.endpoints = endpoints;
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        let mut touched = Vec::new();
        for id in ids {
            let remote = self.conns[&id].tuple.remote;
            match self.endpoints.matching(remote) {
                Some(endpoint) => self.conns.get_mut(&id).expect("listed id").endpoint = endpoint,
                None => {
                    if let Some(conn) = self.unlink(id) {
                        touched.extend(conn.owner);
                    }
                }
            }
        }
        for p in self.processes.values_mut() {
            let watched = &self.endpoints;
            p.connect_failures
                .retain(|f| watched.iter().any(|(e, _)| *e == f.endpoint));
            if p.loss
                .is_some_and(|l| !watched.iter().any(|(e, _)| *e == l.endpoint))
            {
                p.loss = None;
            }
        }
        for pid in touched {
            let has_conns = self.connections_of(pid).next().is_some();
            let has_failures = self
                .processes
                .get(&pid)
                .is_some_and(|p| !p.connect_failures.is_empty() || p.loss.is_some());
            if !has_conns && !has_failures {
                self.processes.remove(&pid);
                self.open_streams.remove(&pid);
            } else {
                self.update_connected(pid, now);
            }
        }
        self.disruptions
            .retain(|e, _| self.endpoints.iter().any(|(w, _)| w == e));
    }

    pub fn connections(&self) -> impl Iterator<Item = &Connection> {
        self.conns.values()
    }

    pub fn processes(&self) -> impl Iterator<Item = &ProcessRecord> {
        self.processes.values()
    }

    pub fn process(&self, pid: u32) -> Option<&ProcessRecord> {
        self.processes.get(&pid)
    }

    /// How many connections are tracked.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Owners' pids, for the liveness check.
    pub fn owners(&self) -> Vec<(u32, u64)> {
        self.processes
            .values()
            .map(|p| (p.info.pid, p.info.start_time_ticks))
            .collect()
    }

    /// Connections owned by `pid`.
    pub fn connections_of(&self, pid: u32) -> impl Iterator<Item = &Connection> {
        self.conns.values().filter(move |c| c.owner == Some(pid))
    }
}

mod apply;
pub mod facts;
pub mod gaps;
pub mod ordered;
mod plan;
mod process;
mod requests;
pub mod sampler;
mod samples;
mod scan;
pub mod streams;

#[cfg(test)]
mod tests;
