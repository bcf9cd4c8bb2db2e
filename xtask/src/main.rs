//! Project tasks: `cargo xtask setup | test | bench | image | e2e | vm-test | demo`.
//!
//! - `setup`: makes a fresh machine of this kind ready (idempotent): apt packages the suites
//!   use, `rust-src`, `bpf-linker` linked against rustc's own LLVM, tracefs mounted.
//! - `test`: the whole test command of the README and CI: the real-cluster suites
//!   (`realcluster`, then the end-to-end test, `e2e`) in the background while format and lint
//!   checks, unit tests (root ones included) and the agent in Debian 11's 5.10, 13's 6.12 and
//!   12's 6.1 guests (`vm-test`) run niced; then the other root integration suites with the
//!   real eBPF programs.
//! - `bench`: what the agent costs, in figures measured in one run (written to
//!   `docs/benchmarks.md`).
//! - `image`: the agent's OCI image archive, built without a container engine.
//! - `e2e`: the image installed with `deploy/` on a real single-node cluster, and checked there.
//! - `vm-test`: the agent on another kernel (Debian 11's 5.10, 12's 6.1 (default), 13's 6.12,
//!   or any image) in a qemu guest.
//! - `demo`: setup, build, a small self-contained topology (an "apiserver" in a network
//!   namespace and client processes), and the agent showing its table until Ctrl-C.
use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use clap::{Parser, Subcommand};

mod bench;
mod clusters;
mod debian;
mod demo;
mod deploy;
mod e2e;
mod gomatrix;
mod hoststate;
mod image;
mod informer;
mod kubernetes;
mod schedstat;
mod setup;
mod vm;
mod vm_suites;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install every prerequisite (idempotent; run as root).
    Setup,
    /// Only setup's Go release matrix: each Debian Go toolchain and the watch client it builds,
    /// and the client-go informer (idempotent; run as root).
    GoMatrix,
    /// fmt + clippy + unit tests + the Debian 5.10, 6.12 and 6.1 guests + root integration
    /// suites + the
    /// end-to-end test (as root).
    Test {
        /// Skip the fmt and clippy checks.
        #[arg(long)]
        no_lint: bool,
        /// Only run the suite of this name (`e2e` for the end-to-end test, `vm-debian-5.10`,
        /// `vm-debian-6.1`, `vm-debian-6.12` for the guest runs), or, ending with `-`, those
        /// whose name starts with it (`vm-` for all three guests).
        #[arg(long)]
        suite: Option<String>,
    },
    /// Only the checks of deploy/ that `test` runs: promtool, the rules in step, the dashboard's
    /// queries, what kustomize renders (no root needed).
    CheckDeploy,
    /// Figures, written to docs/benchmarks.md: unrelated churn against no observer, bpftrace
    /// and ss; kernel cost per call; CPU and RSS per tracked connection; bursts; a connect
    /// storm (as root).
    Bench {
        /// Only these sections (churn, segments, tracked, busy, streams, controller, burst, storm, neighbours, detection), printed and not
        /// written to docs/benchmarks.md, whose figures come from one whole run.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// The agent's container image as an OCI archive (no container engine needed):
    /// target/image/lifeline-<version>-<arch>.tar, named localhost/lifeline:<version>.
    Image {
        /// Where to write the archive.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Image name REPOSITORY:TAG (repeatable; default localhost/lifeline:<version>).
        #[arg(long = "name")]
        names: Vec<String>,
        /// Use the static binary already built.
        #[arg(long)]
        no_build: bool,
        /// Import the archive into a private containerd and run its binary (needs containerd).
        #[arg(long)]
        verify: bool,
    },
    /// The image installed with deploy/ on a real single-node Kubernetes 1.20 cluster built on
    /// this machine, and checked there (as root; builds the image first).
    E2e,
    /// The agent on another kernel, in a qemu guest: `lifeline check`, then detection on
    /// loopback (as root; installs qemu and busybox, extracts the kernel from its Debian
    /// package into /var/tmp/lifeline-vm once).
    VmTest {
        /// `debian-5.10`, `debian-6.1`, `debian-6.12` (Debian 11's, 12's and 13's cloud
        /// kernels), `host` (/boot/vmlinuz-$(uname -r)), or a kernel image's path.
        #[arg(long, default_value = "debian-6.1")]
        kernel: String,
        /// With `--kernel PATH`: its /lib/modules/RELEASE directory (inet_diag, tcp_diag, veth,
        /// netfilter; plain, .xz or .zst): a module neither there nor built in fails the run.
        #[arg(long)]
        modules: Option<PathBuf>,
        /// Run this shell command in the guest instead of the default test.
        #[arg(long)]
        command: Option<String>,
        /// Only xtask/vm/test.sh, not the root suites' tests (xtask/src/vm_suites.rs).
        #[arg(long)]
        no_suites: bool,
        /// Use the binaries already built.
        #[arg(long)]
        no_build: bool,
        /// Fail (and kill the guest) if it has not finished within this many seconds.
        #[arg(long, default_value_t = vm::TIMEOUT_SECS)]
        timeout: u64,
    },
    /// Set up, build, and run the agent against a self-contained demo topology.
    Demo {
        /// Skip `setup`.
        #[arg(long)]
        no_setup: bool,
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long)]
        seconds: Option<u64>,
    },
}

