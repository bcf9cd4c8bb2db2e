//! Reading stripped Go binaries (built with `-s -w`: no ELF symbol table, no DWARF) to place
//! uprobes on their functions: where each wanted function starts and the file offset of every
//! RET in it, since Go code cannot take uretprobes (see [`returns`]), and the places where a
//! probe costs the client least, on jumps the kernel emulates rather than single-steps: the
//! stack check's jump for an entry probe (see [`prologue`]), the error check after the first
//! call for a probe that reads that call's result (see [`call_check`]), and the error check
//! after `ReadFrame`'s call of the frame-header read, with the header still in the result
//! registers (see [`frame_result`]); and whom a function calls directly (see [`calls`]).
//! Functions are found by
//! name in `.gopclntab` (see [`pclntab`]), which the Go runtime needs and no strip removes
//! (found by its header when an external linker merged it away, see [`table`]); the Go version
//! comes from `.go.buildinfo` (see [`buildinfo`]). x86-64 ELF only; Go 1.16 and later
//! (`.gopclntab` magics `0xfffffffa`, `0xfffffff0`, `0xfffffff1`), though only Go 1.18+ tables
//! (1.19 built by the tests, 1.22 to 1.25 binaries found on a host, Debian's go1.27.1 kubectl
//! 1.36) have been read for real. From Go 1.26 the table no longer says where the code starts:
//! [`moduledata`] does. Which functions are wanted is the caller's predicate over their names
//! (the Go probes recognise the HTTP/2 client by shape, see [`http2`]).
//!
//! Memory: the file is never read whole, and nothing read is kept after [`inspect`] returns.
//! It reads the ELF headers, the first bytes of `.go.buildinfo`, from `.gopclntab` its header,
//! its function names and its functab with the `_func` records (not the pc-value tables, file
//! tables and compilation units in between), each scanned once front to back through a 1 MiB
//! window (see [`window`]), and the code of the wanted functions. For kubelet 1.20.2 built with
//! Go 1.19.8 (105 MB file, 33.5 MB `.gopclntab`, 139,123 functions; 12.8 MB of names and
//! 13.0 MB of functab and `_func`s scanned) the test process that inspects it peaks at 11.5 MB
//! RSS against 5.9 MB when it inspects nothing, so about 6 MB for the inspection, and takes
//! 26 to 125 ms with the file in the page cache, 93 ms without (release build, 2 busy shared
//! cores). Inspected again and again in one process, with the names checked as UTF-8 a chunk
//! at a time rather than one by one: kubelet 6.3 ms (9.2 before), the client-go 0.32 informer
//! (46 MB, 67,089 functions) 2.6 ms (4.4 before); at a process's start, in the agent, the
//! informer 2.4–5.4 ms (4.0–7.7 before).
pub mod buildinfo;
pub mod call_check;
pub mod calls;
pub mod frame_result;
pub mod http2;
pub mod image;
pub mod moduledata;
pub mod pclntab;
pub mod prologue;
pub mod returns;
pub mod table;
pub mod window;

use std::path::{Path, PathBuf};

use crate::host::gobin::image::Image;
use crate::host::gobin::window::Window;

/// What [`inspect`] found in a binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    /// The Go version the binary was built with, as `go version` prints it: `go1.19.8`.
    pub go_version: String,
    /// The wanted functions the binary has, in address order.
    pub functions: Vec<Function>,
}

/// One function of a Go binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The name as the Go runtime prints it: `crypto/tls.(*Conn).Read`.
    pub name: String,
    /// The entry's virtual address.
    pub entry: u64,
    /// The next function's entry (the range includes this function's INT3 padding).
    pub end: u64,
    /// The entry's file offset.
    pub entry_offset: u64,
    /// The file offset where an entry probe goes: the stack check's jump, which the kernel
    /// emulates, if the function opens with one, else the entry (see [`prologue`]).
    pub entry_probe_offset: u64,
    /// The error check after its first call, the jump as a file offset (see [`call_check`]).
    pub call_check: Option<call_check::CallCheck>,
    /// `(*Framer).ReadFrame` of an HTTP/2 copy only: the error check after its call of the
    /// copy's `readFrameHeader`, where the header is in the result registers and the framer
    /// at RBP+16, the jump as a file offset (see [`frame_result`]).
    pub frame_result: Option<u64>,
    /// `transportResponseBody.Close` of an HTTP/2 copy only: the functions it calls directly,
    /// by entry (see [`calls`]).
    pub calls: Vec<u64>,
    /// The file offset of each RET instruction, in address order (never empty).
    pub returns: Vec<u64>,
}

