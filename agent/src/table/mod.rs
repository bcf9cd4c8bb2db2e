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
use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    time::{Duration, Instant, SystemTime},
};

use lifeline_common::tcp_state;

use self::{
    facts::{LossCause, Rhythm},
    gaps::Gap,
    ordered::{Ordered, Segment},
    streams::Streams,
};
use crate::{
    endpoint::{Endpoint, EndpointSet},
    host::process::ProcessInfo,
    host::sock_diag::TcpInfo,
    kernel::events::{Change, KernelEvent},
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

/// The agent's own sockets remembered at most (its probes and API watches: a handful).
const OWN_SOCKETS_MAX: usize = 1024;

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

/// A sample is due this much before [`QUIET_EVERY`] is over (rounds are about a second apart,
/// not exactly).
const QUIET_SLACK: Duration = Duration::from_millis(500);

/// A connection whose `tcp_info` has not been read for this long has no readable evidence
/// (a quiet connection is read every [`QUIET_EVERY`]).
pub const SAMPLE_MAX_AGE: Duration = Duration::from_secs(QUIET_EVERY.as_secs() + 2);

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
    /// The last sample found data unacknowledged or not sent yet.
    pub outstanding: bool,
    /// Records about it the kernel did not send, if any were lost lately (see `gaps.rs`).
    pub gap: Option<Gap>,
}

impl Connection {
    /// Since when the client has been waiting for an answer on this connection, seen at
    /// `now`: a request sized as one unanswered, or two small records it initiated that
    /// nothing matched (see `ordered.rs`).
    pub fn waiting(&self, now: Instant) -> Option<Instant> {
        let mut ordered = self.ordered.clone();
        ordered.settle(now);
        ordered.waiting()
    }

    /// Whether its `tcp_info` evidence is current at `now`.
    pub fn readable(&self, now: Instant) -> bool {
        self.sampled_at
            .is_some_and(|at| now.saturating_duration_since(at) <= SAMPLE_MAX_AGE)
    }

    /// Whether it is quiet at `now` (see [`QUIET_AFTER`]): established, sampled, unchanged for
    /// a while, nothing pending.
    pub fn quiet(&self, now: Instant) -> bool {
        self.sampled_at.is_some()
            && self.tcp_state == tcp_state::ESTABLISHED
            && self.vanished_at.is_none()
            && !self.outstanding
            && self.stalled_since.is_none()
            && self.ordered.settled()
            && self
                .last_change
                .is_some_and(|c| now.saturating_duration_since(c) >= QUIET_AFTER)
    }

    /// When a sample of it is due, seen at `now`: at once (every round, about a second apart),
    /// or [`QUIET_EVERY`] after the last one while it is quiet. Only a change of the connection
    /// (an event, a sample) makes a quiet connection due sooner.
    pub fn sample_due_at(&self, now: Instant) -> Instant {
        match self.sampled_at {
            Some(at) if self.quiet(now) => at + QUIET_EVERY - QUIET_SLACK,
            _ => now,
        }
    }
}

/// A tracked connection for the sampler, and whether a sample of it is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleTarget {
    pub tuple: Tuple,
    pub due: bool,
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

impl ProcessRecord {
    fn new(info: ProcessInfo, now: Instant) -> Self {
        Self {
            info,
            first_seen: now,
            connected_since: None,
            loss: None,
            closed_idle_at: None,
            last_endpoint: None,
            trying_since: None,
            last_established: None,
            connect_failures: VecDeque::new(),
            rhythm: Rhythm::default(),
        }
    }

