//! The functions a function calls directly (`call rel32`): what `http2::writes` checks of a
//! copy's `transportResponseBody.Close` (whether it writes a RST_STREAM itself).
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind};

/// The targets of the direct calls in `code` (mapped at `entry`), in address order.
pub fn direct(code: &[u8], entry: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    let mut targets = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if instruction.mnemonic() == Mnemonic::Call && instruction.op0_kind() == OpKind::NearBranch64 {
            targets.push(instruction.near_branch64());
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::gobin::code;

    #[test]
    fn direct_calls_and_nothing_else() {
        // call +0 (to 0x1005); call rax; mov eax, 0xe8000000 (an E8 byte in an immediate);
        // call -0x11 (to 0x1000, itself); ret
        let body = code("e800000000 ffd0 b8000000e8 e8efffffff c3");
        assert_eq!(direct(&body, 0x1000), [0x1005, 0x1000]);
        assert_eq!(direct(&code("c3"), 0x1000), Vec::<u64>::new());
    }
}
