//! `cargo xtask vm-test --kernel debian-5.10|debian-6.1|debian-6.12|host|PATH`: the agent
//! proven on another kernel, in a qemu guest.
//!
//! Everything lifeline knows about the kernel was first proven on the machine's own; users'
//! nodes run others (Debian 11 on 5.10, Debian 12 and Amazon Linux on 6.1, Debian 13 on 6.12,
//! ...), and an eBPF program the verifier
//! takes on one kernel can be rejected on another. So the guest boots the chosen kernel
//! directly (`qemu -kernel -initrd`, no disk, no network device) with a small initramfs: static
//! busybox, the static `lifeline` (built as `cargo xtask image` builds it), the static test
//! programs `ll-server` and `ll-client`, and the kernel's modules that the agent needs. Its
//! `/init` (`xtask/vm/init.sh`) mounts what the agent uses, loads the modules and runs the test
//! (`xtask/vm/test.sh`: `lifeline check`, detection on loopback and in a pod's namespace, a
//! kernel without BTF; then the root suites' chosen tests, [`vm_suites`]), then prints the
//! test's exit code on a marker line and powers off.
//!
//! - Only Debian packages are downloaded: `qemu-system-x86` and `busybox-static` are installed,
//!   the kernel package of the preset's suite is fetched through a private APT configuration
//!   ([`debian::Release`]: nothing installed) and extracted (`dpkg-deb -x`) into [`ROOT`], its
//!   modules decompressed, so a second run downloads nothing.
//! - KVM when a quick probe boot works; nested KVM can hang early in boot, silent after the
//!   decompressor (the probe gives up after 5 s of silence), then TCG.
//! - A guest that cannot boot, or does not finish within the timeout, fails the run; the guest
//!   is always killed. The timeout counts the guest's own time: what it waited for a CPU (it
//!   runs niced beside the real-cluster suites, and TCG needs its CPU) comes on top, up to the
//!   timeout again; a 5.10 guest starved by the end-to-end cluster once got no further than the
//!   BIOS in 900 s.
use std::{
    fs,
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use flate2::{write::GzEncoder, Compression};

use crate::{debian, image, run, show, vm_suites, workspace, Failed, Result};

/// Where kernels extracted from Debian packages are kept between runs.
pub const ROOT: &str = "/var/tmp/lifeline-vm";
/// What the host needs, from Debian (`xz` and `zstd` decompress the modules of kernels that
/// ship them compressed).
const APT_PACKAGES: [&str; 4] = ["qemu-system-x86", "busybox-static", "xz-utils", "zstd"];
/// The Debian kernels `--kernel` names: (preset, suite, the image package's prefix). Each is
/// the suite's cloud kernel (what its cloud images and nodes boot), whose metapackage
/// [`CLOUD_META`] names the current ABI's image package.
pub const PRESETS: [(&str, &str, &str); 3] = [
    ("debian-5.10", "bullseye", "linux-image-5.10."),
    ("debian-6.1", "bookworm", "linux-image-6.1."),
    ("debian-6.12", "trixie", "linux-image-6.12."),
];
const CLOUD_META: &str = "linux-image-cloud-amd64";
/// Modules of [`MODULES`] that older kernels build on their own and newer ones into another
/// (`nft_counter`: a module on 5.10, inside `nf_tables` on 6.1 and 6.12): taken where the
/// release has them, not missing where it does not.
const MERGED_LATER: [&str; 1] = ["net/netfilter/nft_counter.ko"];
/// How Debian ships a module: plain, or compressed (6.12: xz).
const MODULE_SUFFIXES: [&str; 3] = [".ko", ".ko.xz", ".ko.zst"];
/// Modules (under the release's `kernel/`) that Debian builds as modules and the agent, or the
/// test, needs, in load order: `inet_diag` + `tcp_diag` (sock_diag: the start-up scan, tcp_info,
/// SOCK_DESTROY), `veth` (network-namespace tests), and what the root suites' harness needs
/// for its iptables (nft) rule `-m conntrack ! --ctstate DNAT -j REJECT`.
const MODULES: [&str; 15] = [
    "net/ipv4/inet_diag.ko",
    "net/ipv4/tcp_diag.ko",
    "drivers/net/veth.ko",
    "net/netfilter/nfnetlink.ko",
    "lib/libcrc32c.ko",
    "net/netfilter/nf_tables.ko",
    // iptables-nft puts a counter on every rule.
    "net/netfilter/nft_counter.ko",
    "net/netfilter/x_tables.ko",
    "net/netfilter/nft_compat.ko",
    "net/ipv4/netfilter/nf_defrag_ipv4.ko",
    "net/ipv6/netfilter/nf_defrag_ipv6.ko",
    "net/netfilter/nf_conntrack.ko",
    "net/netfilter/xt_conntrack.ko",
    "net/ipv4/netfilter/nf_reject_ipv4.ko",
    "net/ipv4/netfilter/ipt_REJECT.ko",
];
/// What each preset's kernel lacks, as `lifeline check` names it on its `evidence` lines
/// (their starts, all of them: a kernel that gains or loses one is news), and the client
/// uprobe sets it refuses, as the agent's log says (a `grep -E` pattern `test.sh` then
/// requires; empty: none refused, and any refusal fails).
const EXPECTED: [(&str, &[&str], &str); 3] = [
    (
        "debian-5.10",
        &[
            "tcp/tcp_retransmit_skb has no family field",
            // A raw tracepoint of 5.15.
            "inet_sk_error_report not available",
            // The request line's path is scanned with bpf_loop (5.17).
            "the OpenSSL-client uprobes not available",
        ],
        "requests are not followed",
    ),
    (
        "debian-6.1",
        &["every field and program the agent reads is in this kernel"],
        "",
    ),
    (
        "debian-6.12",
        &["every field and program the agent reads is in this kernel"],
        "",
    ),
];
const INIT: &str = include_str!("../vm/init.sh");
/// The default test run in the guest.
const TEST: &str = include_str!("../vm/test.sh");
const EXIT_MARKER: &str = "LIFELINE-VM-EXIT ";
const BEGIN_MARKER: &str = "LIFELINE-VM-BEGIN";
const KERNEL_MARKER: &str = "LIFELINE-VM-KERNEL ";

/// The default timeout of a guest run (boot, `test.sh`, the root suites, power-off), of the
/// guest's own time: what it waits for a CPU while the host's other work runs comes on top,
/// up to as much again (see [`boot`]).
pub const TIMEOUT_SECS: u64 = 900;

/// What `cargo xtask vm-test` was asked for.
pub struct Options {
    /// One of [`PRESETS`], `host`, or a path to a kernel image.
    pub kernel: String,
    /// With `--kernel PATH`: a `/lib/modules/RELEASE` directory to take [`MODULES`] from
    /// (plain, `.xz` or `.zst`).
    pub modules: Option<PathBuf>,
    /// A shell command to run in the guest instead of the default test.
    pub command: Option<String>,
    /// Only `test.sh`, not the root suites' tests.
    pub no_suites: bool,
    /// Use the binaries already built.
    pub no_build: bool,
    /// The whole guest run (boot, test, power-off) must end within this.
    pub timeout: Duration,
}

impl Options {
    pub fn new(kernel: &str) -> Options {
        Options {
            kernel: kernel.to_owned(),
            modules: None,
            command: None,
            no_suites: false,
            no_build: false,
            timeout: Duration::from_secs(TIMEOUT_SECS),
        }
    }
}

/// A kernel to boot: its image and the modules to load, in order.
struct Kernel {
    name: String,
    /// `uname -r` it should report, when known.
    release: Option<String>,
    vmlinuz: PathBuf,
    modules: Vec<PathBuf>,
}

/// What the guest said.
pub struct Outcome {
    /// The test's output (between the begin and exit markers).
    pub output: String,
    /// The test's exit code.
    pub code: i32,
    /// How long the guest waited for a CPU (the most delayed of its threads).
    pub waited: Duration,
}

/// What `cargo xtask setup` prepares: the packages, and every [`PRESETS`] kernel in [`ROOT`].
pub fn setup() -> Result {
    crate::setup::apt(&APT_PACKAGES)?;
    for (preset, suite, prefix) in PRESETS {
        debian_kernel(preset, suite, prefix)?;
    }
    Ok(())
}

/// Boots the kernel, runs the test in it; fails unless the test exits 0.
pub fn vm_test(options: &Options) -> Result {
    let outcome = run_guest(options)?;
    if options.command.is_none() && !options.no_suites {
        // Before the exit code: which of the suites' tests did not pass, by name.
        vm_suites::verify(&outcome.output, &vm_suites::chosen(&options.kernel))?;
    }
    if options.command.is_none() && outcome.code == 0 {
        if let Some((_, evidence, _)) = EXPECTED.iter().find(|(k, ..)| *k == options.kernel) {
            check_evidence(&outcome.output, evidence)
                .map_err(|why| Failed(format!("vm-test on {}: {why}", options.kernel)))?;
        }
    }
    if outcome.code != 0 {
        let failures: Vec<&str> = outcome.output.lines().filter(|l| l.starts_with("FAIL")).collect();
        return Err(Failed(format!(
            "vm-test on {}: the guest's test exited {}: {}",
            options.kernel,
            outcome.code,
            failures.join("; ")
        )));
    }
    Ok(())
}

/// Fails unless the `evidence` lines of `lifeline check` in `output` are those `expected`
/// starts, each once.
fn check_evidence(output: &str, expected: &[&str]) -> std::result::Result<(), String> {
    let lines: Vec<&str> = output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("[info] evidence"))
        .map(str::trim)
        .collect();
    let unexpected: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !expected.iter().any(|e| l.starts_with(e)))
        .collect();
    let missing: Vec<&str> = expected
        .iter()
        .copied()
        .filter(|e| lines.iter().filter(|l| l.starts_with(e)).count() != 1)
        .collect();
    if unexpected.is_empty() && missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "`lifeline check` lists other evidence than this kernel's: unexpected {unexpected:?}, missing {missing:?} (see EXPECTED in xtask/src/vm.rs)"
    ))
}

