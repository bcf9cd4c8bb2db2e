//! The RET instructions of a function, found by decoding its machine code from its entry to its
//! end. A uretprobe cannot be used on Go code: it replaces the return address on the stack,
//! and the Go runtime moves goroutine stacks (and checks return addresses when it unwinds), so
//! the return is observed by a uprobe on each RET instead. Go's amd64 code holds no data
//! between instructions, so a linear sweep decodes every instruction; the bytes between the
//! last instruction and the next function are INT3 padding.
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic};

/// The addresses of the near RET instructions (`c3`, `c2 iw`) in `code`, which is mapped at
/// `entry`.
pub fn find(code: &[u8], entry: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    let mut found = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if instruction.mnemonic() == Mnemonic::Ret {
            found.push(instruction.ip());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_near_returns_not_bytes_that_only_look_like_one() {
        // mov eax, 0xc3c3c3c3; ret; xor eax, eax; ret 8; retf; int3
        let code = [
            0xb8, 0xc3, 0xc3, 0xc3, 0xc3, 0xc3, 0x31, 0xc0, 0xc2, 0x08, 0x00, 0xcb, 0xcc,
        ];
        assert_eq!(find(&code, 0x1000), vec![0x1005, 0x1008]);
    }
}
