//! The connection table: every TCP connection that a process on this node holds to an
//! apiserver endpoint, with its owner and inbound activity, merged from three sources:
//!
//! - kernel events (connect, establish, close, retransmit), keyed by the socket's kernel
//!   address while it lives;
//! - the start-up scan of sock_diag in every network namespace (connections older than the
//!   agent), keyed by network namespace + 4-tuple, so a later event for the same socket finds
//!   the same entry and nothing is listed twice;
//! - the periodic inbound sampler (`tcp_info` of tracked sockets only).
//!
//! The table does no I/O: callers resolve owners (`/proc`) and samples (sock_diag) first and
//! hand in the results, so every merge rule here is unit-tested with plain values.
use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    time::{Duration, Instant, SystemTime},
};

use lifeline_common::tcp_state;

use crate::{
    endpoint::{Endpoint, EndpointSet},
    kernel::events::{Change, KernelEvent},
    process::ProcessInfo,
    sock_diag::TcpInfo,
};

/// Reads whose average size per data segment is at most this many bytes are keepalive
/// traffic (a TLS record carrying an HTTP/2 PING, SETTINGS ack or WINDOW_UPDATE is 31–39
/// bytes; two coalesced are under 80), not payload. Watch events and bookmarks are hundreds of
/// bytes. See README "Inbound payload".
pub const KEEPALIVE_MAX_BYTES_PER_SEGMENT: u64 = 80;

/// How long connect failures are remembered per process (the longest window any rule uses).
pub const FAILURE_MEMORY: Duration = Duration::from_secs(600);

/// A socket's identity that userspace can see everywhere: network namespace and 4-tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub netns: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// Why a connection attempt failed, as far as the kernel's state change tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureReason {
    /// SYN_SENT → CLOSE after a reset before any retransmit: nothing listening.
    Refused,
    /// SYN_SENT → CLOSE after SYN retransmits: no answer.
    Timeout,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Refused => "refused",
            FailureReason::Timeout => "timeout",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectFailure {
    pub at: Instant,
    pub endpoint: Endpoint,
    pub reason: FailureReason,
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
    pub first_seen: Instant,
    pub established_at: Option<SystemTime>,
    pub bytes_received: u64,
    pub data_segs_in: u32,
    /// When data last arrived at all, keepalives included.
    pub last_receive: Option<Instant>,
    /// When payload (not keepalive-sized reads) last arrived.
    pub last_payload: Option<Instant>,
    pub retransmits: u64,
    /// Time of the first retransmit since the peer last acknowledged new data (None while
    /// acknowledgements make progress): how long the connection has been talking into a void.
    pub stalled_since: Option<Instant>,
    /// Bytes the peer has acknowledged, as last sampled.
    pub bytes_acked: u64,
}

/// What the agent remembers about a process that holds or held an apiserver connection.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRecord {
    pub info: ProcessInfo,
    pub first_seen: Instant,
    /// Since when it has continuously held at least one established connection (None: now
    /// it holds none).
    pub connected_since: Option<Instant>,
    /// When its last established connection went away (None: it never had one, or has one).
    pub connection_lost_at: Option<Instant>,
    /// The endpoint of its most recent established connection (kept after it is lost, so a
    /// disconnected client still says which apiserver it lost).
    pub last_endpoint: Option<Endpoint>,
    pub connect_failures: VecDeque<ConnectFailure>,
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

#[derive(Default)]
pub struct ConnectionTable {
    endpoints: EndpointSet,
    conns: HashMap<ConnId, Connection>,
    by_sk: HashMap<u64, ConnId>,
    by_tuple: HashMap<Tuple, ConnId>,
    processes: HashMap<u32, ProcessRecord>,
    next_id: ConnId,
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

impl ConnectionTable {
    pub fn new(endpoints: EndpointSet) -> Self {
        Self {
            endpoints,
            ..Default::default()
        }
    }

    pub fn endpoints(&self) -> &EndpointSet {
        &self.endpoints
    }