/// Boots the kernel and runs the test (or `options.command`) in it: its output and exit code.
/// Fails if the guest does not boot, or does not finish within the timeout.
pub fn run_guest(options: &Options) -> Result<Outcome> {
    let started = Instant::now();
    crate::require_root("vm-test")?;
    crate::setup::apt(&APT_PACKAGES)?;
    let kernel = kernel(options)?;
    let mut binaries = binaries(options.no_build)?;
    let dir = workspace().join("target/vm");
    fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    // The default test is `test.sh`, then the root suites' chosen tests.
    // What test.sh lets this kernel refuse (it fails on any other refusal).
    let refused = EXPECTED
        .iter()
        .find(|(k, ..)| *k == options.kernel)
        .map_or("", |(.., refused)| *refused);
    assert!(
        !refused.contains('\''),
        "EXPECTED: a refusal pattern goes in single quotes"
    );
    let test_sh = format!("REFUSED='{refused}'\n{TEST}");
    let test = match &options.command {
        Some(command) => command.clone(),
        None if options.no_suites => test_sh,
        None => {
            let chosen = vm_suites::chosen(&options.kernel);
            for (kernel, suite, test, why) in vm_suites::LACKING {
                if kernel == options.kernel {
                    eprintln!("vm-test: {kernel}: {suite}::{test} left out: {why}");
                }
            }
            let suites = vm_suites::prepare(
                options.no_build,
                &dir,
                &dir.join("ll-client"),
                &dir.join("ll-server"),
                &chosen,
            )?;
            binaries.extend(suites.files);
            format!("{test_sh}\n{}", suites.script)
        }
    };
    let initrd = dir.join("initramfs.cpio.gz");
    write_initramfs(&initrd, &kernel, &binaries, &test)?;
    let accel = accel(&kernel, &dir)?;
    eprintln!(
        "vm-test: booting {} ({}) under {accel}, timeout {} s",
        kernel.name,
        kernel.vmlinuz.display(),
        options.timeout.as_secs()
    );
    let booted = Instant::now();
    // A kernel that dies before the test begins ran none of it: one more boot, said.
    let outcome = match boot(&kernel, &initrd, accel, options.timeout, true, None)? {
        Booted::Ran(outcome) => outcome,
        Booted::NoTest(why) => {
            eprintln!(
                "vm-test: {why}\nvm-test: the test never began: booting {} once more",
                kernel.name
            );
            match boot(&kernel, &initrd, accel, options.timeout, true, None)? {
                Booted::Ran(outcome) => outcome,
                Booted::NoTest(why) => return Err(Failed(why)),
            }
        }
    };
    eprintln!(
        "vm-test: {} under {accel}: the guest's test exited {} ({:.1} s from boot to power-off, {:.0} s of it waiting for a CPU; {:.1} s in all)",
        kernel.name,
        outcome.code,
        booted.elapsed().as_secs_f64(),
        outcome.waited.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(outcome)
}

fn kernel(options: &Options) -> Result<Kernel> {
    if let Some((preset, suite, prefix)) = PRESETS.iter().find(|(p, ..)| *p == options.kernel) {
        return debian_kernel(preset, suite, prefix);
    }
    match options.kernel.as_str() {
        "host" => host_kernel(),
        path => {
            let vmlinuz = PathBuf::from(path);
            if !vmlinuz.is_file() {
                return Err(Failed(format!(
                    "--kernel {path}: not a file ({}, host, or a kernel image's path)",
                    PRESETS.map(|(p, ..)| p).join(", ")
                )));
            }
            let modules = match &options.modules {
                Some(dir) => {
                    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
                    let into = workspace()
                        .join("target/vm/modules")
                        .join(name.unwrap_or_default());
                    take_modules(dir, &into)?
                }
                None => Vec::new(),
            };
            Ok(Kernel {
                name: path.to_owned(),
                release: None,
                vmlinuz,
                modules,
            })
        }
    }
}

/// This machine's own kernel, as the control: `/boot/vmlinuz-$(uname -r)`.
fn host_kernel() -> Result<Kernel> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(|e| Failed(format!("/proc/sys/kernel/osrelease: {e}")))?
        .trim()
        .to_owned();
    let vmlinuz = PathBuf::from(format!("/boot/vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        return Err(Failed(format!(
            "--kernel host: {} is not on this machine (a VM booted from outside, as \
             Firecracker does, has no image of its own kernel): pass its image as --kernel PATH",
            vmlinuz.display()
        )));
    }
    let tree = PathBuf::from(format!("/lib/modules/{release}"));
    let modules = if tree.is_dir() {
        take_modules(&tree, &workspace().join("target/vm/modules").join(&release))?
    } else {
        Vec::new()
    };
    Ok(Kernel {
        name: format!("host {release}"),
        release: Some(release),
        vmlinuz,
        modules,
    })
}

