//! Where a function tests the error its first callee returned: the conditional jump of
//! `test rbx, rbx; jne` right after the first `call`, a place the kernel emulates (see
//! [`prologue`](super::prologue)) where the callee's work is done. `readFrameHeader(buf, r)`
//! calls `io.ReadFull(r, buf[:9])` first: at that jump the frame header is in `buf`, whose
//! pointer (the first argument, RAX at entry) the function spilled to its slot on the stack
//! before the call. A probe there reads the header from `buf` for ~0.6 µs of trap instead of
//! the ~9.5 µs a probe on a RET costs (a RET is single-stepped). Seen in the bundled HTTP/2
//! client of Go 1.19, 1.23 and 1.27 alike: `mov [rsp+0x50], rax` in the prologue, then the
//! call, `test rbx, rbx` (the error's type word), `jne`. The second argument, `r` (an
//! interface after the slice: its data word in RSI at entry), is spilled beside it (`mov
//! [rsp+0x70], rsi`): the framer's `*bufio.Reader`, which leads to the connection read.
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

/// How many instructions are decoded looking for the first call.
const LOOK_AHEAD: usize = 40;

/// The second argument's data word, from the first's slot when the first is a slice (pointer,
/// length, capacity) and the second an interface (type word, data word).
const DATA_WORD_AFTER_SLICE: u64 = 32;

/// The check after the first call, as [`find`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallCheck {
    /// The address of the conditional jump.
    pub jump: u64,
    /// Where the first argument (RAX at entry) is kept, from RSP at the jump.
    pub first_argument: u64,
    /// Where the second argument's data word is kept, from RSP at the jump, when the first is
    /// a slice and the second an interface (RSI at entry, spilled to its slot 32 bytes above
    /// the first's and not overwritten before the call).
    pub second_argument_data: Option<u64>,
}

/// The check after the first call in `code` (mapped at `entry`), if the function spills RAX
/// to its argument slot before that call, moves RSP only in its prologue (`push rbp`,
/// `sub rsp, N`), never overwrites the slot, and tests RBX and jumps right after the call.
pub fn find(code: &[u8], entry: u64) -> Option<CallCheck> {
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    // Bytes RSP is below its value at entry.
    let mut depth = 0u64;
    // The spills' offsets from RSP, and RSP's depth then: RAX's, RSI's.
    let mut spilled = None::<(u64, u64)>;
    let mut spilled_data = None::<(u64, u64)>;
    for _ in 0..LOOK_AHEAD {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instruction);
        match instruction.mnemonic() {
            Mnemonic::Call => break,
            Mnemonic::Push if instruction.op0_register() == Register::RBP => depth += 8,
            Mnemonic::Sub
                if instruction.op0_register() == Register::RSP
                    && matches!(
                        instruction.op1_kind(),
                        OpKind::Immediate8to64 | OpKind::Immediate32to64
                    ) =>
            {
                depth += instruction.immediate(1);
            }
            _ if writes_rsp(&instruction) => return None,
            _ => {}
        }
        if let Some(slot) = stack_store(&instruction) {
            // The argument slot above the return address: RSP at entry + 8.
            let argument_slot = depth + 8;
            let from = instruction.op1_register();
            match (slot == argument_slot, from == Register::RAX) {
                (true, true) => spilled = Some((slot, depth)),
                (true, false) => return None,
                (false, _) => {}
            }
            if slot == argument_slot + DATA_WORD_AFTER_SLICE {
                spilled_data = (from == Register::RSI).then_some((slot, depth));
            }
        }
    }
    if instruction.mnemonic() != Mnemonic::Call {
        return None;
    }
    // From RSP after the prologue, wherever in it the spill came.
    let after_prologue = |(slot, then): (u64, u64)| slot + (depth - then);
    let first_argument = spilled.map(after_prologue)?;
    let second_argument_data = spilled_data.map(after_prologue);
    decoder.decode_out(&mut instruction);
    let tests_rbx = instruction.mnemonic() == Mnemonic::Test
        && instruction.op0_register() == Register::RBX
        && instruction.op1_register() == Register::RBX;
    if !tests_rbx {
        return None;
    }
    decoder.decode_out(&mut instruction);
    (instruction.mnemonic() == Mnemonic::Jne).then_some(CallCheck {
        jump: instruction.ip(),
        first_argument,
        second_argument_data,
    })
}

/// Whether `instruction` writes RSP as a register operand (a push or pop of another register,
/// a call or a ret move it too, but only the prologue's come before the first call).
fn writes_rsp(instruction: &Instruction) -> bool {
    instruction.op_count() > 0
        && instruction.op0_kind() == OpKind::Register
        && instruction.op0_register() == Register::RSP
        && !matches!(instruction.mnemonic(), Mnemonic::Cmp | Mnemonic::Test)
        || matches!(instruction.mnemonic(), Mnemonic::Push | Mnemonic::Pop)
}

