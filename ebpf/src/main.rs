//! lifeline's kernel programs. Tracepoints only (no kprobes, no fentry), so they load on any
//! kernel that has the three tracepoints:
//!
//! - `sock/inet_sock_set_state`: every TCP state change whose destination matches `ENDPOINTS`
//!   (connects, establishment, failures, closes), in any network namespace.
//! - `tcp/tcp_retransmit_skb`: retransmits on sockets whose destination matches `ENDPOINTS`.
//! - `tcp/tcp_probe` (typed raw tracepoint: no record is built): every segment that arrives on
//!   an established socket whose destination matches `ENDPOINTS`, with how far the client had
//!   sent by then: requests and answers in their order (see `SegmentEvent`).
//!
//! Cost for the node's unrelated traffic: the first test reads one field of the tracepoint
//! record, or of the socket for segments (the destination port), with a direct load and
//! compares it with the endpoints' ports as immediates (the filter in `filter.rs`, which
//! tail-calls these programs); attached directly (more than 8 ports, or a kernel that refuses
//! the filter), their own first test looks the port up in a bitmap (`WATCHED_PORTS`, an array
//! map whose lookup the verifier inlines). Nothing else is read for a socket whose port no
//! endpoint uses. Only candidates pay for the longest-prefix-match
//! lookup of the address. Inbound activity is sampled from userspace for tracked sockets only.
//!
//! A connect storm from one process is aggregated here (see `CONNECT_BUDGET`) so that it cannot
//! crowd other processes' events out of the ring buffer.
//!
//! Entry points are thin wrappers over fallible `try_*` functions.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch, core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map, raw_tracepoint, tracepoint},
    maps::{
        lpm_trie::Key, Array, HashMap, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray, PerCpuHashMap,
        RingBuf,
    },
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
    EbpfContext,
};
use aya_log_ebpf::warn;
use lifeline_common::{
    counter, loss_cause, tcp_state, Budget, DeferredConnect, EndpointKey, EventKind, FailureKey,
    KernelOffsets, LossKey, SegmentEvent, SegmentState, SockEvent, AF_INET, AF_INET6, BUDGET_WINDOW_NS,
    COMM_LEN, CONNECT_BUDGET, ENDPOINT_PORT_BITS, KEEPALIVE_RECORD_BYTES, MAX_ENDPOINTS, MAX_LOSSES,
    MUTE_AFTER, PORT_WORDS, SEGMENT_COALESCE_NS, STREAM_BUDGET,
};

const IPPROTO_TCP: u16 = 6;

/// Structure and tracepoint field offsets of the running kernel, set by userspace before load.
/// In `.rodata`, which the loader freezes: the verifier then knows every field as a constant.
#[no_mangle]
static OFFSETS: KernelOffsets = KernelOffsets {
    sock_common_skc_net: 0,
    net_ns_inum: 0,
    sock_sk_err: 0,
    sock_common_skc_state: 0,
    sock_sk_error_queue: 0,
    sk_buff_head_prev: 0,
    sk_buff_cb: 0,
    sock_exterr_skb_ee: 0,
    tcp_sock_bytes_received: 0,
    set_state: lifeline_common::SetStateOffsets {
        skaddr: 0,
        oldstate: 0,
        newstate: 0,
        sport: 0,
        dport: 0,
        family: 0,
        protocol: 0,
        saddr: 0,
        daddr: 0,
        saddr_v6: 0,
        daddr_v6: 0,
        _pad: 0,
    },
    retransmit: lifeline_common::RetransmitOffsets {
        skaddr: 0,
        state: 0,
        sport: 0,
        dport: 0,
        family: 0,
        saddr: 0,
        daddr: 0,
        saddr_v6: 0,
        daddr_v6: 0,
        sock_common_skc_family: 0,
    },
    segment: lifeline_common::SegmentOffsets {
        skc_daddr: 0,
        skc_rcv_saddr: 0,
        skc_v6_daddr: 0,
        skc_v6_rcv_saddr: 0,
        skc_dport: 0,
        skc_num: 0,
        skc_family: 0,
        tcp_snd_nxt: 0,
        tcp_snd_una: 0,
        tcp_write_seq: 0,
        tcp_srtt_us: 0,
        skb_len: 0,
        skb_data: 0,
    },
    files: lifeline_common::FileOffsets {
        task_struct_files: 0,
        files_struct_fdt: 0,
        fdtable_max_fds: 0,
        fdtable_fd: 0,
        file_private_data: 0,
        socket_sk: 0,
    },
};

/// Stream records each process may send per `BUDGET_WINDOW_NS` (the agent's
/// `--stream-record-budget`), set by userspace before load like `OFFSETS`.
#[no_mangle]
static STREAM_BUDGET_PER_SECOND: u32 = STREAM_BUDGET;

mod exec;
mod gotls;
mod gowrites;
mod openssl;
mod slot;

