//! Uprobes on OpenSSL clients (python-kubernetes through urllib3 and Python's `ssl`, curl):
//! which HTTP/1.1 request a watched connection carries and whether its response came and
//! ended, read from the client's own plaintext without keeping any of it.
//!
//! HTTP/1.1 carries one request at a time per connection; each becomes stream 1 of
//! [`protocol::HTTP1`] frame records, so the table follows it like an HTTP/2 stream:
//!
//! - `ssl_set_fd`, at `SSL_set_fd(ssl, fd)`: which descriptor an `SSL *` uses (Python's `ssl`
//!   and curl bind every connection this way). No OpenSSL struct is read: their layout
//!   changes between versions.
//! - `ssl_free`, at `SSL_free(ssl)`: forgets it.
//! - `ssl_write`, at `SSL_write`/`SSL_write_ex(ssl, buf, num)`: a buffer that starts with a
//!   request line (`GET /api/v1/pods?watch=1 HTTP/1.1`) gives the method and the path up to
//!   the next space, as header records, and a HEADERS frame record. Nothing after the path
//!   leaves the kernel: the headers that follow (`Authorization` among them) are never copied
//!   out of the per-CPU scratch buffer.
//! - `ssl_read` / `ssl_read_ex`, at the entries of `SSL_read`/`SSL_read_ex(ssl, buf, num,
//!   [readbytes])`: the buffer, by thread; `ssl_read_ret`, at their returns: the bytes read
//!   start with `HTTP/1.` (response headers: a HEADERS frame record), end with the chunked
//!   body's terminator (`0\r\n\r\n`: a DATA frame record with END_STREAM), or are any other
//!   response bytes (a DATA frame record, at most one per second per connection).
//!
//! An `SSL *` bound before the probes came (a client's probes go on after it connected) is
//! bound by the first libc `read` or `write` its thread makes inside an SSL call
//! (`ssl_libc_rw`, attached to that client's libc only for a while after its probes go on and
//! while its unbound calls are recent): once per `SSL *`, watched or not.
//!
//! Cost: the probes fire only in the client processes they are attached for (userspace
//! attaches them per process: a libssl is shared by every process that speaks TLS). A call on a connection that is not watched costs the
//! uprobe and one hash lookup (`SSL_FDS`, then the descriptor's socket in `SEGMENTS`).
use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user_buf},
    macros::{map, uprobe, uretprobe},
    maps::{LruHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use lifeline_common::{
    direction, header_field, loss_cause, protocol, EventKind, FrameEvent, HeaderEvent, SslCall, SslKey,
    SslRead, FRAME_COALESCE_NS, HEADER_VALUE_MAX,
};

use crate::{
    bump, counter,
    gotls::{regs, tgid, user_u64, watched_socket},
    lazy_wakeup, lost, stream_budget, EVENTS,
};

/// Frame types and flags (as `gotls.rs`): what the table reads.
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const END_STREAM: u8 = 1;
/// The one stream of an HTTP/1.1 connection.
const STREAM: u32 = 1;
/// Longest method token read (`OPTIONS`, `CONNECT`: 7).
const METHOD_MAX: usize = 7;
/// `"HTTP/1."`: a response's status line.
const STATUS_LINE: &[u8; 7] = b"HTTP/1.";
/// The last chunk of a chunked body after the previous chunk's CRLF (RFC 9112 §7.1), in the
/// low seven bytes of a [`Seen::tail`].
const TERMINATOR: u64 = u64::from_be_bytes(*b"\0\r\n0\r\n\r\n");

/// The descriptor of each `SSL *` of each process, from `SSL_set_fd`.
#[map]
static SSL_FDS: LruHashMap<SslKey, u32> = LruHashMap::with_max_entries(16384, 0);

/// `SSL_FDS` value of an `SSL *` whose descriptor is not a watched socket.
const NOT_WATCHED: u32 = u32::MAX;

/// SSL calls in progress on an `SSL *` whose descriptor is not known yet (its `SSL_set_fd`
/// came before the probes), by thread: the first libc read or write the thread makes inside
/// the call names the descriptor (`ssl_libc_rw`).
#[map]
static SSL_UNBOUND: LruHashMap<u64, SslCall> = LruHashMap::with_max_entries(4096, 0);

/// Reads in progress on watched sockets, by thread (`pid_tgid`). LRU, as `SSL_UNBOUND`: a
/// thread killed inside a call (or blocked in a hung watch forever) never removes its entry.
#[map]
static SSL_READS: LruHashMap<u64, SslRead> = LruHashMap::with_max_entries(4096, 0);

/// Of each watched socket: when a liveness DATA record was last sent, and the last bytes read.
#[map]
static SSL_SEEN: LruHashMap<u64, Seen> = LruHashMap::with_max_entries(16384, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct Seen {
    sent_ns: u64,
    /// The last 8 bytes read on the socket in this response, the latest lowest: a terminator
    /// split across reads (a reader asks for what its buffer has room for) is still seen.
    tail: u64,
}

/// Where a request line's path is looked at before only the path is copied out.
#[repr(C)]
pub struct Scratch {
    bytes: [u8; HEADER_VALUE_MAX],
}

#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// What is known of the descriptor under `ssl` of the current process.
enum Bound {
    Watched(u64),
    NotWatched,
    Unknown,
}

#[inline(always)]
fn ssl_socket(ssl: u64) -> Bound {
    let key = SslKey {
        ssl,
        tgid: tgid(),
        _pad: 0,
    };
    // SAFETY: copied out at once.
    match unsafe { SSL_FDS.get(key) }.copied() {
        None => Bound::Unknown,
        Some(NOT_WATCHED) => Bound::NotWatched,
        Some(fd) => match watched_socket(u64::from(fd)) {
            Some(sk) => Bound::Watched(sk),
            None => Bound::NotWatched,
        },
    }
}

/// An SSL call on an `SSL *` of unknown descriptor: the thread's next read or write system
/// call names it.
#[inline(always)]
fn unbound(ssl: u64, buf: u64, len: u64, write: bool) {
    let call = SslCall {
        ssl,
        buf,
        len,
        write: u64::from(write),
        // SAFETY: helper with no preconditions.
        at_ns: unsafe { bpf_ktime_get_ns() },
    };
    let _ = SSL_UNBOUND.insert(bpf_get_current_pid_tgid(), call, 0);
}

/// At the client's libc `read(fd, ...)` and `write(fd, ...)` (OpenSSL's socket BIO reads and
/// writes with these): the descriptor is the first argument. Attached for one client process
/// at a time (userspace: for a while after its probes go on, and while its unbound calls are
/// recent), so no other process pays for it.
#[uprobe]
pub fn ssl_libc_rw(ctx: ProbeContext) -> u32 {
    let _ = bind(regs(&ctx).rdi);
    0
}

/// Binds the `SSL *` of the thread's unbound SSL call, if any, to descriptor `fd`.
fn bind(fd: u64) -> Option<()> {
    let thread = bpf_get_current_pid_tgid();
    // SAFETY: copied out at once.
    let call = *unsafe { SSL_UNBOUND.get(thread) }?;
    let _ = SSL_UNBOUND.remove(thread);
    let key = SslKey {
        ssl: call.ssl,
        tgid: tgid(),
        _pad: 0,
    };
    let Some(sk) = watched_socket(fd) else {
        let _ = SSL_FDS.insert(key, NOT_WATCHED, 0);
        return None;
    };
    let _ = SSL_FDS.insert(key, fd as u32, 0);
    if call.write != 0 {
        write_request(sk, call.buf, call.len);
    }
    Some(())
}

#[inline(always)]
fn send_frame(sk: u64, frame_type: u8, flags: u8, length: u32, dir: u8) {
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
        goroutine: bpf_get_current_pid_tgid(),
        kind: EventKind::Frame as u32,
        tgid,
        stream_id: STREAM,
        length,
        frame_type,
        flags,
        direction: dir,
        protocol: protocol::HTTP1,
        _pad: [0; 4],
    });
    entry.submit(lazy_wakeup());
    bump(counter::SENT);
}

