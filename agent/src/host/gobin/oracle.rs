//! Test oracles for the gobin reader, independent of it: a small Go client (testdata/client)
//! built with Go's own toolchain, stripped (`-s -w`, what the reader reads) and not (what `go
//! tool objdump` disassembles), Go's `debug/gosym` over the stripped binary's `.gopclntab`
//! (testdata/gosym), and `go version`. The Go toolchain is required: without it the tests
//! fail, naming it.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The binaries, built once per test process.
pub struct Built {
    pub dir: PathBuf,
    pub stripped: PathBuf,
    pub unstripped: PathBuf,
    /// `-buildmode=pie`, linked by Go: the table is `.data.rel.ro.gopclntab`.
    pub pie: Variant,
    /// `-buildmode=pie -linkmode=external` (cgo, the system's C linker): the table is merged
    /// into `.data.rel.ro`.
    pub pie_external: Variant,
    gosym: PathBuf,
}

/// Another build of the client, stripped and not.
pub struct Variant {
    pub stripped: PathBuf,
    pub unstripped: PathBuf,
}

/// One function as `go tool objdump` shows it.
#[derive(Debug)]
pub struct Disassembly {
    pub entry: u64,
    /// The end of the last instruction (the padding after it is not shown).
    pub end: u64,
    /// The function's bytes, from the hex column.
    pub bytes: Vec<u8>,
    /// The addresses of its RET instructions.
    pub returns: Vec<u64>,
    /// The address of a conditional jump among its first four instructions (the stack check's).
    pub early_jump: Option<u64>,
    /// The address of `JNE` right after the first `CALL` and a `TESTQ BX, BX`.
    pub check_after_first_call: Option<u64>,
}

/// The testdata binaries, built with Go on first use into `target/gobin-test` (Go builds are
/// reproducible, and each output is renamed into place, so concurrent test runs agree).
pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/host/gobin/testdata");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/gobin-test");
        std::fs::create_dir_all(&dir).expect("create target/gobin-test");
        let build = |module: &str, output: &str, flags: &[&str]| {
            let cgo = flags.iter().any(|f| f.contains("-linkmode=external"));
            let target = dir.join(output);
            let partial = dir.join(format!("{output}.{}", std::process::id()));
            let out = go(&dir)
                .env("CGO_ENABLED", if cgo { "1" } else { "0" })
                .arg("build")
                .args(flags)
                .arg("-o")
                .arg(&partial)
                .arg(".")
                .current_dir(testdata.join(module))
                .output()
                .unwrap_or_else(|e| panic!("{}", missing_go(e)));
            assert!(
                out.status.success(),
                "go build {flags:?} of testdata/{module} failed (with cgo: {cgo}, which needs a C \
                 compiler and linker, `cc`): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::rename(&partial, &target).expect("rename the Go build into place");
            target
        };
        // Position-independent, linked with `ldflags`.
        let pie = |name: &str, ldflags: &str| Variant {
            stripped: build(
                "client",
                &format!("client-{name}-stripped"),
                &["-buildmode=pie", &format!("-ldflags=-s -w {ldflags}")],
            ),
            unstripped: build(
                "client",
                &format!("client-{name}"),
                &["-buildmode=pie", &format!("-ldflags={ldflags}")],
            ),
        };
        Built {
            stripped: build("client", "client-stripped", &["-ldflags=-s -w"]),
            unstripped: build("client", "client", &[]),
            pie: pie("pie", ""),
            pie_external: pie("pie-external", "-linkmode=external"),
            gosym: build("gosym", "gosym", &[]),
            dir,
        }
    })
}

/// `go`, offline, with no module downloads and a cache of its own.
fn go(dir: &Path) -> Command {
    let mut command = Command::new("go");
    command
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOCACHE", dir.join("gocache"));
    command
}

fn missing_go(e: std::io::Error) -> String {
    format!(
        "the gobin tests need the Go toolchain: cannot run `go` ({e}); install Go 1.19 \
         (`cargo xtask setup` installs golang-1.19 as /usr/bin/go)"
    )
}