/// [`MODULES`] from a release's module directory (`/lib/modules/RELEASE`), decompressed into
/// `into` as plain `.ko` files (busybox `insmod` takes no other), in load order. A module the
/// kernel has built in (`modules.builtin`) is skipped; one neither there nor built in fails,
/// named.
fn take_modules(tree: &Path, into: &Path) -> Result<Vec<PathBuf>> {
    let builtin = fs::read_to_string(tree.join("modules.builtin")).unwrap_or_default();
    let _ = fs::remove_dir_all(into);
    fs::create_dir_all(into).map_err(|e| Failed(format!("{}: {e}", into.display())))?;
    let mut kept = Vec::new();
    for module in MODULES {
        let stem = module.strip_suffix(".ko").expect("MODULES end in .ko");
        let found = MODULE_SUFFIXES
            .iter()
            .map(|suffix| tree.join("kernel").join(format!("{stem}{suffix}")))
            .find(|p| p.is_file());
        let Some(found) = found else {
            if MERGED_LATER.contains(&module) || builtin.lines().any(|l| l == format!("kernel/{module}")) {
                continue;
            }
            return Err(Failed(format!(
                "module {module} is neither in {}/kernel (as {}) nor built in ({}/modules.builtin)",
                tree.display(),
                MODULE_SUFFIXES.join(", "),
                tree.display()
            )));
        };
        let to = into.join(module_file(module));
        let bytes = decompressed(&found)?;
        fs::write(&to, bytes).map_err(|e| Failed(format!("{}: {e}", to.display())))?;
        kept.push(to);
    }
    check_load_order(&kept)?;
    Ok(kept)
}

