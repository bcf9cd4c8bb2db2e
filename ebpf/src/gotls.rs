//! Uprobes on Go clients: which HTTP/2 stream of a watched connection carries which request,
//! read from the client's own plaintext without keeping any of it.
//!
//! Go's ABI (1.17+, amd64) passes arguments and results in registers (RAX, RBX, RCX, RDI,
//! RSI, R8, ...) and keeps the running goroutine in R14. The probes, attached by userspace to
//! the functions it found in the binary's `.gopclntab` (stripped binaries included):
//!
//! - `go_write_header`, at `(*ClientConn).writeHeader(name, value string)` of Go's HTTP/2
//!   transport: the request's `:method` and `:path`, before HPACK. The name is compared in the
//!   kernel and only those two values are ever copied out.
//! - `go_tls_write`, at `crypto/tls.(*Conn).Write(b []byte)`: the frame headers in `b` (type,
//!   flags, stream, length; never a payload), for watched sockets only; where every copy of the
//!   client writes its requests and resets through the functions `gowrites.rs` probes, those
//!   take its place.
//! - `go_frame_result`, in `(*Framer).ReadFrame` where it tests the error of the header read
//!   it called: the header of each frame the client read, in the result registers, and, from
//!   the goroutine, which connection it came from (the framer kept on the stack, checked when
//!   a watched socket closed and every second, leads to it as below). A frame of a known
//!   reader reads none of the client's memory. Where a copy's `ReadFrame` does not keep the
//!   header there, that copy has `go_frame_conn` instead:
//! - `go_frame_conn`, in `readFrameHeader` where it tests the error of its read: the header of
//!   each frame the client read, in the buffer it read it into, and which connection it came
//!   from, through the framer's `*bufio.Reader` (its second argument) to the `*tls.Conn` the
//!   write probe found. Where every copy has one of these two, they are the only read probes:
//!   one trap per frame.
//! - Else `go_tls_read`, at `crypto/tls.(*Conn).Read`: which watched socket the goroutine
//!   reads; and `go_frame_read` at the same jump as `go_frame_conn` (the header only), or
//!   where that place is not found `go_frame_header`, at each RET of `readFrameHeader`
//!   (uretprobes break Go's moving stacks): the header in the result registers. A probe on a
//!   RET costs the client ~16 times the trap of one on that jump (`host/gobin/prologue.rs`).
//!
//! A descriptor leads to its socket through the task's file table; a socket counts when the
//! segment program already keeps it (`SEGMENTS`): an established connection to an endpoint.
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_user, bpf_probe_read_user_buf,
    },
    macros::{map, uprobe},
    maps::{Array, LruHashMap},
    programs::ProbeContext,
};
use lifeline_common::{
    direction, header_field, loss_cause, protocol, EventKind, FrameEvent, GoroutineKey, HeaderEvent,
    StreamKey, FRAME_COALESCE_NS, GO_FRAME_BUF_SLOT, GO_FRAME_READER_SLOT, HEADER_VALUE_MAX,
};

use crate::{
    bump, count_of, count_up, counter, lazy_wakeup, lost, segment_ends,
    slot::{self, Sealed, Slot},
    stream_budget, EVENTS, OFFSETS, SEGMENTS,
};

/// HTTP/2 frame types (RFC 9113 §6).
const DATA: u8 = 0;
pub(crate) const HEADERS: u8 = 1;
pub(crate) const RST_STREAM: u8 = 3;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
/// Not frames: markers for userspace (`table/streams.rs` `frame::READING`, `LOST_PLACE`).
pub(crate) const FRESH: u8 = 0xfd;
const READING: u8 = 0xfe;
const LOST_PLACE: u8 = 0xff;
pub(crate) const END_STREAM: u8 = 1;
/// The client connection preface, before its first frame (RFC 9113 §3.4).
const PREFACE: &[u8; 5] = b"PRI *";
const PREFACE_LEN: u64 = 24;
/// Frame headers read per write: Go's transport writes through a 4 KiB buffer, a handful of
/// frames at a time. A write with more loses the position until a write starts a frame again.
const FRAMES_PER_WRITE: u32 = 32;
/// Largest frame payload any peer may allow (2^24 - 1).
const MAX_FRAME: u32 = (1 << 24) - 1;
/// Words `go_frame_conn` reads from `GO_FRAME_BUF_SLOT`: `buf`'s pointer first, `r`'s data
/// word last.
const FRAME_SPILL_WORDS: usize = ((GO_FRAME_READER_SLOT - GO_FRAME_BUF_SLOT) / 8 + 1) as usize;
/// Where a `Framer` keeps the data word of its `r io.Reader` (its first field; the framer's
/// `*bufio.Reader`): the same in every copy since x/net's first (2014).
const FRAMER_READER_DATA: u64 = 8;
/// How long a record of what the client's memory led to (a `*tls.Conn`'s connection for the
/// write probe, a `*ClientConn`'s for the request and reset probes, a goroutine's framer for
/// `go_frame_result`) is trusted without reading that memory again: see [`trusted`].
const TRUST_NS: u64 = 1_000_000_000;
/// Where a `bufio.Reader` keeps the data word of the `io.Reader` it reads (`rd`, after `buf
/// []byte` and `rd`'s type word): the same since Go 1.0.
const BUFIO_RD_DATA: u64 = 32;