/// Ports of the apiserver endpoints, one bit per port: the first and, for unrelated sockets,
/// only test. Changed by userspace at run time.
#[map]
static WATCHED_PORTS: Array<u64> = Array::with_max_entries(PORT_WORDS, 0);

/// Apiserver endpoints: port + address prefix → 1. Changed by userspace at run time.
#[map]
static ENDPOINTS: LpmTrie<EndpointKey, u8> = LpmTrie::with_max_entries(MAX_ENDPOINTS, 0);

/// Events for userspace. Userspace sets the size at load time.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Per-CPU counters, indexed by `lifeline_common::counter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::LEN, 0);

/// Each process's use of its connect budget, by tgid.
#[map]
static BUDGETS: LruHashMap<u32, Budget> = LruHashMap::with_max_entries(4096, 0);

/// Each process's use of its stream record budget (`STREAM_BUDGET`), by tgid.
#[map]
static STREAM_BUDGETS: LruHashMap<u32, Budget> = LruHashMap::with_max_entries(4096, 0);

/// Records not sent, counted per scope and cause (see `LossKey`) and CPU. A plain hash: a
/// loss that finds it full is counted node-wide (`counter::UNSCOPED`), never evicted unseen.
#[map]
static LOSSES: PerCpuHashMap<LossKey, u64> = PerCpuHashMap::with_max_entries(MAX_LOSSES, 0);

/// Muted connections (see `MUTE_AFTER`): socket address → process, until the socket closes or
/// connects anew. An evicted entry only un-mutes its socket.
#[map]
static MUTED: LruHashMap<u64, u32> = LruHashMap::with_max_entries(32768, 0);

/// Connects held back because their process was over budget, by socket address, until they
/// leave SYN_SENT.
#[map]
static DEFERRED: LruHashMap<u64, DeferredConnect> = LruHashMap::with_max_entries(32768, 0);

/// Failed held-back connects, counted per (process, destination, errno) and CPU.
#[map]
static FAILURES: LruPerCpuHashMap<FailureKey, u64> = LruPerCpuHashMap::with_max_entries(8192, 0);

/// Errors queued on connecting sockets that did not end them, by socket address (errno): an
/// ICMP unreachable for a SYN that arrived while the process held the socket only queues the
/// error (and sets `sk_err_soft`), and the process consumes it (`SO_ERROR`) before it closes
/// the socket, so at SYN_SENT → CLOSE `sk_err` is 0. Written by `inet_sk_error_report`, read
/// and removed when the socket leaves SYN_SENT.
#[map]
static SOFT_ERRORS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(4096, 0);

/// Per watched established socket, by its kernel address: what the last segment sent said
/// (see `SegmentState`). Entries go when the socket leaves ESTABLISHED or connects anew; a
/// plain hash (not LRU), so one socket's state is never evicted by another's.
#[map]
static SEGMENTS: HashMap<u64, SegmentState> = HashMap::with_max_entries(65536, 0);

/// How many sockets have left `SEGMENTS`. A probe that found a socket kept there (the Go
/// probes' `TLS_CONNS`) trusts it again without a lookup while this has not moved: one array
/// load where the lookup in a map of 65,536 costs ~0.5 µs in a cold cache (benchmarks.md).
#[map]
static SEGMENT_ENDS: Array<u64> = Array::with_max_entries(1, 0);

/// Forgets socket `sk`'s segment state; if it had one, moves `SEGMENT_ENDS` after the
/// removal: whoever reads the count before a lookup finds the socket gone or the count moved.
#[inline(always)]
fn forget_segments(sk: u64) {
    if SEGMENTS.remove(sk).is_ok() {
        count_up(&SEGMENT_ENDS);
    }
}

/// The count of `SEGMENT_ENDS` now.
#[inline(always)]
pub(crate) fn segment_ends() -> Option<u64> {
    count_of(&SEGMENT_ENDS)
}

/// Adds one to the count that `counter`, a one-entry array, keeps for every CPU.
#[inline(always)]
pub(crate) fn count_up(counter: &Array<u64>) {
    if let Some(count) = counter.get_ptr_mut(0) {
        // SAFETY: an array value lives as long as the map; other CPUs add to it atomically
        // (BPF's atomic add; `AtomicU64::fetch_add` is not in `core` for this target).
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(count, 1)
        };
    }
}

/// The count `counter` (see [`count_up`]) holds now.
#[inline(always)]
pub(crate) fn count_of(counter: &Array<u64>) -> Option<u64> {
    // SAFETY: an array value, read at once (a torn read is impossible for an aligned u64).
    counter
        .get_ptr(0)
        .map(|count| unsafe { core::ptr::read_volatile(count) })
}

