//! Kernel events applied to the connection table: a connect, a state change, a segment, a
//! retransmit or a reset finds its connection (by the socket's kernel address, else its
//! namespace and 4-tuple), adds or moves it, and ends it; the table's indexes
//! (`insert`, `index_sk`, `unlink`) are kept here too. The agent's own sockets are skipped.
use std::time::{Duration, Instant, SystemTime};

use lifeline_common::tcp_state;

use super::{
    facts::LossCause,
    ordered::{Ordered, Segment},
    process::{end_of, locally_closed, push_failure, End},
    samples::ARRIVAL_SLACK,
    streams::Streams,
    Applied, ConnId, ConnectFailure, Connection, ConnectionTable, FailureReason, Origin, ProcessRecord,
    Tuple,
};
use crate::{
    endpoint::Endpoint,
    host::process::ProcessInfo,
    kernel::events::{Change, KernelEvent},
};

/// The agent's own sockets remembered at most (its probes and API watches: a handful).
const OWN_SOCKETS_MAX: usize = 1024;

impl ConnectionTable {
    /// Applies one kernel event. `owner` is the process the caller resolved from the event's
    /// `owner_tgid` (None when the event ran in softirq or the process is already gone).
    pub fn apply_event(&mut self, ev: &KernelEvent, owner: Option<ProcessInfo>) -> Option<Applied> {
        // A segment changes one known connection: its due time is folded into the plan below
        // (busy connections send many; discarding the plan for each walked the whole table
        // every round). Anything else may add, move or end connections: walk again.
        if !matches!(ev.change, Change::Segment { .. }) {
            self.upcoming = None;
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
            .filter(|id| self.conns.contains_key(id));
        match ev.change {
            Change::Segment {
                len,
                snd_nxt,
                snd_una,
                write_seq,
                srtt_us,
            } => {
                let id = found?;
                if ev.sk != 0 {
                    self.index_sk(id, ev.sk);
                }
                let conn = self.conns.get_mut(&id).expect("found");
                let due_before = conn.sample_due_at(ev.at);
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
                    if conn
                        .inbound_unreported
                        .is_some_and(|at| ev.at + ARRIVAL_SLACK >= at)
                    {
                        conn.inbound_unreported = None;
                    }
                }
                conn.last_payload = conn.last_payload.max(conn.ordered.last_answer());
                if conn.origin == Origin::Event && conn.first_answer.is_none() {
                    conn.first_answer = conn.ordered.last_answer();
                }
                conn.last_request = conn.last_request.max(conn.ordered.last_request());
                if snd_una == snd_nxt && write_seq == snd_nxt {
                    // Nothing unsent, nothing unacknowledged: a look (LOOKED_SAMPLE_EVERY).
                    conn.looked_at = conn.looked_at.max(Some(ev.at));
                }
                let due = conn.sample_due_at(ev.at);
                let owner = conn.owner;
                // A quiet connection's time that did not move is in the plan already: adding it
                // again for every record would only grow the plan.
                if due <= ev.at || due != due_before {
                    self.plan_sample(id, due, ev.at);
                }
                if let (Some(at), Some(pid)) = (request, owner) {
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
                if ev.local.port() != 0 && self.conns[&id].tuple != tuple {
                    self.retuple(id, tuple, ev.at);
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

    /// A connect ended in CLOSE from SYN_SENT: record the failure for its owner.
    pub(super) fn record_failure_event(
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
    pub(super) fn reset_before_payload(&mut self, id: ConnId, ev: &KernelEvent) -> Option<Applied> {
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

    pub(super) fn insert(
        &mut self,
        tuple: Tuple,
        endpoint: Endpoint,
        origin: Origin,
        now: Instant,
    ) -> ConnId {
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
                looked_at: None,
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
                inbound_unreported: None,
                outstanding: false,
                gap: None,
            },
        );
        if tuple.local.port() != 0 {
            self.by_tuple.insert(tuple, id);
        }
        self.ownerless.insert(id);
        id
    }

    /// Connection `id`'s socket is at kernel address `sk`: indexed there, and only there. A
    /// socket address is reused once its socket is freed: a connection that held `sk` before
    /// is gone in the kernel, and loses the index.
    pub(super) fn index_sk(&mut self, id: ConnId, sk: u64) {
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

    /// Connection `id`'s socket has the complete `tuple` now (its port is chosen after the
    /// connect event). Another entry of that tuple is the same socket, added by a scan that
    /// found it before the pump applied its events (scans run on the sampler's thread, and a
    /// connect waits in the ring until the pump's thread next runs), or an older socket of the
    /// tuple whose end was missed: it goes, and `id` keeps its inode and owner where it lacks
    /// them. Left in place, that entry was out of the index: no event and no sample reached it
    /// again, and its client held an ESTABLISHED connection for good (never `disconnected`).
    pub(super) fn retuple(&mut self, id: ConnId, tuple: Tuple, at: Instant) {
        if let Some(other) = self.by_tuple.get(&tuple).copied().filter(|o| *o != id) {
            if let Some(gone) = self.unlink(other) {
                let conn = self.conns.get_mut(&id).expect("caller checked");
                conn.inode = conn.inode.or(gone.inode);
                let owner = conn.owner;
                match (owner, gone.owner) {
                    (None, Some(pid)) => {
                        if let Some(info) = self.processes.get(&pid).map(|p| p.info.clone()) {
                            self.attach_owner(id, info, at);
                        }
                    }
                    (Some(kept), Some(pid)) if kept != pid => self.update_connected(pid, at),
                    _ => {}
                }
            }
        }
        let conn = self.conns.get_mut(&id).expect("caller checked");
        let old = std::mem::replace(&mut conn.tuple, tuple);
        if self.by_tuple.get(&old) == Some(&id) {
            self.by_tuple.remove(&old);
        }
        self.by_tuple.insert(tuple, id);
    }

    /// Removes a connection from every index; returns it.
    pub(super) fn unlink(&mut self, id: ConnId) -> Option<Connection> {
        let conn = self.conns.remove(&id)?;
        self.ownerless.remove(&id);
        self.streams_gone(&conn);
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
}