/// A module file's contents, decompressed by `xz` or `zstd` as its name says.
fn decompressed(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        return read(path);
    };
    let mut cmd = Command::new(tool);
    cmd.args(["-d", "-c", "-q"]).arg(path);
    let out = cmd.output().map_err(|e| Failed(format!("{}: {e}", show(&cmd))))?;
    if !out.status.success() || out.stdout.is_empty() {
        return Err(Failed(format!(
            "{} exited with {}: {}",
            show(&cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// A Debian suite's cloud kernel, extracted from its package once into `ROOT/PRESET`: its
/// image, config and [`MODULES`] (decompressed), named in the stamp with the module list it
/// was kept for.
fn debian_kernel(preset: &str, suite: &str, prefix: &str) -> Result<Kernel> {
    let dir = Path::new(ROOT).join(preset);
    let stamp = dir.join("stamp");
    let text = fs::read_to_string(&stamp).unwrap_or_default();
    let mut lines = text.lines();
    let (package, release, modules) = (lines.next(), lines.next(), lines.next());
    let (Some(package), Some(release), Some(modules)) = (package, release, modules) else {
        // Not extracted yet, or by a version of this that kept other things.
        fetch_debian(preset, suite, prefix, &dir)?;
        return debian_kernel_kept(preset, &dir);
    };
    if modules != MODULES.join(",") {
        // Kept for another list of modules.
        fetch_debian(preset, suite, prefix, &dir)?;
        return debian_kernel_kept(preset, &dir);
    }
    kernel_in(preset, &dir, package, release)
}

/// The kernel [`fetch_debian`] just kept in `dir`.
fn debian_kernel_kept(preset: &str, dir: &Path) -> Result<Kernel> {
    let stamp = dir.join("stamp");
    let text = fs::read_to_string(&stamp).map_err(|e| Failed(format!("{}: {e}", stamp.display())))?;
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(package), Some(release)) => kernel_in(preset, dir, package, release),
        _ => Err(Failed(format!(
            "{}: not `PACKAGE\\nRELEASE\\nMODULES`",
            stamp.display()
        ))),
    }
}

fn kernel_in(preset: &str, dir: &Path, package: &str, release: &str) -> Result<Kernel> {
    let order = dir.join("modules/order");
    let order = fs::read_to_string(&order).map_err(|e| {
        Failed(format!(
            "{}: {e}: remove {} and run again",
            order.display(),
            dir.display()
        ))
    })?;
    Ok(Kernel {
        name: format!("{preset} ({package})"),
        release: Some(release.to_owned()),
        vmlinuz: dir.join("vmlinuz"),
        modules: order.lines().map(|m| dir.join("modules").join(m)).collect(),
    })
}

fn module_file(path: &str) -> &str {
    path.rsplit('/').next().expect("a file name")
}

/// The image package `apt-cache depends` of the cloud metapackage names, for `prefix`.
fn image_package(depends: &str, prefix: &str) -> Option<String> {
    depends
        .lines()
        .filter_map(|l| l.trim().trim_start_matches('|').strip_prefix("Depends: "))
        .find(|p| p.starts_with(prefix))
        .map(str::to_owned)
}

/// Downloads the kernel package the suite's metapackage names now (`apt-get download` through
/// the suite's private APT configuration: nothing installed), and keeps its image, config and
/// [`MODULES`]; the stamp is written last.
fn fetch_debian(preset: &str, suite: &str, prefix: &str, dir: &Path) -> Result {
    let apt = debian::Release::open(suite)?;
    let depends = apt.cache(&["depends", CLOUD_META])?;
    let package = image_package(&depends, prefix).ok_or_else(|| {
        Failed(format!(
            "{suite}: `apt-cache depends {CLOUD_META}` names no {prefix}* package"
        ))
    })?;
    let version = apt.candidate(&package)?;
    // The image package of a signed kernel and of its `-unsigned` twin hold the same release.
    let release = package
        .strip_prefix("linux-image-")
        .expect("starts with the prefix")
        .trim_end_matches("-unsigned")
        .to_owned();
    let partial = PathBuf::from(format!("{}.partial", dir.display()));
    let _ = fs::remove_dir_all(&partial);
    let extracted = partial.join("deb");
    apt.extract(&format!("{package}={version}"), &extracted)?;
    let copy = |from: PathBuf, to: PathBuf| {
        fs::copy(&from, &to)
            .map(|_| ())
            .map_err(|e| Failed(format!("{package}: {}: {e}", from.display())))
    };
    copy(
        extracted.join(format!("boot/vmlinuz-{release}")),
        partial.join("vmlinuz"),
    )?;
    copy(
        extracted.join(format!("boot/config-{release}")),
        partial.join("config"),
    )?;
    // Merged /usr (6.12) puts them under usr/lib/modules.
    let tree = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| extracted.join(d).join(&release))
        .find(|d| d.is_dir())
        .ok_or_else(|| {
            Failed(format!(
                "{package}={version}: no lib/modules/{release} nor usr/lib/modules/{release} in it"
            ))
        })?;
    let kept = take_modules(&tree, &partial.join("modules"))?;
    let order: String = kept
        .iter()
        .map(|p| format!("{}\n", p.file_name().expect("a file").to_string_lossy()))
        .collect();
    let write = |path: PathBuf, text: String| {
        fs::write(&path, text).map_err(|e| Failed(format!("{}: {e}", path.display())))
    };
    write(partial.join("modules/order"), order)?;
    fs::remove_dir_all(&extracted).map_err(|e| Failed(format!("{}: {e}", extracted.display())))?;
    write(
        partial.join("stamp"),
        format!("{package}={version}\n{release}\n{}\n", MODULES.join(",")),
    )?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&partial, dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    eprintln!("vm-test: {preset}: {package} {version} kept in {}", dir.display());
    Ok(())
}

/// Fails unless each module's dependencies (its `.modinfo` `depends=`) come before it.
fn check_load_order(modules: &[PathBuf]) -> Result {
    let mut loaded: Vec<String> = Vec::new();
    for path in modules {
        let bytes = fs::read(path).map_err(|e| Failed(format!("{}: {e}", path.display())))?;
        for dep in modinfo_depends(&bytes) {
            if !loaded.contains(&dep) {
                return Err(Failed(format!(
                    "{} depends on {dep}, which is not loaded before it (add it to MODULES)",
                    path.display()
                )));
            }
        }
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().replace('-', "_"))
            .unwrap_or_default();
        loaded.push(name);
    }
    Ok(())
}

/// The `depends=` list of a module's `.modinfo` strings.
fn modinfo_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|&b| b == 0)
        .find_map(|s| s.strip_prefix(b"depends="))
        .map(|deps| {
            String::from_utf8_lossy(deps)
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| d.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

/// The static binaries the guest runs, with where they go: `lifeline` as `cargo xtask image`
/// builds it; `ll-server` and `ll-client` (std only) compiled alone with `rustc`, statically,
/// without the rest of their package's dependencies (kube, k8s-openapi: minutes of build).
fn binaries(no_build: bool) -> Result<Vec<(String, PathBuf)>> {
    let target = image::host_target()?;
    if !no_build {
        image::build_static(&target)?;
    }
    let lifeline = image::static_binary(&target);
    let mut out = vec![("usr/local/bin/lifeline".to_owned(), lifeline)];
    let dir = workspace().join("target/vm");
    fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    for (name, guest) in [
        ("ll-server", "usr/local/bin/ll-server"),
        ("ll-client", "usr/local/bin/ll-client"),
    ] {
        let source = workspace().join(format!("tests/src/bin/{name}.rs"));
        let binary = dir.join(name);
        if !(no_build && binary.is_file()) {
            run(Command::new("rustc")
                .args(["--edition", "2021", "-O", "--crate-name"])
                .arg(name.replace('-', "_"))
                .args(["-C", "target-feature=+crt-static", "--target", &target, "-o"])
                .arg(&binary)
                .arg(&source))?;
        }
        out.push((guest.to_owned(), binary));
    }
    for (_, binary) in &out {
        image::ensure_static(binary)?;
    }
    Ok(out)
}

/// The initramfs: busybox, the binaries, the modules (listed in load order in `/etc/modules`),
/// `/init` and `/test.sh`.
fn write_initramfs(path: &Path, kernel: &Kernel, binaries: &[(String, PathBuf)], test: &str) -> Result {
    let mut cpio = Cpio::new();
    for dir in [
        "bin",
        "dev",
        "etc",
        "lib",
        "lib/modules",
        "proc",
        "sys",
        "tmp",
        "usr",
        "usr/local",
        "usr/local/bin",
        "root",
        "run",
    ] {
        cpio.dir(dir);
    }
    // The kernel opens /dev/console for init before anything is mounted.
    cpio.char_device("dev/console", 5, 1);
    let busybox = Path::new("/bin/busybox");
    cpio.file("bin/busybox", 0o755, &read(busybox)?);
    cpio.file("init", 0o755, INIT.as_bytes());
    cpio.file("test.sh", 0o755, test.as_bytes());
    let mut order = String::new();
    for module in &kernel.modules {
        let name = module.file_name().expect("a file").to_string_lossy();
        cpio.file(&format!("lib/modules/{name}"), 0o644, &read(module)?);
        order.push_str(&name);
        order.push('\n');
    }
    cpio.file("etc/modules", 0o644, order.as_bytes());
    cpio.file(
        "etc/hosts",
        0o644,
        b"127.0.0.1 localhost lifeline-vm\n::1 localhost\n",
    );
    for (guest, host) in binaries {
        cpio.file(guest, 0o755, &read(host)?);
    }
    let bytes = cpio.finish()?;
    fs::write(path, bytes).map_err(|e| Failed(format!("{}: {e}", path.display())))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| Failed(format!("{}: {e}", path.display())))
}

/// A gzipped cpio archive in the `newc` format the kernel unpacks into its initramfs.
struct Cpio {
    out: GzEncoder<Vec<u8>>,
    ino: u32,
    error: Option<std::io::Error>,
    /// Directories written so far: a file's missing parents are written before it.
    dirs: std::collections::BTreeSet<String>,
}

impl Cpio {
    fn new() -> Cpio {
        Cpio {
            out: GzEncoder::new(Vec::new(), Compression::fast()),
            ino: 0,
            error: None,
            dirs: std::collections::BTreeSet::new(),
        }
    }

    fn dir(&mut self, name: &str) {
        if self.dirs.insert(name.to_owned()) {
            self.entry(name, 0o040755, (0, 0), &[]);
        }
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        let mut parent = String::new();
        for part in name
            .split('/')
            .rev()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            self.dir(&parent.clone());
        }
        self.entry(name, 0o100000 | mode, (0, 0), data);
    }

    fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let header = format!(
            "070701{:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            0,
            0,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0,
        );
        let mut bytes = header.into_bytes();
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        pad4(&mut bytes);
        bytes.extend_from_slice(data);
        pad4(&mut bytes);
        if let Err(e) = self.out.write_all(&bytes) {
            self.error.get_or_insert(e);
        }
    }

    fn finish(mut self) -> Result<Vec<u8>> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        if let Some(e) = self.error {
            return Err(Failed(format!("initramfs: {e}")));
        }
        self.out.finish().map_err(|e| Failed(format!("initramfs: {e}")))
    }
}

