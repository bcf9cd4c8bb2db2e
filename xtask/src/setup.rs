//! `cargo xtask setup`: everything a fresh machine of this kind needs, idempotently.
use std::{fs, os::unix::fs::symlink, path::Path, process::Command};

use crate::{cargo, run, Failed, Result};

/// Debian packages the suites and the demo use.
const APT_PACKAGES: [&str; 15] = [
    "bpftrace",
    "iperf3",
    // capsh: the hardening suite runs the agent without chosen capabilities.
    "libcap2-bin",
    "iproute2",
    "iptables",
    "nftables",
    "bpftool",
    "haproxy",
    "prometheus",
    "prometheus-alertmanager",
    "python3-kubernetes",
    "procps",
    // `cargo xtask image`: the image's CA bundle; `--verify` imports into containerd; buildah
    // proves Containerfile builds.
    "ca-certificates",
    "containerd",
    "buildah",
];

const BPF_LINKER_VERSION: &str = "0.13.0";

/// What building the agent needs beyond cargo: `rust-src` and bpf-linker (for `cargo xtask
/// image` on a fresh machine, without the rest of setup).
pub fn toolchain() -> Result {
    run(Command::new("rustup").args(["component", "add", "rust-src"]))?;
    bpf_linker()
}

/// Where bpf-linker finds rustc's LLVM. It keeps an rpath to this directory: it must stay.
const LLVM_PREFIX: &str = "/opt/lifeline-llvm";

pub fn setup() -> Result {
    crate::require_root("setup")?;
    apt(&APT_PACKAGES)?;
    toolchain()?;
    kubectl_1_20()?;
    kubectl_1_36()?;
    // The Go release matrix: a watch client built by each Go toolchain Debian ships.
    crate::gomatrix::setup()?;
    // A client-go 0.32 shared informer built with go1.24, for the real-cluster tier.
    crate::informer::setup()?;
    tracefs()?;
    crate::kubernetes::setup()?;
    // `cargo xtask vm-test`: qemu, busybox and Debian 12's 6.1 kernel (kept in /var/tmp).
    crate::vm::setup()?;
    eprintln!("setup: done");
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Installs those of `packages` that are missing.
pub fn apt(packages: &[&str]) -> Result {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing))
}

/// bpf-linker built against the LLVM that ships inside the installed rustc (Debian has no
/// LLVM of the same major version): a prefix directory with `lib/libLLVM.so` pointing at it.
fn bpf_linker() -> Result {
    let sysroot = output(Command::new("rustc").args(["--print", "sysroot"]))?;
    let libdir = Path::new(sysroot.trim()).join("lib");
    let llvm = fs::read_dir(&libdir)
        .map_err(|e| Failed(format!("{}: {e}", libdir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libLLVM.so."))
        })
        .ok_or_else(|| Failed(format!("no libLLVM.so.* in {}", libdir.display())))?;
    let prefix_lib = Path::new(LLVM_PREFIX).join("lib");
    fs::create_dir_all(&prefix_lib).map_err(|e| Failed(format!("{}: {e}", prefix_lib.display())))?;
    for name in [
        "libLLVM.so".to_owned(),
        llvm.file_name().expect("file").to_string_lossy().into_owned(),
    ] {
        let link = prefix_lib.join(&name);
        let _ = fs::remove_file(&link);
        symlink(&llvm, &link).map_err(|e| Failed(format!("{}: {e}", link.display())))?;
    }
    let current = Command::new("bpf-linker").arg("--version").output();
    if current
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
    {
        return Ok(());
    }
    let llvm_major = llvm
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("libLLVM.so."))
        .and_then(|v| v.split('.').next())
        .ok_or_else(|| Failed(format!("cannot read the LLVM version from {}", llvm.display())))?
        .to_owned();
    run(cargo().env("LLVM_PREFIX", LLVM_PREFIX).args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--no-default-features",
        "--features",
        &format!("llvm-{llvm_major}"),
        "--locked",
        "--force",
    ]))
}

/// Where Debian's kubectl 1.20 (`kubernetes-client`, the client-go of the seeds' era) is
/// unpacked: the package conflicts with the machine's kubectl 1.32, so it is extracted, not
/// installed.
pub const KUBECTL_1_20_ROOT: &str = "/opt/lifeline-kubectl-1.20";
/// Its kubectl, under `KUBECTL_1_20_ROOT` (the tests name it `KUBECTL_1_20` in
/// `tests/src/kube_fixture.rs`).
pub const KUBECTL_1_20: &str = "/opt/lifeline-kubectl-1.20/usr/bin/kubectl";
/// The image's kubectl 1.32 itself (go1.23), not the dispatcher at `/usr/bin/kubectl` (the
/// tests' `KUBECTL_1_32_ITSELF`).
pub const KUBECTL_1_32_ITSELF: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";

fn kubectl_1_20() -> Result {
    if Path::new(KUBECTL_1_20).exists() {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("lifeline-kubectl-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    let download = || {
        run(Command::new("apt-get")
            .current_dir(&dir)
            .args(["download", "kubernetes-client"]))
    };
    if download().is_err() {
        // The package lists may be missing on a machine where every apt package was present.
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        download()?;
    }
    let deb = fs::read_dir(&dir)
        .map_err(|e| Failed(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| Failed("apt-get download kubernetes-client left no .deb".into()))?;
    run(Command::new("dpkg").arg("-x").arg(&deb).arg(KUBECTL_1_20_ROOT))?;
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

/// Where sid's kubectl 1.36.4 is extracted (`usr/bin/kubectl`): built with go1.27.1, whose
/// HTTP/2 client moved to `net/http/internal/http2` and whose `.gopclntab` no longer holds the
/// text start, a stripped PIE linked by the C linker. The version is named: the machine's own
/// kubectl would otherwise be the candidate, and the tests expect this Go release.
pub const KUBECTL_1_36_ROOT: &str = "/var/tmp/lifeline-kubectl-1.36";
const KUBECTL_1_36: &str = "kubectl=1.36.4+ds-1";

fn kubectl_1_36() -> Result {
    let root = Path::new(KUBECTL_1_36_ROOT);
    if root.join("usr/bin/kubectl").exists() {
        return Ok(());
    }
    // Extracted beside it and renamed into place: an interrupted run leaves no half tree.
    let partial = Path::new(&format!("{KUBECTL_1_36_ROOT}.partial")).to_owned();
    let _ = fs::remove_dir_all(&partial);
    crate::debian::Release::open("sid")?.extract(KUBECTL_1_36, &partial)?;
    fs::rename(&partial, root).map_err(|e| Failed(format!("{}: {e}", root.display())))
}

/// tracefs at /sys/kernel/tracing (the agent's tracepoints; the DaemonSet mounts it from the
/// host).
pub fn tracefs() -> Result {
    if Path::new("/sys/kernel/tracing/events/sock").exists() {
        return Ok(());
    }
    run(Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]))
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .map_err(|e| Failed(format!("{}: {e}", crate::show(cmd))))?;
    if !out.status.success() {
        return Err(Failed(format!("{} exited with {}", crate::show(cmd), out.status)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