/// Runs `go` with `args` in the build directory and returns its standard output.
fn go_output(args: &[&str]) -> String {
    let built = built();
    let out = go(&built.dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}", missing_go(e)));
    assert!(
        out.status.success(),
        "go {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("go prints UTF-8")
}

/// What `go version <binary>` says the binary was built with.
pub fn go_version(binary: &Path) -> String {
    let out = go_output(&["version", binary.to_str().expect("UTF-8 path")]);
    // "<path>: go1.19.8"
    out.trim()
        .rsplit(": ")
        .next()
        .expect("go version prints path: version")
        .to_owned()
}

/// `debug/gosym`'s entry and end of `name` in `binary`, if it has it.
pub fn gosym(binary: &Path, name: &str) -> Option<(u64, u64)> {
    let built = built();
    let out = Command::new(&built.gosym)
        .arg(binary)
        .arg(name)
        .output()
        .expect("run the gosym oracle");
    assert!(
        out.status.success(),
        "gosym oracle: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8(out.stdout).expect("UTF-8");
    let line = out.lines().next()?;
    let mut fields = line.split(' ');
    let hex = |f: Option<&str>| u64::from_str_radix(f.expect("entry end name"), 16).expect("hex");
    let (entry, end) = (hex(fields.next()), hex(fields.next()));
    assert_eq!(fields.next(), Some(name));
    Some((entry, end))
}

/// `go tool objdump -s '^name$' binary`, parsed.
pub fn objdump(binary: &Path, name: &str) -> Disassembly {
    let pattern = format!("^{}$", regex_quote(name));
    let out = go_output(&["tool", "objdump", "-s", &pattern, binary.to_str().expect("UTF-8")]);
    let mut lines = out.lines();
    let header = lines.next().expect("objdump prints the function");
    assert!(
        header.starts_with(&format!("TEXT {name}(SB)")),
        "objdump: {header}"
    );
    let mut found = Disassembly {
        entry: 0,
        end: 0,
        bytes: Vec::new(),
        returns: Vec::new(),
        early_jump: None,
        check_after_first_call: None,
    };
    // The instructions since the first CALL, while looking for its check.
    let mut since_call = None::<usize>;
    for (index, line) in lines.enumerate() {
        assert!(!line.starts_with("TEXT"), "objdump matched more than {name}");
        // "  file.go:12\t0x5e8880\t\t493b6610\t\tCMPQ 0x10(R14), SP\t"
        let fields: Vec<&str> = line
            .split('\t')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        let [_, address, hex, instruction, ..] = fields[..] else {
            panic!("objdump line {line:?}");
        };
        let address = u64::from_str_radix(address.trim_start_matches("0x"), 16).expect("address");
        if found.bytes.is_empty() {
            found.entry = address;
        }
        assert_eq!(
            address,
            found.entry + found.bytes.len() as u64,
            "objdump gap at {line:?}"
        );
        for i in (0..hex.len()).step_by(2) {
            found
                .bytes
                .push(u8::from_str_radix(&hex[i..i + 2], 16).expect("hex byte"));
        }
        if instruction == "RET" || instruction.starts_with("RET ") {
            found.returns.push(address);
        }
        if index < 4 && instruction.starts_with('J') && !instruction.starts_with("JMP") {
            found.early_jump.get_or_insert(address);
        }
        match since_call {
            None if instruction.starts_with("CALL ") => since_call = Some(0),
            Some(0) if instruction == "TESTQ BX, BX" => since_call = Some(1),
            Some(1) if instruction.starts_with("JNE ") => {
                found.check_after_first_call = Some(address);
                since_call = Some(2);
            }
            Some(0 | 1) => since_call = Some(2),
            _ => {}
        }
    }
    found.end = found.entry + found.bytes.len() as u64;
    found
}

/// `name` with the regular-expression metacharacters Go names contain escaped.
fn regex_quote(name: &str) -> String {
    let mut quoted = String::new();
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted
}