#[uprobe]
pub fn ssl_set_fd(ctx: ProbeContext) -> u32 {
    let r = regs(&ctx);
    let key = SslKey {
        ssl: r.rdi,
        tgid: tgid(),
        _pad: 0,
    };
    let _ = SSL_FDS.insert(key, r.rsi as u32, 0);
    0
}

/// `SSL_free(ssl)`: the address may come back for another connection, which must not inherit
/// this one's descriptor (or its `NOT_WATCHED`).
#[uprobe]
pub fn ssl_free(ctx: ProbeContext) -> u32 {
    let key = SslKey {
        ssl: regs(&ctx).rdi,
        tgid: tgid(),
        _pad: 0,
    };
    let _ = SSL_FDS.remove(key);
    0
}

#[uprobe]
pub fn ssl_write(ctx: ProbeContext) -> u32 {
    let _ = try_ssl_write(&ctx);
    0
}

/// `SSL_write(ssl, buf, num)` and `SSL_write_ex(ssl, buf, num, written)`.
fn try_ssl_write(ctx: &ProbeContext) -> Option<()> {
    let r = regs(ctx);
    let (ssl, buf, len) = (r.rdi, r.rsi, r.rdx & 0x7fff_ffff);
    match ssl_socket(ssl) {
        Bound::Watched(sk) => write_request(sk, buf, len),
        Bound::NotWatched => None,
        Bound::Unknown => {
            unbound(ssl, buf, len, true);
            None
        }
    }
}

