//! Namespaces, links and cgroups: throw-away network namespaces, veth pairs between them, and
//! cgroups named like a containerd container's; each removed on drop.
use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;

use crate::setup::{ip, run, unique};
use crate::wait::POLL;

/// A network namespace `ll-<pid>-<n>` with `lo` up; deleted on drop after killing whatever
/// still runs in it.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new() -> NetNs {
        let name = format!("ll-{}", unique());
        ip(&["netns", "add", &name]);
        let ns = NetNs { name };
        ns.run(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`, which execs in
    /// place: the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `args` inside the namespace, panicking unless it succeeds.
    pub fn run(&self, args: &[&str]) -> Output {
        run(self.command(args[0]).args(&args[1..]))
    }

    /// Inode of the namespace (what `stat -L -c %i /proc/PID/ns/net` shows for its members).
    pub fn inode(&self) -> u64 {
        fs::metadata(format!("/run/netns/{}", self.name))
            .expect("stat netns")
            .ino()
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.name]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: plain syscall; the pid belongs to a process this test started.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// The command running `program` in `ns`, or in the test's own namespace for `None`.
pub fn command_in(ns: Option<&NetNs>, program: &Path) -> Command {
    match ns {
        Some(ns) => ns.command(program),
        None => Command::new(program),
    }
}

/// Two fresh namespaces linked by a veth pair: `a` has 10.250.N.1/24 and fd00:250:N::1/64, `b`
/// 10.250.N.2/24 and fd00:250:N::2/64, with N unique per call. Traffic only ever flows between
/// these two namespaces.
pub struct VethPair {
    pub a: NetNs,
    pub b: NetNs,
    pub a_ip: IpAddr,
    pub b_ip: IpAddr,
    pub a_ip6: IpAddr,
    pub b_ip6: IpAddr,
    /// `10.250.N.0/24`
    pub cidr: String,
    /// `fd00:250:N::/64`
    pub cidr6: String,
}

impl VethPair {
    pub fn new() -> VethPair {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // Offset by pid so concurrently running test processes are unlikely to share a subnet.
        let n = 1 + (std::process::id() + NEXT.fetch_add(1, Ordering::Relaxed)) % 254;
        let (a, b) = (NetNs::new(), NetNs::new());
        let (if_a, if_b) = (format!("llv{n}a"), format!("llv{n}b"));
        ip(&[
            "-n", &a.name, "link", "add", &if_a, "type", "veth", "peer", "name", &if_b, "netns", &b.name,
        ]);
        let v4 = |host| IpAddr::from([10, 250, n as u8, host]);
        let v6 = |host| IpAddr::from([0xfd00, 0x250, n as u16, 0, 0, 0, 0, host]);
        for (ns, ifname, host) in [(&a, &if_a, 1), (&b, &if_b, 2)] {
            ns.run(&["ip", "addr", "add", &format!("{}/24", v4(host)), "dev", ifname]);
            let addr6 = format!("{}/64", v6(host as u16));
            ns.run(&["ip", "-6", "addr", "add", &addr6, "dev", ifname, "nodad"]);
            ns.run(&["ip", "link", "set", ifname, "up"]);
        }
        VethPair {
            a,
            b,
            a_ip: v4(1),
            b_ip: v4(2),
            a_ip6: v6(1),
            b_ip6: v6(2),
            cidr: format!("10.250.{n}.0/24"),
            cidr6: format!("{}/64", v6(0)),
        }
    }
}

impl Default for VethPair {
    fn default() -> Self {
        Self::new()
    }
}

/// Root of the cgroup v2 hierarchy (`/sys/fs/cgroup/unified` on hybrid hosts).
pub fn cgroup2_root() -> PathBuf {
    let hybrid = Path::new("/sys/fs/cgroup/unified");
    if hybrid.join("cgroup.procs").exists() {
        hybrid.into()
    } else {
        "/sys/fs/cgroup".into()
    }
}

/// `<root>/lltest-<pid>-<n>/cri-containerd-<64 hex>.scope`, named like a containerd
/// container's cgroup. Removed on drop (any process still inside is moved back to the root).
pub struct ContainerCgroup {
    parent: PathBuf,
    pub dir: PathBuf,
    /// The 64-hex container id in the scope's name.
    pub id: String,
    /// The path as `/proc/PID/cgroup` shows it on the `0::` line.
    pub path: String,
}

impl ContainerCgroup {
    pub fn new() -> ContainerCgroup {
        use std::hash::{BuildHasher, Hasher};
        let mut id = String::new();
        for i in 0..4u64 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write(unique().as_bytes());
            h.write_u64(i);
            id.push_str(&format!("{:016x}", h.finish()));
        }
        let name = format!("lltest-{}", unique());
        let parent = cgroup2_root().join(&name);
        let dir = parent.join(format!("cri-containerd-{id}.scope"));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let path = format!("/{name}/cri-containerd-{id}.scope");
        ContainerCgroup {
            parent,
            dir,
            id,
            path,
        }
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }
}

impl Default for ContainerCgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        let root_procs = cgroup2_root().join("cgroup.procs");
        for _ in 0..40 {
            for pid in fs::read_to_string(self.dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                let _ = fs::write(&root_procs, pid);
            }
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            thread::sleep(POLL);
        }
        let _ = fs::remove_dir(&self.parent);
    }
}

/// Inode of the network namespace of process `pid`.
pub fn netns_inode(pid: u32) -> u64 {
    fs::metadata(format!("/proc/{pid}/ns/net"))
        .expect("stat /proc/PID/ns/net")
        .ino()
}

/// The cgroup v2 path of process `pid` (the `0::` line of `/proc/PID/cgroup`).
pub fn cgroup_path(pid: u32) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("read /proc/PID/cgroup");
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("no 0:: line in /proc/PID/cgroup")
        .to_string()
}