/// Submit flags for a segment or stream record, which nothing waits for: no wakeup, since the
/// pump drains the ring at least every `DRAIN_EVERY` (agent's `app/pump.rs`), in ring order,
/// and a wakeup costs an interrupt and a context switch, more than the rest of the program and
/// the record's handling together (for a uprobe, ~13 µs in the probed client's own thread on
/// this VM: the wakeup's interrupt is taken inside the program); unless the ring is a quarter
/// full, where waiting could lose records.
///
/// Every other record is submitted with [`URGENT_WAKEUP`]: connects, state changes,
/// retransmits and execs, which something waits for.
#[inline(always)]
pub(crate) fn lazy_wakeup() -> u64 {
    let pending = EVENTS.query(u64::from(BPF_RB_AVAIL_DATA));
    let size = EVENTS.query(u64::from(BPF_RB_RING_SIZE));
    u64::from(if pending >= size / 4 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    })
}

/// Submit flags for a record the pump must see at once: a forced wakeup. The kernel's default
/// wakes a reader only when it has read everything before the record, which a lazily submitted
/// record left unread (see [`lazy_wakeup`]) would prevent for up to `DRAIN_EVERY`. When the ring
/// was empty both are the same; behind a backlog the kernel coalesces the wakeups it queues.
pub(crate) const URGENT_WAKEUP: u64 = BPF_RB_FORCE_WAKEUP as u64;

fn bump(index: u32) {
    if let Some(count) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; nothing else writes it while this program runs on this CPU.
        unsafe { *count += 1 };
    }
}

/// A record about socket `sk` (0: unknown; then process `tgid`, 0: unknown too) was not sent,
/// for `cause`: counted where userspace finds whose evidence it was.
#[inline(always)]
pub(crate) fn lost(sk: u64, tgid: u32, cause: u16) {
    if cause == loss_cause::RING_FULL {
        bump(counter::LOST);
    }
    let key = LossKey {
        sk,
        tgid,
        cause,
        _pad: [0; 5],
    };
    match LOSSES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot; nothing else writes it while this program runs here.
        Some(count) => unsafe { *count += 1 },
        None => {
            if LOSSES.insert(key, 1, 0).is_err() {
                bump(counter::UNSCOPED);
            }
        }
    }
}

/// Takes one record from process `tgid`'s stream budget; false (the record is counted lost
/// for `sk`) when it is spent for this window.
#[inline(always)]
pub(crate) fn stream_budget(sk: u64, tgid: u32) -> bool {
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a plain read of a global (see `offset!`).
    let limit = unsafe { core::ptr::read_volatile(&STREAM_BUDGET_PER_SECOND) };
    if take_budget(&STREAM_BUDGETS, tgid, now, limit) {
        return true;
    }
    lost(sk, tgid, loss_cause::RATE_LIMITED);
    false
}

/// A field of `OFFSETS`. Volatile, so that the compiler cannot fold the zeros of the ELF in:
/// the load stays a load from the frozen map, whose value the verifier knows.
macro_rules! offset {
    ($($field:ident).+) => {{
        #[allow(unused_unsafe)]
        // SAFETY: a plain read of a global.
        let value = unsafe { core::ptr::read_volatile(&OFFSETS.$($field).+) };
        value
    }};
}

/// The `u16` at byte `offset` of the tracepoint record.
///
/// The verifier allows direct loads from a tracepoint's record only at offsets fixed in the
/// instruction, and this kernel's offsets are known only at load time. So every even offset
/// of the first 128 bytes gets a load instruction of its own (in a function of its own, or
/// the compiler would merge them back into one load at a computed offset), selected by
/// comparisons with `offset`. `offset` comes from frozen `.rodata`: the verifier knows its
/// value, follows only the matching comparison, and removes the other loads as dead code
/// before the program is JIT-compiled; what runs is one call and one load. An offset beyond
/// them falls back to a probe read.
#[inline(always)]
fn record_u16(ctx: &TracePointContext, offset: u32) -> Result<u16, i32> {
    macro_rules! direct {
        ($($at:literal)*) => {
            match offset {
                $( $at => return Ok(load_u16::<$at>(ctx.as_ptr().cast())), )*
                _ => {}
            }
        };
    }
    direct!(8 10 12 14 16 18 20 22 24 26 28 30 32 34 36 38 40 42 44 46 48 50 52 54 56 58 60 62
        64 66 68 70 72 74 76 78 80 82 84 86 88 90 92 94 96 98 100 102 104 106 108 110 112 114
        116 118 120 122 124 126);
    // SAFETY: offset from this kernel's tracepoint format file.
    unsafe { ctx.read_at(offset as usize) }
}

/// One direct load from the tracepoint record at the fixed offset `AT`.
#[inline(always)]
fn load_u16<const AT: usize>(record: *const u8) -> u16 {
    let value: u64;
    // SAFETY: within the tracepoint record (its format file gave the offset).
    unsafe {
        core::arch::asm!("{v} = *(u16 *)({r} + {at})", v = lateout(reg) value, r = in(reg) record, at = const AT, options(pure, readonly, nostack));
    }
    value as u16
}

