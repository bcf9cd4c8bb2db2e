//! Samples applied to the connection table: one sock_diag result for a tracked socket (found,
//! with its state and `tcp_info`, or gone) folded into its connection's evidence: counters,
//! when data last arrived, ACK progress or a stall, a close the client made itself.
use std::time::{Duration, Instant};

use lifeline_common::tcp_state;

use super::{
    process::{end_of, locally_closed, End},
    Connection, ConnectionTable, Origin, Sample, Tuple, VANISH_GRACE,
};
use crate::host::sock_diag::TcpInfo;

/// How long after its arrival a segment's record may still wait in the ring: the pump's
/// longest wait between drains ([`crate::app::pump::DRAIN_EVERY`], 250 ms) and a margin.
const IN_FLIGHT: Duration = Duration::from_secs(1);
/// `tcp_info`'s `last_data_recv` is counted in jiffies (4 ms at HZ=250), a segment record's
/// arrival in nanoseconds: a record this much before the sample's estimate is the same payload.
pub(super) const ARRIVAL_SLACK: Duration = Duration::from_millis(20);

impl ConnectionTable {
    /// Applies one sampler result taken at `now` (the plan's side of it is
    /// [`Self::apply_sample`]).
    pub(super) fn apply_sample_to(&mut self, tuple: &Tuple, sample: Sample, now: Instant) {
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
    let ago = Duration::from_millis(u64::from(tcp.last_data_recv_ms));
    let t_recv = now.checked_sub(ago).unwrap_or(now);
    if (!first || conn.origin == Origin::Event) && tcp.bytes_received > conn.bytes_received {
        conn.last_receive = conn.last_receive.max(Some(t_recv));
    }
    let inbound = tcp.bytes_received != conn.bytes_received || tcp.data_segs_in != conn.data_segs_in;
    // Payload that arrived within a drain of the pump may have its segment record still in
    // the ring: a change only if the next sample finds it unreported still (a watch that
    // received an event just before a sample would otherwise be read every second for
    // QUIET_AFTER, ~1 in 20 of a busy node's watches at any time).
    let unreported_before = conn.inbound_unreported.take().is_some();
    let unreported = inbound && !reported && !first;
    if unreported && ago <= IN_FLIGHT {
        conn.inbound_unreported = Some(t_recv);
    }
    let changed = first
        || unreported_before
        || (unreported && ago > IN_FLIGHT)
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
