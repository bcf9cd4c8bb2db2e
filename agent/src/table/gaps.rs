//! Gaps in the evidence: records the kernel did not send (its ring buffer was full, or a
//! process spent its stream record budget), each charged to the connections it may have
//! concerned and to nobody else.
//!
//! The kernel counts every lost record under the most precise scope it had (`LossKey` in
//! `lifeline-common`): the socket; its ports, where the kernel's `tcp_probe` names no socket;
//! the process, for a request header (written before its stream is); the node, only where its
//! map of losses was full. The table forgets what a gap may have hidden on exactly those
//! connections (their waits, and the judgement of their open streams) and keeps saying so
//! for [`GAP_SHOWN_FOR`] after the last loss: the API calls such a client's evidence
//! incomplete, since when and why. A gap never makes anything `stale`: what was pending is
//! timed afresh from the gap on.
use std::time::{Duration, Instant};

use lifeline_common::loss_cause;

use super::ConnectionTable;

/// How long after its last lost record a connection's gap is still reported: as long as a
/// wait hidden by it could have taken to turn stale at the default `stale_after`.
pub const GAP_SHOWN_FOR: Duration = Duration::from_secs(60);

/// Why records were not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GapCause {
    /// The kernel's ring buffer was full (the agent fell behind the node's events).
    RingFull,
    /// The process sent stream records faster than its budget
    /// (`lifeline_common::STREAM_BUDGET` a second): its own flood.
    RateLimited,
    /// The kernel's table of losses was full: any connection's records may be missing.
    Unscoped,
    /// Not the kernel's: the connection or its process held more open streams than the table
    /// keeps (`streams::MAX_OPEN`, `streams::MAX_OPEN_PER_PROCESS`), or the node did and it
    /// held the most (`streams::MAX_OPEN_PER_NODE`), and some of its own were forgotten.
    StreamBound,
    /// The kernel lost its place in the frames a client writes on a connection it was
    /// following (a frame header split across writes, more frames in one write than it
    /// reads, a write that starts mid-frame): that write's frames went unseen. One record
    /// per occurrence.
    LostPlace,
    /// The kernel forgot which connection a client's reader reads (its table of readers,
    /// `READERS`, evicted the entry, or the socket was briefly not found): frames read
    /// meanwhile went unseen. One record per occurrence.
    ReaderForgotten,
}

impl GapCause {
    /// The cause of a `LossKey`; `None` for a cause this agent does not know (a newer kernel
    /// object would be a build error, so this is a corrupt key).
    pub fn from_kernel(cause: u16) -> Option<Self> {
        match cause {
            loss_cause::RING_FULL => Some(GapCause::RingFull),
            loss_cause::RATE_LIMITED => Some(GapCause::RateLimited),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GapCause::RingFull => "ring_full",
            GapCause::RateLimited => "rate_limited",
            GapCause::Unscoped => "unscoped",
            GapCause::StreamBound => "stream_bound",
            GapCause::LostPlace => "lost_place",
            GapCause::ReaderForgotten => "reader_forgotten",
        }
    }
}

/// Whose records were lost, as precisely as the kernel knew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GapScope {
    /// One socket, by kernel address; `tgid` is its process where the kernel knew it (a lost
    /// connect), for a socket the table has not met.
    Socket { sk: u64, tgid: u32 },
    /// One process's request headers.
    Process(u32),
    /// Anyone's.
    Node,
}

impl GapScope {
    /// The metrics' label of every [`GapScope::Socket`] loss, whichever socket.
    pub const SOCKET: &'static str = "socket";

    pub fn as_str(self) -> &'static str {
        match self {
            GapScope::Socket { .. } => Self::SOCKET,
            GapScope::Process(_) => "process",
            GapScope::Node => "node",
        }
    }
}

/// A connection's current gap: lost records since `since`, the last at `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub since: Instant,
    pub last: Instant,
    pub cause: GapCause,
    /// Records lost since `since` (as counted at the agent's last read of the kernel's map).
    pub records: u64,
}

impl Gap {
    /// Whether it is still reported at `now`.
    pub fn current(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) < GAP_SHOWN_FOR
    }

    /// `gap` (a connection's) with `records` more lost for `cause` at `now`: the current gap
    /// goes on, a past one is replaced.
    pub fn extended(gap: Option<Gap>, cause: GapCause, records: u64, now: Instant) -> Gap {
        match gap.filter(|g| g.current(now)) {
            Some(g) => Gap {
                last: now,
                records: g.records.saturating_add(records),
                // The latest cause is what it is now.
                cause,
                ..g
            },
            None => Gap {
                since: now,
                last: now,
                cause,
                records,
            },
        }
    }
}

impl ConnectionTable {
    /// `records` records of `scope` were lost for `cause`, read at `now`: the connections they
    /// may have concerned forget what was pending and their open streams' judgement. Returns
    /// how many connections that touched (0: the loss concerned none the table tracks, such
    /// as a connect it will learn of from the next scan).
    pub fn evidence_lost(&mut self, scope: GapScope, cause: GapCause, records: u64, now: Instant) -> usize {
        let ids: Vec<u64> = match scope {
            GapScope::Socket { sk, tgid } => match self.by_sk.get(&sk) {
                Some(&id) => vec![id],
                None if tgid != 0 => return self.evidence_lost(GapScope::Process(tgid), cause, records, now),
                None => Vec::new(),
            },
            GapScope::Process(tgid) => {
                self.pending.forget_process(tgid);
                self.conns
                    .iter()
                    .filter(|(_, c)| c.owner == Some(tgid))
                    .map(|(id, _)| *id)
                    .collect()
            }
            GapScope::Node => {
                self.pending.forget_all();
                self.conns.keys().copied().collect()
            }
        };
        for id in &ids {
            if let Some(conn) = self.conns.get_mut(id) {
                conn.ordered.lost_evidence();
                conn.streams.lost_evidence(now);
                conn.gap = Some(Gap::extended(conn.gap, cause, records, now));
            }
        }
        if !ids.is_empty() {
            // Forgotten waits change what the sampler should look at.
            self.upcoming = None;
        }
        ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_causes_are_known_and_others_are_not() {
        assert_eq!(
            GapCause::from_kernel(loss_cause::RING_FULL),
            Some(GapCause::RingFull)
        );
        assert_eq!(
            GapCause::from_kernel(loss_cause::RATE_LIMITED),
            Some(GapCause::RateLimited)
        );
        assert_eq!(GapCause::from_kernel(0), None);
        assert_eq!(GapCause::from_kernel(99), None);
    }

    #[test]
    fn a_gap_is_reported_for_its_window_after_the_last_loss() {
        let t0 = Instant::now();
        let gap = Gap {
            since: t0,
            last: t0 + Duration::from_secs(5),
            cause: GapCause::RingFull,
            records: 3,
        };
        assert!(gap.current(t0 + Duration::from_secs(5) + GAP_SHOWN_FOR - Duration::from_millis(1)));
        assert!(!gap.current(t0 + Duration::from_secs(5) + GAP_SHOWN_FOR));
    }
}