/// A write on a watched socket: a request line, if it starts with one.
#[inline(always)]
fn write_request(sk: u64, buf: u64, len: u64) -> Option<()> {
    let mut head = [0u8; METHOD_MAX + 2];
    if len < head.len() as u64 {
        return None;
    }
    // SAFETY: a user address; the helper tolerates any.
    unsafe { bpf_probe_read_user_buf(buf as *const u8, &mut head) }.ok()?;
    let method_len = method_token(&head)?;
    let path_at = buf + method_len as u64 + 1;
    let available = len - method_len as u64 - 1;
    let scratch = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: the per-CPU scratch buffer, ours for the duration of the program.
    let scratch = unsafe { &mut (*scratch).bytes };
    let mut copy: u64 = if available < HEADER_VALUE_MAX as u64 {
        available
    } else {
        HEADER_VALUE_MAX as u64
    };
    // Bounded again where the helper takes it: older verifiers (6.1) lose a bound across the
    // stack spill the compiler puts between the comparison above and the call, and the
    // compiler would drop a plain mask it can prove redundant.
    // SAFETY: an AND on a register.
    unsafe { core::arch::asm!("{c} &= 1023", c = inout(reg) copy) };
    if copy > HEADER_VALUE_MAX as u64 {
        copy = HEADER_VALUE_MAX as u64;
    }
    if copy == 0 {
        return None;
    }
    let copy = copy as u32;
    // SAFETY: at most the scratch buffer's size, from a user address the helper checks.
    let failed = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            scratch.as_mut_ptr().cast(),
            copy,
            path_at as *const _,
        )
    } != 0;
    if failed {
        return None;
    }
    // The path ends at the space before the protocol version. A loop helper: an unrolled
    // scan of 512 bytes with an exit at each is more than the verifier follows.
    let mut scan = Scan {
        bytes: scratch.as_ptr(),
        copy,
        end: HEADER_VALUE_MAX as u32 + 1,
    };
    // SAFETY: the callback reads only `scan` and the scratch buffer, within bounds.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            HEADER_VALUE_MAX as u32,
            path_end as *mut c_void,
            (&mut scan as *mut Scan).cast(),
            0,
        )
    };
    let path_len = scan.end;
    send_header(
        header_field::METHOD,
        &head as *const u8,
        method_len as u32,
        method_len as u32,
    );
    let copied = if path_len > HEADER_VALUE_MAX as u32 {
        HEADER_VALUE_MAX as u32
    } else {
        path_len
    };
    send_header(header_field::PATH, scratch.as_ptr(), copied, path_len);
    send_frame(sk, HEADERS, 0, len as u32, direction::SENT);
    Some(())
}