    fn note_request(&mut self, at: Instant) {
        let r = &mut self.rhythm;
        match r.last_request {
            Some(prev) if at > prev => {
                r.longest_gap = r.longest_gap.max(at - prev);
                r.gaps += 1;
                r.last_request = Some(at);
            }
            Some(_) => {}
            None => r.last_request = Some(at),
        }
    }
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

/// A close the client made itself, kept for [`PROMPT_WINDOW`]: if the endpoint turns out to
/// have been going away at that moment, it was prompted (a loss), not idle.
#[derive(Clone, Copy, Debug)]
struct LocalClose {
    pid: u32,
    start_time_ticks: u64,
    at: Instant,
    endpoint: Endpoint,
}

#[derive(Default)]
pub struct ConnectionTable {
    endpoints: EndpointSet,
    conns: HashMap<ConnId, Connection>,
    by_sk: HashMap<u64, ConnId>,
    by_tuple: HashMap<Tuple, ConnId>,
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
    /// The earliest a sample of some connection will be due, as the last walk of the table
    /// for the sampler found and the samples applied since say (None: a connection changed
    /// otherwise since, walk again). Lets the sampler skip a round of quiet connections
    /// without walking them.
    next_sample_due: Option<Instant>,
}

/// States in which the local side has closed: the process no longer holds the socket.
fn locally_closed(state: u32) -> bool {
    matches!(
        state,
        tcp_state::CLOSE
            | tcp_state::FIN_WAIT1
            | tcp_state::FIN_WAIT2
            | tcp_state::CLOSING
            | tcp_state::LAST_ACK
            | tcp_state::TIME_WAIT
    )
}

/// How an established connection ended, from its state change and `sk_err`.
enum End {
    /// The peer or the network ended it.
    Lost(LossCause),
    /// The client closed it.
    Local,
}

fn end_of(old: u32, new: u32, sk_err: i32) -> Option<End> {
    match (old, new) {
        (tcp_state::ESTABLISHED, tcp_state::CLOSE_WAIT) => Some(End::Lost(LossCause::PeerClosed)),
        (tcp_state::ESTABLISHED, tcp_state::FIN_WAIT1) => Some(End::Local),
        (tcp_state::ESTABLISHED | tcp_state::CLOSE_WAIT, tcp_state::CLOSE) => Some(match sk_err {
            libc::ECONNRESET | libc::EPIPE => End::Lost(LossCause::Reset),
            libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH => End::Lost(LossCause::TimedOut),
            libc::ECONNABORTED => End::Lost(LossCause::Aborted),
            // No error: the client aborted it itself (SO_LINGER 0).
            _ => End::Local,
        }),
        _ => None,
    }
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
        self.next_sample_due = None;
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

    /// The connection with these addresses in whatever namespace, if exactly one has them.
    fn by_addresses(&self, local: SocketAddr, remote: SocketAddr) -> Option<ConnId> {
        let mut found = self
            .by_tuple
            .iter()
            .filter(|(t, _)| t.local == local && t.remote == remote)
            .map(|(_, id)| *id);
        match (found.next(), found.next()) {
            (Some(id), None) => Some(id),
            _ => None,
        }
    }

    /// Applies one kernel event. `owner` is the process the caller resolved from the event's
    /// `owner_tgid` (None when the event ran in softirq or the process is already gone).
    pub fn apply_event(&mut self, ev: &KernelEvent, owner: Option<ProcessInfo>) -> Option<Applied> {
        // A segment changes one known connection: its due time is folded into the plan below
        // (busy connections send many; discarding the plan for each walked the whole table
        // every round). Anything else may add, move or end connections: walk again.
        if !matches!(ev.change, Change::Segment { .. }) {
            self.next_sample_due = None;
        }
        let connect = matches!(
            ev.change,
            Change::State {
                old: tcp_state::CLOSE,
                new: tcp_state::SYN_SENT
            }
        );
        if owner.is_some() && owner.as_ref().map(|o| o.pid) == self.own_pid {
            if connect {
                if self.own_sockets.len() >= OWN_SOCKETS_MAX {
                    self.own_sockets.clear();
                }
                self.own_sockets.insert(ev.sk);
            }
            return None;
        }
        if self.own_sockets.contains(&ev.sk) {
            match ev.change {
                // The address was freed and taken by a client's socket.
                _ if connect => {
                    self.own_sockets.remove(&ev.sk);
                }
                Change::State {
                    new: tcp_state::CLOSE,
                    ..
                } => {
                    self.own_sockets.remove(&ev.sk);
                    return None;
                }
                _ => return None,
            }
        }
        let tuple = Tuple {
            netns: ev.netns,
            local: ev.local,
            remote: ev.remote,
        };
        let found = self
            .by_sk
            .get(&ev.sk)
            .or_else(|| {
                (ev.local.port() != 0)
                    .then(|| self.by_tuple.get(&tuple))
                    .flatten()
            })
            .copied()
            // Defensive: an index entry never outlives its connection (see `index_sk`).
            .filter(|id| self.conns.contains_key(id))
            .or_else(|| {
                // A segment from a kernel whose tcp_probe has no `skaddr` names neither the
                // socket nor its namespace: the one connection with these addresses, if only
                // one has them.
                let segment = matches!(ev.change, Change::Segment { .. });
                (segment && ev.sk == 0)
                    .then(|| self.by_addresses(ev.local, ev.remote))
                    .flatten()
            });
        match ev.change {
            Change::Segment {
                len,
                snd_nxt,
                snd_una,
                srtt_us,
            } => {
                let id = found?;
                if ev.sk != 0 {
                    self.index_sk(id, ev.sk);
                }
                let conn = self.conns.get_mut(&id).expect("found");
                let segment = Segment {
                    at: ev.at,
                    len,
                    snd_nxt,
                    snd_una,
                    srtt: Duration::from_micros(u64::from(srtt_us)),
                };
                let request = conn.ordered.apply(segment);
                if len > 0 {
                    conn.last_receive = conn.last_receive.max(Some(ev.at));
                }
                conn.last_payload = conn.last_payload.max(conn.ordered.last_answer());
                if conn.origin == Origin::Event && conn.first_answer.is_none() {
                    conn.first_answer = conn.ordered.last_answer();
                }
                conn.last_request = conn.last_request.max(conn.ordered.last_request());
                let due = conn.sample_due_at(ev.at);
                self.next_sample_due = self.next_sample_due.map(|n| n.min(due));
                if let (Some(at), Some(pid)) = (request, conn.owner) {
                    if let Some(p) = self.processes.get_mut(&pid) {
                        p.note_request(at);
                    }
                }
                None
            }
            Change::Retransmit { .. } => {
                let conn = found.and_then(|id| self.conns.get_mut(&id))?;
                conn.retransmits += 1;
                conn.stalled_since.get_or_insert(ev.at);
                Some(Applied::Retransmit {
                    pid: conn.owner,
                    endpoint: conn.endpoint,
                })
            }
            Change::State { old, new } if locally_closed(new) => {
                if old == tcp_state::SYN_SENT {
                    let failure = self.record_failure_event(found, owner, ev);
                    if let Some(id) = found {
                        self.unlink(id);
                    }
                    return failure;
                }
                let id = found?;
                let reset = matches!(end_of(old, new, ev.sk_err), Some(End::Lost(LossCause::Reset)));
                self.end_connection(id, end_of(old, new, ev.sk_err), ev.at);
                // A connection accepted and reset before anything arrived is a failed connect.
                let conn_failure = reset.then(|| self.reset_before_payload(id, ev)).flatten();
                if let Some(conn) = self.unlink(id) {
                    if let Some(pid) = conn.owner {
                        self.update_connected(pid, ev.at);
                    }
                }
                conn_failure
            }
            Change::State { old, new } => {
                let endpoint = self.endpoints.matching(ev.remote)?;
                let id = found.unwrap_or_else(|| self.insert(tuple, endpoint, Origin::Event, ev.at));
                if let Some(info) = owner {
                    self.attach_owner(id, info, ev.at);
                }
                self.index_sk(id, ev.sk);
                let conn = self.conns.get_mut(&id).expect("found or inserted");
                if ev.local.port() != 0 && conn.tuple != tuple {
                    self.by_tuple.remove(&conn.tuple);
                    conn.tuple = tuple;
                    self.by_tuple.insert(tuple, id);
                }
                let conn = self.conns.get_mut(&id).expect("found or inserted");
                conn.tcp_state = new;
                conn.vanished_at = None;
                if new == tcp_state::ESTABLISHED && conn.established_at.is_none() {
                    conn.established_at = Some(SystemTime::now() - ev.at.elapsed());
                    conn.stalled_since = None;
                } else if new == tcp_state::SYN_SENT {
                    if let Some(pid) = conn.owner {
                        self.note_attempt(pid, ev.at);
                    }
                }
                if let Some(end) = end_of(old, new, ev.sk_err) {
                    self.end_connection(id, Some(end), ev.at);
                }
                if let Some(pid) = self.conns[&id].owner {
                    self.update_connected(pid, ev.at);
                }
                None
            }
        }
    }

    /// Merges a scan of one network namespace: every socket to a watched endpoint that
    /// exists there now, taken after `started`. Adds what is missing (connections older than
    /// the agent, or whose events were lost), applies state changes whose events were lost
    /// (a socket found in CLOSE_WAIT was closed by the peer), and removes entries the scan
    /// proves gone (older than the scan, not found). Returns how many entries were added.
    pub fn reconcile_scan(&mut self, netns: u64, found: &[Scanned], started: Instant) -> usize {
        self.next_sample_due = None;
        let mut added = 0;
        let mut present = std::collections::HashSet::new();
        for s in found.iter().filter(|s| s.tuple.netns == netns) {
            let Some(endpoint) = self.endpoints.matching(s.tuple.remote) else {
                continue;
            };
            present.insert(s.tuple);
            match self.by_tuple.get(&s.tuple).copied() {
                Some(id) => {
                    let conn = self.conns.get_mut(&id).expect("indexed");
                    conn.inode = Some(s.inode).filter(|i| *i != 0).or(conn.inode);
                    conn.vanished_at = None;
                    let old = conn.tcp_state;
                    if old != s.tcp_state {
                        conn.tcp_state = s.tcp_state;
                        if let Some(end) = end_of(old, s.tcp_state, 0) {
                            self.end_connection(id, Some(end), started);
                        }
                        if let Some(pid) = self.conns[&id].owner {
                            self.update_connected(pid, started);
                        }
                    }
                }
                None => {
                    let id = self.insert(s.tuple, endpoint, Origin::Scan, started);
                    let conn = self.conns.get_mut(&id).expect("inserted");
                    conn.inode = Some(s.inode).filter(|i| *i != 0);
                    conn.tcp_state = s.tcp_state;
                    added += 1;
                }
            }
        }
        // Entries of this namespace older than the scan that it did not find are gone; a
        // connect whose port was never learned (its events were lost) too.
        let gone: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.tuple.netns == netns && c.first_seen < started && !present.contains(&c.tuple))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(conn) = self.unlink(id) {
                if let Some(pid) = conn.owner {
                    self.update_connected(pid, started);
                }
            }
        }
        added
    }

    /// Adds a connection found by a scan unless it is already known (the start-up scan of one
    /// socket; [`Self::reconcile_scan`] merges a whole namespace).
    pub fn insert_scanned(&mut self, tuple: Tuple, inode: u64, tcp_state: u32, now: Instant) -> bool {
        self.next_sample_due = None;
        if self.by_tuple.contains_key(&tuple) {
            return false;
        }
        let Some(endpoint) = self.endpoints.matching(tuple.remote) else {
            return false;
        };
        let id = self.insert(tuple, endpoint, Origin::Scan, now);
        let conn = self.conns.get_mut(&id).expect("inserted");
        conn.inode = Some(inode).filter(|i| *i != 0);
        conn.tcp_state = tcp_state;
        true
    }

    /// Connections whose owner is not known yet, with their socket inode when known.
    pub fn ownerless(&self) -> Vec<(Tuple, Option<u64>)> {
        self.conns
            .values()
            .filter(|c| c.owner.is_none())
            .map(|c| (c.tuple, c.inode))
            .collect()
    }

    /// Sets the owner of the connection with this tuple (found through its socket inode).
    pub fn set_owner(&mut self, tuple: &Tuple, info: ProcessInfo, now: Instant) {
        let Some(&id) = self.by_tuple.get(tuple) else {
            return;
        };
        if Some(info.pid) == self.own_pid {
            self.unlink(id);
            return;
        }
        self.attach_owner(id, info, now);
        let pid = self.conns[&id].owner.expect("attached");
        self.update_connected(pid, now);
    }

    /// How many connections are tracked.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Every tracked connection with a complete tuple, for the sampler, with whether a sample
    /// of it is due at `now` (the others may be sampled too, when it costs nothing more);
    /// `None` when none is due and none changed since the last call said when one would be.
    pub fn sample_targets(&mut self, now: Instant) -> Option<Vec<SampleTarget>> {
        if self.next_sample_due.is_some_and(|at| now < at) {
            return None;
        }
        let mut next = None::<Instant>;
        let targets = self
            .conns
            .values()
            .filter(|c| c.tuple.local.port() != 0)
            .map(|c| {
                let at = c.sample_due_at(now);
                if at > now {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
                SampleTarget {
                    tuple: c.tuple,
                    due: at <= now,
                }
            })
            .collect::<Vec<_>>();
        // The due ones' next samples are folded in as they are applied (`apply_sample`).
        self.next_sample_due = Some(next.unwrap_or(now + QUIET_EVERY));
        Some(targets)
    }

    /// Some due connections could not be read (their namespace could not be entered, the
    /// kernel refused): the next round walks the table again instead of trusting the plan.
    pub fn unread_due(&mut self) {
        self.next_sample_due = None;
    }

    /// Applies one sampler result taken at `now`.
    pub fn apply_sample(&mut self, tuple: &Tuple, sample: Sample, now: Instant) {
        self.apply_sample_to(tuple, sample, now);
        // The sampled connection's next sample (gone: none), folded into the plan of the
        // walk that asked for it: no walk is needed to know it.
        if let Some(c) = self.by_tuple.get(tuple).and_then(|id| self.conns.get(id)) {
            let at = c.sample_due_at(now);
            self.next_sample_due = self.next_sample_due.map(|n| n.min(at));
        }
    }

    fn apply_sample_to(&mut self, tuple: &Tuple, sample: Sample, now: Instant) {
        let Some(&id) = self.by_tuple.get(tuple) else {
            return;
        };
        match sample {
            Sample::Gone => {
                // The kernel event of its end may still be on its way; give it a moment.
                let conn = self.conns.get_mut(&id).expect("indexed");
                match conn.vanished_at {
                    Some(at) if now.saturating_duration_since(at) >= VANISH_GRACE => {
                        if let Some(conn) = self.unlink(id) {
                            if let Some(pid) = conn.owner {
                                self.update_connected(pid, now);
                            }
                        }
                    }
                    Some(_) => {}
                    None => conn.vanished_at = Some(now),
                }
            }
            Sample::Found {
                inode,
                tcp_state,
                tcp,
            } => {
                let conn = self.conns.get_mut(&id).expect("indexed");
                conn.inode = Some(inode).filter(|i| *i != 0).or(conn.inode);
                conn.vanished_at = None;
                if locally_closed(tcp_state) {
                    // The client closed it (its event is on its way or was lost).
                    if conn.tcp_state == tcp_state::ESTABLISHED {
                        self.end_connection(id, Some(End::Local), now);
                    }
                    if let Some(conn) = self.unlink(id) {
                        if let Some(pid) = conn.owner {
                            self.update_connected(pid, now);
                        }
                    }
                    return;
                }
                let old = conn.tcp_state;
                conn.tcp_state = tcp_state;
                if let Some(tcp) = tcp {
                    update_evidence(conn, &tcp, now);
                }
                if old != tcp_state {
                    if let Some(end) = end_of(old, tcp_state, 0) {
                        self.end_connection(id, Some(end), now);
                    }
                    // Only a state change changes what the owner has established (this walks
                    // the table: once per sample would make a round quadratic).
                    if let Some(pid) = self.conns[&id].owner {
                        self.update_connected(pid, now);
                    }
                }
            }
        }
    }

    /// Forgets a process (it exited). Its connections stay, without an owner, when another
    /// process may hold the same socket (a forked child keeps what it inherited): the next
    /// owner lookup through the socket inode finds it, and a socket nobody holds closes.
    pub fn forget_process(&mut self, pid: u32, _now: Instant) {
        self.next_sample_due = None;
        self.processes.remove(&pid);
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.owner == Some(pid))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let conn = self.conns.get_mut(&id).expect("listed");
            if conn.inode.is_some() {
                conn.owner = None;
            } else {
                self.unlink(id);
            }
        }
        self.local_closes.retain(|c| c.pid != pid);
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

    /// Failed connects counted in the kernel (a connect storm is aggregated there): `count`
    /// failures of `pid` to `endpoint`, the last at `at`. Only the newest
    /// [`FAILURES_KEPT`] are kept.
    pub fn record_connect_failures(
        &mut self,
        pid: u32,
        endpoint: Endpoint,
        reason: FailureReason,
        count: u32,
        at: Instant,
    ) {
        self.disruptions.insert(endpoint, at);
        let Some(p) = self.processes.get_mut(&pid) else {
            return;
        };
        for _ in 0..count.min(FAILURES_KEPT as u32) {
            push_failure(p, ConnectFailure { at, endpoint, reason });
        }
        p.trying_since.get_or_insert(at);
    }

    fn insert(&mut self, tuple: Tuple, endpoint: Endpoint, origin: Origin, now: Instant) -> ConnId {
        let id = self.next_id;
        self.next_id += 1;
        self.conns.insert(
            id,
            Connection {
                tuple,
                sk: None,
                endpoint,
                tcp_state: tcp_state::CLOSE,
                owner: None,
                inode: None,
                origin,
                first_seen: now,
                established_at: None,
                bytes_received: 0,
                data_segs_in: 0,
                bytes_sent: 0,
                data_segs_out: 0,
                bytes_acked: 0,
                sampled_at: None,
                last_receive: None,
                last_payload: None,
                last_request: None,
                ordered: Ordered::default(),
                streams: Streams::default(),
                first_answer: None,
                retransmits: 0,
                stalled_since: None,
                vanished_at: None,
                last_change: None,
                outstanding: false,
                gap: None,
            },
        );
        if tuple.local.port() != 0 {
            self.by_tuple.insert(tuple, id);
        }
        id
    }

    /// Connection `id`'s socket is at kernel address `sk`: indexed there, and only there. A
    /// socket address is reused once its socket is freed: a connection that held `sk` before
    /// is gone in the kernel, and loses the index.
    fn index_sk(&mut self, id: ConnId, sk: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.sk == Some(sk) {
            return;
        }
        if let Some(old) = conn.sk.replace(sk) {
            if self.by_sk.get(&old) == Some(&id) {
                self.by_sk.remove(&old);
            }
        }
        if let Some(before) = self.by_sk.insert(sk, id).filter(|&b| b != id) {
            if let Some(c) = self.conns.get_mut(&before) {
                c.sk = None;
            }
        }
    }

    /// Removes a connection from every index; returns it.
    fn unlink(&mut self, id: ConnId) -> Option<Connection> {
        let conn = self.conns.remove(&id)?;
        if let Some(sk) = conn.sk {
            if self.by_sk.get(&sk) == Some(&id) {
                self.by_sk.remove(&sk);
            }
        }
        if self.by_tuple.get(&conn.tuple) == Some(&id) {
            self.by_tuple.remove(&conn.tuple);
        }
        Some(conn)
    }

    fn attach_owner(&mut self, id: ConnId, info: ProcessInfo, now: Instant) {
        let pid = info.pid;
        match self.processes.get(&pid) {
            // The pid was recycled: a different process.
            Some(r) if r.info.start_time_ticks != info.start_time_ticks => {
                self.processes.insert(pid, ProcessRecord::new(info, now));
            }
            Some(_) => {}
            None => {
                self.processes.insert(pid, ProcessRecord::new(info, now));
            }
        }
        let conn = self.conns.get_mut(&id).expect("caller checked");
        conn.owner = Some(pid);
        let (state, origin, first_seen, endpoint) =
            (conn.tcp_state, conn.origin, conn.first_seen, conn.endpoint);
        let p = self.processes.get_mut(&pid).expect("inserted");
        if state == tcp_state::SYN_SENT {
            p.trying_since.get_or_insert(first_seen);
        }
        // A connection the scan found closed by the peer and still held: the loss happened
        // before the agent could see it (seeds 000/004 across an agent restart).
        if state == tcp_state::CLOSE_WAIT && origin == Origin::Scan && p.loss.is_none() {
            p.loss = Some(LossRecord {
                at: first_seen,
                cause: LossCause::FoundClosed,
                endpoint,
            });
        }
    }

    fn note_attempt(&mut self, pid: u32, at: Instant) {
        if let Some(p) = self.processes.get_mut(&pid) {
            if p.connected_since.is_none() {
                p.trying_since.get_or_insert(at);
            }
        }
    }

    /// Re-derives whether `pid` holds an established connection: the start of a connected
    /// run clears its loss and attempts; its end (without a loss recorded) leaves it simply
    /// not connected.
    fn update_connected(&mut self, pid: u32, now: Instant) {
        let mut established = self
            .conns
            .values()
            .filter(|c| c.owner == Some(pid) && c.tcp_state == tcp_state::ESTABLISHED);
        let established = established.next().map(|first| {
            established.fold(
                (first.endpoint, first.first_seen, first.first_seen),
                |(e, oldest, newest), c| {
                    if c.first_seen < oldest {
                        (c.endpoint, c.first_seen, newest.max(c.first_seen))
                    } else {
                        (e, oldest, newest.max(c.first_seen))
                    }
                },
            )
        });
        let Some(p) = self.processes.get_mut(&pid) else {
            return;
        };
        match established {
            Some((endpoint, oldest, newest)) => {
                let since = oldest.min(now);
                p.last_established = p.last_established.max(Some(newest.min(now)));
                if p.connected_since.is_none() {
                    p.connected_since = Some(since);
                }
                p.loss = None;
                p.closed_idle_at = None;
                p.trying_since = None;
                p.last_endpoint = Some(endpoint);
            }
            None => p.connected_since = None,
        }
    }

    /// Records how an established connection ended, for its owner: a loss when the peer or
    /// the network ended it, or when the owner's own close came while the endpoint was going
    /// away (a GOAWAY); an idle close otherwise. Only the end of the owner's last established
    /// connection matters.
    fn end_connection(&mut self, id: ConnId, end: Option<End>, at: Instant) {
        let Some(end) = end else { return };
        let (endpoint, owner) = (self.conns[&id].endpoint, self.conns[&id].owner);
        let lived = at.saturating_duration_since(self.conns[&id].first_seen);
        if let End::Lost(cause) = end {
            if cause != LossCause::Aborted && lived >= PROMPT_MIN_AGE {
                self.disruptions.insert(endpoint, at);
                self.promote_local_closes(endpoint, at);
            }
        }
        let Some(pid) = owner else { return };
        let others = self
            .conns
            .iter()
            .any(|(other, c)| *other != id && c.owner == Some(pid) && c.tcp_state == tcp_state::ESTABLISHED);
        if others {
            return;
        }
        let disrupted = self
            .disruptions
            .get(&endpoint)
            .is_some_and(|d| at.saturating_duration_since(*d) <= PROMPT_WINDOW);
        let Some(p) = self.processes.get_mut(&pid) else {
            return;
        };
        p.connected_since = None;
        match end {
            End::Lost(cause) => {
                p.loss = Some(LossRecord { at, cause, endpoint });
                p.closed_idle_at = None;
            }
            End::Local if disrupted => {
                p.loss = Some(LossRecord {
                    at,
                    cause: LossCause::Prompted,
                    endpoint,
                });
                p.closed_idle_at = None;
            }
            End::Local => {
                p.loss = None;
                p.closed_idle_at = Some(at);
                let close = LocalClose {
                    pid,
                    start_time_ticks: p.info.start_time_ticks,
                    at,
                    endpoint,
                };
                self.local_closes.push_back(close);
            }
        }
    }

    /// The endpoint was going away at `at`: clients that closed their last connection to it
    /// themselves shortly before did so because it asked them to (a GOAWAY before the peer's
    /// close): those closes were losses.
    fn promote_local_closes(&mut self, endpoint: Endpoint, at: Instant) {
        while self
            .local_closes
            .front()
            .is_some_and(|c| at.saturating_duration_since(c.at) > PROMPT_WINDOW)
        {
            self.local_closes.pop_front();
        }
        let processes = &mut self.processes;
        self.local_closes.retain(|c| {
            if c.endpoint != endpoint {
                return true;
            }
            if let Some(p) = processes.get_mut(&c.pid) {
                let same = p.info.start_time_ticks == c.start_time_ticks;
                if same && p.connected_since.is_none() && p.closed_idle_at == Some(c.at) {
                    p.loss = Some(LossRecord {
                        at: c.at,
                        cause: LossCause::Prompted,
                        endpoint,
                    });
                    p.closed_idle_at = None;
                }
            }
            false
        });
    }

    /// A connect ended in CLOSE from SYN_SENT: record the failure for its owner.
    fn record_failure_event(
        &mut self,
        found: Option<ConnId>,
        owner: Option<ProcessInfo>,
        ev: &KernelEvent,
    ) -> Option<Applied> {
        let conn = found
            .and_then(|id| self.conns.get(&id))
            .map(|c| (c.owner, c.retransmits > 0, c.first_seen));
        let endpoint = self.endpoints.matching(ev.remote)?;
        let reason = FailureReason::from_errno(ev.sk_err, conn.is_some_and(|c| c.1));
        if reason != FailureReason::Timeout || ev.sk_err != 0 {
            self.disruptions.insert(endpoint, ev.at);
            self.promote_local_closes(endpoint, ev.at);
        }
        let pid = conn.and_then(|c| c.0).or(owner.as_ref().map(|o| o.pid))?;
        if Some(pid) == self.own_pid {
            return None;
        }
        let p = match self.processes.entry(pid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(ProcessRecord::new(owner?, ev.at)),
        };
        let start = conn.map_or(ev.at, |c| c.2);
        p.trying_since.get_or_insert(start);
        push_failure(
            p,
            ConnectFailure {
                at: ev.at,
                endpoint,
                reason,
            },
        );
        Some(Applied::ConnectFailed {
            pid,
            endpoint,
            reason,
        })
    }

    /// An established connection was reset before any payload arrived: the connect did not
    /// really succeed (a proxy accepting and resetting), so it also counts as a failure.
    fn reset_before_payload(&mut self, id: ConnId, ev: &KernelEvent) -> Option<Applied> {
        let conn = self.conns.get(&id)?;
        if conn.last_payload.is_some() || conn.bytes_received > 0 || ev.bytes_received > 0 {
            return None;
        }
        let (pid, endpoint) = (conn.owner?, conn.endpoint);
        let p = self.processes.get_mut(&pid)?;
        push_failure(
            p,
            ConnectFailure {
                at: ev.at,
                endpoint,
                reason: FailureReason::Reset,
            },
        );
        Some(Applied::ConnectFailed {
            pid,
            endpoint,
            reason: FailureReason::Reset,
        })
    }
}

