//! Where an entry probe costs the client least. A uprobe replaces an instruction with INT3; on
//! the hit, the kernel either emulates the original instruction (a jump, a call, a push, a
//! NOP) or single-steps a copy of it out of line, which takes a second trap. Measured on this
//! project's VMs (6.18, bpftrace counting hits of one probe in a tight loop): ~0.6 µs per hit
//! on a conditional jump or a push, ~9.5 µs on a `cmp`, a `lea`, a `mov` or a `ret`. A Go
//! function opens with its stack check, `cmp rsp, [r14+16]` (or `lea r12, [rsp-N]` and
//! `cmp r12, [r14+16]`) and then `jbe` to the code that grows the stack: the CPU state at that
//! jump is the entry's (arguments, stack pointer, goroutine in R14) but for the flags and R12,
//! so a probe there sees what a probe on the entry sees, for a sixteenth of the trap. When the
//! stack must grow, the jump is taken and the function starts over, as it does past an entry
//! probe: either place is hit twice then.
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

/// How many instructions may come before the stack check's jump.
const BEFORE_JUMP: usize = 3;

/// The address of the first conditional jump in `code` (mapped at `entry`) if every
/// instruction before it writes nothing but the flags and R12/R13 (scratch registers in Go's
/// ABI, never arguments); else `entry`.
pub fn cheapest_entry(code: &[u8], entry: u64) -> u64 {
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    for _ in 0..=BEFORE_JUMP {
        if !decoder.can_decode() {
            break;
        }
        decoder.decode_out(&mut instruction);
        if is_conditional_jump(instruction.mnemonic()) {
            return instruction.ip();
        }
        if !writes_only_flags_or_scratch(&instruction) {
            break;
        }
    }
    entry
}

/// `Jcc` (`70`–`7f`, `0f 80`–`0f 8f`), which the kernel emulates.
fn is_conditional_jump(mnemonic: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        mnemonic,
        Ja | Jae | Jb | Jbe | Je | Jne | Jg | Jge | Jl | Jle | Jo | Jno | Jp | Jnp | Js | Jns
    )
}

fn writes_only_flags_or_scratch(instruction: &Instruction) -> bool {
    let scratch = instruction.op0_kind() == OpKind::Register
        && matches!(instruction.op0_register(), Register::R12 | Register::R13);
    match instruction.mnemonic() {
        Mnemonic::Cmp | Mnemonic::Test => true,
        Mnemonic::Lea | Mnemonic::Mov | Mnemonic::Sub | Mnemonic::Add => scratch,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_checks_jump_when_nothing_before_it_writes_an_argument() {
        // cmp rsp, [r14+0x10]; jbe +0x65; push rbp
        let small = [0x49, 0x3b, 0x66, 0x10, 0x76, 0x65, 0x55];
        assert_eq!(cheapest_entry(&small, 0x1000), 0x1004);
        // lea r12, [rsp-0x80]; cmp r12, [r14+0x10]; jbe rel32; push rbp
        let large = [
            0x4c, 0x8d, 0x64, 0x24, 0x80, 0x4d, 0x3b, 0x66, 0x10, 0x0f, 0x86, 0, 1, 0, 0, 0x55,
        ];
        assert_eq!(cheapest_entry(&large, 0x1000), 0x1009);
        // No stack check (a leaf): push rbp; mov rbp, rsp; ...
        assert_eq!(
            cheapest_entry(&[0x55, 0x48, 0x89, 0xe5, 0x76, 0x00], 0x1000),
            0x1000
        );
        // An argument register written before the jump: mov rax, r12; jbe.
        assert_eq!(cheapest_entry(&[0x4c, 0x89, 0xe0, 0x76, 0x00], 0x1000), 0x1000);
        // A store to memory before the jump: mov [rsp+8], rax; jbe.
        assert_eq!(
            cheapest_entry(&[0x48, 0x89, 0x44, 0x24, 0x08, 0x76, 0x00], 0x1000),
            0x1000
        );
        // Too far in: four compares, then the jump.
        let far = [0x49, 0x3b, 0x66, 0x10].repeat(4);
        assert_eq!(
            cheapest_entry(&[&far[..], &[0x76, 0x00]].concat(), 0x1000),
            0x1000
        );
        // Truncated code.
        assert_eq!(cheapest_entry(&[0x49, 0x3b], 0x1000), 0x1000);
    }
}