/// True when some endpoint uses this destination port.
#[inline(always)]
fn port_watched(port: u16) -> bool {
    let bit = 1u64 << (port & 63);
    WATCHED_PORTS
        .get(u32::from(port >> 6))
        .is_some_and(|word| word & bit != 0)
}

/// Destination address and port as the tracepoint reports them.
struct Destination {
    family: u16,
    dport: u16,
    saddr: [u8; 16],
    daddr: [u8; 16],
}

/// Reads the addresses of `family` at the given field offsets; `None` if not IPv4/IPv6.
#[inline(always)]
fn read_destination(
    ctx: &TracePointContext,
    dport: u16,
    family: u16,
    [saddr, daddr, saddr_v6, daddr_v6]: [u32; 4],
) -> Result<Option<Destination>, i32> {
    let mut dest = Destination {
        family,
        dport,
        saddr: [0; 16],
        daddr: [0; 16],
    };
    match family {
        AF_INET => {
            let s: [u8; 4] = unsafe { ctx.read_at(saddr as usize)? };
            let d: [u8; 4] = unsafe { ctx.read_at(daddr as usize)? };
            dest.saddr[..4].copy_from_slice(&s);
            dest.daddr[..4].copy_from_slice(&d);
        }
        AF_INET6 => {
            dest.saddr = unsafe { ctx.read_at(saddr_v6 as usize)? };
            dest.daddr = unsafe { ctx.read_at(daddr_v6 as usize)? };
        }
        _ => return Ok(None),
    }
    Ok(Some(dest))
}

/// True when the destination is one of the configured apiserver endpoints.
#[inline(always)]
fn is_endpoint(dest: &Destination) -> bool {
    let mut addr = [0u8; 16];
    if dest.family == AF_INET {
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[12..].copy_from_slice(&dest.daddr[..4]);
    } else {
        addr = dest.daddr;
    }
    let key = Key::new(
        ENDPOINT_PORT_BITS + 128,
        EndpointKey {
            port_be: dest.dport.to_be_bytes(),
            addr,
        },
    );
    ENDPOINTS.get(&key).is_some()
}

/// Inode of the socket's network namespace: `sk->__sk_common.skc_net.net->ns.inum`.
#[inline(always)]
fn netns_inum<C: EbpfContext>(ctx: &C, sk: u64) -> u32 {
    let skc_net = offset!(sock_common_skc_net);
    let inum = offset!(net_ns_inum);
    // SAFETY: bpf_probe_read_kernel tolerates any address; offsets come from the kernel's BTF.
    let read = unsafe { bpf_probe_read_kernel((sk + u64::from(skc_net)) as *const u64) }
        .and_then(|net| unsafe { bpf_probe_read_kernel((net + u64::from(inum)) as *const u32) });
    match read {
        Ok(inum) => inum,
        Err(err) => {
            warn!(ctx, "lifeline: cannot read netns of socket: {}", err);
            0
        }
    }
}

/// What one state change or retransmit is about: the socket and its endpoint.
struct Watched {
    sk: u64,
    netns: u32,
    sport: u16,
    dest: Destination,
}

/// `sock.sk_err` for a transition (0 when unreadable); for a connect that failed without one,
/// the error reported on it earlier (`SOFT_ERRORS`).
#[inline(always)]
fn ended_with(sk: u64, old_state: u32, new_state: u32) -> i32 {
    // SAFETY: bpf_probe_read_kernel tolerates any address; offset from the kernel's BTF.
    let sk_err: i32 =
        unsafe { bpf_probe_read_kernel((sk + u64::from(offset!(sock_sk_err))) as *const i32) }.unwrap_or(0);
    if sk_err != 0 || old_state != tcp_state::SYN_SENT || new_state != tcp_state::CLOSE {
        return sk_err;
    }
    // SAFETY: copied out at once.
    unsafe { SOFT_ERRORS.get(sk) }.map_or(0, |e| *e as i32)
}