    /// Replaces the endpoint set; connections to endpoints no longer watched are dropped, the
    /// others are re-matched (a more specific endpoint may now apply).
    pub fn set_endpoints(&mut self, endpoints: EndpointSet, now: Instant) {
        self.endpoints = endpoints;
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            let remote = self.conns[&id].tuple.remote;
            match self.endpoints.matching(remote) {
                Some(endpoint) => self.conns.get_mut(&id).expect("listed id").endpoint = endpoint,
                None => self.remove(id, now),
            }
        }
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

    /// Applies one kernel event. `owner` is the process the caller resolved from the event's
    /// `owner_tgid` (None when the event ran in softirq or the process is already gone).
    pub fn apply_event(&mut self, ev: &KernelEvent, owner: Option<ProcessInfo>) -> Option<Applied> {
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
            .copied();
        match ev.change {
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
                let failure = (old == tcp_state::SYN_SENT && new == tcp_state::CLOSE)
                    .then(|| self.record_failure(found, owner, ev))
                    .flatten();
                if let Some(id) = found {
                    self.remove(id, ev.at);
                }
                failure
            }
            Change::State { new, .. } => {
                let endpoint = self.endpoints.matching(ev.remote)?;
                let id = found.unwrap_or_else(|| self.insert(tuple, endpoint, ev.at));
                if let Some(info) = owner {
                    self.attach_owner(id, info, ev.at);
                }
                let conn = self.conns.get_mut(&id).expect("found or inserted");
                if conn.sk != Some(ev.sk) {
                    conn.sk = Some(ev.sk);
                    self.by_sk.insert(ev.sk, id);
                }
                let conn = self.conns.get_mut(&id).expect("found or inserted");
                if ev.local.port() != 0 && conn.tuple != tuple {
                    self.by_tuple.remove(&conn.tuple);
                    conn.tuple = tuple;
                    self.by_tuple.insert(tuple, id);
                }
                let conn = self.conns.get_mut(&id).expect("found or inserted");
                conn.tcp_state = new;
                if new == tcp_state::ESTABLISHED && conn.established_at.is_none() {
                    conn.established_at = Some(SystemTime::now() - ev.at.elapsed());
                    conn.stalled_since = None;
                    self.note_established(id, ev.at);
                } else if new != tcp_state::ESTABLISHED {
                    if let Some(pid) = conn.owner {
                        self.note_maybe_disconnected(pid, ev.at);
                    }
                }
                None
            }
        }
    }

    /// Adds a connection found by the start-up scan (or a rescan), unless it is already known.
    pub fn insert_scanned(&mut self, tuple: Tuple, inode: u64, tcp_state: u32, now: Instant) -> bool {
        if self.by_tuple.contains_key(&tuple) {
            return false;
        }
        let Some(endpoint) = self.endpoints.matching(tuple.remote) else {
            return false;
        };
        let id = self.insert(tuple, endpoint, now);
        let conn = self.conns.get_mut(&id).expect("inserted");
        conn.inode = Some(inode);
        conn.tcp_state = tcp_state;
        true
    }

    // LEAD: replace with main's version at merge (the resync that heals lost events).
    /// Merges what a scan of network namespace `netns` found: `(tuple, inode, tcp_state)` of
    /// every socket to a watched endpoint there. Returns how many were new.
    pub fn reconcile_scan(&mut self, netns: u64, found: &[(Tuple, u64, u32)], now: Instant) -> usize {
        found
            .iter()
            .filter(|(tuple, ..)| tuple.netns == netns)
            .filter(|(tuple, inode, state)| self.insert_scanned(*tuple, *inode, *state, now))
            .count()
    }

