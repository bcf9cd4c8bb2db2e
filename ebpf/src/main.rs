//! lifeline's kernel programs. Tracepoints only (no kprobes, no fentry), so they load on any
//! kernel with BTF-less tracepoints too:
//!
//! - `sock/inet_sock_set_state`: every TCP state change whose destination matches `ENDPOINTS`
//!   (connects, establishment, failures, closes), in any network namespace.
//! - `tcp/tcp_retransmit_skb`: retransmits on sockets whose destination matches `ENDPOINTS`.
//!
//! Both filter in the kernel with one longest-prefix-match lookup, so a node's unrelated
//! traffic costs one map lookup per *state change or retransmit*, never per packet. Inbound
//! activity is sampled from userspace through sock_diag for tracked sockets only.
//!
//! Entry points are thin wrappers over fallible `try_*` functions.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, tracepoint},
    maps::{lpm_trie::Key, LpmTrie, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use lifeline_common::{
    counter, tcp_state, EndpointKey, EventKind, KernelOffsets, SockEvent, AF_INET, AF_INET6,
    ENDPOINT_PORT_BITS, MAX_ENDPOINTS,
};

const IPPROTO_TCP: u16 = 6;

/// Structure and tracepoint field offsets of the running kernel, set by userspace before load.
#[no_mangle]
static OFFSETS: KernelOffsets = KernelOffsets {
    sock_common_skc_net: 0,
    net_ns_inum: 0,
    sock_sk_err: 0,
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
        _pad: 0,
    },
};

/// Apiserver endpoints: port + address prefix → 1. Changed by userspace at run time.
#[map]
static ENDPOINTS: LpmTrie<EndpointKey, u8> = LpmTrie::with_max_entries(MAX_ENDPOINTS, 0);

/// Events for userspace.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Per-CPU counters, indexed by `lifeline_common::counter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::LEN, 0);

fn offsets() -> KernelOffsets {
    // SAFETY: a plain read of a global; volatile so the compiler cannot fold the zeros in
    // (userspace rewrites the value in .rodata before load).
    unsafe { core::ptr::read_volatile(&OFFSETS) }
}

fn bump(index: u32) {
    if let Some(count) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; nothing else writes it while this program runs on this CPU.
        unsafe { *count += 1 };
    }
}

/// Destination address and port as the tracepoint reports them.
struct Destination {
    family: u16,
    dport: u16,
    saddr: [u8; 16],
    daddr: [u8; 16],
}

/// Reads family, addresses and port at the given field offsets; `None` if not IPv4/IPv6.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn read_destination(
    ctx: &TracePointContext,
    family: u32,
    dport: u32,
    saddr: u32,
    daddr: u32,
    saddr_v6: u32,
    daddr_v6: u32,
) -> Result<Option<Destination>, i32> {
    // SAFETY: offsets come from this kernel's tracepoint format file.
    let family: u16 = unsafe { ctx.read_at(family as usize)? };
    let dport: u16 = unsafe { ctx.read_at(dport as usize)? };
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
fn netns_inum(sk: u64, off: &KernelOffsets) -> Result<u32, i32> {
    // SAFETY: bpf_probe_read_kernel tolerates any address; offsets come from the kernel's BTF.
    let net: u64 = unsafe { bpf_probe_read_kernel((sk + off.sock_common_skc_net as u64) as *const u64)? };
    unsafe { bpf_probe_read_kernel((net + off.net_ns_inum as u64) as *const u32) }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn emit(
    ctx: &TracePointContext,
    kind: EventKind,
    sk: u64,
    old_state: u32,
    new_state: u32,
    sport: u16,
    dest: &Destination,
    off: &KernelOffsets,
) {
    let netns = match netns_inum(sk, off) {
        Ok(inum) => inum,
        Err(err) => {
            warn!(ctx, "lifeline: cannot read netns of socket: {}", err);
            0
        }
    };
    let Some(mut entry) = EVENTS.reserve::<SockEvent>(0) else {
        bump(counter::LOST);
        return;
    };
    // Only for sockets that passed the endpoint filter: two reads that tell userspace why a
    // connection ended and whether data arrived just before a close. A failed read is 0.
    // SAFETY: bpf_probe_read_kernel tolerates any address; offsets come from the kernel's BTF.
    let sk_err: i32 =
        unsafe { bpf_probe_read_kernel((sk + off.sock_sk_err as u64) as *const i32) }.unwrap_or(0);
    let bytes_received: u64 =
        unsafe { bpf_probe_read_kernel((sk + off.tcp_sock_bytes_received as u64) as *const u64) }
            .unwrap_or(0);
    let pid_tgid = bpf_get_current_pid_tgid();
    // Only connect() is certain to run in the owner's context; see SockEvent's docs.
    let in_process_context = u16::from(old_state == tcp_state::CLOSE && new_state == tcp_state::SYN_SENT);
    entry.write(SockEvent {
        // SAFETY: helper with no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        sk,
        bytes_received,
        netns,
        kind: kind as u32,
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        old_state,
        new_state,
        sk_err: sk_err as u32,
        _pad: 0,
        family: dest.family,
        sport,
        dport: dest.dport,
        in_process_context,
        saddr: dest.saddr,
        daddr: dest.daddr,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    });
    entry.submit(0);
    bump(counter::SENT);
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let _ = try_inet_sock_set_state(&ctx);
    0
}

fn try_inet_sock_set_state(ctx: &TracePointContext) -> Result<(), i32> {
    let off = offsets();
    let f = &off.set_state;
    // SAFETY (all reads): offsets come from this kernel's tracepoint format file.
    let protocol: u16 = unsafe { ctx.read_at(f.protocol as usize)? };
    if protocol != IPPROTO_TCP {
        return Ok(());
    }
    let Some(dest) = read_destination(ctx, f.family, f.dport, f.saddr, f.daddr, f.saddr_v6, f.daddr_v6)?
    else {
        return Ok(());
    };
    if !is_endpoint(&dest) {
        return Ok(());
    }
    let sk: u64 = unsafe { ctx.read_at(f.skaddr as usize)? };
    let old: i32 = unsafe { ctx.read_at(f.oldstate as usize)? };
    let new: i32 = unsafe { ctx.read_at(f.newstate as usize)? };
    let sport: u16 = unsafe { ctx.read_at(f.sport as usize)? };
    emit(
        ctx,
        EventKind::StateChange,
        sk,
        old as u32,
        new as u32,
        sport,
        &dest,
        &off,
    );
    Ok(())
}

#[tracepoint]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_retransmit_skb(&ctx);
    0
}

fn try_tcp_retransmit_skb(ctx: &TracePointContext) -> Result<(), i32> {
    let off = offsets();
    let f = &off.retransmit;
    let Some(dest) = read_destination(ctx, f.family, f.dport, f.saddr, f.daddr, f.saddr_v6, f.daddr_v6)?
    else {
        return Ok(());
    };
    if !is_endpoint(&dest) {
        return Ok(());
    }
    // SAFETY: offsets come from this kernel's tracepoint format file.
    let sk: u64 = unsafe { ctx.read_at(f.skaddr as usize)? };
    let state: i32 = unsafe { ctx.read_at(f.state as usize)? };
    let sport: u16 = unsafe { ctx.read_at(f.sport as usize)? };
    emit(
        ctx,
        EventKind::Retransmit,
        sk,
        state as u32,
        state as u32,
        sport,
        &dest,
        &off,
    );
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