fn pad4(bytes: &mut Vec<u8>) {
    while !bytes.len().is_multiple_of(4) {
        bytes.push(0);
    }
}

/// `kvm` if `/dev/kvm` opens and a probe guest boots under it, else `tcg`
/// (`LIFELINE_VM_ACCEL=tcg|kvm` chooses). Probed once per run of xtask: whether nested KVM
/// works is the machine's, whichever kernel boots (a failed probe costs some 7 s, and
/// `cargo xtask test` boots three guests).
fn accel(kernel: &Kernel, dir: &Path) -> Result<&'static str> {
    static PROBED: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    match std::env::var("LIFELINE_VM_ACCEL").as_deref() {
        Ok("tcg") => return Ok("tcg"),
        Ok("kvm") => return Ok("kvm"),
        Ok(other) => return Err(Failed(format!("LIFELINE_VM_ACCEL={other}: tcg or kvm"))),
        Err(_) => {}
    }
    if let Some(accel) = PROBED.get() {
        return Ok(accel);
    }
    let accel = probe_accel(kernel, dir)?;
    Ok(PROBED.get_or_init(|| accel))
}

/// [`accel`]'s probe: `/dev/kvm`, then a guest that only powers off, booted under KVM.
fn probe_accel(kernel: &Kernel, dir: &Path) -> Result<&'static str> {
    if let Err(e) = fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        eprintln!("vm-test: /dev/kvm: {e}: TCG");
        return Ok("tcg");
    }
    let probe = dir.join("probe.cpio.gz");
    let mut cpio = Cpio::new();
    for d in ["bin", "dev", "proc"] {
        cpio.dir(d);
    }
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, &read(Path::new("/bin/busybox"))?);
    cpio.file(
        "init",
        0o755,
        format!("#!/bin/busybox sh\n/bin/busybox echo {BEGIN_MARKER}\n/bin/busybox echo {EXIT_MARKER}0\n/bin/busybox poweroff -f\n")
            .as_bytes(),
    );
    fs::write(&probe, cpio.finish()?).map_err(|e| Failed(format!("{}: {e}", probe.display())))?;
    let started = Instant::now();
    // Dead nested KVM hangs right after the decompressor ("Probing EDD ... ok", 2 s in) and
    // says nothing more; a live one prints the kernel's first line at once: 5 s of silence
    // end the probe rather than the whole 30 s.
    match boot(
        kernel,
        &probe,
        "kvm",
        Duration::from_secs(30),
        false,
        Some(Duration::from_secs(5)),
    ) {
        Ok(Booted::Ran(o)) if o.code == 0 => {
            eprintln!(
                "vm-test: KVM probe booted in {:.1} s: KVM",
                started.elapsed().as_secs_f64()
            );
            Ok("kvm")
        }
        Ok(_) | Err(_) => {
            eprintln!(
                "vm-test: KVM probe did not boot ({:.1} s; nested KVM can fail early in boot): TCG",
                started.elapsed().as_secs_f64()
            );
            Ok("tcg")
        }
    }
}