/// Why a binary could not be read: the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct Error {
    pub path: PathBuf,
    pub problem: Problem,
}

/// What is wrong with a binary.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    #[error("not an ELF file")]
    NotElf,
    #[error("not an x86-64 binary ({0}); only x86-64 is read")]
    NotX86_64(String),
    #[error("not a Go binary: it has no {0}")]
    NotGo(&'static str),
    #[error("unsupported .gopclntab version (magic {magic:#010x}); Go 1.16 and later are read")]
    UnsupportedPclntab { magic: u32 },
    #[error("malformed: {what}, at file offset {offset:#x}")]
    Malformed { what: String, offset: u64 },
    #[error("malformed: {what} at address {vaddr:#x} is not in any PT_LOAD segment's file contents")]
    Unmapped { what: String, vaddr: u64 },
    #[error("no RET instruction in {name} (from {entry:#x} to {end:#x})")]
    NoReturn { name: String, entry: u64, end: u64 },
}

/// Reads `path` once; returns the Go version and the functions whose names `wanted` accepts
/// (none accepted, none listed). A wanted function present without a RET is an error: it could
/// not be probed on return.
pub fn inspect(path: &Path, wanted: &dyn Fn(&str) -> bool) -> Result<Inspection, Error> {
    read(path, wanted).map_err(|problem| Error {
        path: path.to_owned(),
        problem,
    })
}

/// Whether `path` is a Go program (an ELF file with a `.go.buildinfo` section): its headers
/// only, read in tens of microseconds, before anything is inspected.
pub fn is_go(path: &Path) -> bool {
    Image::open(path).is_ok_and(|image| image.section(".go.buildinfo").is_some())
}

fn read(path: &Path, wanted: &dyn Fn(&str) -> bool) -> Result<Inspection, Problem> {
    let image = Image::open(path)?;
    let go_version = buildinfo::version(&image)?;
    let located = {
        let table = table::find(&image)?;
        // Where functab offsets start when the header does not say (PIEs; every Go 1.26+
        // table): `runtime.text` from the moduledata if the file holds it, else `.text`,
        // which starts with it when Go links the binary itself.
        let text = match moduledata::text(&image, table.address)? {
            Some(text) => text,
            None => image.section(".text").map_or(0, |s| s.address),
        };
        let head = image.read_at(
            table.offset,
            table.size.min(pclntab::HEADER_LEN),
            ".gopclntab header",
        )?;
        let header = pclntab::Header::parse(&head, table.offset, text)?;
        let region = |from: u64, to: u64, what: &'static str| {
            if from > to || to > table.size {
                return Err(Problem::Malformed {
                    what: format!(".gopclntab header: {what} from {from:#x} to {to:#x} is outside the table"),
                    offset: table.offset,
                });
            }
            Ok(Window::new(&image, table.offset + from, to - from, what))
        };
        let mut names = region(
            header.funcnames,
            header.funcnames_end,
            ".gopclntab function names",
        )?;
        let mut functab = region(header.functab, table.size, ".gopclntab functab")?;
        pclntab::find(&header, &mut names, &mut functab, wanted)?
    };
    // Where each copy's `readFrameHeader` starts: what its `ReadFrame` must call.
    let frame_headers: Vec<(String, u64)> = located
        .iter()
        .filter(|l| http2::role(&l.name) == Some(http2::Role::ReadFrameHeader))
        .map(|l| (l.name.clone(), l.entry))
        .collect();
    let mut functions = Vec::with_capacity(located.len());
    for pclntab::Located { name, entry, end } in located {
        let code = image.read_vaddr(entry, end - entry, &format!("the code of {name}"))?;
        let (entry_offset, _) = image
            .file_offset(entry)
            .expect("read_vaddr found the entry in a segment");
        let returns: Vec<u64> = returns::find(&code, entry)
            .into_iter()
            .map(|ret| entry_offset + (ret - entry))
            .collect();
        if returns.is_empty() {
            return Err(Problem::NoReturn { name, entry, end });
        }
        let entry_probe_offset = entry_offset + (prologue::cheapest_entry(&code, entry) - entry);
        let call_check = call_check::find(&code, entry).map(|check| call_check::CallCheck {
            jump: entry_offset + (check.jump - entry),
            ..check
        });
        let frame_result = if http2::role(&name) == Some(http2::Role::ReadFrame) {
            let callees: Vec<u64> = frame_headers
                .iter()
                .filter(|(header, _)| http2::same_copy(header, &name))
                .map(|(_, at)| *at)
                .collect();
            frame_result::find(&code, entry, &callees).map(|r| entry_offset + (r.jump - entry))
        } else {
            None
        };
        let calls = if http2::role(&name) == Some(http2::Role::BodyClose) {
            calls::direct(&code, entry)
        } else {
            Vec::new()
        };
        functions.push(Function {
            name,
            entry,
            end,
            entry_offset,
            entry_probe_offset,
            call_check,
            frame_result,
            calls,
            returns,
        });
    }
    Ok(Inspection {
        go_version,
        functions,
    })
}