    // LEAD: replace with main's version at merge (failures aggregated in the kernel).
    /// Records `count` failed connects of process `pid` to `endpoint` that the kernel counted
    /// instead of sending them one by one. A process the table does not know is ignored.
    pub fn record_connect_failures(
        &mut self,
        pid: u32,
        endpoint: Endpoint,
        reason: FailureReason,
        count: u32,
        at: Instant,
    ) {
        let Some(p) = self.processes.get_mut(&pid) else {
            return;
        };
        for _ in 0..count.min(64) {
            p.connect_failures
                .push_back(ConnectFailure { at, endpoint, reason });
        }
        while p
            .connect_failures
            .front()
            .is_some_and(|f| at.duration_since(f.at) > FAILURE_MEMORY)
        {
            p.connect_failures.pop_front();
        }
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
        if let Some(&id) = self.by_tuple.get(tuple) {
            self.attach_owner(id, info, now);
        }
    }

    /// Every tracked connection with a complete tuple, for the sampler.
    pub fn sample_targets(&self) -> Vec<Tuple> {
        self.conns
            .values()
            .filter(|c| c.tuple.local.port() != 0)
            .map(|c| c.tuple)
            .collect()
    }

    /// Applies one sampler result taken at `now`.
    pub fn apply_sample(&mut self, tuple: &Tuple, sample: Sample, now: Instant) {
        let Some(&id) = self.by_tuple.get(tuple) else {
            return;
        };
        match sample {
            Sample::Gone => self.remove(id, now),
            Sample::Found {
                inode,
                tcp_state,
                tcp,
            } => {
                let conn = self.conns.get_mut(&id).expect("indexed");
                conn.inode = Some(inode).filter(|i| *i != 0).or(conn.inode);
                if locally_closed(tcp_state) {
                    self.remove(id, now);
                    return;
                }
                let newly_established =
                    tcp_state == tcp_state::ESTABLISHED && conn.tcp_state != tcp_state::ESTABLISHED;
                conn.tcp_state = tcp_state;
                if let Some(tcp) = tcp {
                    update_inbound(conn, &tcp, now);
                }
                if newly_established {
                    self.note_established(id, now);
                } else if tcp_state != tcp_state::ESTABLISHED {
                    if let Some(pid) = self.conns[&id].owner {
                        self.note_maybe_disconnected(pid, now);
                    }
                }
            }
        }
    }