/// What each goroutine last read: the watched connection under its `*tls.Conn` (Go's HTTP/2
/// read loop reads only one), and the stream whose DATA it last reported: a read of the same
/// connection again, or a DATA frame of that stream within `FRAME_COALESCE_NS`, costs one
/// lookup, in `READER_CACHE` first. (A per-CPU slot in front of it was tried and measured
/// worse: the read loop parks between its read and the frame header, and 4 clients on 2 CPUs
/// overwrote the slot; the cache's slots are per goroutine.)
#[map]
static READERS: LruHashMap<GoroutineKey, Reader> = LruHashMap::with_max_entries(16384, 0);

/// A direct-mapped cache of `READERS` by (goroutine, process), in front of it for the calls
/// of every frame: one array load where a lookup in that LRU map (vmalloc'd, 16,384 entries)
/// costs ~0.7 µs with a cold cache (benchmarks.md). A slot holds a copy, keyed by the
/// goroutine; `READERS` stays the record, and a goroutine whose slot another took is found
/// there again.
#[map]
static READER_CACHE: Array<Slot<Reader>> = Array::with_max_entries(slot::SLOTS, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct Reader {
    /// What the goroutine reads through: the `*tls.Conn` and its `net.Conn` data word (a conn
    /// at a reused address differs), as `go_tls_read` found them; as `go_frame_conn` found it,
    /// the framer's `*bufio.Reader` (`data` 0); as `go_frame_result` found it, the `*Framer`
    /// and when it was last checked (`data`, ns; see [`trusted`]).
    conn: u64,
    data: u64,
    /// The watched socket; 0 (frame probes only): the reader leads to no connection known
    /// when `TLS_FOUND` read `data_sent_ns`, so it is not looked for again until that moves.
    sk: u64,
    /// The stream whose DATA was last reported (0: none) and when.
    stream_id: u32,
    /// `go_frame_result`: the low 32 bits of `SEGMENT_ENDS` when the reader was last checked.
    ends_seen: u32,
    data_sent_ns: u64,
}

impl Sealed for Reader {
    fn mix(&self) -> u64 {
        self.conn.rotate_left(21) ^ self.data.rotate_left(42) ^ self.sk.rotate_left(11)
    }
}

/// Each `*tls.Conn` found so far whose slot in `TLS_SLOTS` another live connection held, by
/// process and address: its socket and where its written frames stand. A write on a
/// connection already known costs a load from its slot or this lookup (and one of `SEGMENTS`
/// only when a watched socket has closed since: `SEGMENT_ENDS`), not the walk through the file
/// table. A record is trusted only while the segment program keeps its socket (an established
/// connection to an endpoint) and the `net.Conn` data word is the one it was found under; a
/// walk starts it afresh, out of step with the frames.
#[map]
static TLS_CONNS: LruHashMap<ConnKey, TlsConn> = LruHashMap::with_max_entries(16384, 0);

/// A connection object of a client process (a `*tls.Conn`, a `*ClientConn`), by its address.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ConnKey {
    conn: u64,
    tgid: u32,
    _pad: u32,
}

impl ConnKey {
    #[inline(always)]
    pub(crate) fn new(conn: u64, tgid: u32) -> Self {
        ConnKey { conn, tgid, _pad: 0 }
    }
}

/// A record of a connection whose socket the segment program keeps.
pub(crate) trait Watched {
    fn sk(&self) -> u64;
}