/// Machine code from its hex (as `go tool objdump` prints it, spaces between instructions),
/// for the disassembly tests.
#[cfg(test)]
fn code(hex: &str) -> Vec<u8> {
    let hex: String = hex.split_whitespace().collect();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[cfg(test)]
mod oracle;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::gobin::oracle;

    /// Accepts exactly `names`.
    fn named<'a>(names: &'a [&'a str]) -> impl Fn(&str) -> bool + 'a {
        move |name| names.contains(&name)
    }

    /// What the agent will probe, all in the testdata client.
    const WANTED: [&str; 5] = [
        "crypto/tls.(*Conn).Read",
        "crypto/tls.(*Conn).Write",
        "net/http.(*http2ClientConn).writeHeader",
        "net/http.http2readFrameHeader",
        "vendor/golang.org/x/net/http2/hpack.(*Encoder).WriteField",
    ];

    /// Checks what [`inspect`] finds in `stripped` against Go's own tools: `debug/gosym` over
    /// the same file if `gosym` (it needs the table's section), `go tool objdump` over
    /// `unstripped`, and `go version`.
    fn agrees_with_go(stripped: &Path, unstripped: &Path, gosym: bool) -> Inspection {
        let found = inspect(stripped, &named(&WANTED)).expect("inspect the stripped client");
        assert_eq!(found.go_version, oracle::go_version(stripped));
        assert!(found.go_version.starts_with("go1."), "{}", found.go_version);
        let mut names: Vec<&str> = found.functions.iter().map(|f| f.name.as_str()).collect();
        names.sort_unstable();
        let mut wanted = WANTED.to_vec();
        wanted.sort_unstable();
        assert_eq!(names, wanted);
        let file = std::fs::read(stripped).expect("read the stripped client");
        for function in &found.functions {
            let name = function.name.as_str();
            // debug/gosym over the same stripped .gopclntab: entry and end.
            if gosym {
                let (entry, end) = oracle::gosym(stripped, name).expect("gosym finds it");
                assert_eq!((function.entry, function.end), (entry, end), "{name}");
            }
            // objdump over the unstripped build, whose text has the same layout (its data
            // does not: the symbol table moves it, so RIP-relative displacements differ): the
            // same entry, the same first instruction (the stack check, no data reference) at
            // our entry offset in the stripped file, INT3 from the end of the last instruction
            // to our end, and the same RETs.
            let disassembly = oracle::objdump(unstripped, name);
            assert_eq!(disassembly.entry, function.entry, "{name}: layouts differ");
            let at = function.entry_offset as usize;
            let code = &file[at..at + (function.end - function.entry) as usize];
            assert_eq!(code[..4], disassembly.bytes[..4], "{name}: entry offset");
            assert!(code.len() >= disassembly.bytes.len(), "{name}");
            assert!(
                code[disassembly.bytes.len()..].iter().all(|b| *b == 0xcc),
                "{name}: not INT3 padding after {:#x}",
                disassembly.end
            );
            let returns: Vec<u64> = disassembly
                .returns
                .iter()
                .map(|ret| function.entry_offset + (ret - disassembly.entry))
                .collect();
            assert!(!returns.is_empty(), "{name}: objdump shows no RET");
            assert_eq!(function.returns, returns, "{name}");
            // The entry probe on the stack check's jump, as objdump shows it, where there is one.
            let probe = disassembly.early_jump.map_or(function.entry_offset, |jump| {
                function.entry_offset + (jump - disassembly.entry)
            });
            assert_eq!(function.entry_probe_offset, probe, "{name}: entry probe");
            if !name.contains("readFrameHeader") {
                assert_ne!(
                    function.entry_probe_offset, function.entry_offset,
                    "{name}: no stack check found"
                );
            }
            // The error check after the first call, as objdump shows it; in readFrameHeader
            // with `buf` and its reader where the frame probe reads them.
            let check = disassembly
                .check_after_first_call
                .map(|jump| function.entry_offset + (jump - disassembly.entry));
            if name.contains("readFrameHeader") {
                assert!(check.is_some(), "{name}: objdump shows no check after the read");
                assert_frame_probe_reads_both(function);
            }
            if function.call_check.is_some() {
                assert_eq!(
                    function.call_check.map(|c| c.jump),
                    check,
                    "{name}: check after the first call"
                );
            }
            for ret in &function.returns {
                assert_eq!(file[*ret as usize], 0xc3, "{name}: RET at {ret:#x}");
            }
        }
        found
    }

    #[test]
    fn finds_what_go_itself_finds_in_a_stripped_binary() {
        let built = oracle::built();
        let found = agrees_with_go(&built.stripped, &built.unstripped, true);
        // The unstripped build reads the same.
        let unstripped = inspect(&built.unstripped, &named(&WANTED)).expect("inspect the unstripped client");
        let entries = |i: &Inspection| {
            i.functions
                .iter()
                .map(|f| (f.entry, f.end, f.returns.len()))
                .collect::<Vec<_>>()
        };
        assert_eq!(entries(&unstripped), entries(&found));
    }

    #[test]
    fn finds_the_table_in_position_independent_executables() {
        let built = oracle::built();
        // Linked by Go: `.data.rel.ro.gopclntab`, which gosym is pointed at.
        agrees_with_go(&built.pie.stripped, &built.pie.unstripped, true);
        // Linked by the C linker: merged into `.data.rel.ro`, found by its header.
        let image = Image::open(&built.pie_external.stripped).expect("open");
        assert_eq!(image.section(".gopclntab"), None);
        assert_eq!(image.section(".data.rel.ro.gopclntab"), None);
        agrees_with_go(
            &built.pie_external.stripped,
            &built.pie_external.unstripped,
            false,
        );
    }

    #[test]
    fn absent_functions_are_not_listed() {
        let built = oracle::built();
        let found = inspect(
            &built.stripped,
            &named(&[
                "net/http.http2readFrameHeader",
                "k8s.io/kubernetes/vendor/golang.org/x/net/http2.readFrameHeader",
                "main.nothing",
            ]),
        )
        .expect("inspect");
        let names: Vec<&str> = found.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["net/http.http2readFrameHeader"]);
        assert!(inspect(&built.stripped, &|_| false)
            .expect("inspect")
            .functions
            .is_empty());
    }

    /// A copy of the stripped client with `patch` applied, in the build directory.
    fn patched(name: &str, patch: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
        let built = oracle::built();
        let mut bytes = std::fs::read(&built.stripped).expect("read");
        patch(&mut bytes);
        let path = built.dir.join(format!("{name}.{}", std::process::id()));
        std::fs::write(&path, bytes).expect("write");
        path
    }

    fn problem(path: &Path) -> Problem {
        let error = inspect(path, &named(&WANTED)).expect_err("must fail");
        assert_eq!(error.path, path);
        assert!(
            error.to_string().starts_with(&path.display().to_string()),
            "{error}"
        );
        error.problem
    }

    /// The file offset of the stripped client's `.gopclntab`.
    fn pclntab_offset() -> usize {
        let image = Image::open(&oracle::built().stripped).expect("open");
        image.section(".gopclntab").expect(".gopclntab").offset as usize
    }

    #[test]
    fn says_what_is_wrong_and_with_which_file() {
        let built = oracle::built();
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/host/gobin/testdata/client/main.go");
        assert!(matches!(problem(&source), Problem::NotElf));
        assert!(matches!(problem(&built.dir.join("absent")), Problem::Io(_)));
        // This test binary: ELF x86-64, but Rust.
        let ours = std::env::current_exe().expect("current exe");
        assert!(matches!(problem(&ours), Problem::NotGo(".go.buildinfo section")));

        let arm = patched("arm64", |b| b[18..20].copy_from_slice(&183u16.to_le_bytes()));
        assert!(
            matches!(problem(&arm), Problem::NotX86_64(_)),
            "{:?}",
            problem(&arm)
        );

        let at = pclntab_offset();
        let go115 = patched("go115", |b| {
            b[at..at + 4].copy_from_slice(&0xffff_fffbu32.to_le_bytes())
        });
        let p = problem(&go115);
        assert!(
            matches!(p, Problem::UnsupportedPclntab { magic: 0xffff_fffb }),
            "{p:?}"
        );
        assert!(p.to_string().contains("0xfffffffb"), "{p}");

        // nfunc far beyond the functab.
        let huge = patched("nfunc", |b| {
            b[at + 8..at + 16].copy_from_slice(&0x0f0f_0f0f_0f0f_0f0fu64.to_le_bytes())
        });
        let p = problem(&huge);
        assert!(matches!(p, Problem::Malformed { .. }), "{p:?}");
        // Every RET of one function turned into a NOP.
        let found = inspect(&built.stripped, &named(&["net/http.http2readFrameHeader"])).expect("inspect");
        let returns = found.functions[0].returns.clone();
        let no_ret = patched("no-ret", |b| {
            for ret in returns {
                b[ret as usize] = 0x90;
            }
        });
        let p = problem(&no_ret);
        assert!(
            matches!(&p, Problem::NoReturn { name, .. } if name == "net/http.http2readFrameHeader"),
            "{p:?}"
        );
        for path in [arm, go115, huge, no_ret] {
            std::fs::remove_file(path).expect("remove");
        }
    }

    /// Debian's kubectl 1.36.4 (go1.27.1), which `cargo xtask setup` extracts from sid: a
    /// stripped PIE linked by the C linker, whose `.gopclntab` has no text start (Go 1.26+) and
    /// whose `.text` starts with C code, 0x100 bytes before Go's. It exports every Go function
    /// in `.dynsym`, an oracle that is no part of the table: each function found by its
    /// HTTP/2 role is where that symbol says, and the client is recognised.
    #[test]
    #[ignore = "root tier: reads the kubectl 1.36 that `cargo xtask setup` extracts"]
    fn a_go_1_27_binary_linked_by_the_c_linker_is_read_where_its_symbols_say() {
        use object::{Object, ObjectSymbol};
        const KUBECTL_1_36: &str = "/var/tmp/lifeline-kubectl-1.36/usr/bin/kubectl";
        let path = Path::new(KUBECTL_1_36);
        let found = inspect(path, &|name| http2::role(name).is_some())
            .unwrap_or_else(|e| panic!("{e} (run `cargo xtask setup`)"));
        assert_eq!(found.go_version, "go1.27.1");
        let image = Image::open(path).expect("open");
        let text = image.section(".text").expect(".text").address;
        let table = table::find(&image).expect("table");
        let runtime_text = moduledata::text(&image, table.address)
            .expect("moduledata")
            .expect("the C linker filled in the moduledata");
        assert_ne!(runtime_text, text, "Go's text does not start .text here");
        let data = std::fs::read(path).expect("read");
        let file = object::File::parse(&*data).expect("parse");
        let exported: std::collections::HashMap<&str, (u64, u64)> = file
            .dynamic_symbols()
            .filter_map(|s| Some((s.name().ok()?, (s.address(), s.size()))))
            .collect();
        for f in &found.functions {
            let (address, size) = exported[f.name.as_str()];
            assert_eq!(f.entry, address, "{}", f.name);
            assert!(f.end >= address + size, "{}", f.name);
            println!("{} at {:#x}, {} RETs", f.name, f.entry, f.returns.len());
        }
        let http2::Client::Recognised {
            write_header,
            read_frame_header,
        } = http2::client(&found.functions)
        else {
            panic!("not recognised: {:?}", http2::client(&found.functions));
        };
        let names = |fs: &[&Function]| fs.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&write_header),
            ["net/http/internal/http2.(*ClientConn).writeHeader"]
        );
        assert_eq!(
            names(&read_frame_header).len(),
            2,
            "{:?}",
            names(&read_frame_header)
        );
        // Both copies keep `buf` and their reader where the frame probe reads them.
        for f in &read_frame_header {
            assert_frame_probe_reads_both(f);
        }
    }

    /// `f`, a copy of `readFrameHeader`, has the error check after its read with `buf` and
    /// its reader kept where `go_frame_conn` reads them.
    fn assert_frame_probe_reads_both(f: &Function) {
        let check = f
            .call_check
            .unwrap_or_else(|| panic!("{}: no check after the read", f.name));
        assert_eq!(
            check.first_argument,
            lifeline_common::GO_FRAME_BUF_SLOT,
            "{}",
            f.name
        );
        assert_eq!(
            check.second_argument_data,
            Some(lifeline_common::GO_FRAME_READER_SLOT),
            "{}",
            f.name
        );
    }

    /// The stripped Kubernetes 1.20.2 binaries `cargo xtask setup` builds (or those named by
    /// `GOBIN_INSPECT`, colon-separated): every function the agent probes is found, with its
    /// RETs, and the build's Go version; prints what was found and how long it took (peak RSS:
    /// run the test binary under `/usr/bin/time -v`).
    #[test]
    #[ignore = "root tier: reads the Kubernetes binaries that `cargo xtask setup` builds"]
    fn the_kubernetes_binaries_have_every_probed_function() {
        const AGENT: [&str; 8] = [
            "crypto/tls.(*Conn).Read",
            "crypto/tls.(*Conn).Write",
            "net/http.(*http2ClientConn).writeHeader",
            "k8s.io/kubernetes/vendor/golang.org/x/net/http2.(*ClientConn).writeHeader",
            "net/http.http2readFrameHeader",
            "k8s.io/kubernetes/vendor/golang.org/x/net/http2.readFrameHeader",
            "net/http.(*http2Framer).ReadFrame",
            "k8s.io/kubernetes/vendor/golang.org/x/net/http2.(*Framer).ReadFrame",
        ];
        const K8S_BIN: &str = "/var/tmp/lifeline-k8s/v1.20.2/bin";
        let paths = std::env::var("GOBIN_INSPECT").unwrap_or_else(|_| {
            [
                "kubelet",
                "kube-proxy",
                "kube-controller-manager",
                "kube-scheduler",
            ]
            .map(|b| format!("{K8S_BIN}/{b}"))
            .join(":")
        });
        for path in paths.split(':') {
            let started = std::time::Instant::now();
            let found = inspect(Path::new(path), &named(&AGENT))
                .unwrap_or_else(|e| panic!("{e} (run `cargo xtask setup` to build the Kubernetes binaries)"));
            let took = started.elapsed();
            println!("{path}: {} in {took:?}", found.go_version);
            assert!(
                found.go_version.starts_with("go1.19"),
                "{path}: {}",
                found.go_version
            );
            for f in &found.functions {
                println!(
                    "  {} entry {:#x} end {:#x} offset {:#x} (probed at {:#x}), {} RETs at {:x?}, check after the first call {:x?}",
                    f.name,
                    f.entry,
                    f.end,
                    f.entry_offset,
                    f.entry_probe_offset,
                    f.returns.len(),
                    f.returns,
                    f.call_check
                );
            }
            let names: Vec<&str> = found.functions.iter().map(|f| f.name.as_str()).collect();
            for name in AGENT {
                assert!(names.contains(&name), "{path}: no {name}; found {names:?}");
            }
            for f in found
                .functions
                .iter()
                .filter(|f| f.name.ends_with("readFrameHeader"))
            {
                assert_frame_probe_reads_both(f);
            }
            // Both copies' ReadFrame keep the header in the result registers at their check.
            for f in found.functions.iter().filter(|f| f.name.ends_with("ReadFrame")) {
                assert!(f.frame_result.is_some(), "{path}: {}: no frame result", f.name);
            }
        }
    }

    /// How many copies of the client `path` has, and how many write probes [`http2::writes`]
    /// gives them (None: the written frames are read from TLS).
    fn writes_of(path: &str) -> (usize, Option<(usize, usize)>) {
        let found = inspect(Path::new(path), &|name| http2::role(name).is_some())
            .unwrap_or_else(|e| panic!("{e} (run `cargo xtask setup` to build the clients)"));
        let http2::Client::Recognised { write_header, .. } = http2::client(&found.functions) else {
            panic!("{path}: {:?}", http2::client(&found.functions));
        };
        let writes = http2::writes(&found.functions, &write_header);
        (
            write_header.len(),
            writes.map(|w| (w.headers.len(), w.resets.len())),
        )
    }

    /// Whose requests and resets are read from registers: every client of the Go matrix
    /// (go1.19 to go1.27: executable, PIE, x/net), kubectl 1.32 and 1.36, the informer; not
    /// Kubernetes 1.20's components nor its kubectl, whose x/net of 2020 resets the stream of a
    /// closed response body (a stopped watch) itself.
    #[test]
    #[ignore = "root tier: reads the binaries that `cargo xtask setup` builds"]
    fn the_writes_come_from_registers_where_every_reset_goes_through_one_function() {
        const K8S_BIN: &str = "/var/tmp/lifeline-k8s/v1.20.2/bin";
        for binary in [
            "kubelet",
            "kube-controller-manager",
            "kube-proxy",
            "kube-scheduler",
        ] {
            let path = format!("{K8S_BIN}/{binary}");
            let (copies, writes) = writes_of(&path);
            assert_eq!((copies, writes), (2, None), "{path}");
        }
        assert_eq!(writes_of("/opt/lifeline-kubectl-1.20/usr/bin/kubectl").1, None);
        let clients = "/var/tmp/lifeline-go/clients";
        let manifest = std::fs::read_to_string(format!("{clients}/MANIFEST")).expect("the Go matrix");
        let mut modern: Vec<String> = manifest
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .map(|file| format!("{clients}/{file}"))
            .collect();
        assert!(modern.len() >= 24, "{manifest}");
        modern.extend(
            [
                "/usr/lib/google-cloud-sdk/bin/kubectl.1.32",
                "/var/tmp/lifeline-kubectl-1.36/usr/bin/kubectl",
                "/var/tmp/lifeline-go/informer/ll-informer",
            ]
            .map(String::from),
        );
        for path in &modern {
            let (copies, writes) = writes_of(path);
            assert_eq!(writes, Some((copies, copies)), "{path}");
        }
    }
}
