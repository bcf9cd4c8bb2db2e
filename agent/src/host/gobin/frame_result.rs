//! Where a function tests the error of its call of the frame-header read, with the header
//! still in the result registers: the conditional jump of `test r8, r8; je`/`jne` after the
//! call, a place the kernel emulates (see [`prologue`](super::prologue)). `readFrameHeader`
//! returns `(FrameHeader, error)`, `FrameHeader{valid bool; Type, Flags uint8; Length,
//! StreamID uint32}` in Go's register ABI: `valid` in AL, `Type` in BL, `Flags` in CL,
//! `Length` in EDI, `StreamID` in ESI, and the error's type word in R8 (its data word in R9).
//! A probe at the jump reads the header from those five registers and the caller's receiver
//! (its first argument, RAX at entry) from the argument slot at RBP+16, so the caller must
//! have a frame pointer at RSP at entry − 8, must have spilled its first argument to that slot
//! before the call, and must write none of the header's registers between the call and the
//! test. Seen in `(*Framer).ReadFrame` of Go 1.19's and 1.23's bundle (`call readFrameHeader`,
//! stores of the five registers to the frame, `test r8, r8`, `jne` to the error's return) and
//! of Go 1.27's `net/http/internal/http2` (`call (*Framer).ReadFrameHeader`, the same stores,
//! `test r8, r8`, `je` past the error's return). Go 1.27's `(*Framer).ReadFrameHeader` itself
//! is not such a place: between its call of `readFrameHeader` and the test it reloads BL, CL
//! and DIL from the stored header (`movzx ebx, byte [rsp+0x4c]`: `valid` in BL), for a check
//! after the jump. The agent gives [`find`] only the copy's `readFrameHeader` as callee
//! (`host/gobin.rs`): a method in between, as go1.27's, might be called by more than
//! `ReadFrame`, whose frames a probe in `ReadFrame` would not see, so go1.27's copy keeps the
//! probe in `readFrameHeader` (`call_check`).
//!
//! The code is decoded in a straight line from the entry, following no jump, as
//! [`call_check`](super::call_check) does. Whether an instruction writes a register is decided
//! for the instructions Go emits around a call (moves, arithmetic, compares, NOPs) and any
//! other is taken to write anything: this crate's `iced-x86` has no `instr_info`.
use iced_x86::{Decoder, DecoderOptions, Instruction, MemorySize, Mnemonic, OpKind, Register};

/// How many instructions are decoded looking for the call.
const BEFORE_CALL: usize = 120;

/// How many instructions may come between the call and the jump, the test included.
const AFTER_CALL: usize = 32;

/// Where RBP must point, below RSP at entry: at the caller's RBP, pushed under the return
/// address.
const FRAME: i64 = 8;

/// The first argument's slot, above RSP at entry: over the return address.
const ARGUMENT_SLOT: i64 = 8;

/// The registers the probe at the jump reads (the header, the error's type word, the frame
/// pointer, the stack pointer, the goroutine), which nothing may write after the call.
const READ_AT_JUMP: [Register; 9] = [
    Register::RAX,
    Register::RBX,
    Register::RCX,
    Register::RDI,
    Register::RSI,
    Register::R8,
    Register::RBP,
    Register::RSP,
    Register::R14,
];

/// The error check after the call of the frame-header read, as `find` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameResult {
    /// The address of the conditional jump (`je`/`jne` after `test r8, r8`).
    pub jump: u64,
}