fn push_failure(p: &mut ProcessRecord, failure: ConnectFailure) {
    let at = failure.at;
    p.connect_failures.push_back(failure);
    while p.connect_failures.len() > FAILURES_KEPT
        || p.connect_failures
            .front()
            .is_some_and(|f| at.saturating_duration_since(f.at) > FAILURE_MEMORY)
    {
        p.connect_failures.pop_front();
    }
}

/// Folds one `tcp_info` sample into a connection's evidence: its counters (for the API, and
/// to tell a quiet connection), when data last arrived, and whether acknowledgements make
/// progress. Requests and answers come from the kernel's segment events, in their order, not
/// from these counters (see `ordered.rs`).
fn update_evidence(conn: &mut Connection, tcp: &TcpInfo, now: Instant) {
    let sent = tcp.bytes_sent.saturating_sub(tcp.bytes_retrans);
    let segs_out = tcp.data_segs_out.saturating_sub(tcp.total_retrans);
    let first = conn.sampled_at.is_none();
    // Payload the kernel's segment events reported since the last sample is known, timed
    // there: it does not keep a connection from being quiet (a watch that receives an event
    // every few seconds is sampled as seldom as an idle one).
    let reported = conn.last_receive > conn.sampled_at && conn.sampled_at.is_some();
    if (!first || conn.origin == Origin::Event) && tcp.bytes_received > conn.bytes_received {
        let ago = Duration::from_millis(u64::from(tcp.last_data_recv_ms));
        let t_recv = now.checked_sub(ago).unwrap_or(now);
        conn.last_receive = conn.last_receive.max(Some(t_recv));
    }
    let inbound = tcp.bytes_received != conn.bytes_received || tcp.data_segs_in != conn.data_segs_in;
    let changed = first
        || (inbound && !reported)
        || sent != conn.bytes_sent
        || segs_out != conn.data_segs_out
        || tcp.bytes_acked != conn.bytes_acked;
    if changed {
        conn.last_change = Some(now);
    }
    conn.bytes_received = tcp.bytes_received;
    conn.data_segs_in = tcp.data_segs_in;
    conn.bytes_sent = sent;
    conn.data_segs_out = segs_out;
    // Data outstanding, retransmitted or backed off, and no acknowledgement for a second: the
    // connection is talking into a void, whether or not the retransmit tracepoint fired (it
    // does not for segments dropped on the sender's own path, which stay "not sent" with a
    // growing backoff). A peer with a full receive window acknowledges its probes.
    let progress = tcp.bytes_acked > conn.bytes_acked;
    let outstanding = tcp.unacked > 0 || tcp.notsent_bytes > 0;
    conn.outstanding = outstanding;
    if progress || !outstanding {
        conn.stalled_since = None;
    } else if (tcp.retransmits > 0 || tcp.backoff > 0) && tcp.last_ack_recv_ms >= 1000 {
        conn.stalled_since.get_or_insert(now);
    }
    conn.bytes_acked = tcp.bytes_acked;
    conn.sampled_at = Some(now);
}

pub mod facts;
pub mod gaps;
pub mod ordered;
mod requests;
pub mod sampler;
pub mod streams;

#[cfg(test)]
mod tests;