impl Watched for TlsConn {
    fn sk(&self) -> u64 {
        self.sk
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct TlsConn {
    /// The `net.Conn` interface's data word of the `tls.Conn` when its socket was found.
    data: u64,
    sk: u64,
    /// Bytes of the current written frame still to come in later writes, when `in_step`.
    remaining: u32,
    /// 1 while the written frames are followed; 0 until a write starts a frame.
    in_step: u32,
    /// `SEGMENT_ENDS` when the socket was last found in `SEGMENTS`: while the count has not
    /// moved, no socket has left it since, and the socket is trusted without a lookup.
    ends_seen: u64,
    /// When the write probe last read the `net.Conn` data word and found it `data` (ns): a
    /// slot's connection is trusted without that read while `SEGMENT_ENDS` has not moved, for
    /// at most `TRUST_NS` (see [`trusted`]).
    checked_ns: u64,
}

/// One `*tls.Conn` record per process, keyed by the connection and direct-mapped by process
/// (sealed slots: `slot.rs`). A process's connection found while its slot was free (empty, or
/// its holder's socket gone) keeps its record here while it lives, and a write on it costs one
/// array load where the lookup in `TLS_CONNS` (an LRU hash map) costs ~0.65 µs with a cold
/// cache (benchmarks.md). A client keeps one HTTP/2 connection to an apiserver as a rule, so
/// most writes are on a slot's connection. A live holder is never displaced: a process's other
/// connections, and those of a process whose slot another process holds, keep their records
/// in `TLS_CONNS`, and no two take turns losing their place.
#[map]
static TLS_SLOTS: Array<Slot<TlsConn>> = Array::with_max_entries(slot::SLOTS, 0);

/// The connection's data word and socket enter the seal; its cursor changes under it.
impl Sealed for TlsConn {
    fn mix(&self) -> u64 {
        self.data.rotate_left(21) ^ self.sk.rotate_left(42)
    }
}

/// How many `*tls.Conn` records the write probe has made since the programs were loaded: a
/// reader of `go_frame_conn` that led to none looks again only once this has moved, so a frame
/// of a connection that is not watched costs a load, not the search.
#[map]
static TLS_FOUND: Array<u64> = Array::with_max_entries(1, 0);

/// When a DATA frame of each stream was last sent (see `FRAME_COALESCE_NS`).
#[map]
static STREAM_SEEN: LruHashMap<StreamKey, u64> = LruHashMap::with_max_entries(65536, 0);

macro_rules! file_offset {
    ($field:ident) => {{
        #[allow(unused_unsafe)]
        // SAFETY: a plain read of a global (see `offset!` in main.rs).
        let value = unsafe { core::ptr::read_volatile(&OFFSETS.files.$field) };
        value
    }};
}

#[inline(always)]
fn kernel_u64(at: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_kernel tolerates any address.
    unsafe { bpf_probe_read_kernel(at as *const u64) }.ok()
}

#[inline(always)]
pub(crate) fn user_u64(at: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user tolerates any address.
    unsafe { bpf_probe_read_user(at as *const u64) }.ok()
}

/// The socket behind descriptor `fd` of the current task, if it is a watched one.
#[inline(always)]
pub(crate) fn watched_socket(fd: u64) -> Option<u64> {
    // SAFETY: helper with no preconditions.
    let task = unsafe { bpf_get_current_task() };
    let files = kernel_u64(task + u64::from(file_offset!(task_struct_files)))?;
    let fdt = kernel_u64(files + u64::from(file_offset!(files_struct_fdt)))?;
    // SAFETY: as kernel_u64.
    let max: u32 =
        unsafe { bpf_probe_read_kernel((fdt + u64::from(file_offset!(fdtable_max_fds))) as *const u32) }
            .ok()?;
    if fd >= u64::from(max) {
        return None;
    }
    let table = kernel_u64(fdt + u64::from(file_offset!(fdtable_fd)))?;
    let file = kernel_u64(table + fd * 8)?;
    let socket = kernel_u64(file + u64::from(file_offset!(file_private_data)))?;
    let sk = kernel_u64(socket + u64::from(file_offset!(socket_sk)))?;
    // SAFETY: copied out at once.
    unsafe { SEGMENTS.get(sk) }.map(|_| sk)
}

/// The watched socket of a `*net.TCPConn` at `tcp`: its first word is the `*netFD`, whose
/// `pfd.Sysfd` is at +16 (the same since Go 1.9).
#[inline(always)]
fn tcp_conn_socket(tcp: u64) -> Option<u64> {
    let netfd = user_u64(tcp)?;
    let fd = user_u64(netfd + 16)?;
    if fd >= 1 << 20 {
        return None;
    }
    watched_socket(fd)
}

/// The watched connection of the `*tls.Conn` at `conn`, whose `net.Conn` data word is `data`:
/// its record if one is kept, else found by the walk from its first field (see
/// [`walk_to_socket`]) and kept.
#[inline(always)]
pub(crate) fn tls_conn(conn: u64, data: u64) -> Option<&'static mut TlsConn> {
    let tgid = tgid();
    // Read before any lookup of SEGMENTS (see `forget_segments`).
    let ends = segment_ends();
    if let Some(known) = known_tls_conn(conn, data, tgid, ends) {
        return Some(known);
    }
    let sk = Some(walk_to_socket(data)).filter(|&sk| sk != 0)?;
    let found = TlsConn {
        data,
        sk,
        remaining: 0,
        in_step: 0,
        ends_seen: ends.unwrap_or(u64::MAX),
        checked_ns: 0,
    };
    // Counted before the record is visible, never after: a reader that read the count, then
    // found no record, sees the count moved.
    count_up(&TLS_FOUND);
    if let Some(slot) = TLS_SLOTS.get_ptr_mut(slot::index(u64::from(tgid))) {
        if slot_free(slot, conn, tgid) {
            slot::fill(slot, conn, tgid, found);
            // SAFETY: as in `known_tls_conn`.
            return Some(unsafe { &mut (*slot).value });
        }
    }
    let key = ConnKey::new(conn, tgid);
    let _ = TLS_CONNS.insert(key, found, 0);
    // SAFETY: as in `known_tls_conn`.
    TLS_CONNS.get_ptr_mut(key).map(|known| unsafe { &mut *known })
}

/// The record of the `*tls.Conn` at `conn` of process `tgid`, if one is kept for the data word
/// `data` and its socket is still watched (`ends`: `SEGMENT_ENDS`, read before this call).
#[inline(always)]
fn known_tls_conn(conn: u64, data: u64, tgid: u32, ends: Option<u64>) -> Option<&'static mut TlsConn> {
    let slot = TLS_SLOTS.get_ptr_mut(slot::index(u64::from(tgid)));
    if let Some(slot) = slot {
        if slot::read(slot)
            .is_some_and(|held| held.key == conn && held.tgid == tgid && held.value.data == data)
        {
            // SAFETY: an array value, which lives as long as the map; only the cursor fields
            // are written through it, by the writer that holds the connection's lock in Go.
            let known = unsafe { &mut (*slot).value };
            if still_watched(known, ends) {
                return Some(known);
            }
        }
    }
    let key = ConnKey::new(conn, tgid);
    // SAFETY: a map value, used by this call only (Go writes a conn under its lock).
    let known = unsafe { &mut *TLS_CONNS.get_ptr_mut(key)? };
    (known.data == data && still_watched(known, ends)).then_some(known)
}