/// The check after the first direct call of one of `callees` in `code` (mapped at `entry`), if
/// the function sets RBP to RSP at entry − 8 in its prologue (`push rbp; mov rbp, rsp; sub
/// rsp, N`, or `sub rsp, N; mov [rsp+N-8], rbp; lea rbp, [rsp+N-8]` before Go 1.21), moves
/// RSP and RBP nowhere else before the call, spills a register to the first argument's slot
/// before the call, and after it writes none of RAX, RBX, RCX, RDI, RSI, R8, RBP, RSP and R14
/// and jumps nowhere until `test r8, r8` and a `je` or `jne`.
pub fn find(code: &[u8], entry: u64, callees: &[u64]) -> Option<FrameResult> {
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    // Bytes RSP is below its value at entry.
    let mut depth = 0i64;
    // Whether the prologue's `sub rsp, N` has come.
    let mut allocated = false;
    // Bytes RBP is below RSP at entry, once the prologue has set it.
    let mut frame = None::<i64>;
    let mut spilled = false;
    for _ in 0..BEFORE_CALL {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instruction);
        if instruction.mnemonic() == Mnemonic::Call
            && instruction.op0_kind() == OpKind::NearBranch64
            && callees.contains(&instruction.near_branch_target())
        {
            if frame != Some(FRAME) || !spilled {
                return None;
            }
            return check_after_call(&mut decoder);
        }
        let to = register_operand(&instruction, 0);
        match instruction.mnemonic() {
            Mnemonic::Push if to == Some(Register::RBP) && depth == 0 => depth = 8,
            Mnemonic::Sub if to == Some(Register::RSP) && !allocated && immediate(&instruction) => {
                depth += instruction.immediate(1) as i64;
                allocated = true;
            }
            Mnemonic::Mov
                if to == Some(Register::RBP)
                    && register_operand(&instruction, 1) == Some(Register::RSP)
                    && frame.is_none() =>
            {
                frame = Some(depth);
            }
            // `lea rbp, [rsp+d]`; from another base, RBP written outside the prologue.
            Mnemonic::Lea if to == Some(Register::RBP) && frame.is_none() => {
                frame = Some(depth - rsp_relative(&instruction)?);
            }
            // Other calls (write barriers, indirect calls) give RSP back; jumps write nothing.
            Mnemonic::Call | Mnemonic::Jmp => {}
            mnemonic if is_conditional_jump(mnemonic) => {}
            _ => match writes(&instruction) {
                Writes::Nothing => {}
                Writes::Register(Register::RSP | Register::RBP) | Writes::Unknown => return None,
                Writes::Register(_) => {}
            },
        }
        if let Some(slot) = stack_store(&instruction, depth, frame) {
            spilled |= slot == ARGUMENT_SLOT;
        }
    }
    None
}

/// The `je` or `jne` after `test r8, r8`, if no instruction between the call and the test
/// writes any of [`READ_AT_JUMP`] or jumps.
fn check_after_call(decoder: &mut Decoder<'_>) -> Option<FrameResult> {
    let mut instruction = Instruction::default();
    for _ in 0..AFTER_CALL {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instruction);
        let tests_r8 = instruction.mnemonic() == Mnemonic::Test
            && register_operand(&instruction, 0) == Some(Register::R8)
            && register_operand(&instruction, 1) == Some(Register::R8);
        if tests_r8 {
            if !decoder.can_decode() {
                return None;
            }
            decoder.decode_out(&mut instruction);
            let jump = FrameResult {
                jump: instruction.ip(),
            };
            return matches!(instruction.mnemonic(), Mnemonic::Je | Mnemonic::Jne).then_some(jump);
        }
        match writes(&instruction) {
            Writes::Nothing => {}
            Writes::Register(register) if !READ_AT_JUMP.contains(&register) => {}
            Writes::Register(_) | Writes::Unknown => return None,
        }
    }
    None
}

/// What an instruction writes besides memory and the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writes {
    Nothing,
    /// This register, a general-purpose one as its 64 bits (a write of EBX or BL is RBX's).
    Register(Register),
    /// Not decided here: a call, a jump, a push or pop, a string instruction, a conditional
    /// move, anything but the moves, arithmetic, compares and NOPs Go emits around a call.
    Unknown,
}

/// What `instruction` writes, when it is one of the forms that write at most their first
/// operand: a register there is written, memory there writes no register.
fn writes(instruction: &Instruction) -> Writes {
    use Mnemonic::*;
    let first_operand = match instruction.mnemonic() {
        Nop | Cmp | Test => return Writes::Nothing,
        Mov | Movzx | Movsx | Movsxd | Lea | Add | Sub | And | Or | Xor | Adc | Sbb | Shl | Shr | Sar
        | Rol | Ror | Inc | Dec | Neg | Not | Movups | Movaps | Movdqu | Movq | Movd | Pxor | Xorps => true,
        Imul => instruction.op_count() >= 2,
        _ => false,
    };
    if !first_operand || instruction.op_count() == 0 {
        return Writes::Unknown;
    }
    match instruction.op0_kind() {
        OpKind::Memory => Writes::Nothing,
        OpKind::Register => Writes::Register(full_register(instruction.op0_register())),
        _ => Writes::Unknown,
    }
}

