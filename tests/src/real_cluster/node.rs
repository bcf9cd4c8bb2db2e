//! A node joined to a [`ControlPlane`]: containerd (its own root, state and socket), runc
//! behind a wrapper, the CNI bridge and host-local plugins, and the kubelet (cgroupfs driver,
//! its own cgroup root). No registry: images are OCI archives imported with `ctr`, starting
//! with the pause image built from the Kubernetes source tree.
//!
//! This VM's root lacks CAP_SYS_RESOURCE, so runc cannot set the negative `oom_score_adj` the
//! kubelet gives pod sandboxes, nor grant a container that capability: the wrapper clamps
//! `process.oomScoreAdj` to ≥ 0 and drops CAP_SYS_RESOURCE from the bundle's config.json
//! before calling the real runc (ENVIRONMENT.md). A real node needs neither.
//!
//! Dropped: every pod deleted (the kubelet tears the sandboxes down, the CNI plugins remove
//! their addresses and rules), the kubelet and containerd stopped, leftover shims and container
//! processes killed, mounts under its directory unmounted, the bridge and the cgroups removed.
use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use super::{image::Image, k8s_bin, output, secs, system_bin, unmount_all_under, ControlPlane, Daemon, User};
use crate::{free_port, wait_until};

/// The sandbox image every pod starts with.
pub const PAUSE_IMAGE: &str = "localhost/pause:3.4";
/// The runc the wrapper calls.
const RUNC: &str = "/usr/sbin/runc";
const CNI_BIN: &str = "/usr/lib/cni";

/// The runc wrapper (see the module documentation).
const RUNC_WRAPPER: &str = r#"#!/usr/bin/python3
# runc, with the bundle's process.oomScoreAdj clamped to >= 0 and CAP_SYS_RESOURCE dropped:
# this machine's root lacks CAP_SYS_RESOURCE (lifeline test node only).
import json, os, sys
args = sys.argv[1:]
if "--bundle" in args:
    path = os.path.join(args[args.index("--bundle") + 1], "config.json")
    with open(path) as f:
        spec = json.load(f)
    process = spec.get("process", {})
    if process.get("oomScoreAdj", 0) < 0:
        process["oomScoreAdj"] = 0
    for kind, caps in process.get("capabilities", {}).items():
        process["capabilities"][kind] = [c for c in caps if c != "CAP_SYS_RESOURCE"]
    with open(path, "w") as f:
        json.dump(spec, f)
os.execv("RUNC", ["runc"] + args)
"#;

/// A kubeconfig for a program in a pod that takes no in-cluster configuration: the
/// `kubernetes` Service at `cluster_ip`, the CA and token the kubelet mounts from the pod's
/// service account, `namespace` as the default.
pub fn in_cluster_kubeconfig(cluster_ip: std::net::SocketAddr, namespace: &str) -> String {
    const SA: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: in-cluster
  cluster:
    server: https://{cluster_ip}
    certificate-authority: {SA}/ca.crt
users:
- name: service-account
  user:
    tokenFile: {SA}/token
contexts:
- name: in-cluster
  context: {{cluster: in-cluster, user: service-account, namespace: {namespace}}}
current-context: in-cluster
"
    )
}

/// A running node. Drop it before its control plane: its teardown deletes the pods through
/// the apiserver.
pub struct Node {
    pub name: String,
    /// The pod network (`10.232.N.0/24`, N from the control plane's address).
    pub pod_cidr: String,
    bridge: String,
    /// `/<cgroup root>`: the kubelet's `cgroupRoot`, in every hierarchy.
    cgroup_root: String,
    dir: PathBuf,
    socket: PathBuf,
    admin_kubeconfig: PathBuf,
    /// The kubelet's HTTPS port (its API and `/metrics`, on every address of the host).
    kubelet_port: u16,
    kubelet: Option<Daemon>,
    containerd: Option<Daemon>,
}