/// The state of the scan for a path's end (`path_end`).
#[repr(C)]
struct Scan {
    bytes: *const u8,
    copy: u32,
    /// The path's length; `HEADER_VALUE_MAX + 1` while no end is found (a cut path).
    end: u32,
}

/// One step of the scan: byte `index` of the scratch buffer ends the path if it is a space
/// or a line end, or if it is past the bytes copied.
extern "C" fn path_end(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the caller's `Scan`, alive for the whole loop.
    let scan = unsafe { &mut *ctx.cast::<Scan>() };
    if index >= u64::from(scan.copy) {
        scan.end = scan.copy;
        return 1;
    }
    if index >= HEADER_VALUE_MAX as u64 {
        return 1;
    }
    // SAFETY: within the scratch buffer (checked above).
    let b = unsafe { *scan.bytes.add(index as usize) };
    if b == b' ' || b == b'\r' || b == b'\n' {
        scan.end = index as u32;
        return 1;
    }
    0
}

/// A `Transfer-Encoding` header's name with the line end before it and its colon, lowercased,
/// as the three rolling words of [`TeScan`] hold it at the colon: `"\ntr"`, `"ansfer-e"`,
/// `"ncoding:"`.
const TE_NAME: (u64, u64, u64) = (
    0x0a_74_72,
    u64::from_be_bytes(*b"ansfer-e"),
    u64::from_be_bytes(*b"ncoding:"),
);
/// `"chunked"` in the low seven bytes of the last word.
const CHUNKED: u64 = u64::from_be_bytes(*b"\0chunked");
/// `"\r\n\r\n"` in the low four bytes: the headers' end.
const HEADERS_END: u64 = 0x0d_0a_0d_0a;

/// Whether the response whose first `n` bytes were read into `buf` says
/// `Transfer-Encoding: chunked` within its first `HEADER_VALUE_MAX` bytes (any case): then its
/// end is seen (the terminator), and a response begun and unfinished is evidence. The bytes
/// are looked at in the per-CPU scratch buffer and never leave the kernel.
#[inline(always)]
fn chunked(buf: u64, n: u64) -> bool {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: the per-CPU scratch buffer, ours for the duration of the program.
    let scratch = unsafe { &mut (*scratch).bytes };
    let mut copy = if n < HEADER_VALUE_MAX as u64 {
        n
    } else {
        HEADER_VALUE_MAX as u64
    };
    // Bounded where the helper takes it (see `write_request`).
    // SAFETY: an AND on a register.
    unsafe { core::arch::asm!("{c} &= 1023", c = inout(reg) copy) };
    if copy > HEADER_VALUE_MAX as u64 || copy == 0 {
        return false;
    }
    // SAFETY: at most the scratch buffer's size, from a user address the helper checks.
    let failed = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            scratch.as_mut_ptr().cast(),
            copy as u32,
            buf as *const _,
        )
    } != 0;
    if failed {
        return false;
    }
    let mut scan = TeScan {
        bytes: scratch.as_ptr(),
        copy: copy as u32,
        found: 0,
        name: 0,
        _pad: 0,
        words: [0; 3],
    };
    // SAFETY: the callback reads only `scan` and the scratch buffer, within bounds.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            HEADER_VALUE_MAX as u32,
            te_step as *mut c_void,
            (&mut scan as *mut TeScan).cast(),
            0,
        )
    };
    scan.found == 1
}

/// The state of the scan for `Transfer-Encoding: chunked` (`te_step`).
#[repr(C)]
struct TeScan {
    bytes: *const u8,
    copy: u32,
    found: u32,
    /// 1 on the line of a `Transfer-Encoding` header, after its colon.
    name: u32,
    _pad: u32,
    /// The last 24 bytes, lowercased, oldest first: `words[2]` ends with the latest.
    words: [u64; 3],
}