/// Kills the guest however the run ends.
struct Guest(Child);

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a boot came to when the guest ended by itself.
enum Booted {
    /// The test ran to its end.
    Ran(Outcome),
    /// The guest ended before the test began (its kernel panicked while booting: under TCG,
    /// Debian's 6.12 kernel has once oopsed at an int3 in `sched_clock_cpu` 4 s into boot).
    /// What its console said last.
    NoTest(String),
}

/// Boots `kernel` with `initrd` and waits for the exit marker (or the timeout, or qemu's end);
/// with `echo`, the guest's console is shown line by line as `guest| ...`. With `silence`,
/// the kernel prints from its first instruction on (`earlyprintk`, every message) and a
/// console silent that long ends the boot as failed.
fn boot(
    kernel: &Kernel,
    initrd: &Path,
    accel: &str,
    timeout: Duration,
    echo: bool,
    silence: Option<Duration>,
) -> Result<Booted> {
    let cpu = if accel == "kvm" { "host" } else { "max" };
    let append = if silence.is_some() {
        "console=ttyS0 earlyprintk=ttyS0 panic=-1 loglevel=8"
    } else {
        "console=ttyS0 panic=-1 quiet loglevel=4"
    };
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-machine", &format!("q35,accel={accel}"), "-cpu", cpu])
        .args(["-m", "2048", "-smp", "2", "-nic", "none"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", append, "-nographic", "-no-reboot"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if echo {
        eprintln!("+ {}", show(&cmd));
    }
    let mut child = cmd.spawn().map_err(|e| Failed(format!("{}: {e}", show(&cmd))))?;
    let (tx, rx) = mpsc::channel::<String>();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let text = String::from_utf8_lossy(&line)
                    .trim_end_matches(['\r', '\n'])
                    .to_owned();
                if tx.send(text).is_err() {
                    break;
                }
                line.clear();
            }
        });
    }
    drop(tx);
    let pid = child.id();
    let _guest = Guest(child);
    let started = Instant::now();
    let mut last_line = started;
    let mut lines: Vec<String> = Vec::new();
    let mut output = String::new();
    let mut begun = false;
    let mut code = None;
    let mut release = None;
    while code.is_none() {
        let now = Instant::now();
        // The timeout counts the guest's own time: what it waited for a CPU while other work
        // of the host ran (it runs niced beside the real-cluster suites) comes on top.
        let waited = run_queue_wait(pid);
        let deadline = guest_deadline(started, timeout, waited);
        if now >= deadline {
            return Err(Failed(format!(
                "{}: the guest did not finish within {} s of its own, {:.0} s more waiting for a CPU (killed); last lines:\n{}",
                kernel.name,
                timeout.as_secs(),
                waited.as_secs_f64(),
                tail(&lines)
            )));
        }
        let quiet_until = silence.map(|s| last_line + s);
        if quiet_until.is_some_and(|q| now >= q) {
            return Err(Failed(format!(
                "{}: the guest's console was silent for {} s (killed); last lines:\n{}",
                kernel.name,
                silence.unwrap_or_default().as_secs(),
                tail(&lines)
            )));
        }
        let wait = quiet_until
            .map_or(deadline, |q| q.min(deadline))
            .saturating_duration_since(now)
            .min(DEADLINE_EVERY);
        let line = match rx.recv_timeout(wait) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        last_line = Instant::now();
        if echo {
            eprintln!("guest| {line}");
        }
        if let Some(r) = line.strip_prefix(KERNEL_MARKER) {
            release = Some(r.trim().to_owned());
        } else if line.trim() == BEGIN_MARKER {
            begun = true;
        } else if let Some(c) = line.strip_prefix(EXIT_MARKER) {
            code = c.trim().parse().ok();
        } else if begun {
            output.push_str(&line);
            output.push('\n');
        }
        lines.push(line);
    }
    let Some(code) = code else {
        let why = format!(
            "{}: the guest ended without running the test to its end (no boot, a panic, or qemu failed); last lines:\n{}",
            kernel.name,
            tail(&lines)
        );
        return if begun {
            Err(Failed(why))
        } else {
            Ok(Booted::NoTest(why))
        };
    };
    if let (Some(want), Some(got)) = (&kernel.release, &release) {
        if want != got {
            return Err(Failed(format!(
                "{}: the guest runs {got}, not {want}",
                kernel.name
            )));
        }
    }
    Ok(Booted::Ran(Outcome {
        output,
        code,
        waited: run_queue_wait(pid),
    }))
}