/// Whether a record of what an address in the client led to, checked at `checked_ns` when
/// `SEGMENT_ENDS` read `seen`, is trusted at `now` without a read of the client's memory, with
/// `SEGMENT_ENDS` at `ends`: while no watched socket has closed since the check, for at most
/// [`TRUST_NS`]. The address (a `*tls.Conn`, a `*ClientConn`) holds another connection only
/// after the garbage collector freed the first, whose socket was closed before (by `Close`, or
/// the descriptor's finalizer); a goroutine leaves its read loop only after closing its
/// connection. The segment program moves `SEGMENT_ENDS` as a watched socket leaves ESTABLISHED,
/// so a record is checked again after any such close, and at least every [`TRUST_NS`].
#[inline(always)]
pub(crate) fn trusted(seen: u64, ends: u64, checked_ns: u64, now: u64) -> bool {
    seen == ends && now.wrapping_sub(checked_ns) < TRUST_NS
}

/// The slot's record of the `*tls.Conn` at `conn` of the current process, while [`trusted`]
/// since the write probe last read its data word.
#[inline(always)]
fn trusted_tls_conn(conn: u64, now: u64) -> Option<&'static mut TlsConn> {
    let tgid = tgid();
    let ends = segment_ends()?;
    let slot = TLS_SLOTS.get_ptr_mut(slot::index(u64::from(tgid)))?;
    let held = slot::read(slot)?;
    (held.key == conn && held.tgid == tgid && trusted(held.value.ends_seen, ends, held.value.checked_ns, now))
        // SAFETY: as in `known_tls_conn`.
        .then(|| unsafe { &mut (*slot).value })
}

/// Whether the socket of `known` is still one the segment program keeps: at once while no
/// watched socket has closed since it was last found (`ends`), else by a lookup.
#[inline(always)]
fn still_watched(known: &mut TlsConn, ends: Option<u64>) -> bool {
    if ends == Some(known.ends_seen) {
        return true;
    }
    // SAFETY: copied out at once.
    if unsafe { SEGMENTS.get(known.sk) }.is_some() {
        known.ends_seen = ends.unwrap_or(u64::MAX);
        return true;
    }
    false
}

/// Whether `slot` may take the connection `conn` of `tgid`: it is empty or torn, holds that
/// connection already (found again: another one at its address), or its holder's socket has
/// left `SEGMENTS` (closed, as when its process exited).
#[inline(always)]
pub(crate) fn slot_free<T: Sealed + Watched>(slot: *mut Slot<T>, conn: u64, tgid: u32) -> bool {
    let Some(held) = slot::read(slot) else {
        return true;
    };
    if held.key == conn && held.tgid == tgid {
        return true;
    }
    // SAFETY: copied out at once.
    unsafe { SEGMENTS.get(held.value.sk()) }.is_none()
}

/// The watched socket under a `tls.Conn`'s `net.Conn` data word `data` (see [`tls_conn`]).
/// Out of line (see [`send_frame`]); 0: none.
#[inline(never)]
fn walk_to_socket(data: u64) -> u64 {
    if let Some(sk) = tcp_conn_socket(data) {
        return sk;
    }
    for at in [8u64, 16, 24] {
        if let Some(inner) = user_u64(data + at) {
            if let Some(sk) = tcp_conn_socket(inner) {
                return sk;
            }
        }
    }
    0
}

#[inline(always)]
pub(crate) fn regs(ctx: &ProbeContext) -> &pt_regs {
    // SAFETY: the probe context is the task's saved registers.
    unsafe { &*ctx.regs }
}

#[inline(always)]
pub(crate) fn tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// A frame header that can start a frame: a known type, a length within bounds, and a stream
/// that the type allows (RFC 9113 §6).
#[inline(always)]
fn plausible(length: u32, frame_type: u8, stream_id: u32) -> bool {
    if length > MAX_FRAME || frame_type > CONTINUATION {
        return false;
    }
    match frame_type {
        // DATA, HEADERS, PRIORITY, RST_STREAM, CONTINUATION: on a stream.
        0 | 1 | 2 | 3 | 9 => stream_id != 0,
        // SETTINGS, PING, GOAWAY: on the connection.
        4 | 6 | 7 => stream_id == 0,
        _ => true,
    }
}

/// A frame record's type, flags, direction and stream, in one word for [`send_frame`] (a
/// function of its own takes at most five arguments).
#[inline(always)]
pub(crate) fn frame_word(frame_type: u8, flags: u8, stream_id: u32, dir: u8) -> u64 {
    u64::from(frame_type) | u64::from(flags) << 8 | u64::from(dir) << 16 | u64::from(stream_id) << 32
}

