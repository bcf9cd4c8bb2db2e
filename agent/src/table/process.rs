//! Per-process bookkeeping: a connection's owner (`attach_owner`), whether the process is
//! connected or trying, how its last established connection ended (`end_connection`: a loss,
//! a close prompted by the endpoint going away, or an idle close of its own, kept as a
//! [`LocalClose`] for [`PROMPT_WINDOW`](super::PROMPT_WINDOW)), its recent connect failures
//! (bounded) and the rhythm of its requests.
use std::{collections::VecDeque, time::Instant};

use lifeline_common::tcp_state;

use super::{
    facts::{LossCause, Rhythm},
    ConnId, ConnectFailure, ConnectionTable, FailureReason, LossRecord, Origin, ProcessRecord, FAILURES_KEPT,
    FAILURE_MEMORY, PROMPT_MIN_AGE, PROMPT_WINDOW,
};
use crate::{endpoint::Endpoint, host::process::ProcessInfo};

/// A close the client made itself, kept for [`PROMPT_WINDOW`]: if the endpoint turns out to
/// have been going away at that moment, it was prompted (a loss), not idle.
#[derive(Clone, Copy, Debug)]
pub(super) struct LocalClose {
    pid: u32,
    start_time_ticks: u64,
    at: Instant,
    endpoint: Endpoint,
}

impl ProcessRecord {
    pub(super) fn new(info: ProcessInfo, now: Instant) -> Self {
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

    pub(super) fn note_request(&mut self, at: Instant) {
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

/// States in which the local side has closed: the process no longer holds the socket.
pub(super) fn locally_closed(state: u32) -> bool {
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
pub(super) enum End {
    /// The peer or the network ended it.
    Lost(LossCause),
    /// The client closed it.
    Local,
}

pub(super) fn end_of(old: u32, new: u32, sk_err: i32) -> Option<End> {
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
    pub(super) fn attach_owner(&mut self, id: ConnId, info: ProcessInfo, now: Instant) {
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
        self.ownerless.remove(&id);
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

    pub(super) fn note_attempt(&mut self, pid: u32, at: Instant) {
        if let Some(p) = self.processes.get_mut(&pid) {
            if p.connected_since.is_none() {
                p.trying_since.get_or_insert(at);
            }
        }
    }

    /// Re-derives whether `pid` holds an established connection: the start of a connected
    /// run clears its loss and attempts; its end (without a loss recorded) leaves it simply
    /// not connected.
    pub(super) fn update_connected(&mut self, pid: u32, now: Instant) {
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
    pub(super) fn end_connection(&mut self, id: ConnId, end: Option<End>, at: Instant) {
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
    pub(super) fn promote_local_closes(&mut self, endpoint: Endpoint, at: Instant) {
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

    /// Forgets a process (it exited). Its connections stay, without an owner, when another
    /// process may hold the same socket (a forked child keeps what it inherited): the next
    /// owner lookup through the socket inode finds it, and a socket nobody holds closes.
    pub fn forget_process(&mut self, pid: u32, _now: Instant) {
        self.upcoming = None;
        self.processes.remove(&pid);
        self.open_streams.remove(&pid);
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
                self.ownerless.insert(id);
            } else {
                self.unlink(id);
            }
        }
        self.local_closes.retain(|c| c.pid != pid);
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
}

pub(super) fn push_failure(p: &mut ProcessRecord, failure: ConnectFailure) {
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