/// A task step that failed, with what it was.
#[derive(Debug)]
pub struct Failed(pub String);

pub type Result<T = ()> = std::result::Result<T, Failed>;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

/// Runs a command to completion; fails naming it when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result {
    eprintln!("+ {}", show(cmd));
    let started = std::time::Instant::now();
    let status = cmd.status().map_err(|e| Failed(format!("{}: {e}", show(cmd))))?;
    // Where a run's time goes, in its log (steps under 20 s left unsaid).
    let took = started.elapsed().as_secs_f64();
    if took >= 20.0 {
        eprintln!("xtask: {took:.0} s: {}", show(cmd));
    }
    if status.success() {
        Ok(())
    } else {
        Err(Failed(format!("{} exited with {status}", show(cmd))))
    }
}

pub fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace());
    cmd
}

/// Builds the integration suites `tests/<name>.rs` of `names` (`offline`: without touching the
/// network; the compiler's diagnostics shown) and gives each one's test executable, by name.
pub fn integration_tests(names: &[&str], offline: bool) -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = cargo();
    cmd.args(["test", "-p", "lifeline-integration"]);
    for name in names {
        cmd.args(["--test", name]);
    }
    cmd.args(["--no-run", "--message-format=json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit());
    if offline {
        cmd.arg("--offline");
    }
    eprintln!("+ {}", show(&cmd));
    let json = image::output(&mut cmd)?;
    let mut found = Vec::new();
    for message in json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let is_test = message["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if let (true, Some(name), Some(exe)) = (
            is_test,
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            found.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    Ok(found)
}

fn require_root(what: &str) -> Result {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failed(format!(
            "{what} needs root (eBPF, network namespaces, cgroups)"
        )));
    }
    Ok(())
}

/// The integration suites, in the order they run (`realcluster`, in the background before the
/// others, needs the Kubernetes binaries
/// `cargo xtask setup` builds), each with the tests it runs at once. Those whose tests mostly
/// wait (for a silence to outlast a threshold, an agent to start, a client to retry) run four
/// at a time on the 2 cores; those that measure CPU (`neighbours`, `performance`) two, as do
/// the short ones and `realcluster`, whose clusters take turns anyway (`CLUSTER_LOCK`).
const SUITES: [(&str, usize); 9] = [
    ("foundation", 2),
    ("judgement", 4),
    ("fixture", 2),
    ("scenarios", 4),
    ("kubernetes", 4),
    ("hardening", 4),
    ("neighbours", 2),
    ("performance", 2),
    ("realcluster", 2),
];

/// How many of `suite`'s tests run at once ([`SUITES`]), on the host and in the vm-test guests.
pub fn test_threads(suite: &str) -> usize {
    SUITES
        .iter()
        .find(|(name, _)| *name == suite)
        .map_or(2, |(_, threads)| *threads)
}

/// The suite whose agent is the image's static release binary, not `target/debug/lifeline`.
const RELEASE_SUITE: &str = "realcluster";

fn test(no_lint: bool, suite: Option<&str>) -> Result {
    require_root("the test suite")?;
    let chosen = |name: &str| suite.is_none_or(|s| chosen_by(s, name));
    // The real clusters mostly wait: they run in the background while the CPU-bound steps
    // that leave the host's network alone run niced (xtask/src/clusters.rs).
    let background = clusters::start(cluster_suites(&chosen)?)?;
    let foreground = clusters::niced(|| {
        if !no_lint {
            lint()?;
        }
        // deploy/: what kustomize renders, the Prometheus rules (promtool), the dashboard's
        // queries.
        deploy::check()?;
        // The binaries first: some unit tests of the agent's Kubernetes side run the apiserver
        // fixture. (The background needs none of the debug agent: it runs the static one.)
        run(cargo().args(["build", "-p", "lifeline", "-p", "lifeline-integration", "--bins"]))?;
        unit_tests()?;
        guests(&chosen)
    });
    both(foreground, background.finish())?;
    // The rest, each with the host's iptables rules and routes to itself.
    for (name, threads) in SUITES.iter().filter(|(n, _)| *n != RELEASE_SUITE && chosen(n)) {
        let mut cargo_test = cargo();
        cargo_test.args([
            "test",
            "-p",
            "lifeline-integration",
            "--test",
            name,
            "--",
            &format!("--test-threads={threads}"),
        ]);
        hoststate::checked(&format!("suite {name}"), || run(&mut cargo_test))?;
    }
    Ok(())
}

/// The format and lint checks: both crates' clippy (the eBPF one for its own target).
fn lint() -> Result {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "lifeline-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo()
        .env("RUSTC_BOOTSTRAP", "1")
        .current_dir(workspace().join("ebpf"))
        .args([
            "clippy",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--",
            "-D",
            "warnings",
        ]))
}