impl Node {
    /// Starts containerd and the kubelet, imports the pause image, and returns once the node
    /// is Ready and schedulable.
    pub fn start(cp: &ControlPlane) -> Node {
        let dir = cp.dir().join("node");
        fs::create_dir_all(&dir).expect("create the node directory");
        let octet = cp.advertise.octets()[2];
        let mut node = Node {
            name: cp.options().node_name.clone(),
            pod_cidr: format!("10.232.{octet}.0/24"),
            bridge: format!("llcni{octet}"),
            cgroup_root: format!("/lifeline-{}", crate::unique()),
            socket: dir.join("containerd/containerd.sock"),
            admin_kubeconfig: cp.admin_kubeconfig(),
            dir,
            kubelet_port: free_port(),
            kubelet: None,
            containerd: None,
        };
        node.start_containerd();
        let pause = Image::new(PAUSE_IMAGE)
            .binary(&k8s_bin("pause"), "/pause")
            .entrypoint(&["/pause"])
            .write(&node.dir.join("pause.tar"));
        node.import_image(&pause);
        node.start_kubelet(cp);
        node.wait_ready(secs(120));
        // The kubelet registers with the not-ready taint; the node lifecycle controller lifts
        // it once Ready, this makes sure.
        let _ = cp.kubectl(&[
            "taint",
            "nodes",
            &node.name,
            "node.kubernetes.io/not-ready:NoSchedule-",
        ]);
        node
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the kubelet serves its API and `/metrics` (HTTPS, webhook authentication).
    pub fn kubelet_endpoint(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.kubelet_port))
    }

    /// The kubelet's pid.
    pub fn kubelet_pid(&self) -> u32 {
        self.kubelet.as_ref().expect("the kubelet runs").pid()
    }

    /// containerd's pid.
    pub fn containerd_pid(&self) -> u32 {
        self.containerd.as_ref().expect("containerd runs").pid()
    }

    /// The kubelet's cgroup root (`/lifeline-…`): every pod's cgroup is under it.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// The bridge the CNI plugin gives pods (`llcniN`).
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// `unix://` address of the node's containerd (for a CRI client).
    pub fn cri_endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// `ctr -a SOCKET -n k8s.io ARGS`
    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        output(
            Command::new(system_bin("/usr/bin/ctr", "containerd"))
                .arg("-a")
                .arg(&self.socket)
                .args(["-n", "k8s.io"])
                .args(args),
        )
    }

    /// Imports an OCI image archive (e.g. from [`Image::write`] or `cargo xtask image`); its
    /// `io.containerd.image.name` annotation names it.
    pub fn import_image(&self, archive: &Path) {
        let archive = archive.display().to_string();
        let out = self.ctr(&["images", "import", &archive]);
        assert!(
            out.status.success(),
            "ctr images import {archive} failed with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        output(
            Command::new(super::KUBECTL)
                .arg("--kubeconfig")
                .arg(&self.admin_kubeconfig)
                .args(args),
        )
    }

    fn start_containerd(&mut self) {
        let d = &self.dir;
        let cni_conf = d.join("cni/net.d");
        fs::create_dir_all(&cni_conf).expect("create the CNI config directory");
        fs::create_dir_all(d.join("containerd")).expect("create the containerd directory");
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "lifeline",
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": self.pod_cidr }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": d.join("cni/ipam"),
                },
            }],
        });
        fs::write(cni_conf.join("10-lifeline.conflist"), conflist.to_string()).expect("write the CNI config");
        let wrapper = d.join("runc-wrapper");
        fs::write(&wrapper, RUNC_WRAPPER.replace("RUNC", RUNC)).expect("write the runc wrapper");
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod the runc wrapper");
        system_bin(RUNC, "runc");
        system_bin(&format!("{CNI_BIN}/bridge"), "containernetworking-plugins");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
