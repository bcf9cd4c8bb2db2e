//! Uprobes on the writes of a Go HTTP/2 client connection that the judgement needs, taken
//! from the registers at the entry of the transport's own functions instead of from the bytes
//! `crypto/tls.(*Conn).Write` is given (`gotls.rs`, `go_tls_write`, which reads each frame
//! header from the client's buffer):
//!
//! - `go_headers_sent`, at `(*ClientConn).writeHeaders(streamID uint32, endStream bool,
//!   maxFrameSize int, hdrs []byte)`: every request's HEADERS (and its trailers'): RAX the
//!   connection, EBX the stream, CL whether the request ends with them, RDI the largest frame
//!   and R8 the length of the encoded block. Stream 1 is the connection's first request: the
//!   connection began under the probes (`FRESH`, as the preface says to `go_tls_write`).
//! - `go_reset_sent`, at `(*ClientConn).writeStreamReset(streamID uint32, code ErrCode, ...)`:
//!   every RST_STREAM the client sends (a watch it cancels): RAX the connection, EBX the
//!   stream.
//!
//! Userspace attaches them only to a binary where every copy of the client has both, on the
//! stack check's jump (the entry's registers), and then not `go_tls_write`. What they do not
//! report, and the judgement does not use: DATA with END_STREAM sent (a request body's end),
//! GOAWAY sent (the client closing), the connection-level frames.
//!
//! A `*ClientConn` leads to its socket once: its `tconn` (a `net.Conn`, the second field in
//! every copy from Go 1.17 to 1.27's and x/net's) holds the `*tls.Conn`, found as the write
//! probe finds it (`gotls::tls_conn`, whose record the frame probes look for). Then a write on
//! it reads none of the client's memory while its record is trusted (`gotls::trusted`: no
//! watched socket closed since, at most a second), as `go_tls_write` trusts a `*tls.Conn`.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, uprobe},
    maps::{Array, LruHashMap},
    programs::ProbeContext,
};
use lifeline_common::direction;

use crate::{
    gotls::{self, frame_word, regs, send_frame, tgid, tls_conn, user_u64, ConnKey, Watched},
    segment_ends,
    slot::{self, Sealed, Slot},
};

/// `(*ClientConn).tconn`'s data word: after `t *Transport` and the interface's type word.
const TCONN_DATA: u64 = 16;

/// Each `*ClientConn` found so far whose slot in `CLIENT_SLOTS` another live connection
/// held, by process and address: its socket.
#[map]
static CLIENT_CONNS: LruHashMap<ConnKey, ClientConn> = LruHashMap::with_max_entries(16384, 0);

/// One `*ClientConn` record per process, direct-mapped by process (as `gotls::TLS_SLOTS`): a
/// client keeps one connection to an apiserver as a rule, and a write on it costs an array
/// load.
#[map]
static CLIENT_SLOTS: Array<Slot<ClientConn>> = Array::with_max_entries(slot::SLOTS, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct ClientConn {
    sk: u64,
    /// `SEGMENT_ENDS`, and the time (ns), when it was found (see `gotls::trusted`).
    ends_seen: u64,
    checked_ns: u64,
}

/// All of it enters the seal: a record is written whole, once.
impl Sealed for ClientConn {
    fn mix(&self) -> u64 {
        self.sk.rotate_left(42) ^ self.ends_seen.rotate_left(21) ^ self.checked_ns
    }
}

impl Watched for ClientConn {
    fn sk(&self) -> u64 {
        self.sk
    }
}

#[uprobe]
pub fn go_headers_sent(ctx: ProbeContext) -> u32 {
    let _ = try_go_headers_sent(&ctx);
    0
}

fn try_go_headers_sent(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    let stream = r.rbx as u32;
    let sk = client_conn(r.rax)?;
    if stream == 1 {
        // The connection's first request: its reader has read nothing the kernel reports
        // yet, so every frame of it is seen from here.
        send_frame(sk, r.r14, frame_word(gotls::FRESH, 0, 0, direction::SENT), 0);
    }
    let flags = if r.rcx as u8 != 0 { gotls::END_STREAM } else { 0 };
    send_frame(
        sk,
        r.r14,
        frame_word(gotls::HEADERS, flags, stream, direction::SENT),
        r.r8.min(r.rdi) as u32,
    );
    Some(())
}

#[uprobe]
pub fn go_reset_sent(ctx: ProbeContext) -> u32 {
    let _ = try_go_reset_sent(&ctx);
    0
}

fn try_go_reset_sent(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    let sk = client_conn(r.rax)?;
    send_frame(
        sk,
        r.r14,
        frame_word(gotls::RST_STREAM, 0, r.rbx as u32, direction::SENT),
        4,
    );
    Some(())
}

/// The watched socket of the current process's HTTP/2 client connection `cc`: from its record
/// while it is trusted, else found through its `tconn` (see [`find_client_conn`]).
#[inline(always)]
fn client_conn(cc: u64) -> Option<u64> {
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let tgid = tgid();
    let ends = segment_ends()?;
    let trusted = |held: &ClientConn| gotls::trusted(held.ends_seen, ends, held.checked_ns, now);
    if let Some(slot) = CLIENT_SLOTS.get_ptr_mut(slot::index(u64::from(tgid))) {
        if let Some(held) = slot::read(slot) {
            if held.key == cc && held.tgid == tgid && trusted(&held.value) {
                return Some(held.value.sk);
            }
        }
    }
    let key = ConnKey::new(cc, tgid);
    // SAFETY: copied out at once.
    if let Some(known) = unsafe { CLIENT_CONNS.get(key) }.copied() {
        if trusted(&known) {
            return Some(known.sk);
        }
    }
    Some(find_client_conn(cc, now)).filter(|&sk| sk != 0)
}

/// Finds the watched socket under the `*ClientConn` at `cc` (through its `*tls.Conn`, whose
/// record is made as the write probe makes it) and keeps it as of `now`. Out of line (see
/// `gotls::send_frame`); 0: none.
#[inline(never)]
fn find_client_conn(cc: u64, now: u64) -> u64 {
    let tgid = tgid();
    // Read before any lookup of SEGMENTS (see `forget_segments`).
    let ends = segment_ends().unwrap_or(u64::MAX);
    let Some(tls) = user_u64(cc + TCONN_DATA) else {
        return 0;
    };
    let Some(data) = user_u64(tls + 8) else {
        return 0;
    };
    let Some(conn) = tls_conn(tls, data) else {
        return 0;
    };
    let found = ClientConn {
        sk: conn.sk(),
        ends_seen: ends,
        checked_ns: now,
    };
    if let Some(slot) = CLIENT_SLOTS.get_ptr_mut(slot::index(u64::from(tgid))) {
        if gotls::slot_free(slot, cc, tgid) {
            slot::fill(slot, cc, tgid, found);
            return found.sk;
        }
    }
    let _ = CLIENT_CONNS.insert(ConnKey::new(cc, tgid), found, 0);
    found.sk
}