/// One step: byte `index` of the scratch buffer.
extern "C" fn te_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the caller's `TeScan`, alive for the whole loop.
    let scan = unsafe { &mut *ctx.cast::<TeScan>() };
    if index >= u64::from(scan.copy) || index >= HEADER_VALUE_MAX as u64 {
        return 1;
    }
    // SAFETY: within the scratch buffer (checked above).
    let mut b = unsafe { *scan.bytes.add(index as usize) };
    if b.is_ascii_uppercase() {
        b |= 0x20;
    }
    let [w0, w1, w2] = scan.words;
    scan.words = [w0 << 8 | w1 >> 56, w1 << 8 | w2 >> 56, w2 << 8 | u64::from(b)];
    let [w0, w1, w2] = scan.words;
    if w2 & 0xffff_ffff == HEADERS_END {
        return 1;
    }
    if b == b'\n' {
        scan.name = 0;
    } else if (w0 & 0xff_ffff, w1, w2) == TE_NAME {
        scan.name = 1;
    } else if scan.name == 1 && w2 & 0x00ff_ffff_ffff_ffff == CHUNKED {
        scan.found = 1;
        return 1;
    }
    0
}

/// `before` (a socket's last bytes read) followed by the `n` bytes just read at `buf`: their
/// last 8 bytes, the latest lowest.
#[inline(always)]
fn tail_after(before: u64, buf: u64, n: u64) -> Option<u64> {
    if n >= 8 {
        let mut last = [0u8; 8];
        // SAFETY: a user address; the helper tolerates any.
        unsafe { bpf_probe_read_user_buf((buf + n - 8) as *const u8, &mut last) }.ok()?;
        return Some(u64::from_be_bytes(last));
    }
    let mut tail = before;
    for i in 0..7u64 {
        if i >= n {
            break;
        }
        let mut b = [0u8; 1];
        // SAFETY: as above.
        unsafe { bpf_probe_read_user_buf((buf + i) as *const u8, &mut b) }.ok()?;
        tail = tail << 8 | u64::from(b[0]);
    }
    Some(tail)
}

/// The length of the method token a request line starts with (`GET /…`), if it is one: 3
/// to 7 capitals, a space, a slash.
#[inline(always)]
fn method_token(head: &[u8; METHOD_MAX + 2]) -> Option<usize> {
    let mut n = 0;
    while n < METHOD_MAX {
        if !head[n].is_ascii_uppercase() {
            break;
        }
        n += 1;
    }
    (n >= 3 && head[n] == b' ' && head[n + 1] == b'/').then_some(n)
}

