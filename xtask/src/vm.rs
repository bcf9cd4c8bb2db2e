//! `cargo xtask vm-test --kernel debian-6.1|host|PATH`: the agent proven on another kernel, in a
//! qemu guest.
//!
//! Everything lifeline knows about the kernel was first proven on the machine's own; users'
//! nodes run others (Debian 12 and Amazon Linux on 6.1, ...), and an eBPF program the verifier
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
//!   the kernel package is extracted (`dpkg-deb -x`) into [`ROOT`], so a second run downloads
//!   nothing.
//! - KVM when a quick probe boot works; nested KVM can die early in boot ("emulation failure"),
//!   then TCG.
//! - A guest that cannot boot, or does not finish within the timeout, fails the run; the guest
//!   is always killed.
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

use crate::{image, image::output, run, show, vm_suites, workspace, Failed, Result};

/// Where kernels extracted from Debian packages are kept between runs.
pub const ROOT: &str = "/var/tmp/lifeline-vm";
/// What the host needs, from Debian.
const APT_PACKAGES: [&str; 2] = ["qemu-system-x86", "busybox-static"];
/// Debian 12's cloud kernel (what Debian 12 cloud images and nodes boot): the metapackage
/// names the current ABI's image package.
const DEBIAN_61_META: &str = "linux-image-cloud-amd64";
/// Modules (under the release's `kernel/`) that Debian builds as modules and the agent, or the
/// test, needs, in load order: `inet_diag` + `tcp_diag` (sock_diag: the start-up scan, tcp_info,
/// SOCK_DESTROY), `veth` (network-namespace tests), and what the root suites' harness needs
/// for its iptables (nft) rule `-m conntrack ! --ctstate DNAT -j REJECT`.
const MODULES: [&str; 14] = [
    "net/ipv4/inet_diag.ko",
    "net/ipv4/tcp_diag.ko",
    "drivers/net/veth.ko",
    "net/netfilter/nfnetlink.ko",
    "lib/libcrc32c.ko",
    "net/netfilter/nf_tables.ko",
    "net/netfilter/x_tables.ko",
    "net/netfilter/nft_compat.ko",
    "net/ipv4/netfilter/nf_defrag_ipv4.ko",
    "net/ipv6/netfilter/nf_defrag_ipv6.ko",
    "net/netfilter/nf_conntrack.ko",
    "net/netfilter/xt_conntrack.ko",
    "net/ipv4/netfilter/nf_reject_ipv4.ko",
    "net/ipv4/netfilter/ipt_REJECT.ko",
];
const INIT: &str = include_str!("../vm/init.sh");
/// The default test run in the guest.
const TEST: &str = include_str!("../vm/test.sh");
const EXIT_MARKER: &str = "LIFELINE-VM-EXIT ";
const BEGIN_MARKER: &str = "LIFELINE-VM-BEGIN";
const KERNEL_MARKER: &str = "LIFELINE-VM-KERNEL ";

/// The default timeout of a guest run (boot, `test.sh`, the root suites, power-off).
pub const TIMEOUT_SECS: u64 = 900;

/// What `cargo xtask vm-test` was asked for.
pub struct Options {
    /// `debian-6.1`, `host`, or a path to a kernel image.
    pub kernel: String,
    /// With `--kernel PATH`: a `/lib/modules/RELEASE` directory to take [`MODULES`] from.
    pub modules: Option<PathBuf>,
    /// A shell command to run in the guest instead of the default test.
    pub command: Option<String>,
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
}

/// What `cargo xtask setup` prepares: the packages, and Debian 12's 6.1 kernel in [`ROOT`].
pub fn setup() -> Result {
    crate::setup::apt(&APT_PACKAGES)?;
    debian_61().map(|_| ())
}

