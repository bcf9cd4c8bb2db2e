//! Keeping test traffic on this machine, and leaving the machine as the suites found it.
//!
//! The agent probes every endpoint it watches from the host's network namespace; where the host
//! has no route of its own to a test address, that probe must fail here rather than leave the
//! machine by the default route. While a suite runs, its network namespace (the host's, for the
//! suites) holds exactly:
//!
//! - a blackhole route (protocol [`ROUTE_PROTO`], table main) for each of [`TEST_RANGES`]: more
//!   specific routes a test adds (a topology's link to the host, a CNI bridge) and the host's
//!   own addresses still win;
//! - chain [`CHAIN`] in iptables' filter table, jumped to first from OUTPUT: a REJECT of what is
//!   sent to [`SERVICE_RANGE`] without having been translated (a ClusterIP kube-proxy
//!   translates to a backend passes; one probed while no kube-proxy runs does not leave).
//!
//! Nothing else of 10.0.0.0/8 (where a resolver or a package mirror may be) is touched, and
//! [`contain`] refuses, changing nothing, when a resolver of `/etc/resolv.conf` or a default
//! gateway lies in one of those ranges.
//!
//! A suite is one process running many tests, and several suites may run at once on a machine.
//! Each process registers as a holder (a file in [`STATE_DIR`] named by network namespace, pid
//! and start time, under an `flock`); the last holder of a namespace to leave removes the
//! rules: at exit (`atexit`, after the last test, whether tests failed or not), or on SIGINT,
//! SIGTERM or SIGHUP. A suite killed outright leaves them: installing adopts them (it is
//! idempotent) and the next suite to end in that namespace removes them, or `xtask` clears
//! them before its first suite ([`clear_abandoned`](crate::containment_state::clear_abandoned)).
//! What is installed, the holders and the removal are [`containment_state`](crate::containment_state).
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::thread;

use crate::containment_state::{
    family, holder_name, live_holders, ok, quiet, remove_legacy_reject, uninstall, StateLock, CHAIN,
    ROUTE_PROTO, SERVICE_RANGE, STATE_DIR, TEST_RANGES,
};
use crate::netns::NetNs;

/// The rule in [`CHAIN`].
const SERVICE_REJECT: [&str; 9] = [
    "-d",
    SERVICE_RANGE,
    "-m",
    "conntrack",
    "!",
    "--ctstate",
    "DNAT",
    "-j",
    "REJECT",
];

/// This process's holder file name, once registered.
static HOLDER: OnceLock<String> = OnceLock::new();
/// Set once the rules were released (at exit or on a signal, whichever comes first).
static RELEASED: AtomicBool = AtomicBool::new(false);
/// Write end of the pipe the signal handler writes the signal number to.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

/// Keeps test traffic on this machine, once per process (see the module's documentation);
/// what it installs is removed when the last suite process of this network namespace ends.
pub fn contain() {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    let lock = StateLock::take().unwrap_or_else(|e| panic!("lock {STATE_DIR}: {e}"));
    if let Some(why) = unsafe_here() {
        panic!(
            "the suites will not contain their traffic here, changing nothing: {why}; they route \
             {TEST_RANGES:?} into a blackhole and reject {SERVICE_RANGE} while they run"
        );
    }
    let name = HOLDER.get_or_init(|| holder_name(std::process::id()).expect("this process's start time"));
    fs::write(lock.dir.join(name), "").expect("register as a holder");
    static HOOKS: Once = Once::new();
    HOOKS.call_once(register_exit_hooks);
    for line in remove_legacy_reject() {
        // Past libtest's capture: shown whatever the test's outcome.
        let _ = writeln!(
            io::stderr(),
            "removed what an earlier version of the suites left: iptables {line}"
        );
    }
    install();
    *done = true;
}

/// What makes containing test traffic here unsafe: a resolver or a default gateway in a range
/// the suites contain.
fn unsafe_here() -> Option<String> {
    let contained = TEST_RANGES.iter().chain([&SERVICE_RANGE]);
    let resolv = fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let resolvers = resolv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().split('%').next()?.parse::<IpAddr>().ok())
        .map(|a| (a, "the resolver"));
    let mut gateways = Vec::new();
    for family in ["-4", "-6"] {
        let out = quiet(Command::new("ip").args([family, "route", "show", "default"]));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut words = text.split_whitespace();
        while let Some(w) = words.next() {
            if w == "via" {
                if let Some(a) = words.next().and_then(|a| a.parse::<IpAddr>().ok()) {
                    gateways.push((a, "the default gateway"));
                }
            }
        }
    }
    for (addr, what) in resolvers.chain(gateways) {
        if let Some(range) = contained.clone().find(|r| in_range(addr, r)) {
            return Some(format!("{what} {addr} is in {range}"));
        }
    }
    None
}