/// Sends one event. `owner` is (tgid, pid, comm, timestamp) of a connect that was held back,
/// sent now on its behalf; `None` takes them from the current task and time.
#[inline(always)]
fn emit(kind: EventKind, w: &Watched, old_state: u32, new_state: u32, owner: Option<&DeferredConnect>) {
    let connect = old_state == tcp_state::CLOSE && new_state == tcp_state::SYN_SENT;
    let Some(mut entry) = EVENTS.reserve::<SockEvent>(0) else {
        // The process is known only in connect()'s context (see SockEvent's docs).
        let tgid = match owner {
            Some(o) => o.tgid,
            None if connect => (bpf_get_current_pid_tgid() >> 32) as u32,
            None => 0,
        };
        lost(w.sk, tgid, loss_cause::RING_FULL);
        return;
    };
    // Only for sockets that passed the endpoint filter: two reads that tell userspace why a
    // connection ended and whether data arrived just before a close. A failed read is 0.
    // SAFETY: bpf_probe_read_kernel tolerates any address; offsets come from the kernel's BTF.
    let sk_err = ended_with(w.sk, old_state, new_state);
    let bytes_received: u64 =
        unsafe { bpf_probe_read_kernel((w.sk + u64::from(offset!(tcp_sock_bytes_received))) as *const u64) }
            .unwrap_or(0);
    let (timestamp_ns, tgid, pid, comm) = match owner {
        Some(o) => (o.timestamp_ns, o.tgid, o.pid, o.comm),
        None => {
            let pid_tgid = bpf_get_current_pid_tgid();
            (
                // SAFETY: helper with no preconditions.
                unsafe { bpf_ktime_get_ns() },
                (pid_tgid >> 32) as u32,
                pid_tgid as u32,
                bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
            )
        }
    };
    entry.write(SockEvent {
        timestamp_ns,
        sk: w.sk,
        bytes_received,
        netns: w.netns,
        kind: kind as u32,
        tgid,
        pid,
        old_state,
        new_state,
        sk_err: sk_err as u32,
        _pad: 0,
        family: w.dest.family,
        sport: w.sport,
        dport: w.dest.dport,
        // Only connect() is certain to run in the owner's context; see SockEvent's docs.
        in_process_context: u16::from(connect),
        saddr: w.dest.saddr,
        daddr: w.dest.daddr,
        comm,
    });
    entry.submit(URGENT_WAKEUP);
    bump(counter::SENT);
}

/// Takes one event from the process's budget in `budgets`; false when `limit` is spent for
/// this window.
#[inline(always)]
fn take_budget(budgets: &LruHashMap<u32, Budget>, tgid: u32, now: u64, limit: u32) -> bool {
    let Some(budget) = window(budgets, tgid, now) else {
        return true;
    };
    budget.used = budget.used.saturating_add(1);
    budget.used <= limit
}

/// Process `tgid`'s budget in `budgets` for the window at `now` (a new one once the last has
/// passed); None only when the map refused a new entry.
#[inline(always)]
#[allow(clippy::mut_from_ref)] // a map value, which the map hands out mutably by design
fn window(budgets: &LruHashMap<u32, Budget>, tgid: u32, now: u64) -> Option<&mut Budget> {
    if budgets.get_ptr_mut(tgid).is_none() {
        let fresh = Budget {
            window_start_ns: now,
            used: 0,
            closed: 0,
        };
        let _ = budgets.insert(tgid, fresh, 0);
    }
    // SAFETY: a map value; a race between CPUs only shifts a count by one.
    let budget = unsafe { &mut *budgets.get_ptr_mut(tgid)? };
    if now.wrapping_sub(budget.window_start_ns) >= BUDGET_WINDOW_NS {
        budget.window_start_ns = now;
        budget.used = 0;
        budget.closed = 0;
    }
    Some(budget)
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let _ = try_inet_sock_set_state(&ctx);
    0
}