/// Boots the kernel, runs the test in it; fails unless the test exits 0.
pub fn vm_test(options: &Options) -> Result {
    let outcome = run_guest(options)?;
    if options.command.is_none() {
        // Before the exit code: which of the suites' tests did not pass, by name.
        vm_suites::verify(&outcome.output)?;
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
    let test = match &options.command {
        Some(command) => command.clone(),
        None => {
            let suites = vm_suites::prepare(
                options.no_build,
                &dir,
                &dir.join("ll-client"),
                &dir.join("ll-server"),
            )?;
            binaries.extend(suites.files);
            format!("{TEST}\n{}", suites.script)
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
    let outcome = boot(&kernel, &initrd, accel, options.timeout, true)?;
    eprintln!(
        "vm-test: {} under {accel}: the guest's test exited {} ({:.1} s from boot to power-off, {:.1} s in all)",
        kernel.name,
        outcome.code,
        booted.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(outcome)
}

fn kernel(options: &Options) -> Result<Kernel> {
    match options.kernel.as_str() {
        "debian-6.1" => debian_61(),
        "host" => host_kernel(),
        path => {
            let vmlinuz = PathBuf::from(path);
            if !vmlinuz.is_file() {
                return Err(Failed(format!(
                    "--kernel {path}: not a file (debian-6.1, host, or a kernel image's path)"
                )));
            }
            let modules = match &options.modules {
                Some(dir) => modules_from(&dir.join("kernel"))?,
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
    let tree = PathBuf::from(format!("/lib/modules/{release}/kernel"));
    let modules = if tree.is_dir() {
        modules_from(&tree)?
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

/// Those of [`MODULES`] present under `tree` (a release's `kernel/` directory); absent ones
/// are taken to be built in (`lifeline check` in the guest says if they are not).
fn modules_from(tree: &Path) -> Result<Vec<PathBuf>> {
    let found: Vec<PathBuf> = MODULES
        .iter()
        .map(|m| tree.join(m))
        .filter(|p| p.is_file())
        .collect();
    check_load_order(&found)?;
    Ok(found)
}

/// Debian 12's 6.1 cloud kernel, extracted from its package once into `ROOT/debian-6.1`.
fn debian_61() -> Result<Kernel> {
    let dir = Path::new(ROOT).join("debian-6.1");
    let stamp = dir.join("stamp");
    let kept = |m: &&str| dir.join("modules").join(module_file(m)).is_file();
    if !stamp.is_file() || !MODULES.iter().all(kept) {
        // Not extracted yet, or by a version of this that kept fewer modules.
        fetch_debian_61(&dir)?;
    }
    let text = fs::read_to_string(&stamp).map_err(|e| Failed(format!("{}: {e}", stamp.display())))?;
    let mut lines = text.lines();
    let (Some(package), Some(release)) = (lines.next(), lines.next()) else {
        return Err(Failed(format!(
            "{}: not `PACKAGE\\nRELEASE`: remove {} and run again",
            stamp.display(),
            dir.display()
        )));
    };
    let modules = MODULES
        .iter()
        .map(|m| dir.join("modules").join(module_file(m)))
        .collect();
    Ok(Kernel {
        name: format!("debian-6.1 ({package})"),
        release: Some(release.to_owned()),
        vmlinuz: dir.join("vmlinuz"),
        modules,
    })
}

fn module_file(path: &str) -> &str {
    path.rsplit('/').next().expect("a file name")
}

/// Downloads the kernel package the metapackage names now (`apt-get download`: not
/// installed), and keeps its image, config and [`MODULES`]; the stamp is written last.
fn fetch_debian_61(dir: &Path) -> Result {
    let depends = output(Command::new("apt-cache").args(["depends", DEBIAN_61_META]))?;
    let package = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-6.1."))
        .map(str::to_owned)
        .ok_or_else(|| {
            Failed(format!(
                "`apt-cache depends {DEBIAN_61_META}` names no linux-image-6.1.* package (is this Debian 12?)"
            ))
        })?;
    let release = package
        .strip_prefix("linux-image-")
        .expect("checked above")
        .to_owned();
    let partial = PathBuf::from(format!("{}.partial", dir.display()));
    let _ = fs::remove_dir_all(&partial);
    let extracted = partial.join("deb");
    fs::create_dir_all(&extracted).map_err(|e| Failed(format!("{}: {e}", extracted.display())))?;
    let download = || {
        run(Command::new("apt-get")
            .current_dir(&partial)
            .args(["download", "-q", &package]))
    };
    if download().is_err() {
        // The package lists may be missing or older than the metapackage's.
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        download()?;
    }
    let deb = fs::read_dir(&partial)
        .map_err(|e| Failed(format!("{}: {e}", partial.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| Failed(format!("apt-get download {package} left no .deb")))?;
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted))?;
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
    let tree = extracted.join(format!("lib/modules/{release}/kernel"));
    fs::create_dir_all(partial.join("modules")).map_err(|e| Failed(format!("{}: {e}", partial.display())))?;
    let mut kept = Vec::new();
    for module in MODULES {
        let to = partial.join("modules").join(module_file(module));
        copy(tree.join(module), to.clone())?;
        kept.push(to);
    }
    check_load_order(&kept)?;
    fs::remove_dir_all(&extracted).map_err(|e| Failed(format!("{}: {e}", extracted.display())))?;
    fs::remove_file(&deb).map_err(|e| Failed(format!("{}: {e}", deb.display())))?;
    fs::write(partial.join("stamp"), format!("{package}\n{release}\n"))
        .map_err(|e| Failed(format!("{}: {e}", partial.display())))?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&partial, dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    eprintln!("vm-test: {package} kept in {}", dir.display());
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
/// (`LIFELINE_VM_ACCEL=tcg|kvm` chooses).
fn accel(kernel: &Kernel, dir: &Path) -> Result<&'static str> {
    match std::env::var("LIFELINE_VM_ACCEL").as_deref() {
        Ok("tcg") => return Ok("tcg"),
        Ok("kvm") => return Ok("kvm"),
        Ok(other) => return Err(Failed(format!("LIFELINE_VM_ACCEL={other}: tcg or kvm"))),
        Err(_) => {}
    }
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
    match boot(kernel, &probe, "kvm", Duration::from_secs(30), false) {
        Ok(o) if o.code == 0 => {
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

/// Boots `kernel` with `initrd` and waits for the exit marker (or the timeout, or qemu's end);
/// with `echo`, the guest's console is shown line by line as `guest| ...`.
fn boot(kernel: &Kernel, initrd: &Path, accel: &str, timeout: Duration, echo: bool) -> Result<Outcome> {
    let cpu = if accel == "kvm" { "host" } else { "max" };
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-machine", &format!("q35,accel={accel}"), "-cpu", cpu])
        .args(["-m", "2048", "-smp", "2", "-nic", "none"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            "console=ttyS0 panic=-1 quiet loglevel=4",
            "-nographic",
            "-no-reboot",
        ])
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
    let _guest = Guest(child);
    let deadline = Instant::now() + timeout;
    let mut lines: Vec<String> = Vec::new();
    let mut output = String::new();
    let mut begun = false;
    let mut code = None;
    let mut release = None;
    while code.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(Failed(format!(
                    "{}: the guest did not finish within {} s (killed); last lines:\n{}",
                    kernel.name,
                    timeout.as_secs(),
                    tail(&lines)
                )))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
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
        return Err(Failed(format!(
            "{}: the guest ended without running the test to its end (no boot, a panic, or qemu failed); last lines:\n{}",
            kernel.name,
            tail(&lines)
        )));
    };
    if let (Some(want), Some(got)) = (&kernel.release, &release) {
        if want != got {
            return Err(Failed(format!(
                "{}: the guest runs {got}, not {want}",
                kernel.name
            )));
        }
    }
    Ok(Outcome { output, code })
}

fn tail(lines: &[String]) -> String {
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modinfo_depends_reads_the_list() {
        let ko = b"\x7fELF\0junk\0license=GPL\0depends=inet_diag,foo-bar\0name=tcp_diag\0";
        assert_eq!(modinfo_depends(ko), vec!["inet_diag", "foo_bar"]);
        assert!(modinfo_depends(b"depends=\0").is_empty());
        assert!(modinfo_depends(b"nothing here").is_empty());
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
