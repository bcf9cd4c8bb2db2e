//! A real Kubernetes 1.20 cluster on this machine, for the real-cluster tier and the shipping
//! end-to-end test: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy
//! ([`ControlPlane`]), optionally a node (containerd + runc + CNI + kubelet, [`Node`]), and the
//! real clients run against it ([`clients`]).
//!
//! The Kubernetes binaries come from `cargo xtask setup` (Debian's `kubernetes` source package,
//! built into [`K8S_BIN`]); etcd, containerd, runc and the CNI plugins are Debian packages.
//!
//! Every piece is a guard: dropping the [`ControlPlane`] stops its processes, cleans
//! kube-proxy's iptables rules, removes the address it added to `lo` and its directory (kept
//! for inspection when the test panicked). One cluster runs on the machine at a time: the
//! control plane holds a host-wide lock ([`CLUSTER_LOCK`]) for its lifetime, because port 6443,
//! the service range and kube-proxy's iptables chains are shared by the whole host.
use std::{
    fs,
    net::Ipv4Addr,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

pub mod clients;
mod control_plane;
mod daemon;
pub mod dashboard;
pub mod findings;
pub mod holding;
pub mod image;
pub mod monitor;
mod node;
pub mod pki;
pub mod podmonitor;
pub mod prometheus;
pub mod supervisor;

pub use control_plane::{ControlPlane, Options, Restart, Stop, User};
pub use daemon::Daemon;
pub use node::{in_cluster_kubeconfig, Node, PAUSE_IMAGE};

/// Where `cargo xtask setup` puts the Kubernetes binaries (xtask/src/kubernetes.rs).
pub const K8S_BIN: &str = "/var/tmp/lifeline-k8s/v1.20.2/bin";
/// The version those binaries report.
pub const K8S_VERSION: &str = "v1.20.2";
/// The lock file every real cluster on this machine holds while it runs.
pub const CLUSTER_LOCK: &str = "/var/tmp/lifeline-k8s/cluster.lock";
/// The system kubectl (1.32).
pub const KUBECTL: &str = crate::KUBECTL_1_32;

/// `K8S_BIN/NAME`, checked to exist.
pub fn k8s_bin(name: &str) -> PathBuf {
    let path = Path::new(K8S_BIN).join(name);
    assert!(
        path.is_file(),
        "{} not found: run `cargo xtask setup` (it builds Kubernetes {K8S_VERSION} from Debian's \
         source package into {K8S_BIN})",
        path.display()
    );
    path
}

/// A program from a Debian package, checked to exist.
pub fn system_bin(path: &str, package: &str) -> PathBuf {
    assert!(
        Path::new(path).is_file(),
        "{path} not found: install Debian's `{package}` (`cargo xtask setup` does)"
    );
    path.into()
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Runs `cmd`, returning its output whether it succeeded or not (panics only if it cannot be
/// spawned).
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

/// An exclusive `flock` on [`CLUSTER_LOCK`], held while a cluster runs; waits for another
/// cluster on the machine to finish first.
pub struct HostLock(fs::File);

impl HostLock {
    pub fn take() -> HostLock {
        let path = Path::new(CLUSTER_LOCK);
        fs::create_dir_all(path.parent().expect("parent")).expect("create the lock's directory");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            eprintln!("waiting for another real cluster on this machine ({CLUSTER_LOCK})");
            // SAFETY: as above.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            assert_eq!(rc, 0, "flock {CLUSTER_LOCK}: {}", std::io::Error::last_os_error());
        }
        HostLock(file)
    }
}

impl Drop for HostLock {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// An address in 10.231.0.0/16 added to `lo` (`/32`), removed on drop. Pods and the host reach
/// the apiserver advertised there (the VM's own eth0 address is never used).
pub struct LoAddress {
    pub ip: Ipv4Addr,
}

impl LoAddress {
    /// 10.231.N.1 with N derived from the pid, skipping addresses already on the host.
    pub fn add() -> LoAddress {
        let taken = String::from_utf8_lossy(
            &crate::run(Command::new("ip").args(["-4", "-o", "addr", "show"])).stdout,
        )
        .into_owned();
        let start = std::process::id() % 250;
        let ip = (0..250)
            .map(|k| Ipv4Addr::new(10, 231, (1 + (start + k) % 250) as u8, 1))
            .find(|ip| !taken.contains(&format!("inet {ip}/")))
            .expect("a free address in 10.231.0.0/16");
        crate::run(Command::new("ip").args(["addr", "add", &format!("{ip}/32"), "dev", "lo"]));
        LoAddress { ip }
    }
}

impl Drop for LoAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["addr", "del", &format!("{}/32", self.ip), "dev", "lo"])
            .status();
    }
}

/// Writes a kubeconfig for `server` trusting `ca`, authenticating with a bearer `token`.
/// Written to a temporary name and renamed: clients may read it while it is replaced.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &str, token: &str) {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: lifeline
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: lifeline
  context:
    cluster: lifeline
    user: {user}
    namespace: default
current-context: lifeline
preferences: {{}}
",
        ca = ca.display()
    );
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// Pids of the processes whose `comm` is `name`.
pub fn pids_named(name: &str) -> Vec<u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name))
        .collect()
}

/// Mount points at or under `dir` (deepest first), from /proc/self/mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found.dedup();
    found
}

