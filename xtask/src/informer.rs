//! A real client-go informer for the real-cluster tier and the streams bench:
//! `tests/clients/informer` (a SharedInformerFactory over ConfigMaps and Secrets, or over Pods
//! with `--pods`) built against trixie's
//! `golang-k8s-client-go-dev` (client-go 0.32) with trixie's go1.24, in GOPATH mode (no module
//! proxy), stripped as Kubernetes builds (`-ldflags=-s -w`). The client-go source and its
//! `golang-*` dependency closure are extracted through [`crate::debian`] (nothing installed)
//! under [`DIR`]; the binary is [`BIN`], rebuilt only when the source differs from the copy
//! kept beside it: a warm run reads two files.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use crate::{gomatrix, run, Failed, Result};

/// Where the extracted source tree, the GOPATH and the binary are kept.
pub const DIR: &str = "/var/tmp/lifeline-go/informer";
/// The informer the real-cluster tier runs (`tests/src/real_cluster/clients.rs`).
pub const BIN: &str = "/var/tmp/lifeline-go/informer/ll-informer";
/// The suite and Go release it is built from: client-go 0.32.3 with go1.24.
const SUITE: &str = "trixie";
const GO: &str = "1.24";
const CLIENT_GO: &str = "golang-k8s-client-go-dev";
/// In the closure but overlapping `golang-github-golang-protobuf-1-5-dev`'s files.
const DROPPED: [&str; 1] = ["golang-github-golang-protobuf-1-3-dev"];

pub fn setup() -> Result {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/clients/informer/main.go");
    let text = fs::read_to_string(&source).map_err(|e| Failed(format!("{}: {e}", source.display())))?;
    // The source it was built from, kept beside it: the cache key.
    let built_from = Path::new(DIR).join("ll-informer.go");
    if Path::new(BIN).exists() && fs::read_to_string(&built_from).is_ok_and(|t| t == text) {
        eprintln!("informer: {BIN} cached");
        return Ok(());
    }
    let started = Instant::now();
    fs::create_dir_all(DIR).map_err(|e| Failed(format!("{DIR}: {e}")))?;
    let goroot = gomatrix::toolchain(SUITE, GO)?;
    let gocode = sources()?;
    let partial = Path::new(DIR).join("ll-informer.partial");
    run(Command::new(goroot.join("bin/go"))
        .env("GOROOT", &goroot)
        .env(
            "GOPATH",
            format!("{DIR}/gopath:{}", gocode.join("usr/share/gocode").display()),
        )
        .env("GOCACHE", Path::new(gomatrix::ROOT).join("cache").join(GO))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .args(["build", "-ldflags=-s -w", "-o"])
        .arg(&partial)
        .arg(&source))?;
    fs::rename(&partial, BIN).map_err(|e| Failed(format!("{BIN}: {e}")))?;
    fs::write(&built_from, &text).map_err(|e| Failed(format!("{}: {e}", built_from.display())))?;
    eprintln!(
        "informer: built {BIN} (client-go of {SUITE}, go{GO}) in {:.0} s (cold: package download and extraction included)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The extracted tree of client-go and its `golang-*` dependency closure (`usr/share/gocode`
/// inside), extracted once.
fn sources() -> Result<PathBuf> {
    let dir = Path::new(DIR).join("gocode");
    if dir
        .join("usr/share/gocode/src/k8s.io/client-go/informers")
        .exists()
    {
        return Ok(dir);
    }
    let release = crate::debian::Release::open(SUITE)?;
    let partial = Path::new(DIR).join("gocode.partial");
    let _ = fs::remove_dir_all(&partial);
    for package in closure(&release)? {
        release.extract(&package, &partial)?;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// client-go and the source packages it depends on, recursively: the `golang-*-dev` ones (the
/// toolchain's own packages, `golang-1.NN-go` and the like, are not sources).
fn closure(release: &crate::debian::Release) -> Result<Vec<String>> {
    let tree = release.cache(&[
        "depends",
        "--recurse",
        "--no-recommends",
        "--no-suggests",
        "--no-conflicts",
        "--no-breaks",
        "--no-replaces",
        "--no-enhances",
        CLIENT_GO,
    ])?;
    let mut packages: Vec<String> = tree
        .lines()
        .filter(|l| !l.starts_with(' '))
        .map(str::trim)
        .filter(|p| p.starts_with("golang-") && p.ends_with("-dev") && !DROPPED.contains(p))
        .map(str::to_owned)
        .collect();
    packages.sort();
    packages.dedup();
    if !packages.iter().any(|p| p == CLIENT_GO) {
        return Err(Failed(format!("{SUITE}: no {CLIENT_GO} in {packages:?}")));
    }
    Ok(packages)
}
