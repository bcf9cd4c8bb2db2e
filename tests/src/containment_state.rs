//! What the suites' containment ([`containment`](crate::containment)) puts on a host, who holds
//! it, and how it is removed: the ranges, the chain and the route protocol, the holder files in
//! [`STATE_DIR`] under their lock, and the removal. Standard library only: `xtask` compiles this
//! same file (`#[path]`) to clear what a killed suite left ([`clear_abandoned`]) before it takes
//! the host's state to compare each suite against.
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

// `crate::network_state` in the harness, `hoststate::network_state` in xtask: beside this file
// in both.
use super::network_state::is_legacy_reject;

/// The address ranges the suites give their namespaces and addresses: the veth pairs
/// (10.250), the demo (10.251), the scenario topologies (10.252), hardening's host links
/// (10.249), the real cluster's advertised address on `lo` (10.231) and its pods (10.232), and
/// the IPv6 veth addresses.
pub const TEST_RANGES: [&str; 7] = [
    "10.231.0.0/16",
    "10.232.0.0/16",
    "10.249.0.0/16",
    "10.250.0.0/16",
    "10.251.0.0/16",
    "10.252.0.0/16",
    "fd00:250::/32",
];

/// The service (ClusterIP) range of the real cluster and of the fake apiserver's `kubernetes`
/// Service (10.96.0.1).
pub const SERVICE_RANGE: &str = "10.96.0.0/12";

/// The iptables chain (filter table) holding the REJECT for [`SERVICE_RANGE`].
pub const CHAIN: &str = "LIFELINE-TESTS";

/// The routing protocol number the blackhole routes carry: what marks them as the suites'.
pub const ROUTE_PROTO: &str = "76";

/// Where the holders are registered (tmpfs: gone at reboot, like the routes). Removed when the
/// last holder leaves.
pub const STATE_DIR: &str = "/run/lifeline-tests";

/// `-4` or `-6` for `ip`, by the range's family.
pub fn family(range: &str) -> &'static str {
    if range.contains(':') {
        "-6"
    } else {
        "-4"
    }
}

/// Removes all of it from the current network namespace: every jump to [`CHAIN`], the chain,
/// the routes with [`ROUTE_PROTO`].
pub fn uninstall() {
    while ok(Command::new("iptables").args(["-w", "-D", "OUTPUT", "-j", CHAIN])) {}
    let _ = quiet(Command::new("iptables").args(["-w", "-F", CHAIN]));
    let _ = quiet(Command::new("iptables").args(["-w", "-X", CHAIN]));
    for range in TEST_RANGES {
        let fam = family(range);
        let _ =
            quiet(Command::new("ip").args([fam, "route", "del", "blackhole", range, "proto", ROUTE_PROTO]));
    }
}

/// What of the containment the current network namespace holds: the suites' blackhole routes
/// and [`CHAIN`], as `ip` and `iptables` show them (empty: nothing).
pub fn installed() -> Vec<String> {
    let mut found = Vec::new();
    for fam in ["-4", "-6"] {
        let out = quiet(Command::new("ip").args([fam, "route", "show", "proto", ROUTE_PROTO]));
        found.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.trim().to_owned()),
        );
    }
    if ok(Command::new("iptables").args(["-w", "-S", CHAIN])) {
        found.push(format!("iptables chain {CHAIN}"));
    }
    found.retain(|l| !l.is_empty());
    found
}

/// Removes the containment of the current network namespace when no suite process still holds
/// it: a suite killed outright (SIGKILL, or its session ended) leaves it, and the next suite to
/// end removes it, but a comparison of the host before and after that suite would count the
/// removal against it. Returns what was removed.
pub fn clear_abandoned() -> io::Result<Vec<String>> {
    let lock = StateLock::take()?;
    let netns = fs::metadata("/proc/self/ns/net")?.ino().to_string();
    let holders = live_holders(&lock.dir);
    if holders
        .iter()
        .any(|h| h.split('.').next() == Some(netns.as_str()))
    {
        return Ok(Vec::new());
    }
    let found = installed();
    if !found.is_empty() {
        uninstall();
    }
    if holders.is_empty() {
        lock.remove();
    }
    Ok(found)
}

/// Removes the [`is_legacy_reject`] rules of the current network namespace: the REJECT of all
/// of 10.0.0.0/8 that earlier versions of the suites installed on the default interface and
/// never removed (it cuts off a resolver or mirror there). Returns the rules removed.
pub fn remove_legacy_reject() -> Vec<String> {
    let saved = quiet(Command::new("iptables-save").args(["-t", "filter"]));
    let mut removed = Vec::new();
    for line in String::from_utf8_lossy(&saved.stdout).lines() {
        if is_legacy_reject(line) {
            let rule: Vec<&str> = line["-A ".len()..].split_whitespace().collect();
            if ok(Command::new("iptables").args(["-w", "-D"]).args(&rule)) {
                removed.push(line.to_owned());
            }
        }
    }
    removed
}

/// `<netns inode>.<pid>.<start time>` of a process, if it exists and is not a zombie.
pub fn holder_name(pid: u32) -> Option<String> {
    let netns = fs::metadata(format!("/proc/{pid}/ns/net")).ok()?.ino();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    Some(format!("{netns}.{pid}.{}", fields.get(19)?))
}

/// The holders still running, after removing the files of those that are not.
pub fn live_holders(dir: &Path) -> Vec<String> {
    let mut live = Vec::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.split('.');
        let (Some(_), Some(pid), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        // Same pid, same start time: the same process (its namespace is where it registered).
        let alive = pid
            .parse()
            .ok()
            .and_then(holder_name)
            .is_some_and(|now| now.split('.').nth(2) == name.split('.').nth(2));
        if alive {
            live.push(name);
        } else {
            let _ = fs::remove_file(entry.path());
        }
    }
    live
}

/// An exclusive lock (`flock`) on `STATE_DIR/lock`, for registering, releasing and clearing.
pub struct StateLock {
    pub dir: PathBuf,
    file: fs::File,
}

impl StateLock {
    pub fn take() -> io::Result<StateLock> {
        let dir = PathBuf::from(STATE_DIR);
        let path = dir.join("lock");
        loop {
            fs::create_dir_all(&dir)?;
            let file = match fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
            {
                Ok(file) => file,
                // Removed between creating the directory and opening: again.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            file.lock()?;
            // The last holder removes the file under the lock: locked a removed one, again.
            let same = fs::metadata(&path).is_ok_and(|m| file.metadata().is_ok_and(|f| f.ino() == m.ino()));
            if same {
                return Ok(StateLock { dir, file });
            }
        }
    }

    /// Removes the lock file and the directory (no holder left), still holding the lock.
    pub fn remove(self) {
        let _ = fs::remove_file(self.dir.join("lock"));
        let _ = fs::remove_dir(&self.dir);
        drop(self.file);
    }
}

/// The command's output, stdin closed.
pub fn quiet(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

/// Whether the command succeeded.
pub fn ok(cmd: &mut Command) -> bool {
    quiet(cmd).status.success()
}