/// A guest that waited for a CPU gets that long more, up to this many times its timeout (a
/// guest hung while the host was idle is still killed at its timeout).
const STARVED_AT_MOST: u32 = 2;
/// How often a boot's deadline is read again (it moves while the guest waits for a CPU).
const DEADLINE_EVERY: Duration = Duration::from_secs(5);

/// When a guest booted at `started` is killed: after `timeout` of its own time, that is plus
/// what it `waited` for a CPU, and at most [`STARVED_AT_MOST`] times the timeout.
fn guest_deadline(started: Instant, timeout: Duration, waited: Duration) -> Instant {
    started + (timeout + waited).min(STARVED_AT_MOST * timeout)
}

/// How long the most delayed of process `pid`'s threads has waited on a run queue, runnable
/// but not running (`schedstat`'s second field): a vCPU thread starved by the host's other
/// work. Zero when it cannot be read.
fn run_queue_wait(pid: u32) -> Duration {
    let most = crate::schedstat::threads(pid)
        .iter()
        .map(|t| t.waited_ns)
        .max()
        .unwrap_or(0);
    Duration::from_nanos(most)
}

fn tail(lines: &[String]) -> String {
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_gets_the_time_it_waited_for_a_cpu_up_to_its_timeout_again() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(900);
        assert_eq!(guest_deadline(t0, timeout, Duration::ZERO), t0 + timeout);
        assert_eq!(
            guest_deadline(t0, timeout, Duration::from_secs(300)),
            t0 + Duration::from_secs(1200)
        );
        assert_eq!(
            guest_deadline(t0, timeout, Duration::from_secs(5000)),
            t0 + Duration::from_secs(1800)
        );
    }

    #[test]
    fn run_queue_wait_reads_a_threads_time_waiting_for_a_cpu() {
        // Twice as many busy threads as CPUs: each waits for one about half the time, and the
        // most delayed is read.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        let busy: Vec<_> = (0..cpus * 2)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(500));
        let waited = run_queue_wait(std::process::id());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for b in busy {
            b.join().unwrap();
        }
        assert!(waited >= Duration::from_millis(50), "waited {waited:?}");
        assert_eq!(run_queue_wait(u32::MAX), Duration::ZERO, "no such process");
    }

    #[test]
    fn modinfo_depends_reads_the_list() {
        let ko = b"\x7fELF\0junk\0license=GPL\0depends=inet_diag,foo-bar\0name=tcp_diag\0";
        assert_eq!(modinfo_depends(ko), vec!["inet_diag", "foo_bar"]);
        assert!(modinfo_depends(b"depends=\0").is_empty());
        assert!(modinfo_depends(b"nothing here").is_empty());
    }

    #[test]
    fn check_must_list_exactly_the_kernels_evidence() {
        let output = "lifeline check\n  [ok  ] kernel BTF             /sys/kernel/btf/vmlinux\n\
                        [info] evidence               tcp/tcp_retransmit_skb has no family field: read from the socket\n\
                      the agent can run here\n";
        assert_eq!(
            check_evidence(output, &["tcp/tcp_retransmit_skb has no family field"]),
            Ok(())
        );
        let err = check_evidence(output, &[]).unwrap_err();
        assert!(
            err.contains("unexpected [\"tcp/tcp_retransmit_skb has no family"),
            "{err}"
        );
        let err = check_evidence(
            output,
            &[
                "tcp/tcp_retransmit_skb has no family field",
                "inet_sk_error_report",
            ],
        )
        .unwrap_err();
        assert!(err.contains("missing [\"inet_sk_error_report\"]"), "{err}");
        // No check output at all (it did not run): every expected line is missing.
        assert!(check_evidence("", &["tcp/tcp_retransmit_skb has no family field"]).is_err());
        for (preset, evidence, _) in EXPECTED {
            assert!(PRESETS.iter().any(|(p, ..)| *p == preset), "{preset}");
            assert!(
                !evidence.is_empty(),
                "{preset}: check always prints an evidence line"
            );
        }
    }

    #[test]
    fn the_cloud_metapackage_names_the_image_package() {
        let depends = "linux-image-cloud-amd64\n  Depends: linux-image-6.12.57+deb13-cloud-amd64\n";
        assert_eq!(
            image_package(depends, "linux-image-6.12.").as_deref(),
            Some("linux-image-6.12.57+deb13-cloud-amd64")
        );
        let alternatives = "linux-image-cloud-amd64\n |Depends: linux-image-5.10.0-32-cloud-amd64\n  Depends: linux-image-5.10.0-32-cloud-amd64-unsigned\n";
        assert_eq!(
            image_package(alternatives, "linux-image-5.10.").as_deref(),
            Some("linux-image-5.10.0-32-cloud-amd64")
        );
        assert_eq!(image_package(depends, "linux-image-6.1."), None);
    }

    /// A release directory as a Debian package lays it out, in a fresh temporary directory.
    fn module_tree(name: &str) -> PathBuf {
        let tree = std::env::temp_dir().join(format!("xtask-vm-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tree);
        fs::create_dir_all(tree.join("kernel")).unwrap();
        tree
    }

    fn put(tree: &Path, module: &str, suffix: &str, bytes: &[u8]) {
        let stem = module.strip_suffix(".ko").unwrap();
        let path = tree.join("kernel").join(format!("{stem}{suffix}"));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let compress = |tool: &str| {
            let mut child = Command::new(tool)
                .args(["-c", "-q"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(bytes).unwrap();
            child.wait_with_output().unwrap().stdout
        };
        let data = match suffix {
            ".ko.xz" => compress("xz"),
            ".ko.zst" => compress("zstd"),
            _ => bytes.to_vec(),
        };
        fs::write(path, data).unwrap();
    }

    #[test]
    fn modules_are_taken_in_every_compression_and_a_missing_one_is_named() {
        let tree = module_tree("take");
        let into = tree.join("out");
        // veth built in, nft_counter in nf_tables (as on 6.1); the others plain, xz and zstd
        // in turn.
        fs::write(tree.join("modules.builtin"), "kernel/drivers/net/veth.ko\n").unwrap();
        for (i, module) in MODULES.iter().enumerate() {
            if module.ends_with("veth.ko") || MERGED_LATER.contains(module) {
                continue;
            }
            let body = format!("\x7fELF {module}\0depends=\0");
            put(&tree, module, MODULE_SUFFIXES[i % 3], body.as_bytes());
        }
        let kept = take_modules(&tree, &into).unwrap();
        assert_eq!(
            kept.len(),
            MODULES.len() - 2,
            "veth is built in, nft_counter merged"
        );
        // Where the release has it (5.10), it is taken.
        put(
            &tree,
            "net/netfilter/nft_counter.ko",
            ".ko",
            b"\x7fELF nft_counter.ko\0",
        );
        let kept = take_modules(&tree, &into).unwrap();
        assert!(kept.contains(&into.join("nft_counter.ko")), "{kept:?}");
        assert_eq!(kept[0], into.join("inet_diag.ko"));
        for path in &kept {
            let text = String::from_utf8(fs::read(path).unwrap()).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                text.starts_with("\x7fELF ") && text.contains(&name),
                "{name}: {text:?}"
            );
        }
        // tcp_diag (xz) gone, and not built in: the run fails naming it.
        fs::remove_file(tree.join("kernel/net/ipv4/tcp_diag.ko.xz")).unwrap();
        let err = take_modules(&tree, &into).unwrap_err().0;
        assert!(
            err.starts_with("module net/ipv4/tcp_diag.ko is neither in ") && err.contains("modules.builtin"),
            "{err}"
        );
        fs::remove_dir_all(&tree).unwrap();
    }

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut cpio = Cpio::new();
        cpio.file("init", 0o755, b"#!/bin/sh\n");
        let gz = cpio.finish().unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        assert!(raw.starts_with(b"070701"));
        // mode, then file size at field 7, name size at field 12
        assert_eq!(&raw[14..22], b"000081ed");
        assert_eq!(&raw[54..62], b"0000000a");
        assert_eq!(&raw[94..102], b"00000005");
        assert_eq!(&raw[110..115], b"init\0");
        assert_eq!(raw.len() % 4, 0);
        assert!(raw.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