/// Whether `addr` lies in `range` (`a.b.c.d/n` or an IPv6 prefix).
pub fn in_range(addr: IpAddr, range: &str) -> bool {
    let (net, len) = range.split_once('/').expect("a prefix");
    let len: u32 = len.parse().expect("a prefix length");
    match (addr, net.parse::<IpAddr>().expect("a prefix address")) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Installs the routes and the chain; adopts what is already there (a killed suite's).
fn install() {
    for range in TEST_RANGES {
        let fam = family(range);
        let add =
            quiet(Command::new("ip").args([fam, "route", "add", "blackhole", range, "proto", ROUTE_PROTO]));
        if !add.status.success() {
            let shown = quiet(Command::new("ip").args([fam, "route", "show", "exact", range]));
            let shown = String::from_utf8_lossy(&shown.stdout).trim().to_owned();
            // A blackhole already: this suite's from a killed run, or an older version's.
            assert!(
                shown.starts_with("blackhole"),
                "cannot route {range} into a blackhole ({}): this host routes it ({shown}), and \
                 the suites give it to their test namespaces",
                String::from_utf8_lossy(&add.stderr).trim()
            );
        }
    }
    let _ = quiet(Command::new("iptables").args(["-w", "-N", CHAIN]));
    if !ok(Command::new("iptables")
        .args(["-w", "-C", CHAIN])
        .args(SERVICE_REJECT))
    {
        must(
            Command::new("iptables")
                .args(["-w", "-A", CHAIN])
                .args(SERVICE_REJECT),
        );
    }
    if !ok(Command::new("iptables").args(["-w", "-C", "OUTPUT", "-j", CHAIN])) {
        must(Command::new("iptables").args(["-w", "-I", "OUTPUT", "1", "-j", CHAIN]));
    }
}

/// Unregisters this process; the last holder of its network namespace removes the rules.
/// Runs at most once.
fn release() {
    let Some(me) = HOLDER.get() else { return };
    if RELEASED.swap(true, Ordering::SeqCst) {
        return;
    }
    let lock = StateLock::take().unwrap_or_else(|e| panic!("lock {STATE_DIR}: {e}"));
    let _ = fs::remove_file(lock.dir.join(me));
    let netns = me.split('.').next().unwrap_or_default();
    let holders = live_holders(&lock.dir);
    if !holders.iter().any(|h| h.split('.').next() == Some(netns)) {
        uninstall();
    }
    if holders.is_empty() {
        lock.remove();
    }
}

extern "C" fn release_at_exit() {
    let _ = std::panic::catch_unwind(release);
}

extern "C" fn on_signal(sig: libc::c_int) {
    let byte = sig as u8;
    // SAFETY: write(2) is async-signal-safe; the pipe outlives the process's handlers.
    unsafe {
        libc::write(
            SIGNAL_PIPE.load(Ordering::Relaxed),
            (&byte as *const u8).cast(),
            1,
        )
    };
}

/// `atexit(release)`, and SIGINT/SIGTERM/SIGHUP (where not ignored) release and then die of
/// the signal as they would have.
fn register_exit_hooks() {
    // SAFETY: registers a plain function; it catches any panic.
    unsafe { libc::atexit(release_at_exit) };
    let mut fds = [0; 2];
    // SAFETY: fds is two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    let read_end = fds[0];
    thread::spawn(move || {
        let mut byte = 0u8;
        // SAFETY: reads one byte into a local.
        let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            let sig = libc::c_int::from(byte);
            release();
            // SAFETY: back to the default action, then the signal again: the process ends as
            // it would have without the handler.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }
    });
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: plain sigaction calls with initialised structures.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            if old.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// A network namespace's (the host's, for `None`) packet handling, as
/// [`network_state::state`](crate::network_state::state) puts it: compared before and after a
/// suite.
pub fn network_state(ns: Option<&NetNs>) -> String {
    crate::network_state::state(|args| {
        let mut cmd = match ns {
            Some(ns) => ns.command(args[0]),
            None => Command::new(args[0]),
        };
        let out = crate::setup::run(cmd.args(&args[1..]));
        Ok::<_, std::convert::Infallible>(String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .unwrap_or_else(|never| match never {})
}

fn must(cmd: &mut Command) {
    let out = quiet(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(in_range(a("10.96.0.10"), SERVICE_RANGE));
        assert!(in_range(a("10.111.255.255"), SERVICE_RANGE));
        assert!(!in_range(a("10.112.0.1"), SERVICE_RANGE));
        assert!(!in_range(a("10.255.255.53"), SERVICE_RANGE));
        assert!(TEST_RANGES.iter().all(|r| !in_range(a("10.255.255.53"), r)));
        assert!(in_range(a("fd00:250:7::1"), "fd00:250::/32"));
        assert!(!in_range(a("fd00::1"), "fd00:250::/32"));
        assert!(!in_range(a("10.250.0.1"), "fd00:250::/32"));
        assert!(in_range(a("1.2.3.4"), "0.0.0.0/0"));
    }
}