/// Unit tests, root-only ones (marked #[ignore]) included: this runs as root.
fn unit_tests() -> Result {
    run(cargo().args([
        "test",
        "-p",
        "lifeline",
        "-p",
        "lifeline-common",
        "-p",
        "xtask",
        // The harness's own unit tests (and those of the fake apiserver it holds).
        "-p",
        "lifeline-integration",
        "--lib",
        "--bins",
        "--",
        "--include-ignored",
    ]))
}

/// The agent on the oldest and newest kernels users' nodes boot, and the one between, each in
/// a qemu guest (kernel packages extracted once into /var/tmp/lifeline-vm): `lifeline check`
/// and detection there, not only on this machine's kernel, with the image's static binary.
fn guests(chosen: &dyn Fn(&str) -> bool) -> Result {
    let mut built = false;
    for (_, kernel, suites) in GUESTS.into_iter().filter(|(n, ..)| chosen(n)) {
        vm::vm_test(&vm::Options {
            no_suites: !suites,
            // The suites' tests for the guest are built by the first guest run.
            no_build: built,
            ..vm::Options::new(kernel)
        })?;
        built = true;
    }
    Ok(())
}

/// The chosen real-cluster suites, built and ready to run: `realcluster` with what users run,
/// the image's static binary (its agent races a fresh client's start-up: issue 23, first
/// requests), then `e2e` with the image built and installed on a real node.
fn cluster_suites(chosen: &dyn Fn(&str) -> bool) -> Result<Vec<clusters::Suite>> {
    let mut suites = Vec::new();
    if chosen(RELEASE_SUITE) {
        let target = image::host_target()?;
        image::build_static(&target)?;
        let threads = format!("--test-threads={}", test_threads(RELEASE_SUITE));
        let mut suite = clusters::Suite::build(RELEASE_SUITE, &[&threads])?;
        suite.command.env("LIFELINE_BIN", image::static_binary(&target));
        suites.push(suite);
    }
    if chosen(E2E) {
        let env = e2e::prepare()?;
        let mut suite = clusters::Suite::build(E2E, &e2e::ARGS)?;
        suite.command.envs(env);
        suites.push(suite);
    }
    Ok(suites)
}

/// Whether `--suite wanted` picks the suite or guest `name`: the same name, or a prefix of it
/// that ends with `-` (`vm-debian-6.1` is not `vm-debian-6.12`).
fn chosen_by(wanted: &str, name: &str) -> bool {
    name == wanted || (wanted.ends_with('-') && name.starts_with(wanted))
}

/// The first error of `first` and `second`; both shown when both failed.
pub fn both(first: Result, second: Result) -> Result {
    if let (Err(_), Err(Failed(why))) = (&first, &second) {
        eprintln!("xtask: {why}");
    }
    first.and(second)
}

/// The guest runs ([`vm::vm_test`]), in order: (name for `--suite`, kernel, whether the root
/// suites' chosen tests run too or `xtask/vm/test.sh` alone). The oldest and the newest kernel
/// run everything; 6.1 between them only `test.sh`: its verifier and its tracepoints' records,
/// which differ from both neighbours'.
const GUESTS: [(&str, &str, bool); 3] = [
    ("vm-debian-5.10", "debian-5.10", true),
    ("vm-debian-6.12", "debian-6.12", true),
    ("vm-debian-6.1", "debian-6.1", false),
];

/// The end-to-end suite's name (`tests/e2e.rs`), run by [`e2e::e2e`] after [`SUITES`].
const E2E: &str = "e2e";

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Setup => setup::setup(),
        Task::GoMatrix => gomatrix::setup().and_then(|()| informer::setup()),
        Task::Test { no_lint, suite } => test(no_lint, suite.as_deref()),
        Task::Demo { no_setup, seconds } => demo::demo(no_setup, seconds),
        Task::Bench { only } => bench::bench(&only),
        Task::CheckDeploy => deploy::check(),
        Task::E2e => e2e::e2e(),
        Task::VmTest {
            kernel,
            modules,
            command,
            no_suites,
            no_build,
            timeout,
        } => vm::vm_test(&vm::Options {
            modules,
            command,
            no_suites,
            no_build,
            timeout: std::time::Duration::from_secs(timeout),
            ..vm::Options::new(&kernel)
        }),
        Task::Image {
            out,
            names,
            no_build,
            verify,
        } => image::image(image::Options {
            out,
            names,
            no_build,
            verify,
        })
        .map(|_| ()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed(what)) => {
            eprintln!("xtask: {what}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suite_is_picked_by_its_name_or_a_prefix_ending_in_a_dash() {
        assert!(chosen_by("vm-debian-6.1", "vm-debian-6.1"));
        assert!(!chosen_by("vm-debian-6.1", "vm-debian-6.12"));
        let guests: Vec<&str> = GUESTS
            .iter()
            .map(|g| g.0)
            .filter(|n| chosen_by("vm-", n))
            .collect();
        assert_eq!(guests.len(), GUESTS.len());
        assert!(!chosen_by("judge", "judgement"));
        assert!(SUITES.iter().filter(|(n, _)| chosen_by("neighbours", n)).count() == 1);
    }
}
