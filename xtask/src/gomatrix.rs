//! The Go release matrix: the watch client `tests/clients/go-watch` built by every Go
//! toolchain Debian ships (one line per release in [`RELEASES`]), stripped as Kubernetes
//! builds (`-ldflags=-s -w`), with the standard library's HTTP/2 client as an executable and
//! as a PIE, and with `golang.org/x/net/http2`'s (the x/net of the release's Debian suite,
//! GOPATH mode), for the judgement test `every_go_release_s_hung_watch_is_stuck_and_named`.
//! The toolchains (`golang-1.NN-go` and `golang-1.NN-src`), x/net and x/text
//! (`golang-golang-x-net-dev`, `golang-golang-x-text-dev`), extracted through
//! [`crate::debian`] (nothing installed), and the clients are kept under [`ROOT`]: a warm run
//! rebuilds nothing.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{run, Failed, Result};

/// Where the toolchains, the build cache and the clients are kept.
pub const ROOT: &str = "/var/tmp/lifeline-go";
/// Where the clients are written: `go-watch-1.NN-exe`, `go-watch-1.NN-pie`,
/// `go-watch-1.NN-xnet`, and `MANIFEST` (one line each: file name, Go release).
pub const CLIENTS: &str = "/var/tmp/lifeline-go/clients";

/// Each Go release Debian ships (register ABI, 1.17+), the suite that has it, and the suite
/// whose x/net it is built with (the backports have none of their own).
const RELEASES: [(&str, &str, &str); 8] = [
    ("bookworm", "1.19", "bookworm"),
    ("bookworm-backports", "1.21", "bookworm"),
    ("bookworm-backports", "1.22", "bookworm"),
    ("bookworm-backports", "1.23", "bookworm"),
    ("trixie", "1.24", "trixie"),
    ("trixie-backports", "1.25", "trixie"),
    ("sid", "1.26", "sid"),
    ("sid", "1.27", "sid"),
];

/// The build variants: name, the HTTP/2 client's source file beside `main.go`, `go build`
/// flags.
const VARIANTS: [(&str, &str, &[&str]); 3] = [
    ("exe", "transport_std.go", &["-ldflags=-s -w"]),
    ("pie", "transport_std.go", &["-buildmode=pie", "-ldflags=-s -w"]),
    ("xnet", "transport_xnet.go", &["-ldflags=-s -w"]),
];

/// The client's source files.
const SOURCES: [&str; 3] = ["main.go", "transport_std.go", "transport_xnet.go"];

/// Extracts each toolchain and builds the clients that are missing or were built from another
/// source text.
pub fn setup() -> Result {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/clients/go-watch");
    let mut text = String::new();
    for file in SOURCES {
        let path = dir.join(file);
        text += &fs::read_to_string(&path).map_err(|e| Failed(format!("{}: {e}", path.display())))?;
    }
    fs::create_dir_all(CLIENTS).map_err(|e| Failed(format!("{CLIENTS}: {e}")))?;
    // The source the clients were built from, kept beside them: the cache key (not the
    // source's mtime, which a fresh clone sets to now).
    let built_from = Path::new(CLIENTS).join("go-watch.source");
    let same_source = fs::read_to_string(&built_from).is_ok_and(|t| t == text);
    let mut manifest = String::new();
    for (suite, version, xnet_suite) in RELEASES {
        let goroot = toolchain(suite, version)?;
        for (variant, transport, flags) in VARIANTS {
            let out = Path::new(CLIENTS).join(format!("go-watch-{version}-{variant}"));
            manifest.push_str(&format!("go-watch-{version}-{variant} go{version}\n"));
            if same_source && out.is_file() {
                continue;
            }
            let partial = beside(&out);
            run(Command::new(goroot.join("bin/go"))
                .env("GOROOT", &goroot)
                .env("GOPATH", gopath(xnet_suite)?)
                .env("GOCACHE", Path::new(ROOT).join("cache").join(version))
                .env("GOTOOLCHAIN", "local")
                .env("GOPROXY", "off")
                .env("GO111MODULE", "off")
                .env("GOFLAGS", "")
                .env("CGO_ENABLED", "0")
                .arg("build")
                .args(flags)
                .arg("-o")
                .arg(&partial)
                .arg(dir.join("main.go"))
                .arg(dir.join(transport)))?;
            fs::rename(&partial, &out).map_err(|e| Failed(format!("{}: {e}", out.display())))?;
        }
    }
    fs::write(&built_from, &text).map_err(|e| Failed(format!("{}: {e}", built_from.display())))?;
    // What the judgement test runs: every client, with the Go release it must be read as.
    let list = Path::new(CLIENTS).join("MANIFEST");
    fs::write(&list, manifest).map_err(|e| Failed(format!("{}: {e}", list.display())))
}

/// `path` with `.partial` appended: built or extracted there, renamed into place, so an
/// interrupted run leaves nothing that looks done.
fn beside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// A GOPATH holding the x/net and x/text of Debian's `suite` (`usr/share/gocode`), extracted
/// once.
fn gopath(suite: &str) -> Result<PathBuf> {
    let packages = ["golang-golang-x-net-dev", "golang-golang-x-text-dev"].map(String::from);
    let complete = ["src/golang.org/x/net/http2", "src/golang.org/x/text"];
    extracted(
        suite,
        &format!("gopath-{suite}"),
        &packages,
        "usr/share/gocode",
        &complete,
    )
}

/// GOROOT of Go `version` from `suite`, extracted once.
pub fn toolchain(suite: &str, version: &str) -> Result<PathBuf> {
    let packages = ["go", "src"].map(|p| format!("golang-{version}-{p}"));
    let goroot = format!("usr/lib/go-{version}");
    extracted(
        suite,
        &format!("go-{version}"),
        &packages,
        &goroot,
        &["bin/go", "src/net/http"],
    )
}

/// The directory `inside` of Debian `suite`'s `packages` extracted into `ROOT/name`: kept
/// from an earlier run when each of its `complete` paths exists, extracted again otherwise.
fn extracted(
    suite: &str,
    name: &str,
    packages: &[String],
    inside: &str,
    complete: &[&str],
) -> Result<PathBuf> {
    let dir = Path::new(ROOT).join(name);
    let found = dir.join(inside);
    if complete.iter().all(|p| found.join(p).exists()) {
        return Ok(found);
    }
    let partial = beside(&dir);
    let _ = fs::remove_dir_all(&partial);
    let release = crate::debian::Release::open(suite)?;
    for package in packages {
        release.extract(package, &partial)?;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    Ok(found)
}