/// One header record: `copy` bytes of kernel memory at `from` (the method in the stack, or
/// the path in the scratch buffer); `len` is the value's whole length.
#[inline(always)]
fn send_header(field: u32, from: *const u8, copy: u32, len: u32) {
    // A header names no socket here either: a loss is the process's.
    let tgid = tgid();
    if !stream_budget(0, tgid) {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<HeaderEvent>(0) else {
        lost(0, tgid, loss_cause::RING_FULL);
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` is the reserved record, written field by field before submit.
    unsafe {
        (*event).timestamp_ns = bpf_ktime_get_ns();
        (*event).goroutine = bpf_get_current_pid_tgid();
        (*event).kind = EventKind::Header as u32;
        (*event).tgid = tgid;
        (*event).field = field;
        (*event).value_len = len;
        // Bounded here, where it is used: the compiler may otherwise drop a bound it can
        // prove from the callers and reload the value from the stack, where the verifier (6.1)
        // no longer knows it ("R2 unbounded memory access").
        let mut copy = core::hint::black_box(copy) & 0x3ff;
        if copy > HEADER_VALUE_MAX as u32 {
            copy = HEADER_VALUE_MAX as u32;
        }
        let dst = (*event).value.as_mut_ptr();
        if copy == 0
            || aya_ebpf::helpers::generated::bpf_probe_read_kernel(dst.cast(), copy, from.cast()) != 0
        {
            (*event).value_len = 0;
        }
    }
    // The frame record that follows wakes userspace: a wakeup costs an interrupt (on a VM
    // an exit), more than the rest of the program.
    entry.submit(u64::from(aya_ebpf::bindings::BPF_RB_NO_WAKEUP));
    bump(counter::SENT);
}

#[uprobe]
pub fn ssl_read(ctx: ProbeContext) -> u32 {
    let r = regs(&ctx);
    remember_read(r.rdi, r.rsi, 0);
    0
}

#[uprobe]
pub fn ssl_read_ex(ctx: ProbeContext) -> u32 {
    let r = regs(&ctx);
    remember_read(r.rdi, r.rsi, r.rcx);
    0
}

#[inline(always)]
fn remember_read(ssl: u64, buf: u64, readbytes: u64) {
    let sk = match ssl_socket(ssl) {
        Bound::Watched(sk) => sk,
        Bound::NotWatched => return,
        // Resolved by the return probe, once the thread's system call named it.
        Bound::Unknown => {
            unbound(ssl, buf, 0, false);
            0
        }
    };
    let read = SslRead {
        sk,
        ssl,
        buf,
        readbytes,
    };
    let _ = SSL_READS.insert(bpf_get_current_pid_tgid(), read, 0);
}

#[uretprobe]
pub fn ssl_read_ret(ctx: RetProbeContext) -> u32 {
    let _ = try_ssl_read_ret(&ctx);
    0
}

fn try_ssl_read_ret(ctx: &RetProbeContext) -> Option<()> {
    let thread = bpf_get_current_pid_tgid();
    // SAFETY: copied out at once.
    let mut read = *unsafe { SSL_READS.get(thread) }?;
    let _ = SSL_READS.remove(thread);
    if read.sk == 0 {
        // A read of data OpenSSL already held makes no system call: forget the call.
        let _ = SSL_UNBOUND.remove(thread);
        match ssl_socket(read.ssl) {
            Bound::Watched(sk) => read.sk = sk,
            _ => return None,
        }
    }
    let result: i64 = ctx.ret();
    let n = if read.readbytes != 0 {
        if result != 1 {
            return None;
        }
        user_u64(read.readbytes)?
    } else {
        if result <= 0 {
            return None;
        }
        result as u64
    };
    let n = n & 0x7fff_ffff;
    let mut marked = false;
    if n >= STATUS_LINE.len() as u64 {
        let mut head = [0u8; 7];
        // SAFETY: a user address; the helper tolerates any.
        unsafe { bpf_probe_read_user_buf(read.buf as *const u8, &mut head) }.ok()?;
        if &head == STATUS_LINE {
            let flags = if chunked(read.buf, n) {
                protocol::HTTP1_CHUNKED
            } else {
                0
            };
            send_frame(read.sk, HEADERS, flags, n as u32, direction::RECEIVED);
            marked = true;
        }
    }
    // SAFETY: copied out at once.
    let seen = unsafe { SSL_SEEN.get(read.sk) }.copied();
    // A status line starts a response: what was read before is no part of it.
    let before = match seen {
        Some(s) if !marked => s.tail,
        _ => 0,
    };
    let tail = tail_after(before, read.buf, n)?;
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if tail & 0x00ff_ffff_ffff_ffff == TERMINATOR {
        let _ = SSL_SEEN.remove(read.sk);
        send_frame(read.sk, DATA, END_STREAM, n as u32, direction::RECEIVED);
        return Some(());
    }
    let sent_ns = seen.map_or(0, |s| s.sent_ns);
    let send = !marked && now.wrapping_sub(sent_ns) >= FRAME_COALESCE_NS;
    let sent_ns = if marked || send { now } else { sent_ns };
    let _ = SSL_SEEN.insert(read.sk, Seen { sent_ns, tail }, 0);
    if !send {
        return None;
    }
    send_frame(read.sk, DATA, 0, n as u32, direction::RECEIVED);
    Some(())
}
