//! Where the OpenSSL read and write probes cost a client least. A uprobe on the first
//! instruction of `SSL_read`, `SSL_read_ex`, `SSL_write` or `SSL_write_ex` (`sub rsp, imm` in
//! Debian's libssl builds) is single-stepped by the kernel: a second trap, ~9.5 µs of the
//! client's time per call on this project's VMs, where a push or a jump is emulated (~0.6 µs,
//! see `gobin/prologue.rs`). A python client's request (`SSL_write_ex`, `SSL_read_ex`) cost it
//! 19.5–28.5 µs more with probes on those entries and 1.2–9.3 µs more with them on the calls
//! below, measured with kernel uprobe events alone (docs/benchmarks.md).
//!
//! Each pair hands its arguments to one internal function, `ssl_read_internal(s, buf, num,
//! readbytes)` and `ssl_write_internal(s, buf, num, written)`, which in Debian's OpenSSL 1.1.1
//! and 3.0 opens by pushing the registers it keeps: an instruction the kernel emulates. The
//! internal function is found where the `_ex` variant calls it first thing (nothing but
//! `endbr64` and `sub rsp, imm` before the call, so its arguments are the `_ex` variant's own),
//! and kept only when the plain variant calls it too and it opens with a push (after
//! `endbr64`, which moves no stack: a return probe there still finds the return address at
//! RSP). Anything else keeps that pair on the exported entries, as before: OpenSSL 3.5's
//! `SSL_write_ex` (trixie) hands over to `SSL_write_ex2` with one more argument, so its writes
//! stay there while its reads move; sid's internal read function opens with a `sub` itself. The
//! probes' programs are the same on either place: the internal function takes the `_ex`
//! variants' arguments and returns 1 on success.
use std::path::{Path, PathBuf};

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

use crate::host::gobin::{image::Image, Problem};

#[derive(Debug, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct Error {
    path: PathBuf,
    problem: Problem,
}

/// Where the read and the write probes go in a libssl, as file offsets: each None where the
/// exported entries stay its places.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Internals {
    pub read: Option<u64>,
    pub write: Option<u64>,
}

/// Bytes of an exported function read for its calls: the wrappers are a few instructions.
const SCAN: u64 = 96;
/// Instructions allowed before the `_ex` variant's call (`endbr64`, `sub rsp, imm`).
const BEFORE_CALL: usize = 2;

/// The internal read and write functions of the libssl at `path`, each where it can take the
/// probes (see the module's text). Reads its ELF headers, dynamic symbols and a few hundred
/// bytes of code, never the whole file.
pub fn internals(path: &Path) -> Result<Internals, Error> {
    internals_in(path).map_err(|problem| Error {
        path: path.to_owned(),
        problem,
    })
}

fn internals_in(path: &Path) -> Result<Internals, Problem> {
    let image = Image::open(path)?;
    let [read_ex, read, write_ex, write] =
        image.dynamic_symbols(["SSL_read_ex", "SSL_read", "SSL_write_ex", "SSL_write"])?;
    Ok(Internals {
        read: shared_callee(&image, read_ex, read)?,
        write: shared_callee(&image, write_ex, write)?,
    })
}

/// The file offset of the place in the function that `ex` calls first thing and `plain`
/// calls too, if it opens with an emulated push.
fn shared_callee(image: &Image, ex: Option<u64>, plain: Option<u64>) -> Result<Option<u64>, Problem> {
    let (Some(ex), Some(plain)) = (ex, plain) else {
        return Ok(None);
    };
    let Some(callee) = code_at(image, ex)?.and_then(|code| leading_call(&code, ex)) else {
        return Ok(None);
    };
    if !code_at(image, plain)?.is_some_and(|code| calls(&code, plain, callee)) {
        return Ok(None);
    }
    let entry = code_at(image, callee)?.and_then(|code| pushing_entry(&code, callee));
    Ok(entry
        .and_then(|at| image.file_offset(at))
        .map(|(offset, _)| offset))
}