fn try_inet_sock_set_state(ctx: &TracePointContext) -> Result<(), i32> {
    let dport = record_u16(ctx, offset!(set_state.dport))?;
    if !port_watched(dport) {
        return Ok(());
    }
    // A candidate: everything else is read with probe reads (at most a few per second).
    // SAFETY (all reads): offsets come from this kernel's tracepoint format file.
    let protocol: u16 = unsafe { ctx.read_at(offset!(set_state.protocol) as usize)? };
    if protocol != IPPROTO_TCP {
        return Ok(());
    }
    let addrs = [
        offset!(set_state.saddr),
        offset!(set_state.daddr),
        offset!(set_state.saddr_v6),
        offset!(set_state.daddr_v6),
    ];
    let family: u16 = unsafe { ctx.read_at(offset!(set_state.family) as usize)? };
    let Some(dest) = read_destination(ctx, dport, family, addrs)? else {
        return Ok(());
    };
    if !is_endpoint(&dest) {
        return Ok(());
    }
    let sk: u64 = unsafe { ctx.read_at(offset!(set_state.skaddr) as usize)? };
    let old = unsafe { ctx.read_at::<i32>(offset!(set_state.oldstate) as usize)? } as u32;
    let new = unsafe { ctx.read_at::<i32>(offset!(set_state.newstate) as usize)? } as u32;
    // SAFETY: copied out at once.
    if let Some(tgid) = unsafe { MUTED.get(sk) }.copied() {
        let connect = old == tcp_state::CLOSE && new == tcp_state::SYN_SENT;
        if connect || new == tcp_state::CLOSE {
            let _ = MUTED.remove(sk);
        }
        if !connect {
            // A muted connection's change: its process's loss, and nothing else.
            lost(0, tgid, loss_cause::RATE_LIMITED);
            if new != tcp_state::ESTABLISHED {
                forget_segments(sk);
            }
            return Ok(());
        }
    }
    let sport: u16 = unsafe { ctx.read_at(offset!(set_state.sport) as usize)? };
    let w = Watched {
        sk,
        netns: netns_inum(ctx, sk),
        sport,
        dest,
    };
    if old == tcp_state::CLOSE && new == tcp_state::SYN_SENT {
        // connect(), in the owner's context.
        // SAFETY: helper with no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        let pid_tgid = bpf_get_current_pid_tgid();
        let tgid = (pid_tgid >> 32) as u32;
        if !take_budget(&BUDGETS, tgid, now, CONNECT_BUDGET) {
            let held = DeferredConnect {
                timestamp_ns: now,
                tgid,
                pid: pid_tgid as u32,
                comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
            };
            if DEFERRED.insert(sk, held, 0).is_ok() {
                bump(counter::DEFERRED);
                return Ok(());
            }
        }
    } else if old == tcp_state::SYN_SENT {
        // SAFETY: copied out at once; the entry is removed right after.
        if let Some(held) = unsafe { DEFERRED.get(sk) }.copied() {
            let _ = DEFERRED.remove(sk);
            if new == tcp_state::CLOSE {
                count_failure(&w, &held);
                let _ = SOFT_ERRORS.remove(sk);
                return Ok(());
            }
            // SAFETY: helper with no preconditions.
            if storming(held.tgid, unsafe { bpf_ktime_get_ns() }) {
                // Connects by the thousand: this one is muted (its connect and establishment
                // are its process's loss).
                let _ = MUTED.insert(sk, held.tgid, 0);
                lost(0, held.tgid, loss_cause::RATE_LIMITED);
                lost(0, held.tgid, loss_cause::RATE_LIMITED);
                return Ok(());
            }
            // It connected: its connect is sent now, then what happened.
            emit(
                EventKind::StateChange,
                &w,
                tcp_state::CLOSE,
                tcp_state::SYN_SENT,
                Some(&held),
            );
        }
    }
    emit(EventKind::StateChange, &w, old, new, None);
    // close() by the owner, in its context: counted for `MUTE_AFTER`.
    if (old == tcp_state::ESTABLISHED && new == tcp_state::FIN_WAIT1)
        || (old == tcp_state::CLOSE_WAIT && new == tcp_state::LAST_ACK)
    {
        // SAFETY: helper with no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        if let Some(budget) = window(&BUDGETS, (bpf_get_current_pid_tgid() >> 32) as u32, now) {
            budget.closed = budget.closed.saturating_add(1);
        }
    }
    if new != tcp_state::ESTABLISHED {
        forget_segments(sk);
    }
    if old == tcp_state::SYN_SENT {
        // Read by `ended_with` for this event; not needed any more.
        let _ = SOFT_ERRORS.remove(sk);
    }
    Ok(())
}

/// Whether process `tgid` has closed more than `MUTE_AFTER` connections in its budget's
/// current window (a connect/close storm, see `MUTE_AFTER`).
#[inline(always)]
fn storming(tgid: u32, now: u64) -> bool {
    // SAFETY: copied out at once.
    unsafe { BUDGETS.get(tgid) }
        .is_some_and(|b| now.wrapping_sub(b.window_start_ns) < BUDGET_WINDOW_NS && b.closed > MUTE_AFTER)
}

/// Counts a held-back connect that failed, for userspace to read.
#[inline(always)]
fn count_failure(w: &Watched, held: &DeferredConnect) {
    // SAFETY: bpf_probe_read_kernel tolerates any address; offset from the kernel's BTF.
    let sk_err = ended_with(w.sk, tcp_state::SYN_SENT, tcp_state::CLOSE);
    let key = FailureKey {
        tgid: held.tgid,
        netns: w.netns,
        sk_err: sk_err as u32,
        family: w.dest.family,
        dport: w.dest.dport,
        daddr: w.dest.daddr,
    };
    match FAILURES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot; nothing else writes it while this program runs here.
        Some(count) => unsafe { *count += 1 },
        None => {
            let _ = FAILURES.insert(key, 1, 0);
        }
    }
    bump(counter::AGGREGATED);
}

/// `sock/inet_sk_error_report` (raw: its first argument is the `struct sock`): remembers the
/// errno of an ICMP error queued on a connecting socket that the report did not end (see
/// `SOFT_ERRORS`). Errors are rare, and only sockets in SYN_SENT are looked at further.
#[raw_tracepoint(tracepoint = "inet_sk_error_report")]
pub fn inet_sk_error_report(ctx: RawTracePointContext) -> i32 {
    let _ = try_inet_sk_error_report(&ctx);
    0
}

