//! lifeline's first test on every TCP state change, retransmit and arriving segment of the node,
//! attached in front of the programs in `main.rs`.
//!
//! It reads one field of the tracepoint record (of the socket, for segments), the destination
//! port, compares it with the endpoints' ports, and only on a match tail-calls the full program
//! (`TARGETS`, `SEGMENT_TARGETS`). Offset and
//! ports are instruction immediates, not map values: the agent writes them into this object's
//! instructions before each load (`agent/src/kernel/filter.rs`; placeholders below) and loads
//! a new copy when the set of ports changes. So an unrelated socket costs one load from the
//! record and a few compares, and touches no map memory — each map page touched costs more
//! than the whole test on a busy node (TLB and cache misses; docs/benchmarks.md).
//!
//! Placeholders the agent replaces (an unpatched object fails verification: the offsets lie
//! beyond any tracepoint record, or `struct sock`):
//! - the record offset of `dport`: 0x7ff0 (`sock/inet_sock_set_state`), 0x7ff2
//!   (`tcp/tcp_retransmit_skb`), in `ldxh` instructions; the socket's `skc_dport`: 0x7ff4
//!   (`tcp/tcp_probe`, typed: its first argument is the socket);
//! - the ports: `0x4c4c0000 + slot` for slots 0..8, in `jeq` immediates.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    macros::{btf_tracepoint, map, tracepoint},
    maps::ProgramArray,
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};

/// The full programs, by the agent: 0 `inet_sock_set_state`, 1 `tcp_retransmit_skb`. (The
/// segment program is a raw tracepoint with its own first test: it has no record to read.)
#[map]
static TARGETS: ProgramArray = ProgramArray::with_max_entries(2, 0);

/// Tail-calls `TARGETS[$index]` when the `u16` at the placeholder offset `$offset` of the
/// record in `r1` is one of the 8 port slots; otherwise does nothing. Written out in assembly
/// so that the compiler keeps exactly these instructions for the agent to patch, and so that a
/// miss is one load and one comparison per watched port, like a one-comparison bpftrace
/// filter: no flag to set and test afterwards. The verifier proves the comparisons of unused
/// slots (placeholders beyond any `u16`) never match and removes them with their jumps.
macro_rules! tail_call_on_port {
    ($record:expr, [$($load:literal),+], $targets:ident, $index:literal) => {
        // SAFETY: reads within the tracepoint record once the agent has patched the offset;
        // `bpf_tail_call(ctx, &TARGETS, index)` (helper 12) takes the context the program got,
        // and returns only when the call fails, clobbering the caller-saved registers.
        unsafe {
            core::arch::asm!(
                $($load,)+
                "if r2 == 0x4c4c0000 goto 1f",
                "if r2 == 0x4c4c0001 goto 11f",
                "if r2 == 0x4c4c0002 goto 12f",
                "if r2 == 0x4c4c0003 goto 13f",
                "if r2 == 0x4c4c0004 goto 14f",
                "if r2 == 0x4c4c0005 goto 15f",
                "if r2 == 0x4c4c0006 goto 16f",
                "if r2 == 0x4c4c0007 goto 17f",
                // No match: return at once (0, as the program's own return).
                "r0 = 0",
                "exit",
                // A jump of its own per slot: the verifier drops a comparison that never
                // matches only if nothing else reaches its target.
                "11:",
                "goto 1f",
                "12:",
                "goto 1f",
                "13:",
                "goto 1f",
                "14:",
                "goto 1f",
                "15:",
                "goto 1f",
                "16:",
                "goto 1f",
                "17:",
                "goto 1f",
                "1:",
                "r2 = {targets} ll",
                concat!("r3 = ", $index),
                "call 12",
                targets = sym $targets,
                inout("r1") $record => _,
                out("r0") _,
                out("r2") _,
                out("r3") _,
                out("r4") _,
                out("r5") _,
                options(nostack),
            );
        }
    };
}

#[tracepoint]
pub fn set_state_filter(ctx: TracePointContext) -> u32 {
    tail_call_on_port!(ctx.as_ptr(), ["r2 = *(u16 *)(r1 + 0x7ff0)"], TARGETS, "0");
    0
}

#[tracepoint]
pub fn retransmit_filter(ctx: TracePointContext) -> u32 {
    tail_call_on_port!(ctx.as_ptr(), ["r2 = *(u16 *)(r1 + 0x7ff2)"], TARGETS, "1");
    0
}

/// The segment program (`tcp/tcp_probe` as a typed raw tracepoint), by the agent. A map of its
/// own: a program array holds programs of one type, and this one is a tracing program.
#[map]
static SEGMENT_TARGETS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// `tcp/tcp_probe` (typed): the socket is the first argument; its destination port (network
/// order, at the placeholder offset 0x7ff4 in `struct sock`, which the verifier refuses until
/// the agent patches it) is compared as the other filters compare theirs. The load through the
/// typed pointer is checked against the kernel's BTF and made fault-safe by the verifier.
#[btf_tracepoint(function = "tcp_probe")]
pub fn segment_filter(ctx: BtfTracePointContext) -> i32 {
    tail_call_on_port!(
        ctx.as_ptr(),
        [
            "r2 = *(u64 *)(r1 + 0)",
            "r2 = *(u16 *)(r2 + 0x7ff4)",
            "r2 = be16 r2"
        ],
        SEGMENT_TARGETS,
        "0"
    );
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