oom_score = 0
[grpc]
  address = "{socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{wrapper}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"#,
            root = d.join("containerd/root").display(),
            state = d.join("containerd/state").display(),
            socket = self.socket.display(),
            opt = d.join("containerd/opt").display(),
            wrapper = wrapper.display(),
            cni_conf = cni_conf.display(),
        );
        let config_path = d.join("containerd/config.toml");
        fs::write(&config_path, config).expect("write containerd's config");
        let mut cmd = Command::new(system_bin("/usr/bin/containerd", "containerd"));
        cmd.arg("--config").arg(&config_path);
        let mut daemon = Daemon::spawn("containerd", cmd, d);
        wait_until(secs(30), "containerd answering", || {
            daemon.assert_running();
            let out = self.ctr(&["version"]);
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        });
        self.containerd = Some(daemon);
    }

    fn start_kubelet(&mut self, cp: &ControlPlane) {
        let d = self.dir.join("kubelet");
        fs::create_dir_all(&d).expect("create the kubelet directory");
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failSwapOn: false
oomScoreAdj: 0
address: 0.0.0.0
port: {port}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
makeIPTablesUtilChains: false
serializeImagePulls: false
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
",
            cgroup_root = self.cgroup_root,
            port = self.kubelet_port,
            ca = cp.ca_pem().display(),
        );
        let config_path = d.join("config.yaml");
        fs::write(&config_path, config).expect("write the kubelet config");
        // The kubelet wants its cgroup root to exist in every hierarchy.
        for hierarchy in self.cgroup_hierarchies() {
            let dir = hierarchy.join(self.cgroup_root.trim_start_matches('/'));
            fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        }
        let kubeconfig = cp.kubeconfig(User::Node, &cp.url());
        let mut cmd = Command::new(k8s_bin("kubelet"));
        cmd.arg(format!("--config={}", config_path.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--container-runtime=remote")
            .arg(format!("--container-runtime-endpoint={}", self.cri_endpoint()))
            .arg(format!("--root-dir={}", d.join("root").display()))
            .arg(format!("--cert-dir={}", d.join("pki").display()))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={}", cp.advertise))
            .arg(format!("--pod-infra-container-image={PAUSE_IMAGE}"))
            .arg("--v=2");
        self.kubelet = Some(Daemon::spawn("kubelet", cmd, &self.dir));
    }

    /// Waits until the node reports Ready.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let jsonpath = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
        wait_until(timeout, &format!("node {} Ready", self.name), || {
            for d in self.kubelet.iter_mut().chain(self.containerd.iter_mut()) {
                d.assert_running();
            }
            let out = self.kubectl(&["get", "node", &self.name, "-o", jsonpath]);
            let status = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if status == "True" {
                Ok(())
            } else {
                Err(format!("{status} {}", String::from_utf8_lossy(&out.stderr)))
            }
        });
    }

    /// Deletes every workload controller (so nothing re-creates the pods: a DaemonSet, a
    /// Deployment's ReplicaSet), then every pod, and waits (up to 90 s) until the kubelet has
    /// torn them down.
    fn delete_pods(&self) {
        let _ = self.kubectl(&[
            "delete",
            "daemonsets,deployments,replicasets,statefulsets,jobs",
            "--all",
            "--all-namespaces",
            "--wait=false",
        ]);
        let _ = self.kubectl(&[
            "delete",
            "pods",
            "--all",
            "--all-namespaces",
            "--grace-period=1",
            "--wait=true",
            "--timeout=90s",
        ]);
        for _ in 0..60 {
            let out = self.ctr(&["tasks", "ls", "-q"]);
            if out.status.success() && out.stdout.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            thread::sleep(secs(1));
        }
        eprintln!(
            "node {}: containers still running after the pods were deleted",
            self.name
        );
    }

    /// Pids of containerd shims of this node (their command line names its socket).
    fn shims(&self) -> Vec<i32> {
        let needle = self.socket.display().to_string();
        fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                cmdline.contains("containerd-shim") && cmdline.contains(&needle)
            })
            .collect()
    }

    /// The mounted cgroup hierarchies: each v1 controller's directory (not the symlinks like
    /// `cpu` → `cpu,cpuacct`) and the v2 one (`unified` on a hybrid host, or the root itself).
    fn cgroup_hierarchies(&self) -> Vec<PathBuf> {
        let base = Path::new("/sys/fs/cgroup");
        let mut found: Vec<PathBuf> = fs::read_dir(base)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .filter(|p| p.join("cgroup.procs").exists())
            .collect();
        if base.join("cgroup.procs").exists() {
            found.push(base.to_path_buf());
        }
        found
    }

    /// Every cgroup directory of the kubelet's cgroup root, deepest first, in every hierarchy.
    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        for root in self.cgroup_hierarchies() {
            let top = root.join(self.cgroup_root.trim_start_matches('/'));
            let mut stack = vec![top];
            while let Some(d) = stack.pop() {
                if let Ok(entries) = fs::read_dir(&d) {
                    stack.extend(entries.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()));
                    dirs.push(d);
                }
            }
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        dirs
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.kubelet.is_some() {
            self.delete_pods();
        }
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(libc::SIGTERM, secs(10));
        }
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop(libc::SIGTERM, secs(10));
        }
        for pid in self.shims() {
            // SAFETY: kill on a shim of this node's containerd.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // Container processes left behind (pods the kubelet did not tear down).
        for dir in self.cgroup_dirs() {
            for pid in fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill on a process in this node's own cgroups.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        thread::sleep(Duration::from_millis(300));
        unmount_all_under(&self.dir);
        for dir in self.cgroup_dirs() {
            let _ = fs::remove_dir(&dir);
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
        super::remove_cni_masquerade(&self.pod_cidr);
    }
}