fn try_inet_sk_error_report(ctx: &RawTracePointContext) -> Result<(), i64> {
    let sk: *const u8 = ctx.arg(0);
    let sk = sk as u64;
    // SAFETY (all reads): bpf_probe_read_kernel tolerates any address; offsets from BTF.
    let state: u8 =
        unsafe { bpf_probe_read_kernel((sk + u64::from(offset!(sock_common_skc_state))) as *const u8)? };
    if u32::from(state) != tcp_state::SYN_SENT {
        return Ok(());
    }
    // The report comes from queueing the ICMP error (before TCP sets `sk_err_soft`): its
    // errno is in the newest skb of the error queue.
    let queue = sk + u64::from(offset!(sock_sk_error_queue));
    let newest: u64 =
        unsafe { bpf_probe_read_kernel((queue + u64::from(offset!(sk_buff_head_prev))) as *const u64)? };
    if newest == 0 || newest == queue {
        return Ok(()); // empty: `prev` points at the head itself
    }
    let ee = newest + u64::from(offset!(sk_buff_cb)) + u64::from(offset!(sock_exterr_skb_ee));
    let errno: u32 = unsafe { bpf_probe_read_kernel(ee as *const u32)? };
    if errno > 0 && errno < 4096 {
        SOFT_ERRORS.insert(sk, errno, 0)?;
    }
    Ok(())
}

#[tracepoint]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_retransmit_skb(&ctx);
    0
}

fn try_tcp_retransmit_skb(ctx: &TracePointContext) -> Result<(), i32> {
    let dport = record_u16(ctx, offset!(retransmit.dport))?;
    if !port_watched(dport) {
        return Ok(());
    }
    let addrs = [
        offset!(retransmit.saddr),
        offset!(retransmit.daddr),
        offset!(retransmit.saddr_v6),
        offset!(retransmit.daddr_v6),
    ];
    // SAFETY (all reads): offsets come from this kernel's tracepoint format file.
    let sk: u64 = unsafe { ctx.read_at(offset!(retransmit.skaddr) as usize)? };
    let family = retransmit_family(ctx, sk)?;
    let Some(dest) = read_destination(ctx, dport, family, addrs)? else {
        return Ok(());
    };
    if !is_endpoint(&dest) {
        return Ok(());
    }
    let state = unsafe { ctx.read_at::<i32>(offset!(retransmit.state) as usize)? } as u32;
    // A SYN of a held-back connect: its outcome is all userspace will hear of it.
    if state == tcp_state::SYN_SENT && unsafe { DEFERRED.get(sk) }.is_some() {
        return Ok(());
    }
    let sport: u16 = unsafe { ctx.read_at(offset!(retransmit.sport) as usize)? };
    let w = Watched {
        sk,
        netns: netns_inum(ctx, sk),
        sport,
        dest,
    };
    emit(EventKind::Retransmit, &w, state, state, None);
    Ok(())
}

/// The retransmitting socket's address family: the record's `family`, or, where the record has
/// none (5.10), the socket's own `sk->__sk_common.skc_family` (what newer kernels copy into it).
#[inline(always)]
fn retransmit_family(ctx: &TracePointContext, sk: u64) -> Result<u16, i32> {
    let field = offset!(retransmit.family);
    if field != 0 {
        // SAFETY: the offset comes from this kernel's tracepoint format file.
        return unsafe { ctx.read_at(field as usize) };
    }
    let at = sk + u64::from(offset!(retransmit.sock_common_skc_family));
    // SAFETY: bpf_probe_read_kernel tolerates any address; the offset comes from the BTF.
    unsafe { bpf_probe_read_kernel(at as *const u16) }
}

/// `tcp/tcp_probe` as a typed raw tracepoint (`tcp_rcv_established`: a segment arrived on an
/// established socket). Its arguments are the socket and the segment; the kernel builds no
/// record, and the socket is typed (BTF), so an unrelated socket costs one direct load of its
/// destination port and a bitmap test.
#[btf_tracepoint(function = "tcp_probe")]
pub fn tcp_probe(ctx: BtfTracePointContext) -> i32 {
    let _ = try_tcp_probe(&ctx);
    0
}

/// Reads a `T` at `at` in kernel memory.
#[inline(always)]
fn kernel<T>(at: u64) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_kernel tolerates any address.
    unsafe { bpf_probe_read_kernel(at as *const T) }
}

/// The socket's local (`local`) or remote address, IPv4 in the first 4 bytes.
#[inline(always)]
fn socket_addr(sk: u64, family: u16, local: bool) -> Result<[u8; 16], i32> {
    let mut addr = [0u8; 16];
    let (v4, v6) = if local {
        (offset!(segment.skc_rcv_saddr), offset!(segment.skc_v6_rcv_saddr))
    } else {
        (offset!(segment.skc_daddr), offset!(segment.skc_v6_daddr))
    };
    if family == AF_INET {
        let a: [u8; 4] = kernel(sk + u64::from(v4))?;
        addr[..4].copy_from_slice(&a);
    } else {
        addr = kernel(sk + u64::from(v6))?;
    }
    Ok(addr)
}