    /// Forgets a process (it exited) and every connection it owned.
    pub fn forget_process(&mut self, pid: u32, now: Instant) {
        self.processes.remove(&pid);
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.owner == Some(pid))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.remove(id, now);
        }
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

    fn insert(&mut self, tuple: Tuple, endpoint: Endpoint, now: Instant) -> ConnId {
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
                first_seen: now,
                established_at: None,
                bytes_received: 0,
                data_segs_in: 0,
                last_receive: None,
                last_payload: None,
                retransmits: 0,
                stalled_since: None,
                bytes_acked: 0,
            },
        );
        if tuple.local.port() != 0 {
            self.by_tuple.insert(tuple, id);
        }
        id
    }

    fn remove(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        if let Some(sk) = conn.sk {
            self.by_sk.remove(&sk);
        }
        if self.by_tuple.get(&conn.tuple) == Some(&id) {
            self.by_tuple.remove(&conn.tuple);
        }
        if let Some(pid) = conn.owner {
            self.note_maybe_disconnected(pid, now);
        }
    }

    fn attach_owner(&mut self, id: ConnId, info: ProcessInfo, now: Instant) {
        let pid = info.pid;
        let record = self.processes.entry(pid).or_insert_with(|| ProcessRecord {
            info: info.clone(),
            first_seen: now,
            connected_since: None,
            connection_lost_at: None,
            last_endpoint: None,
            connect_failures: VecDeque::new(),
        });
        if record.info.start_time_ticks != info.start_time_ticks {
            // The pid was recycled: a different process.
            *record = ProcessRecord {
                info,
                first_seen: now,
                connected_since: None,
                connection_lost_at: None,
                last_endpoint: None,
                connect_failures: VecDeque::new(),
            };
        }
        let conn = self.conns.get_mut(&id).expect("caller checked");
        conn.owner = Some(pid);
        if conn.tcp_state == tcp_state::ESTABLISHED {
            self.note_established(id, now);
        }
    }

    fn note_established(&mut self, id: ConnId, at: Instant) {
        let Some(conn) = self.conns.get(&id) else { return };
        let Some(p) = conn.owner.and_then(|pid| self.processes.get_mut(&pid)) else {
            return;
        };
        p.connected_since.get_or_insert(at);
        p.connection_lost_at = None;
        p.last_endpoint = Some(conn.endpoint);
    }

    /// After a connection of `pid` went away or left ESTABLISHED: if it holds no established
    /// connection any more, it lost the apiserver now.
    fn note_maybe_disconnected(&mut self, pid: u32, now: Instant) {
        let connected = self
            .connections_of(pid)
            .any(|c| c.tcp_state == tcp_state::ESTABLISHED);
        if let Some(p) = self.processes.get_mut(&pid) {
            if !connected && p.connected_since.take().is_some() {
                p.connection_lost_at = Some(now);
            }
        }
    }

    fn record_failure(
        &mut self,
        found: Option<ConnId>,
        owner: Option<ProcessInfo>,
        ev: &KernelEvent,
    ) -> Option<Applied> {
        let conn = found.and_then(|id| self.conns.get(&id));
        let pid = conn.and_then(|c| c.owner).or(owner.as_ref().map(|o| o.pid))?;
        let endpoint = self.endpoints.matching(ev.remote)?;
        let reason = match conn {
            Some(c) if c.retransmits > 0 => FailureReason::Timeout,
            _ => FailureReason::Refused,
        };
        let p = match self.processes.entry(pid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(ProcessRecord {
                info: owner?,
                first_seen: ev.at,
                connected_since: None,
                connection_lost_at: None,
                last_endpoint: None,
                connect_failures: VecDeque::new(),
            }),
        };

        p.connect_failures.push_back(ConnectFailure {
            at: ev.at,
            endpoint,
            reason,
        });
        while p
            .connect_failures
            .front()
            .is_some_and(|f| ev.at.duration_since(f.at) > FAILURE_MEMORY)
        {
            p.connect_failures.pop_front();
        }
        Some(Applied::ConnectFailed {
            pid,
            endpoint,
            reason,
        })
    }
}