/// The 64-bit register a general-purpose register is part of; any other register itself.
/// (`Register::full_register` needs `iced-x86`'s `instr_info`.)
fn full_register(register: Register) -> Register {
    use Register::*;
    match register {
        AL | AH | AX | EAX => RAX,
        CL | CH | CX | ECX => RCX,
        DL | DH | DX | EDX => RDX,
        BL | BH | BX | EBX => RBX,
        SPL | SP | ESP => RSP,
        BPL | BP | EBP => RBP,
        SIL | SI | ESI => RSI,
        DIL | DI | EDI => RDI,
        R8L | R8W | R8D => R8,
        R9L | R9W | R9D => R9,
        R10L | R10W | R10D => R10,
        R11L | R11W | R11D => R11,
        R12L | R12W | R12D => R12,
        R13L | R13W | R13D => R13,
        R14L | R14W | R14D => R14,
        R15L | R15W | R15D => R15,
        other => other,
    }
}

/// `Jcc` (`70`–`7f`, `0f 80`–`0f 8f`).
fn is_conditional_jump(mnemonic: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        mnemonic,
        Ja | Jae | Jb | Jbe | Je | Jne | Jg | Jge | Jl | Jle | Jo | Jno | Jp | Jnp | Js | Jns
    )
}

/// The register operand `operand` of `instruction`, if that operand is a register.
fn register_operand(instruction: &Instruction, operand: u32) -> Option<Register> {
    (operand < instruction.op_count() && instruction.op_kind(operand) == OpKind::Register)
        .then(|| instruction.op_register(operand))
}

/// Whether the second operand is an immediate (`sub rsp, 0x28`).
fn immediate(instruction: &Instruction) -> bool {
    matches!(
        instruction.op1_kind(),
        OpKind::Immediate8to64 | OpKind::Immediate32to64
    )
}

/// The offset from RSP of the memory operand `[rsp+N]` of `instruction`.
fn rsp_relative(instruction: &Instruction) -> Option<i64> {
    (instruction.memory_base() == Register::RSP && instruction.memory_index() == Register::None)
        .then(|| instruction.memory_displacement64() as i64)
}

