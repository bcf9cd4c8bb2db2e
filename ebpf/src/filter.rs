//! lifeline's first test on every TCP state change and retransmit of the node, attached in
//! front of the programs in `main.rs`.
//!
//! It reads one field of the tracepoint record, the destination port, compares it with the
//! endpoints' ports, and only on a match tail-calls the full program (`TARGETS`). Offset and
//! ports are instruction immediates, not map values: the agent writes them into this object's
//! instructions before each load (`agent/src/kernel/filter.rs`; placeholders below) and loads
//! a new copy when the set of ports changes. So an unrelated socket costs one load from the
//! record and a few compares, and touches no map memory — each map page touched costs more
//! than the whole test on a busy node (TLB and cache misses; docs/benchmarks.md).
//!
//! Placeholders the agent replaces (an unpatched object fails verification: the offsets lie
//! beyond any tracepoint record):
//! - the record offset of `dport`: 0x7ff0 (`sock/inet_sock_set_state`), 0x7ff2
//!   (`tcp/tcp_retransmit_skb`), in `ldxh` instructions;
//! - the ports: `0x4c4c0000 + slot` for slots 0..8, in `jne` immediates.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::ProgramArray,
    programs::TracePointContext,
    EbpfContext,
};

/// The full programs, by the agent: 0 `inet_sock_set_state`, 1 `tcp_retransmit_skb`.
#[map]
static TARGETS: ProgramArray = ProgramArray::with_max_entries(2, 0);

/// 1 when the `u16` at the placeholder offset `$offset` of `$record` is one of the 8 port
/// slots. Written out in assembly so that the compiler keeps exactly these instructions for
/// the agent to patch.
macro_rules! port_matches {
    ($record:expr, $offset:literal) => {{
        let hit: u64;
        // SAFETY: reads within the tracepoint record once the agent has patched the offset.
        unsafe {
            core::arch::asm!(
                concat!("{port} = *(u16 *)({record} + ", $offset, ")"),
                "{hit} = 0",
                "if {port} != 0x4c4c0000 goto +1",
                "{hit} = 1",
                "if {port} != 0x4c4c0001 goto +1",
                "{hit} = 1",
                "if {port} != 0x4c4c0002 goto +1",
                "{hit} = 1",
                "if {port} != 0x4c4c0003 goto +1",
                "{hit} = 1",
                "if {port} != 0x4c4c0004 goto +1",
                "{hit} = 1",
                "if {port} != 0x4c4c0005 goto +1",
                "{hit} = 1",
                "if {port} != 0x4c4c0006 goto +1",
                "{hit} = 1",
                "if {port} != 0x4c4c0007 goto +1",
                "{hit} = 1",
                record = in(reg) $record,
                port = out(reg) _,
                hit = out(reg) hit,
                options(pure, readonly, nostack),
            );
        }
        hit != 0
    }};
}

#[tracepoint]
pub fn set_state_filter(ctx: TracePointContext) -> u32 {
    if port_matches!(ctx.as_ptr(), "0x7ff0") {
        // SAFETY: the target takes the same context; on failure nothing happens.
        unsafe { TARGETS.tail_call(&ctx, 0) };
    }
    0
}

#[tracepoint]
pub fn retransmit_filter(ctx: TracePointContext) -> u32 {
    if port_matches!(ctx.as_ptr(), "0x7ff2") {
        // SAFETY: as above.
        unsafe { TARGETS.tail_call(&ctx, 1) };
    }
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