/// Up to [`SCAN`] bytes of the code at `address`, as far as its segment holds them in the file
/// (None where none does).
fn code_at(image: &Image, address: u64) -> Result<Option<Vec<u8>>, Problem> {
    let Some((offset, left)) = image.file_offset(address) else {
        return Ok(None);
    };
    image.read_at(offset, left.min(SCAN), "code").map(Some)
}

fn decoder(code: &[u8], at: u64) -> Decoder<'_> {
    Decoder::with_ip(64, code, at, DecoderOptions::NONE)
}

/// The target of a direct call that `code` (at `at`) makes before writing any register but
/// RSP (`endbr64`, `sub rsp, imm`): the callee then gets the caller's arguments unchanged.
fn leading_call(code: &[u8], at: u64) -> Option<u64> {
    let mut decoder = decoder(code, at);
    let mut instruction = Instruction::default();
    for _ in 0..=BEFORE_CALL {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instruction);
        match instruction.mnemonic() {
            Mnemonic::Call if instruction.op0_kind() == OpKind::NearBranch64 => {
                return Some(instruction.near_branch_target())
            }
            Mnemonic::Endbr64 => {}
            Mnemonic::Sub
                if instruction.op0_kind() == OpKind::Register
                    && instruction.op0_register() == Register::RSP
                    && is_immediate(instruction.op1_kind()) => {}
            _ => return None,
        }
    }
    None
}

fn is_immediate(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Immediate8 | OpKind::Immediate8to64 | OpKind::Immediate32 | OpKind::Immediate32to64
    )
}

/// Whether `code` (at `at`) makes a direct call to `target` before its first return.
fn calls(code: &[u8], at: u64, target: u64) -> bool {
    let mut decoder = decoder(code, at);
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        match instruction.mnemonic() {
            Mnemonic::Call
                if instruction.op0_kind() == OpKind::NearBranch64
                    && instruction.near_branch_target() == target =>
            {
                return true
            }
            Mnemonic::Ret | Mnemonic::INVALID => return false,
            _ => {}
        }
    }
    false
}