/// The RSP offset a `mov [rsp+N], reg` stores to.
fn stack_store(instruction: &Instruction) -> Option<u64> {
    (instruction.mnemonic() == Mnemonic::Mov
        && instruction.op0_kind() == OpKind::Memory
        && instruction.memory_base() == Register::RSP
        && instruction.memory_index() == Register::None
        && instruction.op1_kind() == OpKind::Register)
        .then(|| instruction.memory_displacement64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::gobin::code;

    /// Go 1.23's `net/http.http2readFrameHeader` up to its error check, as `go tool objdump`
    /// prints it.
    const GO_1_23: &str = "493b6610 0f863c010000 55 4889e5 4883ec40 4889442450 48897c2468 \
        4889742470 48c744243400000000 c744243c00000000 4883f909 0f82f9000000 48895c2458 \
        4889442450 4889f3 4889ce 41b809000000 4889c1 4889f8 4c89c7 0f1f440000 e8dbace8ff \
        4885db 0f858b000000 488b4c2458";
    /// Go 1.19's: the frame pointer saved inside the frame (`sub rsp, 0x48`, `mov [rsp+0x40],
    /// rbp`).
    const GO_1_19: &str = "493b6610 0f8653010000 4883ec48 48896c2440 488d6c2440 4889442450 \
        48897c2468 4889742470 48c744243400000000 48c744243800000000 0f1f8000000000 4883f909 \
        0f8205010000 4889442450 48895c2458 4889f3 4889ce 41b809000000 4889c1 4889f8 4c89c7 \
        e85252eaff 4885db 0f8593000000 488b4c2458";

    #[test]
    fn the_error_check_after_reading_the_header_and_where_buf_is() {
        let expected = |jump, second_argument_data| {
            Some(CallCheck {
                jump,
                first_argument: 0x50,
                second_argument_data,
            })
        };
        assert_eq!(find(&code(GO_1_23), 0x618aa0), expected(0x618b08, Some(0x70)));
        assert_eq!(find(&code(GO_1_19), 0x5e8880), expected(0x5e88f1, Some(0x70)));
        // The spills before the frame is allocated: push rbp; mov [rsp+0x10], rax;
        // mov [rsp+0x30], rsi; sub rsp, 0x40; call; test rbx, rbx; jne.
        let early = code("55 4889442410 4889742430 4883ec40 e800000000 4885db 0f8500000000");
        assert_eq!(
            find(&early, 0x1000),
            expected(0x1000 + 1 + 5 + 5 + 4 + 5 + 3, Some(0x70))
        );
        // RSI not spilled: the check is found, the second argument is not.
        let no_data = code("55 4889442410 4883ec40 e800000000 4885db 0f8500000000");
        assert_eq!(find(&no_data, 0x1000), expected(0x1000 + 1 + 5 + 4 + 5 + 3, None));
    }

    #[test]
    fn the_second_argument_overwritten_before_the_call_is_not_kept() {
        let go = code(GO_1_23);
        let spill = [0x48, 0x89, 0x74, 0x24, 0x70];
        let at = (0..go.len() - spill.len())
            .find(|&i| go[i..i + spill.len()] == spill)
            .expect("mov [rsp+0x70], rsi");
        // mov [rsp+0x70], rdx in its place: the slot no longer holds RSI.
        let mut overwritten = go.clone();
        overwritten[at + 2] = 0x54;
        let check = find(&overwritten, 0x618aa0).expect("the check is still found");
        assert_eq!(check.second_argument_data, None);
        // Spilled, then overwritten after (the RSI store repeated as from RDX after it).
        let later = [&go[..at + 5], &[0x48, 0x89, 0x54, 0x24, 0x70][..], &go[at + 5..]].concat();
        assert_eq!(find(&later, 0x618aa0).map(|c| c.second_argument_data), Some(None));
    }

    #[test]
    fn anything_else_is_no_check() {
        let go = code(GO_1_23);
        let at = |pattern: &[u8]| -> Vec<usize> {
            (0..go.len() - pattern.len())
                .filter(|&i| go[i..i + pattern.len()] == *pattern)
                .collect()
        };
        let spills = at(&[0x48, 0x89, 0x44, 0x24, 0x50]);
        assert_eq!(spills.len(), 2);
        // RAX spilled elsewhere (mov [rsp+0x48], rax): no pointer to buf.
        let mut elsewhere = go.clone();
        for &i in &spills {
            elsewhere[i + 4] = 0x48;
        }
        assert_eq!(find(&elsewhere, 0x1000), None);
        // The slot overwritten from another register after the spill (mov [rsp+0x50], rdx).
        let mut overwritten = go.clone();
        overwritten[spills[1] + 2] = 0x54;
        assert_eq!(find(&overwritten, 0x1000), None);
        let [call] = at(&[0xe8, 0xdb, 0xac, 0xe8, 0xff])[..] else {
            panic!("one call")
        };
        // No test of RBX after the call (test rcx, rcx).
        let mut other_test = go.clone();
        other_test[call + 7] = 0xc9;
        assert_eq!(find(&other_test, 0x1000), None);
        // A JE instead of the JNE.
        let mut je = go.clone();
        je[call + 9] = 0x84;
        assert_eq!(find(&je, 0x1000), None);
        // Truncated before the call.
        assert_eq!(find(&go[..call], 0x1000), None);
        // RSP moved outside the prologue (add rsp, 8 before the call).
        let moved = [&go[..call], &[0x48, 0x83, 0xc4, 0x08][..], &go[call..]].concat();
        assert_eq!(find(&moved, 0x1000), None);
    }
}