/// TCP payload of the segment: its length less the TCP header's (`doff`, the high nibble of
/// byte 12 of the header at `skb->data`).
#[inline(always)]
fn payload_len(skb: u64) -> Result<u16, i32> {
    let len: u32 = kernel(skb + u64::from(offset!(segment.skb_len)))?;
    let data: u64 = kernel(skb + u64::from(offset!(segment.skb_data)))?;
    let doff: u8 = kernel(data + 12)?;
    Ok(len.saturating_sub(u32::from(doff >> 4) * 4) as u16)
}

fn try_tcp_probe(ctx: &BtfTracePointContext) -> Result<(), i32> {
    let sk_ptr: *const u8 = ctx.arg(0);
    // SAFETY: a typed argument: the verifier checks this load against `struct sock` in the
    // kernel's BTF and makes it fault-safe; the offset comes from the same BTF.
    let dport = u16::from_be(unsafe {
        core::ptr::read_volatile(sk_ptr.add(offset!(segment.skc_dport) as usize).cast::<u16>())
    });
    let sk = sk_ptr as u64;
    if !port_watched(dport) {
        return Ok(());
    }
    let skb: *const u8 = ctx.arg(1);
    let data_len = payload_len(skb as u64)?;
    let snd_nxt: u32 = kernel(sk + u64::from(offset!(segment.tcp_snd_nxt)))?;
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let payload = u32::from(data_len) > KEEPALIVE_RECORD_BYTES;
    let family = || kernel::<u16>(sk + u64::from(offset!(segment.skc_family)));
    let netns = match unsafe { SEGMENTS.get(sk) } {
        // A muted connection's segment: its process's loss, never its socket's (the table does
        // not know the socket, and by the time the loss is read its address may be another's).
        Some(last) if last.muted_tgid != 0 => {
            lost(0, last.muted_tgid, loss_cause::RATE_LIMITED);
            return Ok(());
        }
        Some(last) => {
            // Nothing new: an acknowledgement of nothing the client sent, or the next segment
            // of an answer already reported (within the coalescing window).
            let sent_since = last.snd_nxt != snd_nxt;
            if !sent_since
                && (data_len == 0
                    || (payload
                        && last.payload != 0
                        && now.wrapping_sub(last.last_sent_ns) < SEGMENT_COALESCE_NS))
            {
                return Ok(());
            }
            last.netns
        }
        None => {
            // First segment of this socket: is it one of the endpoints'?
            let family = family()?;
            if family != AF_INET && family != AF_INET6 {
                return Ok(());
            }
            let dest = Destination {
                family,
                dport,
                saddr: [0; 16],
                daddr: socket_addr(sk, family, false)?,
            };
            if !is_endpoint(&dest) {
                return Ok(());
            }
            // SAFETY: copied out at once.
            if let Some(tgid) = unsafe { MUTED.get(sk) }.copied() {
                let muted = SegmentState {
                    last_sent_ns: now,
                    snd_nxt,
                    netns: 0,
                    payload: 0,
                    muted_tgid: tgid,
                };
                let _ = SEGMENTS.insert(sk, muted, 0);
                lost(0, tgid, loss_cause::RATE_LIMITED);
                return Ok(());
            }
            netns_inum(ctx, sk)
        }
    };
    let state = SegmentState {
        last_sent_ns: now,
        snd_nxt,
        netns,
        payload: u32::from(payload),
        muted_tgid: 0,
    };
    // Full map: the segment is still reported, only not coalesced.
    let _ = SEGMENTS.insert(sk, state, 0);
    // Read again only for a segment that is sent (the common one, coalesced, returned above).
    let family = family()?;
    let Some(mut entry) = EVENTS.reserve::<SegmentEvent>(0) else {
        // Softirq: no process to name; the socket.
        lost(sk, 0, loss_cause::RING_FULL);
        return Ok(());
    };
    let sport: u16 = kernel(sk + u64::from(offset!(segment.skc_num))).unwrap_or(0);
    let srtt: u32 = kernel::<u32>(sk + u64::from(offset!(segment.tcp_srtt_us))).unwrap_or(0) >> 3;
    let snd_una: u32 = kernel(sk + u64::from(offset!(segment.tcp_snd_una))).unwrap_or(snd_nxt);
    // Unreadable: as if something were unsent (the record is then no look at the connection).
    let write_seq: u32 =
        kernel(sk + u64::from(offset!(segment.tcp_write_seq))).unwrap_or(snd_nxt.wrapping_add(1));
    let saddr = socket_addr(sk, family, true).unwrap_or([0; 16]);
    let daddr = socket_addr(sk, family, false).unwrap_or([0; 16]);
    entry.write(SegmentEvent {
        timestamp_ns: now,
        sk,
        kind: EventKind::Segment as u32,
        netns,
        snd_nxt,
        snd_una,
        write_seq,
        srtt_us: srtt,
        data_len,
        family,
        sport,
        dport,
        saddr,
        daddr,
    });
    entry.submit(lazy_wakeup());
    bump(counter::SENT);
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