/// Where a `mov [rsp+N], reg64` or `mov [rbp+N], reg64` stores, from RSP at entry, with RSP
/// `depth` bytes below it and RBP `frame` bytes below it.
fn stack_store(instruction: &Instruction, depth: i64, frame: Option<i64>) -> Option<i64> {
    let is_store = instruction.mnemonic() == Mnemonic::Mov
        && instruction.op0_kind() == OpKind::Memory
        && instruction.memory_size() == MemorySize::UInt64
        && instruction.memory_index() == Register::None
        && instruction.op1_kind() == OpKind::Register;
    if !is_store {
        return None;
    }
    let displacement = instruction.memory_displacement64() as i64;
    match instruction.memory_base() {
        Register::RSP => Some(displacement - depth),
        Register::RBP => frame.map(|frame| displacement - frame),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::gobin::code;

    /// Go 1.19's `net/http.(*http2Framer).ReadFrame` up to a few instructions past its error
    /// check, as `go tool objdump` prints it: the frame pointer saved inside the frame (`sub
    /// rsp, 0xa8`, `mov [rsp+0xa0], rbp`, `lea rbp, [rsp+0xa0]`), a write barrier's call and
    /// an indirect call before the spill's reload and `call http2readFrameHeader`.
    const GO_1_19: &str = "4c8d6424d8 4d3b6610 0f8697040000 4881eca8000000 4889ac24a0000000 \
        488dac24a0000000 48c7402000000000 488d7828 833da7e72a0000 750a 48c7402800000000 eb07 \
        31d2 e854c5e7ff 4889bc2498000000 48898424b0000000 488b5010 4c8b4018 4885d2 7411 \
        488b4a20 4c89c0 ffd1 488b8424b0000000 488d5040 488b7008 488b38 bb09000000 4889d9 \
        4889d0 e8ebf7ffff 88442464 885c2465 884c2466 897c2468 8974246c 488b542464 448b54246c \
        4889542458 4489542460 0f1f00 4d85c0 0f85ac030000 8b44245c 488bb424b0000000 39463c";
    const GO_1_19_ENTRY: u64 = 0x5e9000;
    /// `net/http.http2readFrameHeader` in that build.
    const GO_1_19_CALLEE: u64 = 0x5e8880;

    /// Go 1.23's: `push rbp; mov rbp, rsp; sub rsp, 0x98`.
    const GO_1_23: &str = "4c8d6424e0 4d3b6610 0f8644040000 55 4889e5 4881ec98000000 \
        48c7402000000000 833d0706300000 740c 488b5028 e8ecabe5ff 498913 48898424a8000000 \
        48c7402800000000 488b5010 4885d2 7415 488b4818 488b5220 4889c8 ffd2 488b8424a8000000 \
        488d5040 488b38 488b7008 bb09000000 4889d9 4889d0 0f1f440000 e81bf9ffff 8844244c \
        885c244d 884c244e 897c2450 89742454 488b54244c 488954243c 89742444 4d85c0 \
        0f8579030000 8b442440 488bb424a8000000 0f1f4000";
    const GO_1_23_ENTRY: u64 = 0x619100;
    const GO_1_23_CALLEE: u64 = 0x618aa0;

    /// Go 1.27's `net/http/internal/http2.(*Framer).ReadFrame`: the spill, the call of
    /// `(*Framer).ReadFrameHeader`, `test r8, r8`, `je`.
    const GO_1_27: &str = "493b6610 7665 55 4889e5 4883ec28 4889442438 e808f8ffff 8844241c \
        885c241d 884c241e 897c2420 89742424 4d85c0 7410 31c0 31db 4c89c1";
    const GO_1_27_ENTRY: u64 = 0x5f0d20;
    /// `(*Framer).ReadFrameHeader` in that build.
    const GO_1_27_CALLEE: u64 = 0x5f0540;

    /// Go 1.27's `(*Framer).ReadFrameHeader`, which calls `readFrameHeader` and reloads BL, CL
    /// and DIL from the stored header before its `test r8, r8`.
    const GO_1_27_HEADER: &str = "493b6610 0f8697020000 55 4889e5 4883ec68 48c744242800000000 \
        c744243000000000 48c7402000000000 833dde533e0000 740c 488b5028 e843b2e9ff 498913 \
        4889442478 48c7402800000000 488d5044 488b38 488b7008 4889d0 bb09000000 89d9 \
        e8f9f9ffff 8844244c 885c244d 884c244e 897c2450 89742454 488b54244c 448b542450 \
        0fb65c244c 0fb64c244d 0fb67c244e 4889542434 8974243c 0f1f00 4d85c0 0f85cc010000 \
        488b442478 44395040 0f8345010000";
    const GO_1_27_HEADER_ENTRY: u64 = 0x5f0540;
    /// `readFrameHeader` in that build.
    const GO_1_27_HEADER_CALLEE: u64 = 0x5effa0;

    /// `test r8, r8`.
    const TEST_R8: [u8; 3] = [0x4d, 0x85, 0xc0];

    /// Where `pattern` is in `code`, when it is there once.
    fn at(code: &[u8], pattern: &[u8]) -> usize {
        let found: Vec<usize> = (0..=code.len() - pattern.len())
            .filter(|&i| code[i..i + pattern.len()] == *pattern)
            .collect();
        let [i] = found[..] else {
            panic!("{pattern:02x?} found {} times", found.len())
        };
        i
    }

    /// `code` with `removed` bytes at `i` replaced by `inserted`.
    fn splice(code: &[u8], i: usize, removed: usize, inserted: &[u8]) -> Vec<u8> {
        [&code[..i], inserted, &code[i + removed..]].concat()
    }

    /// The same, before the `call rel32` at `call`, whose rel32 is adjusted so that it still
    /// calls its callee.
    fn splice_before(code: &[u8], call: usize, i: usize, removed: usize, inserted: &[u8]) -> Vec<u8> {
        assert!(i + removed <= call && code[call] == 0xe8);
        let moved = inserted.len() as i32 - removed as i32;
        let rel = i32::from_le_bytes(code[call + 1..call + 5].try_into().unwrap()) - moved;
        let spliced = splice(code, i, removed, inserted);
        let call = (call as i32 + moved) as usize;
        splice(&spliced, call + 1, 4, &rel.to_le_bytes())
    }

    fn jump(address: u64) -> Option<FrameResult> {
        Some(FrameResult { jump: address })
    }

    fn find_19(code: &[u8]) -> Option<FrameResult> {
        find(code, GO_1_19_ENTRY, &[GO_1_19_CALLEE])
    }

    fn find_23(code: &[u8]) -> Option<FrameResult> {
        find(code, GO_1_23_ENTRY, &[GO_1_23_CALLEE])
    }

    fn find_27(code: &[u8]) -> Option<FrameResult> {
        find(code, GO_1_27_ENTRY, &[GO_1_27_CALLEE])
    }

    #[test]
    fn the_error_check_after_reading_the_header_in_each_version() {
        assert_eq!(find_19(&code(GO_1_19)), jump(0x5e90c3));
        assert_eq!(find_23(&code(GO_1_23)), jump(0x6191aa));
        assert_eq!(find_27(&code(GO_1_27)), jump(0x5f0d4f));
        // With other callees beside it.
        assert_eq!(
            find(&code(GO_1_27), GO_1_27_ENTRY, &[0x1000, GO_1_27_CALLEE, 0x2000]),
            jump(0x5f0d4f)
        );
    }

    #[test]
    fn not_where_the_header_is_reloaded_before_the_test() {
        let header = code(GO_1_27_HEADER);
        let find = |code: &[u8]| find(code, GO_1_27_HEADER_ENTRY, &[GO_1_27_HEADER_CALLEE]);
        assert_eq!(find(&header), None);
        // Without the three reloads (movzx ebx/ecx/edi, byte [rsp+0x4c..0x4e]) it would be.
        let reloads = at(&header, &[0x0f, 0xb6, 0x5c, 0x24, 0x4c]);
        assert_eq!(find(&splice(&header, reloads, 15, &[])), jump(0x5f05e3 - 15));
    }

    #[test]
    fn not_after_a_call_of_another_function() {
        let go = code(GO_1_27);
        assert_eq!(find(&go, GO_1_27_ENTRY, &[]), None);
        assert_eq!(find(&go, GO_1_27_ENTRY, &[GO_1_27_CALLEE + 1]), None);
        assert_eq!(find(&go, GO_1_27_ENTRY, &[GO_1_27_HEADER_CALLEE]), None);
        // Go 1.23's first direct call, runtime.gcWriteBarrier1, comes before the spill.
        let write_barrier = 0x473d20;
        let go = code(GO_1_23);
        assert_eq!(find(&go, GO_1_23_ENTRY, &[write_barrier]), None);
        assert_eq!(find(&go, GO_1_23_ENTRY, &[write_barrier, GO_1_23_CALLEE]), None);
    }

    #[test]
    fn not_when_a_register_is_written_between_the_call_and_the_test() {
        let go = code(GO_1_23);
        let test = at(&go, &TEST_R8);
        let with = |inserted: &[u8]| find_23(&splice(&go, test, 0, inserted));
        // Another register, or memory: still the check, moved by the insertion.
        let kept: [(&[u8], &str); 4] = [
            (&[0x41, 0xba, 1, 0, 0, 0], "mov r10d, 1"),
            (&[0x31, 0xd2], "xor edx, edx"),
            (&[0x88, 0x5c, 0x24, 0x10], "mov [rsp+0x10], bl"),
            (&[0x0f, 0x1f, 0x00], "nop dword [rax]"),
        ];
        for (inserted, instruction) in kept {
            let moved = jump(0x6191aa + inserted.len() as u64);
            assert_eq!(with(inserted), moved, "{instruction}");
        }
        // The header's, the error's, the frame's, the stack's or the goroutine's register, or
        // an instruction whose writes are not decided here.
        let written: [(&[u8], &str); 11] = [
            (&[0xbb, 1, 0, 0, 0], "mov ebx, 1"),
            (&[0x31, 0xc9], "xor ecx, ecx"),
            (&[0x40, 0xb7, 0x01], "mov dil, 1"),
            (&[0x0f, 0xb6, 0x74, 0x24, 0x4c], "movzx esi, byte [rsp+0x4c]"),
            (&[0x48, 0x89, 0xd0], "mov rax, rdx"),
            (&[0x4d, 0x31, 0xc0], "xor r8, r8"),
            (&[0x48, 0x89, 0xd5], "mov rbp, rdx"),
            (&[0x48, 0x83, 0xc4, 0x08], "add rsp, 8"),
            (&[0x4d, 0x89, 0xd6], "mov r14, r10"),
            (&[0x4c, 0x87, 0xd2], "xchg rdx, r10"),
            (&[0x48, 0x0f, 0x44, 0xda], "cmove rbx, rdx"),
        ];
        for (inserted, instruction) in written {
            assert_eq!(with(inserted), None, "{instruction}");
        }
    }

    #[test]
    fn not_without_test_r8_and_je_or_jne() {
        let go = code(GO_1_27);
        let test = at(&go, &TEST_R8);
        // test rbx, rbx; test r8, r9.
        assert_eq!(find_27(&splice(&go, test, 3, &[0x48, 0x85, 0xdb])), None);
        assert_eq!(find_27(&splice(&go, test, 3, &[0x4d, 0x85, 0xc8])), None);
        // A jb after it, and the jne of 1.19 and 1.23 in the je's place.
        assert_eq!(find_27(&splice(&go, test + 3, 1, &[0x72])), None);
        assert_eq!(find_27(&splice(&go, test + 3, 1, &[0x75])), jump(0x5f0d4f));
        // A call, or a jump, between the call and the test.
        assert_eq!(find_27(&splice(&go, test, 0, &[0xe8, 0, 0, 0, 0])), None);
        assert_eq!(find_27(&splice(&go, test, 0, &[0xeb, 0x00])), None);
        // Truncated before the jump, or inside it.
        assert_eq!(find_27(&go[..test + 3]), None);
        assert_eq!(find_27(&go[..test + 4]), None);
        assert_eq!(find_27(&go[..test + 5]), jump(0x5f0d4f));
    }

    #[test]
    fn not_without_the_first_argument_in_its_slot() {
        let go = code(GO_1_27);
        let spill = at(&go, &[0x48, 0x89, 0x44, 0x24, 0x38]);
        let call = at(&go, &[0xe8, 0x08, 0xf8, 0xff, 0xff]);
        let instead = |inserted: &[u8]| find_27(&splice_before(&go, call, spill, 5, inserted));
        // mov [rsp+0x30], rax: below the slot.
        assert_eq!(instead(&[0x48, 0x89, 0x44, 0x24, 0x30]), None);
        // mov [rsp+0x38], eax: half of it.
        assert_eq!(instead(&[0x89, 0x44, 0x24, 0x38]), None);
        // No spill at all.
        assert_eq!(instead(&[]), None);
        // Spilled after the call: too late.
        let test = at(&go, &TEST_R8);
        let late = splice(&go, test, 0, &go[spill..spill + 5]);
        assert_eq!(find_27(&splice_before(&late, call, spill, 5, &[])), None);
        // The same store, another register's, and the slot as [rbp+0x10]: the spill still.
        assert_eq!(instead(&go[spill..spill + 5]), jump(0x5f0d4f));
        assert_eq!(instead(&[0x48, 0x89, 0x5c, 0x24, 0x38]), jump(0x5f0d4f));
        assert_eq!(instead(&[0x48, 0x89, 0x45, 0x10]), jump(0x5f0d4f - 1));
        // [rbp+0x10] before RBP is set.
        let frame_pointer = at(&go, &[0x48, 0x89, 0xe5]);
        let early = splice_before(&go, call, frame_pointer, 0, &[0x48, 0x89, 0x45, 0x10]);
        let call = call + 4;
        let spill = spill + 4;
        assert_eq!(find_27(&splice_before(&early, call, spill, 5, &[])), None);
        // Go 1.19's slot, [rsp+0xb0] under a frame of 0xa8 bytes, moved to [rsp+0xa8].
        let go = code(GO_1_19);
        let spill = at(&go, &[0x48, 0x89, 0x84, 0x24, 0xb0, 0, 0, 0]);
        assert_eq!(find_19(&splice(&go, spill + 4, 1, &[0xa8])), None);
    }

    #[test]
    fn not_when_rsp_or_rbp_moves_outside_the_prologue() {
        let go = code(GO_1_23);
        let call = at(&go, &[0xe8, 0x1b, 0xf9, 0xff, 0xff]);
        let before_call = |inserted: &[u8]| find_23(&splice_before(&go, call, call, 0, inserted));
        // Another register, or memory: still the check.
        let kept: [(&[u8], &str); 3] = [
            (&[0x41, 0xba, 1, 0, 0, 0], "mov r10d, 1"),
            (&[0x48, 0x89, 0x5c, 0x24, 0x10], "mov [rsp+0x10], rbx"),
            (&[0x48, 0x83, 0xc0, 0x08], "add rax, 8"),
        ];
        for (inserted, instruction) in kept {
            let moved = jump(0x6191aa + inserted.len() as u64);
            assert_eq!(before_call(inserted), moved, "{instruction}");
        }
        let moved: [(&[u8], &str); 10] = [
            (&[0x48, 0x83, 0xc4, 0x08], "add rsp, 8"),
            (&[0x48, 0x83, 0xec, 0x08], "a second sub rsp, 8"),
            (&[0x53], "push rbx"),
            (&[0x5b], "pop rbx"),
            (&[0x55], "a second push rbp"),
            (&[0x48, 0x89, 0xec], "mov rsp, rbp"),
            (&[0x48, 0x89, 0xd5], "mov rbp, rdx"),
            (&[0xbd, 1, 0, 0, 0], "mov ebp, 1"),
            (&[0x48, 0x89, 0xe5], "a second mov rbp, rsp"),
            (&[0x48, 0x8d, 0x6c, 0x24, 0x08], "lea rbp, [rsp+8]"),
        ];
        for (inserted, instruction) in moved {
            assert_eq!(before_call(inserted), None, "{instruction}");
        }
    }

    #[test]
    fn not_when_the_call_is_too_far() {
        // Go 1.27's call is its seventh instruction: NOPs before it bring it to the last
        // decoded, then past it.
        let go = code(GO_1_27);
        let call = at(&go, &[0xe8, 0x08, 0xf8, 0xff, 0xff]);
        let nops = |n: usize| find_27(&splice_before(&go, call, call, 0, &vec![0x90; n]));
        let last = BEFORE_CALL - 7;
        assert_eq!(nops(last), jump(0x5f0d4f + last as u64));
        assert_eq!(nops(last + 1), None);
        // No call at all, the test and jump within the look-ahead.
        let no_call = splice(&go, call, 5, &[0x90; 5]);
        assert_eq!(find_27(&no_call), None);
    }

    #[test]
    fn not_without_rbp_at_rsp_at_entry_minus_8() {
        let go = code(GO_1_27);
        let call = at(&go, &[0xe8, 0x08, 0xf8, 0xff, 0xff]);
        // Go 1.27 without `mov rbp, rsp`.
        let frame_pointer = at(&go, &[0x48, 0x89, 0xe5]);
        assert_eq!(find_27(&splice_before(&go, call, frame_pointer, 3, &[])), None);
        // The same length of NOP in its place.
        let nop = [0x0f, 0x1f, 0x00];
        assert_eq!(find_27(&splice(&go, frame_pointer, 3, &nop)), None);
        // `mov rbp, rsp` after the `sub rsp, 0x28`: RBP at the frame's bottom.
        let sub = at(&go, &[0x48, 0x83, 0xec, 0x28]);
        let late = splice(&go, sub + 4, 0, &[0x48, 0x89, 0xe5]);
        assert_eq!(find_27(&splice(&late, frame_pointer, 3, &[])), None);
        // Go 1.19 without `lea rbp, [rsp+0xa0]` (a NOP of its length instead), and with
        // `lea rbp, [rsp+0x98]`.
        let go = code(GO_1_19);
        let lea = at(&go, &[0x48, 0x8d, 0xac, 0x24, 0xa0, 0, 0, 0]);
        let nop = [0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
        assert_eq!(find_19(&splice(&go, lea, 8, &nop)), None);
        assert_eq!(find_19(&splice(&go, lea + 4, 1, &[0x98])), None);
    }
}