/// Unmounts everything at or under `dir` (lazily, deepest first).
pub fn unmount_all_under(dir: &Path) {
    for _ in 0..3 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

/// Removes what `kube-proxy --cleanup` leaves in the host's iptables (its canary chains,
/// KUBE-MARK-DROP/MASQ) and anything else named `KUBE-*`: the jumps to them from other chains
/// first, then the chains. Both address families; only called while the cluster lock is held.
pub fn remove_kube_chains() {
    for tool in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            let saved = output(Command::new(format!("{tool}-save")).args(["-t", table]));
            let text = String::from_utf8_lossy(&saved.stdout).into_owned();
            let (jumps, chains) = kube_rules(&text);
            for rule in jumps {
                let _ = Command::new(tool)
                    .args(["-w", "-t", table, "-D"])
                    .args(split_rule(&rule))
                    .output();
            }
            for chain in &chains {
                let _ = Command::new(tool).args(["-w", "-t", table, "-F", chain]).output();
            }
            for chain in &chains {
                let _ = Command::new(tool).args(["-w", "-t", table, "-X", chain]).output();
            }
        }
    }
}

/// Removes what the CNI bridge plugin's `ipMasq` left in the host's nat table for pods of
/// `pod_cidr` the kubelet did not tear down: the POSTROUTING jump per pod address and the
/// `CNI-*` chain it jumps to. Pods of other networks (other pod ranges) are left alone.
pub fn remove_cni_masquerade(pod_cidr: &str) {
    let saved = output(Command::new("iptables-save").args(["-t", "nat"]));
    let script = cni_masquerade_removal(&String::from_utf8_lossy(&saved.stdout), pod_cidr);
    if script.is_empty() {
        return;
    }
    let mut restore = Command::new("iptables-restore")
        .args(["-w", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn iptables-restore: {e}"));
    use std::io::Write;
    let _ = restore.stdin.take().expect("stdin").write_all(script.as_bytes());
    let _ = restore.wait();
}

/// The `iptables-restore --noflush` input deleting [`remove_cni_masquerade`]'s rules and
/// chains from the nat table `saved`; empty if there are none.
fn cni_masquerade_removal(saved: &str, pod_cidr: &str) -> String {
    let mut deletes = Vec::new();
    let mut chains = Vec::new();
    for rule in saved.lines().filter_map(|l| l.strip_prefix("-A POSTROUTING ")) {
        let mut words = rule.split_whitespace();
        let source = words
            .clone()
            .skip_while(|w| *w != "-s")
            .nth(1)
            .and_then(|s| s.trim_end_matches("/32").parse::<std::net::IpAddr>().ok());
        let target = words.by_ref().skip_while(|w| *w != "-j").nth(1);
        if let (Some(source), Some(target)) = (source, target) {
            if target.starts_with("CNI-") && crate::containment::in_range(source, pod_cidr) {
                deletes.push(format!("-D POSTROUTING {rule}\n"));
                chains.push(target.to_owned());
            }
        }
    }
    if deletes.is_empty() {
        return String::new();
    }
    let mut script = String::from("*nat\n");
    script.extend(deletes);
    for chain in &chains {
        script.push_str(&format!("-F {chain}\n-X {chain}\n"));
    }
    script.push_str("COMMIT\n");
    script
}

/// From one table of `iptables-save` output: the rules of non-KUBE chains that jump to a
/// `KUBE-*` chain (as `CHAIN ARGS...` for `-D`), and the `KUBE-*` chains.
fn kube_rules(saved: &str) -> (Vec<String>, Vec<String>) {
    let chains = saved
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| c.starts_with("KUBE-"))
        .map(str::to_owned)
        .collect();
    let jumps = saved
        .lines()
        .filter_map(|l| l.strip_prefix("-A "))
        .filter(|r| !r.starts_with("KUBE-") && r.contains(" -j KUBE-"))
        .map(str::to_owned)
        .collect();
    (jumps, chains)
}

/// An `iptables-save` rule split into arguments: whitespace separates them except inside
/// double quotes (comments), which are removed.
fn split_rule(rule: &str) -> Vec<String> {
    let (mut args, mut current, mut quoted) = (Vec::new(), String::new(), false);
    for c in rule.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        args.push(current);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_masquerade_of_this_node_only() {
        let saved = "*nat\n:POSTROUTING ACCEPT [0:0]\n:CNI-0a1b - [0:0]\n:CNI-ffff - [0:0]\n\
-A POSTROUTING -s 10.232.7.5/32 -m comment --comment \"name: \\\"lifeline\\\" id: \\\"c1\\\"\" -j CNI-0a1b\n\
-A POSTROUTING -s 10.88.0.3/32 -m comment --comment \"name: \\\"podman\\\"\" -j CNI-ffff\n\
-A CNI-0a1b -d 10.232.7.0/24 -j ACCEPT\nCOMMIT\n";
        let script = cni_masquerade_removal(saved, "10.232.7.0/24");
        assert_eq!(
            script,
            "*nat\n-D POSTROUTING -s 10.232.7.5/32 -m comment --comment \"name: \\\"lifeline\\\" id: \\\"c1\\\"\" -j CNI-0a1b\n\
-F CNI-0a1b\n-X CNI-0a1b\nCOMMIT\n"
        );
        assert_eq!(cni_masquerade_removal(saved, "10.232.8.0/24"), "");
    }

    #[test]
    fn kube_rules_finds_jumps_and_chains() {
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n-A OUTPUT -j DOCKER\nCOMMIT\n";
        let (jumps, chains) = kube_rules(saved);
        assert_eq!(
            jumps,
            ["PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"]
        );
        assert_eq!(chains, ["KUBE-SERVICES", "KUBE-MARK-MASQ"]);
        assert_eq!(
            split_rule(&jumps[0]),
            [
                "PREROUTING",
                "-m",
                "comment",
                "--comment",
                "kubernetes service portals",
                "-j",
                "KUBE-SERVICES"
            ]
        );
    }
}