/// Where a probe on the function at `at` sees its entry and the kernel emulates what it
/// replaces: its first instruction if it pushes a register, or the push after `endbr64`.
fn pushing_entry(code: &[u8], at: u64) -> Option<u64> {
    let mut decoder = decoder(code, at);
    let mut instruction = Instruction::default();
    for _ in 0..2 {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instruction);
        match instruction.mnemonic() {
            Mnemonic::Endbr64 => {}
            Mnemonic::Push if instruction.op0_kind() == OpKind::Register => return Some(instruction.ip()),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first bytes of Debian bookworm's libssl 3.0 (`libssl.so.3`), at their addresses.
    const SSL_READ_EX: (u64, &[u8]) = (
        0x354c0,
        // sub rsp, 8; call 0x35290; xor edx, edx; test eax, eax
        &[
            0x48, 0x83, 0xec, 0x08, 0xe8, 0xc7, 0xfd, 0xff, 0xff, 0x31, 0xd2, 0x85, 0xc0,
        ],
    );
    const SSL_READ: (u64, &[u8]) = (
        0x35430,
        &[
            0x48, 0x83, 0xec, 0x18, // sub rsp, 0x18
            0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0, // mov rax, fs:[0x28]
            0x48, 0x89, 0x44, 0x24, 0x08, // mov [rsp+8], rax
            0x31, 0xc0, // xor eax, eax
            0x85, 0xd2, // test edx, edx
            0x78, 0x2f, // js +0x2f
            0x48, 0x89, 0xe1, // mov rcx, rsp
            0x48, 0x63, 0xd2, // movsxd rdx, edx
            0xe8, 0x3d, 0xfe, 0xff, 0xff, // call 0x35290
            0x85, 0xc0, // test eax, eax
            0xc3, // ret
        ],
    );
    /// `ssl_read_internal`: push r13; push r12; push rbp.
    const INTERNAL: (u64, &[u8]) = (0x35290, &[0x41, 0x55, 0x41, 0x54, 0x55]);

    #[test]
    fn the_ex_variant_names_the_function_it_calls_first_thing() {
        let (at, code) = SSL_READ_EX;
        assert_eq!(leading_call(code, at), Some(0x35290));
        // endbr64 before it changes nothing.
        let cet = [&[0xf3, 0x0f, 0x1e, 0xfa][..], code].concat();
        assert_eq!(leading_call(&cet, at - 4), Some(0x35290));
        // A register written before the call: the callee's arguments may not be the caller's.
        let moved = [&[0x48, 0x89, 0xfe][..], code].concat(); // mov rsi, rdi
        assert_eq!(leading_call(&moved, at - 3), None);
        // OpenSSL 3.5's SSL_write_ex (trixie, sid) hands over to SSL_write_ex2 with one more
        // argument: endbr64; mov r8, rcx; xor ecx, ecx; jmp.
        let ex2 = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x49, 0x89, 0xc8, 0x31, 0xc9, 0xe9, 0x02, 0x70, 0xfe, 0xff,
        ];
        assert_eq!(leading_call(&ex2, 0x3ee90), None);
        // No call within the instructions allowed.
        assert_eq!(leading_call(SSL_READ.1, SSL_READ.0), None);
        assert_eq!(leading_call(&code[..6], at), None);
    }

    #[test]
    fn the_plain_variant_must_call_the_same_function() {
        let (at, code) = SSL_READ;
        assert!(calls(code, at, 0x35290));
        assert!(!calls(code, at, 0x355a0));
        // A call after the first return does not count (a ret put before the call moves it,
        // and its target, one byte on).
        let cut = [&code[..30], &[0xc3], &code[30..]].concat();
        assert!(!calls(&cut, at, 0x35291));
        let nop = [&code[..30], &[0x90], &code[30..]].concat();
        assert!(calls(&nop, at, 0x35291));
    }

    #[test]
    fn only_a_push_at_the_entry_is_a_cheaper_place() {
        let (at, code) = INTERNAL;
        assert_eq!(pushing_entry(code, at), Some(at));
        let cet = [&[0xf3, 0x0f, 0x1e, 0xfa][..], code].concat();
        assert_eq!(pushing_entry(&cet, at), Some(at + 4));
        // sub rsp, 0x18: single-stepped, no better than the exported entry.
        assert_eq!(pushing_entry(SSL_READ.1, SSL_READ.0), None);
        // push of memory, not a register.
        assert_eq!(pushing_entry(&[0xff, 0x34, 0x24], at), None);
    }

    /// A file that is no ELF library: an error naming it, so that the caller keeps the
    /// exported entries and says why.
    #[test]
    fn a_file_that_is_no_library_is_named_in_the_error() {
        let dir = std::env::temp_dir().join(format!("lifeline-sslbin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("libssl.so.3");
        std::fs::write(&path, b"not an ELF file").unwrap();
        let err = internals(&path).map(|_| ()).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            err.contains("libssl.so.3") && err.contains("not an ELF file"),
            "{err}"
        );
    }

    /// The libssl this machine's clients use (Debian bookworm's 3.0), where there is one: both
    /// internal functions found, each where the kernel emulates its first instruction.
    #[test]
    fn the_systems_libssl_3_has_both_internal_functions() {
        let path = Path::new("/usr/lib/x86_64-linux-gnu/libssl.so.3");
        if !path.exists() {
            eprintln!("no {} here", path.display());
            return;
        }
        let found = internals(path).expect("read");
        let (Some(read), Some(write)) = (found.read, found.write) else {
            panic!("{found:?}");
        };
        assert_ne!(read, write);
        let data = std::fs::read(path).unwrap();
        for offset in [read, write] {
            let code = &data[offset as usize..offset as usize + 4];
            assert_eq!(
                decoder(code, offset).decode().mnemonic(),
                Mnemonic::Push,
                "at {offset:#x}"
            );
        }
    }
}