/// Sends a frame record (`word`: [`frame_word`]). Out of line, like every path that sends or
/// searches: each program runs once per watch event with a cold cache, and what the common
/// call (a frame of a known connection, coalesced) touches is its own few instructions, not
/// the copies of this one inlined around them.
#[inline(never)]
pub(crate) fn send_frame(sk: u64, goroutine: u64, word: u64, length: u32) {
    let (frame_type, flags, dir, stream_id) = (
        word as u8,
        (word >> 8) as u8,
        (word >> 16) as u8,
        (word >> 32) as u32,
    );
    let tgid = tgid();
    if !stream_budget(sk, tgid) {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<FrameEvent>(0) else {
        lost(sk, tgid, loss_cause::RING_FULL);
        return;
    };
    entry.write(FrameEvent {
        // SAFETY: helper with no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        sk,
        goroutine,
        kind: EventKind::Frame as u32,
        tgid,
        stream_id,
        length,
        frame_type,
        flags,
        direction: dir,
        protocol: protocol::HTTP2,
        _pad: [0; 4],
    });
    entry.submit(lazy_wakeup());
    bump(counter::SENT);
}

#[uprobe]
pub fn go_write_header(ctx: ProbeContext) -> u32 {
    let _ = try_go_write_header(&ctx);
    0
}

fn try_go_write_header(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    let (name, name_len, value, value_len) = (r.rbx, r.rcx, r.rdi, r.rsi);
    let field = match name_len {
        5 => {
            let mut n = [0u8; 5];
            // SAFETY: a user address; the helper tolerates any.
            unsafe { bpf_probe_read_user_buf(name as *const u8, &mut n) }.ok()?;
            (&n == b":path").then_some(header_field::PATH)?
        }
        7 => {
            let mut n = [0u8; 7];
            // SAFETY: as above.
            unsafe { bpf_probe_read_user_buf(name as *const u8, &mut n) }.ok()?;
            (&n == b":method").then_some(header_field::METHOD)?
        }
        _ => return None,
    };
    // A header names no socket (it is written before the stream is): a loss is the process's.
    let tgid = tgid();
    if !stream_budget(0, tgid) {
        return None;
    }
    let Some(mut entry) = EVENTS.reserve::<HeaderEvent>(0) else {
        lost(0, tgid, loss_cause::RING_FULL);
        return None;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` is the reserved record, written field by field before submit.
    unsafe {
        (*event).timestamp_ns = bpf_ktime_get_ns();
        (*event).goroutine = r.r14;
        (*event).kind = EventKind::Header as u32;
        (*event).tgid = tgid;
        (*event).field = field;
        (*event).value_len = value_len as u32;
        let mut copy = value_len as u32 & 0x3ff;
        if copy > HEADER_VALUE_MAX as u32 {
            copy = HEADER_VALUE_MAX as u32;
        }
        let dst = (*event).value.as_mut_ptr();
        if copy == 0
            || aya_ebpf::helpers::generated::bpf_probe_read_user(dst.cast(), copy, value as *const _) != 0
        {
            (*event).value_len = 0;
        }
    }
    entry.submit(lazy_wakeup());
    bump(counter::SENT);
    Some(())
}

#[uprobe]
pub fn go_tls_read(ctx: ProbeContext) -> u32 {
    let _ = try_go_tls_read(&ctx);
    0
}

/// `(*tls.Conn).Read`: RAX the conn.
fn try_go_tls_read(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    let tgid = tgid();
    let key = GoroutineKey {
        goroutine: r.r14,
        tgid,
        _pad: 0,
    };
    let conn = r.rax;
    let data = user_u64(conn + 8)?;
    if let Some((known, _)) = reader_of(r.r14, tgid) {
        if known.conn == conn && known.data == data {
            return Some(());
        }
    }
    match tls_conn(conn, data) {
        Some(found) => {
            let reader = Reader {
                conn,
                data,
                sk: found.sk,
                stream_id: 0,
                ends_seen: 0,
                data_sent_ns: 0,
            };
            keep_reader(r.r14, tgid, reader);
            send_frame(
                reader.sk,
                r.r14,
                frame_word(READING, 0, 0, direction::RECEIVED),
                0,
            );
        }
        None => {
            let _ = READERS.remove(key);
            if let Some(slot) = reader_slot(r.r14, tgid) {
                slot::empty(slot, r.r14);
            }
        }
    }
    Some(())
}

#[uprobe]
pub fn go_frame_header(ctx: ProbeContext) -> u32 {
    let _ = try_go_frame_header(&ctx);
    0
}

/// At a RET of `readFrameHeader(buf []byte, r io.Reader) (FrameHeader, error)`: the result
/// `FrameHeader{valid bool; Type uint8; Flags uint8; Length uint32; StreamID uint32}` is in
/// RAX, RBX, RCX, RDI, RSI, the error's type word in R8 (0: no error).
fn try_go_frame_header(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    if r.r8 != 0 || r.rax & 0xff != 1 {
        return None;
    }
    let reader = reader_of(r.r14, tgid())?;
    let (length, stream_id) = (r.rdi as u32, r.rsi as u32 & 0x7fff_ffff);
    frame_received(reader, r.r14, r.rbx as u8, r.rcx as u8, length, stream_id)
}

#[uprobe]
pub fn go_frame_read(ctx: ProbeContext) -> u32 {
    let _ = try_go_frame_read(&ctx);
    0
}

/// In `readFrameHeader`, at the jump that tests the error of its `io.ReadFull(r, buf[:9])`
/// (userspace attaches it there only where `buf`, the first argument, is kept at
/// `GO_FRAME_BUF_SLOT` above RSP: `host/gobin/call_check.rs`): the error's type word in RBX
/// (0: none), the frame header in `buf`. The goroutine's reader is looked up before any user
/// memory is read: a frame of a connection that is not watched costs that lookup only.
fn try_go_frame_read(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    if r.rbx != 0 {
        return None;
    }
    let reader = reader_of(r.r14, tgid())?;
    let buf = user_u64(r.rsp + GO_FRAME_BUF_SLOT)?;
    frame_in(buf, reader, r.r14)
}

#[uprobe]
pub fn go_frame_conn(ctx: ProbeContext) -> u32 {
    let _ = try_go_frame_conn(&ctx);
    0
}

/// At the same jump as `go_frame_read`, where userspace found `r` (the framer's
/// `*bufio.Reader`) kept at `GO_FRAME_READER_SLOT` too: both are read at once, and the
/// goroutine's reader is the connection under that `*bufio.Reader` (see [`reader_through`]).
/// It replaces `go_tls_read`: one trap per frame where there were two.
fn try_go_frame_conn(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    if r.rbx != 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_user tolerates any address.
    let spilled: [u64; FRAME_SPILL_WORDS] =
        unsafe { bpf_probe_read_user((r.rsp + GO_FRAME_BUF_SLOT) as *const [u64; FRAME_SPILL_WORDS]) }
            .ok()?;
    let (buf, through) = (spilled[0], spilled[FRAME_SPILL_WORDS - 1]);
    let tgid = tgid();
    let reader = match reader_of(r.r14, tgid) {
        Some((known, _)) if known.conn == through && known.sk == 0 => {
            if count_of(&TLS_FOUND) == Some(known.data_sent_ns) {
                return None;
            }
            reader_through(through, r.r14, tgid)?
        }
        Some(known) if known.0.conn == through => known,
        _ => reader_through(through, r.r14, tgid)?,
    };
    frame_in(buf, reader, r.r14)
}

#[uprobe]
pub fn go_frame_result(ctx: ProbeContext) -> u32 {
    let _ = try_go_frame_result(&ctx);
    0
}

/// At the error check after the framer's call of the frame-header read, `(*Framer).ReadFrame`'s
/// (userspace attaches it only where the header is still in the result registers there and
/// the framer is kept at RBP+16: `host/gobin/frame_result.rs`): the header in RAX (`valid`),
/// RBX, RCX, RDI, RSI, the error's type word in R8 (0: none). It replaces `go_frame_conn` in
/// that copy, and reads none of the client's memory for a goroutine whose reader is known and
/// [`trusted`] (a read loop reads one framer for its life): the framer is read and compared
/// after a watched socket closed, and at least every `TRUST_NS`.
fn try_go_frame_result(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    if r.r8 != 0 || r.rax & 0xff != 1 {
        return None;
    }
    let tgid = tgid();
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let ends = segment_ends().unwrap_or(0) as u32;
    let reader = match reader_of(r.r14, tgid) {
        Some((known, cached))
            if known.sk != 0 && trusted(u64::from(known.ends_seen), u64::from(ends), known.data, now) =>
        {
            (known, cached)
        }
        known => checked_reader(r.rbp, r.r14, tgid, known.map(|(k, _)| k), now)?,
    };
    frame_received(
        reader,
        r.r14,
        r.rbx as u8,
        r.rcx as u8,
        r.rdi as u32,
        r.rsi as u32 & 0x7fff_ffff,
    )
}

/// The reader of goroutine `goroutine` (whose cached record was `known`) checked against the
/// framer kept at `rbp + 16`: the same framer, whose socket is still watched, is checked
/// again as of `now`; another is looked for through its `*bufio.Reader` (see
/// [`reader_through`]).
#[inline(always)]
fn checked_reader(
    rbp: u64,
    goroutine: u64,
    tgid: u32,
    known: Option<Reader>,
    now: u64,
) -> Option<(Reader, &'static mut Reader)> {
    let framer = user_u64(rbp + 16)?;
    match known {
        // Leads nowhere, and no record was made since it was looked for.
        Some(known)
            if known.conn == framer && known.sk == 0 && count_of(&TLS_FOUND) == Some(known.data_sent_ns) =>
        {
            return None;
        }
        // SAFETY: copied out at once.
        Some(known) if known.conn == framer && unsafe { SEGMENTS.get(known.sk) }.is_some() => {
            let checked = Reader {
                data: now,
                ends_seen: segment_ends().unwrap_or(0) as u32,
                ..known
            };
            keep_reader(goroutine, tgid, checked);
            return reader_of(goroutine, tgid);
        }
        _ => {}
    }
    let through = user_u64(framer + FRAMER_READER_DATA)?;
    reader_through_as(through, framer, now, goroutine, tgid)
}

/// Keeps `reader` as goroutine `goroutine`'s, in `READERS` and its cache slot.
#[inline(always)]
fn keep_reader(goroutine: u64, tgid: u32, reader: Reader) {
    let key = GoroutineKey {
        goroutine,
        tgid,
        _pad: 0,
    };
    let _ = READERS.insert(key, reader, 0);
    if let Some(slot) = reader_slot(goroutine, tgid) {
        slot::fill(slot, goroutine, tgid, reader);
    }
}

/// The goroutine's reader through the `*bufio.Reader` at `through`, looked for and kept (see
/// [`find_reader`]): None when it leads to no watched connection.
#[inline(always)]
fn reader_through(through: u64, goroutine: u64, tgid: u32) -> Option<(Reader, &'static mut Reader)> {
    reader_through_as(through, through, 0, goroutine, tgid)
}

/// [`reader_through`], the reader kept under `key` with `data` (see [`Reader`]).
#[inline(always)]
fn reader_through_as(
    through: u64,
    key: u64,
    data: u64,
    goroutine: u64,
    tgid: u32,
) -> Option<(Reader, &'static mut Reader)> {
    let sk = find_reader(through, key, data, goroutine, tgid);
    if sk == 0 {
        return None;
    }
    // Sent here, not by the search: the kernel bounds the stack of a chain of calls (512
    // bytes on 5.10, each frame rounded up), and this one is the shorter.
    send_frame(sk, goroutine, frame_word(READING, 0, 0, direction::RECEIVED), 0);
    reader_of(goroutine, tgid)
}

/// Looks for the `*tls.Conn` that the `*bufio.Reader` at `through` reads (its `rd`, or a
/// field of a wrapper there: +8, +16, +24 as in [`walk_to_socket`]) among the records the
/// write probe keeps, and keeps what it found as goroutine `goroutine`'s reader, under `key`
/// with `data` (see [`Reader`]). Found, its socket is returned (for the caller to say
/// `READING`); not, it is kept as leading nowhere until `TLS_FOUND` moves, and 0 returned. Out
/// of line (see [`send_frame`]).
#[inline(never)]
fn find_reader(through: u64, key: u64, data: u64, goroutine: u64, tgid: u32) -> u64 {
    // Read before any lookup: a record made after them moves it.
    let found_count = count_of(&TLS_FOUND);
    let ends = segment_ends();
    let Some(rd) = user_u64(through + BUFIO_RD_DATA) else {
        return 0;
    };
    let mut found = None;
    for at in [0u64, 8, 16, 24] {
        let conn = if at == 0 { Some(rd) } else { user_u64(rd + at) };
        let Some(conn) = conn else { continue };
        let Some(word) = user_u64(conn + 8) else { continue };
        if let Some(known) = known_tls_conn(conn, word, tgid, ends) {
            found = Some(known.sk);
            break;
        }
    }
    let sk = found.unwrap_or(0);
    let reader = Reader {
        conn: key,
        data,
        sk,
        stream_id: 0,
        ends_seen: ends.unwrap_or(0) as u32,
        data_sent_ns: if sk == 0 {
            found_count.unwrap_or(u64::MAX)
        } else {
            0
        },
    };
    keep_reader(goroutine, tgid, reader);
    sk
}

/// The frame header in `buf` that goroutine `goroutine` read from `reader`'s connection.
#[inline(always)]
fn frame_in(buf: u64, reader: (Reader, &mut Reader), goroutine: u64) -> Option<()> {
    let mut header = [0u8; 9];
    // SAFETY: bpf_probe_read_user_buf tolerates any address.
    unsafe { bpf_probe_read_user_buf(buf as *const u8, &mut header) }.ok()?;
    let length = u32::from(header[0]) << 16 | u32::from(header[1]) << 8 | u32::from(header[2]);
    let stream_id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    frame_received(reader, goroutine, header[3], header[4], length, stream_id)
}

/// The cache slot of goroutine `goroutine` of process `tgid`.
#[inline(always)]
fn reader_slot(goroutine: u64, tgid: u32) -> Option<*mut Slot<Reader>> {
    READER_CACHE.get_ptr_mut(slot::index(goroutine ^ u64::from(tgid)))
}

/// What goroutine `goroutine` of process `tgid` (the current one) last read, a watched
/// connection (None: none): a copy to judge by, and where its coalescing state is kept (another
/// goroutine may take the slot meanwhile: then that state is merely lost, never the connection
/// mixed up).
#[inline(always)]
fn reader_of(goroutine: u64, tgid: u32) -> Option<(Reader, &'static mut Reader)> {
    let slot = reader_slot(goroutine, tgid)?;
    if let Some(cached) = slot::read(slot).filter(|held| held.key == goroutine && held.tgid == tgid) {
        // SAFETY: an array value, which lives as long as the map; only the coalescing fields
        // are written through it.
        return Some((cached.value, unsafe { &mut (*slot).value }));
    }
    let key = GoroutineKey {
        goroutine,
        tgid,
        _pad: 0,
    };
    // SAFETY: copied out at once.
    let found = unsafe { READERS.get(key) }.copied()?;
    slot::fill(slot, goroutine, tgid, found);
    // SAFETY: as above.
    Some((found, unsafe { &mut (*slot).value }))
}

/// A frame header the client of goroutine `goroutine` read from `reader`'s connection:
/// HEADERS, RST_STREAM and GOAWAY are sent, DATA coalesced per stream (`FRAME_COALESCE_NS`),
/// the rest ignored.
#[inline(always)]
fn frame_received(
    (known, reader): (Reader, &mut Reader),
    goroutine: u64,
    frame_type: u8,
    flags: u8,
    length: u32,
    stream_id: u32,
) -> Option<()> {
    let sk = known.sk;
    match frame_type {
        HEADERS | RST_STREAM | GOAWAY => {}
        DATA => {
            // SAFETY: helper with no preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            let ends = flags & END_STREAM != 0;
            if !ends
                && known.stream_id == stream_id
                && now.wrapping_sub(known.data_sent_ns) < FRAME_COALESCE_NS
            {
                return None;
            }
            let stream = StreamKey {
                sk,
                stream_id,
                _pad: 0,
            };
            if ends {
                let _ = STREAM_SEEN.remove(stream);
                if known.stream_id == stream_id {
                    reader.stream_id = 0;
                }
            } else {
                // Another stream than the one last reported: its own time.
                // SAFETY: copied out at once.
                if let Some(sent) = unsafe { STREAM_SEEN.get(stream) }.copied() {
                    if now.wrapping_sub(sent) < FRAME_COALESCE_NS {
                        reader.stream_id = stream_id;
                        reader.data_sent_ns = sent;
                        return None;
                    }
                }
                let _ = STREAM_SEEN.insert(stream, now, 0);
                reader.stream_id = stream_id;
                reader.data_sent_ns = now;
            }
        }
        _ => return None,
    }
    send_frame(
        sk,
        goroutine,
        frame_word(frame_type, flags, stream_id, direction::RECEIVED),
        length,
    );
    Some(())
}

#[uprobe]
pub fn go_tls_write(ctx: ProbeContext) -> u32 {
    let _ = try_go_tls_write(&ctx);
    0
}

/// `(*tls.Conn).Write(b []byte)`: RAX the conn, RBX and RCX the buffer and its length.
fn try_go_tls_write(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    let (buf, len, goroutine) = (r.rbx, r.rcx, r.r14);
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let conn = match trusted_tls_conn(r.rax, now) {
        Some(conn) => conn,
        None => {
            let data = user_u64(r.rax + 8)?;
            let conn = tls_conn(r.rax, data)?;
            conn.checked_ns = now;
            conn
        }
    };
    let sk = conn.sk;
    let mut head = [0u8; 9];
    let mut at = match conn.in_step {
        1 => u64::from(conn.remaining),
        _ => {
            // Not in step yet: the connection's first write (the preface), or a write that
            // starts with a frame (Go's transport flushes whole frames, as a rule).
            // SAFETY: a user address; the helper tolerates any.
            unsafe { bpf_probe_read_user_buf(buf as *const u8, &mut head) }.ok()?;
            if head[..5] == PREFACE[..] {
                // A connection that begins under the probes: its reader's first read comes
                // before its first frame, so every frame of it is seen.
                send_frame(sk, goroutine, frame_word(FRESH, 0, 0, direction::SENT), 0);
                PREFACE_LEN
            } else {
                let length = u32::from(head[0]) << 16 | u32::from(head[1]) << 8 | u32::from(head[2]);
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                if !plausible(length, head[3], stream) {
                    // Mid-frame with no cursor (evicted, or the connection began before the
                    // probes): this write's frames go unseen, and userspace is told so.
                    return lose_place(conn, goroutine);
                }
                0
            }
        }
    };
    for _ in 0..FRAMES_PER_WRITE {
        if at >= len {
            break;
        }
        if at + 9 > len {
            // A header split across writes: rare; find the next frame start instead.
            return lose_place(conn, goroutine);
        }
        // SAFETY: as above.
        if unsafe { bpf_probe_read_user_buf((buf + at) as *const u8, &mut head) }.is_err() {
            return lose_place(conn, goroutine);
        }
        let length = u32::from(head[0]) << 16 | u32::from(head[1]) << 8 | u32::from(head[2]);
        let (frame_type, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if !plausible(length, frame_type, stream) {
            return lose_place(conn, goroutine);
        }
        let report = match frame_type {
            HEADERS | RST_STREAM | GOAWAY => true,
            DATA => flags & END_STREAM != 0,
            _ => false,
        };
        if report {
            send_frame(
                sk,
                goroutine,
                frame_word(frame_type, flags, stream, direction::SENT),
                length,
            );
        }
        at += 9 + u64::from(length);
    }
    if at < len {
        // More frames than one call reads: lose the position rather than guess.
        return lose_place(conn, goroutine);
    }
    conn.remaining = (at - len) as u32;
    conn.in_step = 1;
    Some(())
}

/// The written frames can no longer be followed on `conn` until a write starts a frame again:
/// userspace stops judging the connection's open streams (one of their ends may go unseen).
#[inline(never)]
fn lose_place(conn: &mut TlsConn, goroutine: u64) -> Option<()> {
    conn.in_step = 0;
    send_frame(
        conn.sk,
        goroutine,
        frame_word(LOST_PLACE, 0, 0, direction::SENT),
        0,
    );
    None
}