/// Folds one `tcp_info` sample into a connection's inbound and ack-progress history.
fn update_inbound(conn: &mut Connection, tcp: &TcpInfo, now: Instant) {
    let last_data = now.checked_sub(Duration::from_millis(u64::from(tcp.last_data_recv_ms)));
    let first_sample = conn.bytes_received == 0 && conn.data_segs_in == 0;
    let bytes = tcp.bytes_received.saturating_sub(conn.bytes_received);
    let segs = u64::from(tcp.data_segs_in.saturating_sub(conn.data_segs_in));
    if bytes > 0 {
        conn.last_receive = last_data;
        // A connection's history before the first sample is unknown: credit it as payload
        // (an agent restart must not make every client look stale).
        let payload = first_sample || bytes > segs.max(1) * KEEPALIVE_MAX_BYTES_PER_SEGMENT;
        if payload {
            conn.last_payload = last_data;
        }
    }
    conn.bytes_received = tcp.bytes_received;
    conn.data_segs_in = tcp.data_segs_in;
    if tcp.bytes_acked > conn.bytes_acked || tcp.unacked == 0 {
        conn.stalled_since = None;
    }
    conn.bytes_acked = tcp.bytes_acked;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::events::{Change, KernelEvent};

    const NETNS: u64 = 4026531840;

    fn endpoints(list: &[&str]) -> EndpointSet {
        let mut set = EndpointSet::default();
        for e in list {
            for ep in Endpoint::parse_all(e).unwrap() {
                set.insert(ep, crate::endpoint::Source::Flag);
            }
        }
        set
    }

    fn process(pid: u32, start: u64) -> ProcessInfo {
        ProcessInfo {
            pid,
            comm: format!("proc-{pid}"),
            cmdline: String::new(),
            cgroup: "/".into(),
            container: None,
            netns: Some(NETNS),
            start_time_ticks: start,
        }
    }

    struct Events {
        t0: Instant,
    }

    impl Events {
        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        fn ev(&self, ms: u64, sk: u64, local: &str, change: Change, tgid: Option<u32>) -> KernelEvent {
            KernelEvent {
                at: self.at(ms),
                sk,
                netns: NETNS,
                change,
                local: local.parse().unwrap(),
                remote: "10.0.0.1:6443".parse().unwrap(),
                owner_tgid: tgid,
                thread_comm: "worker".into(),
                sk_err: 0,
                bytes_received: 0,
            }
        }

        /// connect() (sport not yet chosen), then ESTABLISHED from softirq with the real port.
        fn connect(&self, table: &mut ConnectionTable, ms: u64, sk: u64, port: u16, pid: u32) {
            let syn = self.ev(
                ms,
                sk,
                "10.0.0.2:0",
                state(tcp_state::CLOSE, tcp_state::SYN_SENT),
                Some(pid),
            );
            table.apply_event(&syn, Some(process(pid, 1)));
            let est = self.ev(
                ms + 1,
                sk,
                &format!("10.0.0.2:{port}"),
                state(tcp_state::SYN_SENT, tcp_state::ESTABLISHED),
                Some(999),
            );
            table.apply_event(&est, None);
        }
    }

    fn state(old: u32, new: u32) -> Change {
        Change::State { old, new }
    }

    fn setup() -> (ConnectionTable, Events) {
        (
            ConnectionTable::new(endpoints(&["10.0.0.1:6443"])),
            Events { t0: Instant::now() },
        )
    }

    fn tuple(port: u16) -> Tuple {
        Tuple {
            netns: NETNS,
            local: format!("10.0.0.2:{port}").parse().unwrap(),
            remote: "10.0.0.1:6443".parse().unwrap(),
        }
    }

    #[test]
    fn connect_then_establish_is_one_connection_owned_by_the_connecting_process() {
        let (mut table, e) = setup();
        e.connect(&mut table, 0, 0xa, 40000, 7);
        let conns: Vec<&Connection> = table.connections().collect();
        assert_eq!(conns.len(), 1);
        assert_eq!(
            conns[0].tuple,
            tuple(40000),
            "the port from the softirq event fills the tuple"
        );
        assert_eq!(
            conns[0].owner,
            Some(7),
            "the softirq event's bystander (999) is not the owner"
        );
        assert_eq!(conns[0].tcp_state, tcp_state::ESTABLISHED);
        assert!(conns[0].established_at.is_some());
        assert_eq!(table.process(7).unwrap().connected_since, Some(e.at(1)));
    }

    #[test]
    fn scanned_connection_and_later_events_do_not_duplicate() {
        let (mut table, e) = setup();
        assert!(table.insert_scanned(tuple(40000), 77, tcp_state::ESTABLISHED, e.at(0)));
        assert!(
            !table.insert_scanned(tuple(40000), 77, tcp_state::ESTABLISHED, e.at(0)),
            "rescan"
        );
        // A retransmit on a scanned socket is matched by its tuple.
        let retrans = e.ev(5, 0xb, "10.0.0.2:40000", Change::Retransmit { state: 1 }, None);
        assert!(matches!(
            table.apply_event(&retrans, None),
            Some(Applied::Retransmit { pid: None, .. })
        ));
        let close_wait = e.ev(
            6,
            0xb,
            "10.0.0.2:40000",
            state(tcp_state::ESTABLISHED, tcp_state::CLOSE_WAIT),
            None,
        );
        table.apply_event(&close_wait, None);
        assert_eq!(
            table.connections().count(),
            1,
            "the event found the scanned entry by tuple"
        );
        assert_eq!(table.connections().next().unwrap().sk, Some(0xb));
        let retrans = e.ev(7, 0xb, "10.0.0.2:40000", Change::Retransmit { state: 8 }, None);
        assert!(matches!(
            table.apply_event(&retrans, None),
            Some(Applied::Retransmit { .. })
        ));
        assert_eq!(table.connections().next().unwrap().retransmits, 2);
        // The owner comes from the inode, later.
        assert_eq!(table.ownerless(), vec![(tuple(40000), Some(77))]);
        table.set_owner(&tuple(40000), process(8, 1), e.at(8));
        assert!(table.ownerless().is_empty());
    }

    #[test]
    fn closing_forgets_the_connection_and_marks_the_process_disconnected() {
        let (mut table, e) = setup();
        e.connect(&mut table, 0, 0xa, 40000, 7);
        e.connect(&mut table, 10, 0xb, 40001, 7);
        let fin = e.ev(
            20,
            0xa,
            "10.0.0.2:40000",
            state(tcp_state::ESTABLISHED, tcp_state::FIN_WAIT1),
            Some(7),
        );
        table.apply_event(&fin, None);
        assert_eq!(table.connections().count(), 1);
        assert_eq!(
            table.process(7).unwrap().connection_lost_at,
            None,
            "still has one"
        );
        let peer_closed = e.ev(
            30,
            0xb,
            "10.0.0.2:40001",
            state(tcp_state::ESTABLISHED, tcp_state::CLOSE_WAIT),
            None,
        );
        table.apply_event(&peer_closed, None);
        let p = table.process(7).unwrap();
        assert_eq!(
            p.connection_lost_at,
            Some(e.at(30)),
            "CLOSE_WAIT is not connected"
        );
        assert_eq!(p.connected_since, None);
        assert_eq!(
            table.connections().count(),
            1,
            "listed until the process closes it"
        );
        let close = e.ev(
            40,
            0xb,
            "10.0.0.2:40001",
            state(tcp_state::CLOSE_WAIT, tcp_state::LAST_ACK),
            Some(7),
        );
        table.apply_event(&close, None);
        assert_eq!(table.connections().count(), 0);
    }

    #[test]
    fn failed_connects_are_recorded_as_refused_or_timeout() {
        let (mut table, e) = setup();
        let syn = e.ev(
            0,
            0xa,
            "10.0.0.2:0",
            state(tcp_state::CLOSE, tcp_state::SYN_SENT),
            Some(7),
        );
        table.apply_event(&syn, Some(process(7, 1)));
        let rst = e.ev(
            1,
            0xa,
            "10.0.0.2:40000",
            state(tcp_state::SYN_SENT, tcp_state::CLOSE),
            None,
        );
        let applied = table.apply_event(&rst, None);
        let endpoint = Endpoint::parse_all("10.0.0.1:6443").unwrap()[0];
        assert_eq!(
            applied,
            Some(Applied::ConnectFailed {
                pid: 7,
                endpoint,
                reason: FailureReason::Refused
            })
        );
        let syn = e.ev(
            2,
            0xb,
            "10.0.0.2:0",
            state(tcp_state::CLOSE, tcp_state::SYN_SENT),
            Some(7),
        );
        table.apply_event(&syn, Some(process(7, 1)));
        table.apply_event(
            &e.ev(1000, 0xb, "10.0.0.2:40001", Change::Retransmit { state: 2 }, None),
            None,
        );
        let gave_up = e.ev(
            3000,
            0xb,
            "10.0.0.2:40001",
            state(tcp_state::SYN_SENT, tcp_state::CLOSE),
            None,
        );
        let applied = table.apply_event(&gave_up, None);
        assert_eq!(
            applied,
            Some(Applied::ConnectFailed {
                pid: 7,
                endpoint,
                reason: FailureReason::Timeout
            })
        );
        let p = table.process(7).unwrap();
        assert_eq!(p.connect_failures.len(), 2);
        assert_eq!(p.connected_since, None);
        assert_eq!(table.connections().count(), 0);
    }

    #[test]
    fn events_for_other_destinations_are_ignored_and_removed_endpoints_drop_connections() {
        let (mut table, e) = setup();
        let mut other = e.ev(
            0,
            0xc,
            "10.0.0.2:0",
            state(tcp_state::CLOSE, tcp_state::SYN_SENT),
            Some(7),
        );
        other.remote = "10.0.0.9:6443".parse().unwrap();
        assert_eq!(table.apply_event(&other, Some(process(7, 1))), None);
        assert_eq!(table.connections().count(), 0);
        e.connect(&mut table, 0, 0xa, 40000, 7);
        table.set_endpoints(endpoints(&["10.0.0.0/8:6443"]), e.at(5));
        assert_eq!(
            table.connections().next().unwrap().endpoint.to_string(),
            "10.0.0.0/8:6443",
            "re-matched"
        );
        table.set_endpoints(endpoints(&["10.0.0.1:443"]), e.at(6));
        assert_eq!(table.connections().count(), 0);
    }

    #[test]
    fn samples_track_payload_but_not_keepalives_and_gone_sockets_go() {
        let (mut table, e) = setup();
        e.connect(&mut table, 0, 0xa, 40000, 7);
        let info = |bytes, segs, acked, last_recv_ms| TcpInfo {
            bytes_received: bytes,
            data_segs_in: segs,
            bytes_acked: acked,
            last_data_recv_ms: last_recv_ms,
            ..TcpInfo::default()
        };
        let found = |tcp| Sample::Found {
            inode: 5,
            tcp_state: tcp_state::ESTABLISHED,
            tcp: Some(tcp),
        };
        table.apply_sample(&tuple(40000), found(info(2000, 3, 100, 0)), e.at(1000));
        let c = table.connections().next().unwrap().clone();
        assert_eq!((c.bytes_received, c.inode), (2000, Some(5)));
        assert_eq!(c.last_payload, Some(e.at(1000)));
        // Two 38-byte PING acks: bytes grow, payload age does not reset.
        table.apply_sample(&tuple(40000), found(info(2076, 5, 100, 0)), e.at(2000));
        let c = table.connections().next().unwrap().clone();
        assert_eq!(c.last_receive, Some(e.at(2000)));
        assert_eq!(
            c.last_payload,
            Some(e.at(1000)),
            "keepalive-sized reads are not payload"
        );
        // A 600-byte watch event is.
        table.apply_sample(&tuple(40000), found(info(2676, 6, 100, 500)), e.at(3000));
        assert_eq!(table.connections().next().unwrap().last_payload, Some(e.at(2500)));
        // Retransmits with no ack progress stall; progress clears it.
        table.apply_event(
            &e.ev(3100, 0xa, "10.0.0.2:40000", Change::Retransmit { state: 1 }, None),
            None,
        );
        table.apply_sample(
            &tuple(40000),
            found(TcpInfo {
                unacked: 2,
                ..info(2676, 6, 100, 0)
            }),
            e.at(4000),
        );
        assert_eq!(
            table.connections().next().unwrap().stalled_since,
            Some(e.at(3100))
        );
        table.apply_sample(
            &tuple(40000),
            found(TcpInfo {
                unacked: 1,
                ..info(2676, 6, 180, 0)
            }),
            e.at(5000),
        );
        assert_eq!(table.connections().next().unwrap().stalled_since, None);
        table.apply_sample(&tuple(40000), Sample::Gone, e.at(6000));
        assert_eq!(table.connections().count(), 0);
        assert_eq!(table.process(7).unwrap().connection_lost_at, Some(e.at(6000)));
    }

    #[test]
    fn a_recycled_pid_is_a_new_process_and_exits_are_forgotten() {
        let (mut table, e) = setup();
        e.connect(&mut table, 0, 0xa, 40000, 7);
        table.forget_process(7, e.at(10));
        assert!(table.process(7).is_none());
        assert_eq!(table.connections().count(), 0);
        let syn = e.ev(
            20,
            0xb,
            "10.0.0.2:0",
            state(tcp_state::CLOSE, tcp_state::SYN_SENT),
            Some(7),
        );
        table.apply_event(&syn, Some(process(7, 2)));
        assert_eq!(table.process(7).unwrap().info.start_time_ticks, 2);
        assert_eq!(table.process(7).unwrap().first_seen, e.at(20));
    }
}
