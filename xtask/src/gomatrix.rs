//! The Go release matrix: the watch client `tests/clients/go-watch` built by every Go
//! toolchain Debian ships (one line per release in [`RELEASES`]), stripped as Kubernetes
//! builds (`-ldflags=-s -w`), as an executable and as a PIE, for the judgement test
//! `every_go_release_s_hung_watch_is_stuck_and_named`. The toolchains (`golang-1.NN-go` and
//! `golang-1.NN-src`, extracted through [`crate::debian`], nothing installed) and the clients
//! are kept under [`ROOT`]: a warm run rebuilds nothing.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{run, Failed, Result};

/// Where the toolchains, the build cache and the clients are kept.
pub const ROOT: &str = "/var/tmp/lifeline-go";
/// Where the clients are written: `go-watch-1.NN-exe`, `go-watch-1.NN-pie`, and `MANIFEST`
/// (one line each: file name, Go release).
pub const CLIENTS: &str = "/var/tmp/lifeline-go/clients";

/// Each Go release Debian ships (register ABI, 1.17+), and the suite that has it.
const RELEASES: [(&str, &str); 7] = [
    ("bookworm", "1.19"),
    ("bookworm-backports", "1.21"),
    ("bookworm-backports", "1.22"),
    ("bookworm-backports", "1.23"),
    ("trixie", "1.24"),
    ("sid", "1.26"),
    ("sid", "1.27"),
];

/// The build variants: name and `go build` flags.
const VARIANTS: [(&str, &[&str]); 2] = [
    ("exe", &["-ldflags=-s -w"]),
    ("pie", &["-buildmode=pie", "-ldflags=-s -w"]),
];

/// Extracts each toolchain and builds the clients that are missing or were built from another
/// source text.
pub fn setup() -> Result {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/clients/go-watch/main.go");
    let text = fs::read_to_string(&source).map_err(|e| Failed(format!("{}: {e}", source.display())))?;
    fs::create_dir_all(CLIENTS).map_err(|e| Failed(format!("{CLIENTS}: {e}")))?;
    // The source the clients were built from, kept beside them: the cache key (not the
    // source's mtime, which a fresh clone sets to now).
    let built_from = Path::new(CLIENTS).join("go-watch.source");
    let same_source = fs::read_to_string(&built_from).is_ok_and(|t| t == text);
    let mut manifest = String::new();
    for (suite, version) in RELEASES {
        let goroot = toolchain(suite, version)?;
        for (variant, flags) in VARIANTS {
            let out = Path::new(CLIENTS).join(format!("go-watch-{version}-{variant}"));
            if same_source && out.is_file() {
                continue;
            }
            let partial = beside(&out);
            run(Command::new(goroot.join("bin/go"))
                .env("GOROOT", &goroot)
                .env("GOPATH", Path::new(ROOT).join("gopath"))
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
                .arg(&source))?;
            fs::rename(&partial, &out).map_err(|e| Failed(format!("{}: {e}", out.display())))?;
        }
        manifest.push_str(&format!(
            "go-watch-{version}-exe go{version}\ngo-watch-{version}-pie go{version}\n"
        ));
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

/// GOROOT of Go `version` from `suite`, extracted once.
pub fn toolchain(suite: &str, version: &str) -> Result<PathBuf> {
    let dir = Path::new(ROOT).join(format!("go-{version}"));
    let goroot = dir.join(format!("usr/lib/go-{version}"));
    if goroot.join("bin/go").exists() && goroot.join("src/net/http").exists() {
        return Ok(goroot);
    }
    let partial = beside(&dir);
    let _ = fs::remove_dir_all(&partial);
    let release = crate::debian::Release::open(suite)?;
    for package in ["go", "src"] {
        release.extract(&format!("golang-{version}-{package}"), &partial)?;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    Ok(goroot)
}
