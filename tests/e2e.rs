//! The shipping end-to-end test (README "Install on a cluster", docs/operations.md "In a cluster"):
//! the image `cargo xtask image` built, installed with the shipped kustomize files on a real single
//! node (Kubernetes 1.20 from Debian's source package: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, kube-proxy, and a node of containerd + runc + CNI +
//! kubelet; `tests/src/real_cluster/`).
//!
//! 1. The image is imported into the node's containerd and `kubectl apply -k deploy/local/` is
//!    run as the README says; then an overlay in a temporary directory adds
//!    `components/restart` and a config with `remediation: {mode: restart}` on top of
//!    `deploy/local/` (the shipped files are what is tested). Each time the agent pod becomes
//!    Ready, and its securityContext is read back from the API and from the running process.
//! 2. `kubectl exec` into the agent pod, `lifeline status -o json`: the host components
//!    (kubelet, kube-proxy, kube-controller-manager, kube-scheduler, all on 127.0.0.1:6443, an
//!    endpoint no configuration names) and the test pods, by name.
//! 3. Two Deployments whose container is `ll-stuck` (never dials again once it lost its
//!    connection), one with `lifeline.dev/remediate: "true"`; the apiserver is SIGKILLed and a
//!    new one started at once: both `disconnected`, both get an Event; the opted-in pod is
//!    evicted through the Eviction API (the apiserver's audit log says who and how) and its
//!    replacement is healthy; the other is left alone (same UID, the skip counted).
//! 4. The monitoring path (`e2e/monitoring.rs`, docs/testing.md "End to end"): a real Prometheus
//!    scraping as the shipped PodMonitor says, with the shipped rules, sending to a real
//!    Alertmanager: `LifelineClientDisconnected` fires, reaches Alertmanager and resolves; every
//!    dashboard panel is queried; `LifelineAgentDown` goes pending for a stopped agent, and for
//!    the node once its agent pod is deleted and the replacement cannot be scheduled, then
//!    clears; `kubectl lifeline`, with docs/operations.md's RBAC only, lists the never-redial
//!    pod.
//! 5. Teardown (the harness's guards) leaves no process, mount, cgroup, bridge, address or
//!    iptables chain behind.
//!
//! The image archive is `$LIFELINE_IMAGE`, else `target/image/lifeline-<version>-<arch>.tar`
//! (`cargo xtask e2e` builds it first). Thresholds are the shipped defaults.
use std::{
    collections::BTreeSet,
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant, SystemTime},
};

use lifeline_integration::{
    init, real_cluster,
    real_cluster::{
        findings::Findings,
        image::Image,
        in_cluster_kubeconfig,
        monitor::Monitor,
        prometheus::{Kubelet, Monitoring},
        secs, ControlPlane, HostLock, Node, Options, Stop, User, KUBECTL,
    },
    *,
};
use serde_json::Value;

#[path = "e2e/monitoring.rs"]
mod monitoring;

/// The agent's namespace and DaemonSet (deploy/base).
const AGENT_NS: &str = "lifeline";
/// The namespace of the test workloads.
const NS: &str = "lifeline-e2e";
/// The Deployment opted into remediation, and the one that is not.
const OPTED_IN: &str = "stuck-opted-in";
const PLAIN: &str = "stuck-plain";
/// The image of the test workloads.
const STUCK_IMAGE: &str = "localhost/ll-stuck:e2e";
/// The agent's HTTP port (deploy/base/daemonset.yaml); with hostNetwork, the node's.
const AGENT_PORT: u16 = 9477;
/// The agent's service account, as the apiserver names it.
const AGENT_USER: &str = "system:serviceaccount:lifeline:lifeline";
/// `disconnect_grace`, the shipped default (docs/configuration.md "Thresholds").
const GRACE: u64 = 15;
/// The capabilities the base DaemonSet adds (docs/operations.md "Privileges"), and what
/// components/restart adds to them.
const BASE_CAPABILITIES: [&str; 5] = ["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"];
const RESTART_CAPABILITIES: [&str; 2] = ["NET_ADMIN", "KILL"];
/// How long a pod gets to become Ready (image already imported).
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Capability numbers (linux/capability.h), for the running process's sets.
fn capability_bit(name: &str) -> u32 {
    match name {
        "DAC_READ_SEARCH" => 2,
        "KILL" => 5,
        "NET_ADMIN" => 12,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("no bit known for capability {other}"),
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The image archive of `cargo xtask image`.
fn image_archive() -> PathBuf {
    let path = std::env::var_os("LIFELINE_IMAGE").map_or_else(
        || {
            let arch = if cfg!(target_arch = "aarch64") {
                "arm64"
            } else {
                "amd64"
            };
            workspace()
                .join("target/image")
                .join(format!("lifeline-{}-{arch}.tar", env!("CARGO_PKG_VERSION")))
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "image archive {} not found: run `cargo xtask image` first (or `cargo xtask e2e`, which \
         builds it and runs this suite), or set LIFELINE_IMAGE",
        path.display()
    );
    path
}

/// `kubectl ARGS -o json`, parsed; panics unless it succeeds.
fn kubectl_json(cp: &ControlPlane, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let text = cp.kubectl_ok(&all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("kubectl {}: {e}:\n{text}", args.join(" ")))
}

/// The pods of `namespace` matching `selector` that are not being deleted.
fn live_pods(cp: &ControlPlane, namespace: &str, selector: &str) -> Vec<Value> {
    let list = kubectl_json(cp, &["-n", namespace, "get", "pods", "-l", selector]);
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn name_of(pod: &Value) -> String {
    pod["metadata"]["name"].as_str().unwrap_or("?").to_owned()
}

fn uid_of(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().unwrap_or("?").to_owned()
}

/// The one live pod matching `selector`, once it is Ready and `accept` takes it (e.g. the
/// DaemonSet's new revision).
fn wait_one_ready_pod(
    cp: &ControlPlane,
    namespace: &str,
    selector: &str,
    accept: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(
        READY_TIMEOUT,
        &format!("one Ready pod -l {selector} in {namespace}"),
        || {
            let pods = live_pods(cp, namespace, selector);
            match pods.as_slice() {
                [pod] if is_ready(pod) && accept(pod) => Ok(pod.clone()),
                _ => {
                    let describe = cp.kubectl(&["-n", namespace, "describe", "pods", "-l", selector]);
                    Err(Shown(String::from_utf8_lossy(&describe.stdout).into_owned()))
                }
            }
        },
    )
}

/// The capabilities the pod's `lifeline` container adds, as the API has them.
fn added_capabilities(pod: &Value) -> BTreeSet<String> {
    pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str().map(str::to_owned))
        .collect()
}

fn strings(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// The host pid of the container `containerID` (`containerd://ID`) of a pod status, from the
/// node's containerd.
fn container_pid(node: &Node, container_id: &str) -> u32 {
    let id = container_id.trim_start_matches("containerd://");
    let out = node.ctr(&["tasks", "ls"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next()? == id).then(|| cols.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no running task {id} in the node's containerd:\n{text}"))
}

/// The pid of the pod's first container.
fn pod_pid(node: &Node, pod: &Value) -> u32 {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_else(|| panic!("pod {} has no container ID: {pod}", name_of(pod)));
    container_pid(node, id)
}

/// `/proc/PID/status` field `name` (e.g. `CapEff`).
fn proc_status(pid: u32, name: &str) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
}

/// Checks what the API says of the agent pod and what the kernel says of its process against
/// the capabilities docs/operations.md documents (`added`): host namespaces, no privileged mode, no
/// privilege escalation, a read-only root, every capability dropped but these.
fn check_security(pod: &Value, pid: u32, added: &BTreeSet<String>, findings: &mut Findings) {
    let spec = &pod["spec"];
    let sc = &spec["containers"][0]["securityContext"];
    let name = name_of(pod);
    for (field, want) in [("hostPID", true), ("hostNetwork", true)] {
        findings.check(spec[field] == want, || {
            format!("pod {name}: spec.{field} is {}, not {want}", spec[field])
        });
    }
    for (field, want) in [
        ("privileged", false),
        ("allowPrivilegeEscalation", false),
        ("readOnlyRootFilesystem", true),
    ] {
        findings.check(sc[field] == want, || {
            format!("pod {name}: securityContext.{field} is {}, not {want}", sc[field])
        });
    }
    findings.check(sc["capabilities"]["drop"] == serde_json::json!(["ALL"]), || {
        format!(
            "pod {name}: capabilities.drop is {}, not [ALL]",
            sc["capabilities"]["drop"]
        )
    });
    let api = added_capabilities(pod);
    findings.check(&api == added, || {
        format!("pod {name}: capabilities.add is {api:?}, docs/operations.md documents {added:?}")
    });
    findings.check(sc["seccompProfile"]["type"] == "RuntimeDefault", || {
        format!("pod {name}: seccompProfile is {}", sc["seccompProfile"])
    });

    // What the runtime made of it: the process's capability sets, no_new_privs, seccomp, and
    // its root mount.
    let want: u64 = added.iter().map(|c| 1u64 << capability_bit(c)).sum();
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        let have = u64::from_str_radix(&proc_status(pid, set), 16).expect("a hex capability set");
        findings.check(have == want, || {
            format!("agent process {pid}: {set} is {have:#x}, want {want:#x} ({added:?})")
        });
    }
    findings.check(proc_status(pid, "NoNewPrivs") == "1", || {
        format!("agent process {pid}: no_new_privs is not set")
    });
    findings.check(proc_status(pid, "Seccomp") == "2", || {
        format!(
            "agent process {pid}: no seccomp filter (Seccomp {})",
            proc_status(pid, "Seccomp")
        )
    });
    let mountinfo = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let root = mountinfo
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .map(|f| f.get(5).copied().unwrap_or("").to_owned());
    findings.check(
        root.as_deref().is_some_and(|o| o.split(',').any(|x| x == "ro")),
        || format!("agent process {pid}: its root is not mounted read-only ({root:?})"),
    );
}

/// The agent's API on the node's loopback (the test runs in the host network namespace, the
/// agent with hostNetwork).
fn agent_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], AGENT_PORT))
}

fn agent_json(path: &str) -> Result<Value, String> {
    match http_get(agent_addr(), path) {
        Ok((200, body)) => serde_json::from_str(&body).map_err(|e| format!("{path}: {e}: {body}")),
        other => Err(format!("{path}: {other:?}")),
    }
}

fn agent_clients() -> Result<Vec<Value>, String> {
    match agent_json("/api/v1/clients")? {
        Value::Array(clients) => Ok(clients),
        other => Err(format!("/api/v1/clients is not a list: {other}")),
    }
}

/// The agent's `/metrics` sample of `lifeline_remediations_total` for `action` and `result`.
fn remediations(action: &str, result: &str) -> u64 {
    let (_, text) = http_get(agent_addr(), "/metrics").expect("the agent's /metrics");
    text.lines()
        .filter(|l| l.starts_with("lifeline_remediations_total{"))
        .filter(|l| {
            l.contains(&format!("action=\"{action}\"")) && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// A client the agent must list.
#[derive(Clone, Debug)]
enum Who {
    /// A host process, by `comm` (and its current pid).
    Host { comm: &'static str, pid: u32 },
    /// The process of a pod, by namespace/name.
    Pod { namespace: String, pod: String },
}

impl Who {
    fn pod(pod: &Value) -> Who {
        Who::Pod {
            namespace: pod["metadata"]["namespace"].as_str().unwrap_or("?").to_owned(),
            pod: name_of(pod),
        }
    }

    fn find<'a>(&self, clients: &'a [Value]) -> Option<&'a Value> {
        clients.iter().find(|c| match self {
            Who::Host { comm, pid } => c["comm"] == *comm && c["pid"] == *pid && c["pod"].is_null(),
            Who::Pod { namespace, pod } => c["namespace"] == namespace.as_str() && c["pod"] == pod.as_str(),
        })
    }
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Host { comm, pid } => write!(f, "host process {comm} (pid {pid})"),
            Who::Pod { namespace, pod } => write!(f, "pod {namespace}/{pod}"),
        }
    }
}

/// `Ok` when `who` is listed, judged healthy, with an established connection to `endpoint`.
fn judged_healthy<'a>(clients: &'a [Value], who: &Who, endpoint: &str) -> Result<&'a Value, String> {
    let c = who.find(clients).ok_or_else(|| format!("{who} is not listed"))?;
    lifeline_integration::judged_healthy(c, Some(endpoint)).map_err(|is| format!("{who} is {is}"))?;
    Ok(c)
}

/// Waits until every `(who, endpoint)` is judged healthy; records those that are not after
/// `timeout`.
fn wait_judged_healthy(want: &[(Who, String)], timeout: Duration, findings: &mut Findings) {
    let deadline = Instant::now() + timeout;
    loop {
        let clients = agent_clients().unwrap_or_default();
        let missing: Vec<String> = want
            .iter()
            .filter_map(|(who, endpoint)| judged_healthy(&clients, who, endpoint).err())
            .collect();
        if missing.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for m in missing {
                findings.add(format!("{timeout:?}: {m}"));
            }
            eprintln!("the agent's clients then:\n{:?}", Pretty(&clients));
            return;
        }
        thread::sleep(secs(1));
    }
}

/// The Events of `namespace` (core v1 view, whichever API the agent wrote them with).
fn events(cp: &ControlPlane, namespace: &str) -> Vec<Value> {
    kubectl_json(cp, &["-n", namespace, "get", "events"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits for an Event `reason` on pod `pod` whose message contains `message`.
fn wait_event(cp: &ControlPlane, pod: &str, reason: &str, message: &str, timeout: Duration) -> Value {
    wait_until(timeout, &format!("Event {reason} on pod {NS}/{pod}"), || {
        let all = events(cp, NS);
        all.iter()
            .find(|e| {
                e["reason"] == reason
                    && e["involvedObject"]["kind"] == "Pod"
                    && e["involvedObject"]["name"] == pod
                    && e["message"].as_str().is_some_and(|m| m.contains(message))
            })
            .cloned()
            .ok_or_else(|| Shown(format!("{:?}", Pretty(&all))))
    })
}

/// The audit log's eviction requests (`pods/eviction` creations).
fn evictions(cp: &ControlPlane) -> Vec<Value> {
    cp.audit_events()
        .into_iter()
        .filter(|e| e["verb"] == "create" && e["objectRef"]["subresource"] == "eviction")
        .collect()
}

/// A Deployment of one `ll-stuck` pod; `annotations` on its pod template.
fn stuck_deployment(name: &str, annotations: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {NS}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{{annotations}}}
    spec:
      # ll-stuck is PID 1 and ignores SIGTERM: an evicted pod goes after this grace.
      terminationGracePeriodSeconds: 3
      containers:
      - name: ll-stuck
        image: {STUCK_IMAGE}
        imagePullPolicy: Never
"
    )
}

/// The overlay the opted-in remediation needs, layered on the shipped `deploy/local/`:
/// `components/restart` and the shipped config with `remediation.mode: restart`.
fn write_restart_overlay(dir: &Path) {
    let deploy = workspace().join("deploy");
    let shipped = fs::read_to_string(deploy.join("base/config.yaml")).expect("deploy/base/config.yaml");
    assert!(
        shipped.contains("\n  mode: none\n"),
        "deploy/base/config.yaml no longer sets `remediation: mode: none`:\n{shipped}"
    );
    let config = shipped.replace("\n  mode: none\n", "\n  mode: restart\n");
    fs::write(dir.join("config.yaml"), config).expect("write the overlay's config.yaml");
    fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [{local}]
components: [{restart}]
configMapGenerator:
  - name: lifeline
    namespace: {AGENT_NS}
    behavior: replace
    files: [config.yaml]
    options: {{disableNameSuffixHash: true}}
",
            local = relative(dir, &deploy.join("local")),
            restart = relative(dir, &deploy.join("components/restart")),
        ),
    )
    .expect("write the overlay's kustomization.yaml");
}

/// `to` as a path relative to the directory `from` (kustomize refuses absolute paths).
fn relative(from: &Path, to: &Path) -> String {
    let canonical = |p: &Path| fs::canonicalize(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let (from, to) = (canonical(from), canonical(to));
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let up = from.components().count() - common;
    let mut path: PathBuf = std::iter::repeat_n("..", up).collect();
    path.extend(to.components().skip(common));
    path.display().to_string()
}

/// On a failure: the agent's log and its pods, before the node is torn down.
struct AgentLogOnPanic {
    kubeconfig: PathBuf,
}

impl Drop for AgentLogOnPanic {
    fn drop(&mut self) {
        if !thread::panicking() {
            return;
        }
        for args in [
            &["-n", AGENT_NS, "logs", "ds/lifeline", "--tail=80"][..],
            &["-n", AGENT_NS, "get", "pods", "-o", "wide"][..],
            &["-n", NS, "get", "events"][..],
        ] {
            let out = Command::new(KUBECTL)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .output();
            if let Ok(out) = out {
                eprintln!(
                    "----- kubectl {} -----\n{}{}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// What the teardown must remove, recorded while the cluster runs.
struct Traces {
    pids: Vec<(String, u32)>,
    run_dir: PathBuf,
    bridge: String,
    cgroup_root: String,
    advertise: String,
}

impl Traces {
    /// Records what is still there. Call it with the cluster lock held (no other cluster
    /// runs: iptables chains would be theirs).
    fn left_behind(&self) -> Vec<String> {
        let mut left = Vec::new();
        for (what, pid) in &self.pids {
            if Path::new(&format!("/proc/{pid}")).exists()
                && fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
            {
                left.push(format!("{what} (pid {pid}) still runs"));
            }
        }
        let mounts = real_cluster::mounts_under(&self.run_dir);
        if !mounts.is_empty() {
            left.push(format!("mounts under {}: {mounts:?}", self.run_dir.display()));
        }
        if self.run_dir.exists() {
            left.push(format!("{} still exists", self.run_dir.display()));
        }
        let link = Command::new("ip").args(["link", "show", &self.bridge]).output();
        if link.is_ok_and(|o| o.status.success()) {
            left.push(format!("bridge {} still exists", self.bridge));
        }
        let addrs = run(Command::new("ip").args(["-4", "-o", "addr", "show", "dev", "lo"]));
        if String::from_utf8_lossy(&addrs.stdout).contains(&format!("inet {}/", self.advertise)) {
            left.push(format!("{} still on lo", self.advertise));
        }
        for base in fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let dir = base.path().join(self.cgroup_root.trim_start_matches('/'));
            if dir.exists() {
                left.push(format!("cgroup {} still exists", dir.display()));
            }
        }
        let root = Path::new("/sys/fs/cgroup").join(self.cgroup_root.trim_start_matches('/'));
        if root.exists() {
            left.push(format!("cgroup {} still exists", root.display()));
        }
        for table in ["filter", "nat"] {
            let saved = run(Command::new("iptables-save").args(["-t", table]));
            let chains: Vec<String> = String::from_utf8_lossy(&saved.stdout)
                .lines()
                .filter(|l| l.starts_with(":KUBE-"))
                .map(str::to_owned)
                .collect();
            if !chains.is_empty() {
                left.push(format!("iptables {table}: {chains:?}"));
            }
        }
        left
    }
}

#[test]
fn shipped_install_watches_and_remediates_on_a_real_node() {
    init!();
    let started = Instant::now();
    let archive = image_archive();
    let stuck_bin = PathBuf::from(env!("CARGO_BIN_EXE_ll-stuck"));
    let mut findings = Findings::default();
    let mut timeline: Vec<(String, Duration)> = Vec::new();
    let mark = |what: &str, timeline: &mut Vec<(String, Duration)>| {
        eprintln!("e2e: {what} ({:.1} s)", started.elapsed().as_secs_f64());
        timeline.push((what.to_owned(), started.elapsed()));
    };

    let mut cp = ControlPlane::start(Options {
        audit: true,
        ..Options::default()
    });
    if let Err(e) = std::net::TcpListener::bind(("0.0.0.0", AGENT_PORT)) {
        let who = run(Command::new("ss").args(["-Htlnp", &format!("sport = :{AGENT_PORT}")]));
        panic!(
            "port {AGENT_PORT} is taken ({e}): the DaemonSet's agent listens there on the node \
             (hostNetwork):\n{}",
            String::from_utf8_lossy(&who.stdout)
        );
    }
    let node = Node::start(&cp);
    let _logs = AgentLogOnPanic {
        kubeconfig: cp.admin_kubeconfig(),
    };
    mark("cluster and node up", &mut timeline);
    // Prometheus (the shipped PodMonitor's scrape, the shipped rules) and Alertmanager.
    let kubelet = Kubelet {
        endpoint: node.kubelet_endpoint(),
        node: node.name.clone(),
        token: cp.token(User::Admin).to_owned(),
    };
    let prom = Monitoring::start(&cp.admin_kubeconfig(), &workspace(), &kubelet);
    // The kubelet's scrape answers (the rules' word that the node is in the cluster).
    let kubelet_up = format!("up{{job=\"kubelet\", node=\"{}\"}} == 1", node.name);
    monitoring::wait_series(&prom, &kubelet_up, "Prometheus scraping the kubelet", secs(30));
    mark("Prometheus and Alertmanager up", &mut timeline);

    // Step 2 of the README: the image into the node's containerd. And the test workloads'
    // image: ll-stuck with its shared libraries, talking to the ClusterIP with the pod's
    // service-account token.
    node.import_image(&archive);
    // Without its debug information (a tenth of the size to import).
    let stripped = node.dir().join("ll-stuck");
    run(Command::new("strip").arg("-o").arg(&stripped).arg(&stuck_bin));
    let stuck_archive = Image::new(STUCK_IMAGE)
        .program_with_libraries(&stripped, "/ll-stuck")
        .file(
            "/kubeconfig",
            in_cluster_kubeconfig(cp.cluster_ip_endpoint(), NS).into_bytes(),
            0o644,
        )
        .entrypoint(&["/ll-stuck", "--kubeconfig", "/kubeconfig", "--namespace", NS])
        .write(&node.dir().join("ll-stuck.tar"));
    node.import_image(&stuck_archive);
    let _ = fs::remove_file(&stuck_archive);
    let _ = fs::remove_file(&stripped);
    let version = env!("CARGO_PKG_VERSION");
    let image = format!("localhost/lifeline:{version}");
    let images = String::from_utf8_lossy(&node.ctr(&["images", "ls", "-q"]).stdout).into_owned();
    assert!(
        images.lines().any(|l| l == image),
        "{} did not import as {image}: the node has {images}",
        archive.display()
    );

    // Step 3 of the README, as written: `kubectl apply -k deploy/local/`.
    let local = workspace().join("deploy/local");
    cp.kubectl_ok(&["apply", "-k", &format!("{}/", local.display())]);
    let base = strings(&BASE_CAPABILITIES);
    let pod = wait_one_ready_pod(&cp, AGENT_NS, "app.kubernetes.io/name=lifeline", |p| {
        added_capabilities(p) == base
    });
    mark("agent Ready (deploy/local/)", &mut timeline);
    findings.check(pod["spec"]["containers"][0]["image"] == image.as_str(), || {
        format!(
            "the agent pod runs {}, not {image}",
            pod["spec"]["containers"][0]["image"]
        )
    });
    check_security(&pod, pod_pid(&node, &pod), &base, &mut findings);

    // Remediation on: the restart component and mode, layered on the shipped overlay.
    let overlay = TempDir::new();
    write_restart_overlay(overlay.path());
    cp.kubectl_ok(&["apply", "-k", &overlay.path().display().to_string()]);
    let with_restart: BTreeSet<String> = base
        .iter()
        .cloned()
        .chain(strings(&RESTART_CAPABILITIES))
        .collect();
    let pod = wait_one_ready_pod(&cp, AGENT_NS, "app.kubernetes.io/name=lifeline", |p| {
        added_capabilities(p) == with_restart
    });
    mark("agent Ready (restart overlay)", &mut timeline);
    let agent_pod = name_of(&pod);
    let agent_pid = pod_pid(&node, &pod);
    check_security(&pod, agent_pid, &with_restart, &mut findings);
    let config = kubectl_json(&cp, &["-n", AGENT_NS, "get", "configmap", "lifeline"]);
    findings.check(
        config["data"]["config.yaml"]
            .as_str()
            .is_some_and(|c| c.contains("mode: restart")),
        || format!("the ConfigMap lifeline does not set mode restart: {config}"),
    );
    let version_out = cp.kubectl_ok(&["-n", AGENT_NS, "exec", &agent_pod, "--", "lifeline", "--version"]);
    findings.check(version_out.contains(version), || {
        format!("`lifeline --version` in the pod says {version_out:?}, not {version}")
    });
    // The node's port is the agent's.
    let listeners = run(Command::new("ss").args(["-Htlnp", &format!("sport = :{AGENT_PORT}")]));
    let listeners = String::from_utf8_lossy(&listeners.stdout).into_owned();
    assert!(
        listeners.contains(&format!("pid={agent_pid},")),
        "port {AGENT_PORT} is not held by the agent (pid {agent_pid}): {listeners}"
    );

    // The test workloads.
    cp.create_viewer_namespace(NS, secs(60));
    cp.apply(&stuck_deployment(OPTED_IN, "lifeline.dev/remediate: \"true\""));
    cp.apply(&stuck_deployment(PLAIN, ""));
    let opted = wait_one_ready_pod(&cp, NS, &format!("app={OPTED_IN}"), |_| true);
    let plain = wait_one_ready_pod(&cp, NS, &format!("app={PLAIN}"), |_| true);
    for p in [&opted, &plain] {
        let name = name_of(p);
        let what = format!("ll-stuck in {name} listing pods");
        cp.wait_pod_log(NS, &name, secs(60), &what, |l| l.starts_with("LIST "));
    }
    let stuck_pids = [pod_pid(&node, &opted), pod_pid(&node, &plain)];
    mark("test workloads running", &mut timeline);

    // The agent, with no endpoint configured, finds the node-local apiserver address the host
    // components use, and lists them and the pods.
    let loopback = cp.loopback_endpoint().to_string();
    let cluster_ip = cp.cluster_ip_endpoint().to_string();
    let host = |cp: &ControlPlane, node: &Node| -> Vec<(Who, String)> {
        [
            ("kubelet", node.kubelet_pid()),
            ("kube-proxy", cp.pid("kube-proxy")),
            ("kube-controller", cp.pid("kube-controller-manager")),
            ("kube-scheduler", cp.pid("kube-scheduler")),
        ]
        .into_iter()
        .map(|(comm, pid)| (Who::Host { comm, pid }, loopback.clone()))
        .collect()
    };
    let mut want = host(&cp, &node);
    want.push((Who::pod(&opted), cluster_ip.clone()));
    want.push((Who::pod(&plain), cluster_ip.clone()));
    wait_judged_healthy(&want, secs(90), &mut findings);
    mark("host components and pods judged healthy", &mut timeline);
    match agent_json("/api/v1/endpoints") {
        Ok(view) => {
            let list = view["endpoints"].as_array().cloned().unwrap_or_default();
            let local = list.iter().find(|e| e["endpoint"] == loopback.as_str());
            findings.check(
                local.is_some_and(|e| {
                    e["sources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| s == "local-apiserver" || s == "kubelet-kubeconfig")
                }),
                || format!("{loopback} is not found by node-local discovery: {view:#}"),
            );
            eprintln!("the agent's endpoints: {view}");
            findings.check(view["api_versions"]["eviction"] == "policy/v1beta1", || {
                format!("the agent does not evict through policy/v1beta1 on a 1.20 apiserver: {view:#}")
            });
        }
        Err(e) => findings.add(format!("the agent's /api/v1/endpoints: {e}")),
    }
    // The same through `kubectl exec ... -- lifeline status -o json`, as the README shows.
    let status = cp.kubectl_ok(&[
        "-n", AGENT_NS, "exec", &agent_pod, "--", "lifeline", "status", "-o", "json",
    ]);
    match serde_json::from_str::<Vec<Value>>(&status) {
        Ok(listed) => {
            for (who, _) in &want {
                findings.check(who.find(&listed).is_some(), || {
                    format!("`lifeline status -o json` in the agent pod does not list {who}: {status}")
                });
            }
        }
        Err(e) => findings.add(format!(
            "`lifeline status -o json` printed no client list ({e}): {status}"
        )),
    }
    let table = cp.kubectl_ok(&["-n", AGENT_NS, "exec", &agent_pod, "--", "lifeline", "status"]);
    eprintln!("lifeline status in the agent pod:\n{table}");
    for name in [name_of(&opted), name_of(&plain), "kubelet".into()] {
        findings.check(table.contains(&name), || {
            format!("`lifeline status` in the agent pod does not show {name}:\n{table}")
        });
    }

    // Prometheus scrapes the agent pod, with the labels the rules and the dashboard use.
    let up = format!(
        "up{{job=\"lifeline\", namespace=\"{AGENT_NS}\", pod=\"{agent_pod}\", node=\"{}\"}} == 1",
        node.name
    );
    monitoring::wait_series(&prom, &up, "Prometheus scraping the agent pod", secs(30));
    mark("Prometheus scrapes the agent", &mut timeline);
    // `kubectl lifeline` as a service account with docs/operations.md's RBAC only.
    let plugin_dir = TempDir::new();
    let viewer = monitoring::plugin_viewer(&cp, &workspace(), AGENT_NS, plugin_dir.path(), &mut findings);
    mark("kubectl lifeline's service account", &mut timeline);

    // The fault: the apiserver SIGKILLed, a new one started at once. The re-dialing clients
    // come back; ll-stuck in both pods never dials again.
    let monitor = Monitor::start(agent_addr(), |c| c["comm"] == "kube-apiserver");
    let done_before = remediations("restart", "done");
    let incident = SystemTime::now();
    let restart = cp.restart_apiserver(Stop::Kill);
    mark("apiserver restarted (SIGKILL)", &mut timeline);
    let (opted_ref, plain_ref) = (
        format!("{NS}/{}", name_of(&opted)),
        format!("{NS}/{}", name_of(&plain)),
    );
    let disconnected = |pod: &str| {
        monitor
            .sightings()
            .into_iter()
            .find(|s| s.pod == pod && s.state == "disconnected")
    };
    let both = wait_until(secs(GRACE + 45), "both ll-stuck pods disconnected", || {
        match (disconnected(&opted_ref), disconnected(&plain_ref)) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(Shown(format!("{:#?}", monitor.sightings()))),
        }
    });
    mark("both ll-stuck pods disconnected", &mut timeline);
    // Streams on the node after the restart: a first kubectl (1.32, go1.23) gets its binary
    // probed; a second one's pods watch is then followed from its first request, so the
    // stream panels have a watch to show, and the stuck-streams panel's emptiness is judged
    // with the stream gauges exported.
    let kubectl_watch = |args: &[&str]| {
        let mut cmd = Command::new(KUBECTL);
        cmd.arg("--kubeconfig").arg(cp.admin_kubeconfig()).args(args);
        Watched::spawn("kubectl --watch", cmd)
    };
    let probing = kubectl_watch(&["get", "nodes", "--watch"]);
    wait_until(secs(30), "the first kubectl's streams followed", || {
        let clients = agent_json("/api/v1/clients").map_err(Shown)?;
        match find_pid(
            clients.as_array().map(Vec::as_slice).unwrap_or_default(),
            probing.pid(),
        ) {
            Some(c) if c["visibility"] == "streams" => Ok(()),
            other => Err(Shown(format!("{other:?}"))),
        }
    });
    let watching = kubectl_watch(&["get", "pods", "--all-namespaces", "--watch"]);
    mark("kubectl watches on the node, followed", &mut timeline);
    // `kubectl lifeline`: the never-redial pod without opt-in listed unhealthy, with its node
    // (the opted-in one may already be evicted).
    match monitoring::kubectl_lifeline(&viewer, plugin_dir.path()) {
        Ok(rows) => {
            let listed = |pod: &str| {
                rows.iter().any(|r| {
                    r.len() == 6
                        && r[0] == node.name
                        && r[1] == NS
                        && r[2] == pod
                        && r[3] == "ll-stuck"
                        && r[5] == "disconnected"
                })
            };
            findings.check(listed(&name_of(&plain)), || {
                format!(
                    "`kubectl lifeline` does not list {plain_ref} disconnected on {}: {rows:?}",
                    node.name
                )
            });
            findings.check(
                rows.iter().all(|r| r.get(1).map(String::as_str) == Some(NS)),
                || format!("`kubectl lifeline` lists clients other than the test pods: {rows:?}"),
            );
        }
        Err(e) => findings.add(e),
    }
    mark("kubectl lifeline lists the pod", &mut timeline);
    // The monitor started just before the SIGKILL and polls every second: each was judged
    // `disconnect_grace` after the loss.
    for s in [&both.0, &both.1] {
        eprintln!("seen {s}");
        let at = s.at.as_secs_f64();
        findings.check(at >= GRACE as f64 - 1.0 && at <= GRACE as f64 + 5.0, || {
            format!(
                "{} judged disconnected {at:.1} s after the SIGKILL, not within {GRACE} s + 5 s: {s}",
                s.pod
            )
        });
    }
    for pod in [name_of(&opted), name_of(&plain)] {
        let e = wait_event(&cp, &pod, "LifelineClientDisconnected", "", secs(30));
        eprintln!("Event on {pod}: {} {}", e["reason"], e["message"]);
    }
    mark("LifelineClientDisconnected Events on both pods", &mut timeline);

    // The opted-in pod: evicted by the agent's service account through pods/eviction.
    let eviction = wait_until(secs(60), "the agent's eviction of the opted-in pod", || {
        let all = evictions(&cp);
        all.iter()
            .find(|e| e["objectRef"]["name"] == name_of(&opted).as_str())
            .cloned()
            .ok_or_else(|| Shown(format!("{all:#?}")))
    });
    mark("opted-in pod evicted", &mut timeline);
    findings.check(eviction["user"]["username"] == AGENT_USER, || {
        format!(
            "the eviction was made by {}, not the agent: {eviction:#}",
            eviction["user"]["username"]
        )
    });
    findings.check(
        eviction["responseStatus"]["code"]
            .as_u64()
            .is_some_and(|c| (200..300).contains(&c)),
        || format!("the eviction was not accepted: {eviction:#}"),
    );
    let restart_event = wait_event(&cp, &name_of(&opted), "LifelineRestart", "", secs(30));
    eprintln!("Event on {}: {}", name_of(&opted), restart_event["message"]);

    // Its replacement: a new pod, its client healthy.
    let replacement = wait_one_ready_pod(&cp, NS, &format!("app={OPTED_IN}"), |p| {
        uid_of(p) != uid_of(&opted)
    });
    findings.check(name_of(&replacement) != name_of(&opted), || {
        format!(
            "the replacement pod has the evicted one's name {}",
            name_of(&opted)
        )
    });
    wait_judged_healthy(
        &[(Who::pod(&replacement), cluster_ip.clone())],
        secs(90),
        &mut findings,
    );
    mark("replacement pod's client healthy", &mut timeline);

    // The pod without opt-in: untouched, still disconnected, the skip counted and said.
    let skipped = wait_event(
        &cp,
        &name_of(&plain),
        "LifelineRestartSkipped",
        "not opted in",
        secs(30),
    );
    eprintln!("Event on {}: {}", name_of(&plain), skipped["message"]);
    let plain_now = kubectl_json(&cp, &["-n", NS, "get", "pod", &name_of(&plain)]);
    findings.check(uid_of(&plain_now) == uid_of(&plain), || {
        format!("the pod without opt-in was replaced: {plain_now}")
    });
    findings.check(plain_now["metadata"]["deletionTimestamp"].is_null(), || {
        format!("the pod without opt-in is being deleted: {plain_now}")
    });
    findings.check(
        plain_now["status"]["containerStatuses"][0]["restartCount"] == 0,
        || format!("the container without opt-in was restarted: {plain_now}"),
    );
    let clients = agent_clients().unwrap_or_default();
    match Who::pod(&plain).find(&clients) {
        Some(c) => findings.check(c["state"] == "disconnected", || {
            format!("the pod without opt-in should still be disconnected: {c}")
        }),
        None => findings.add(format!("{plain_ref} is no longer listed: {:?}", Pretty(&clients))),
    }
    let all_evictions = evictions(&cp);
    findings.check(all_evictions.len() == 1, || {
        format!("one eviction expected (the opted-in pod), the audit log has {all_evictions:#?}")
    });
    let agent_deletes: Vec<Value> = cp
        .audit_events()
        .into_iter()
        .filter(|e| e["verb"] == "delete" && e["user"]["username"] == AGENT_USER)
        .collect();
    findings.check(agent_deletes.is_empty(), || {
        format!("the agent deleted pods (it must only evict): {agent_deletes:#?}")
    });
    let done = remediations("restart", "done") - done_before;
    findings.check(done == 1, || {
        format!("lifeline_remediations_total{{action=\"restart\",result=\"done\"}} grew by {done}, not 1")
    });
    let skips = remediations("restart", "skipped");
    findings.check(skips >= 1, || {
        "lifeline_remediations_total{action=\"restart\",result=\"skipped\"} is 0: the skip of the pod without opt-in is not counted".to_owned()
    });

    // The re-dialing host components: healthy again, never judged otherwise.
    wait_judged_healthy(&host(&cp, &node), secs(60), &mut findings);
    let others: Vec<String> = monitor
        .sightings()
        .into_iter()
        .filter(|s| s.pod != opted_ref && s.pod != plain_ref)
        .map(|s| s.to_string())
        .collect();
    findings.check(others.is_empty(), || {
        format!("clients other than the two ll-stuck pods judged unhealthy after the restart: {others:#?}")
    });
    drop(monitor);
    eprintln!(
        "apiserver back {:.1} s after the SIGKILL",
        restart.ready_after.as_secs_f64()
    );
    mark("checks done", &mut timeline);
    check_monitoring(
        &mut cp,
        &node,
        &prom,
        incident,
        (&opted, &plain),
        (&agent_pod, agent_pid),
        &mut findings,
        &mut |w| mark(w, &mut timeline),
    );
    drop(watching);
    drop(probing);
    drop(prom);

    // Teardown: the guards, then what they must have removed.
    drop(plugin_dir);
    let replacement_pid = pod_pid(&node, &replacement);
    let traces = Traces {
        pids: vec![
            ("the agent".into(), agent_pid),
            ("ll-stuck (opted in)".into(), stuck_pids[0]),
            ("ll-stuck (no opt-in)".into(), stuck_pids[1]),
            ("ll-stuck (replacement)".into(), replacement_pid),
            ("the kubelet".into(), node.kubelet_pid()),
            ("containerd".into(), node.containerd_pid()),
            ("kube-apiserver".into(), cp.pid("kube-apiserver")),
            ("etcd".into(), cp.pid("etcd")),
        ],
        run_dir: cp.dir().to_path_buf(),
        bridge: node.bridge().to_owned(),
        cgroup_root: node.cgroup_root().to_owned(),
        advertise: cp.advertise.to_string(),
    };
    drop(overlay);
    drop(_logs);
    drop(node);
    drop(cp);
    // No other cluster may start while we look (its chains would be found).
    let lock = HostLock::take();
    let left = traces.left_behind();
    drop(lock);
    mark("torn down", &mut timeline);
    for l in left {
        findings.add(format!("teardown left {l}"));
    }
    eprintln!("e2e timeline:");
    for (what, at) in &timeline {
        eprintln!("  {:6.1} s  {what}", at.as_secs_f64());
    }
    findings.assert_none("end-to-end");
}

/// The monitoring path during and after the incident (docs/operations.md "In a cluster",
/// docs/testing.md "End to end"): the rule alerts in Prometheus and Alertmanager, every dashboard
/// panel, `LifelineAgentDown`.
#[allow(clippy::too_many_arguments)]
fn check_monitoring(
    cp: &mut ControlPlane,
    node: &Node,
    prom: &Monitoring,
    incident: SystemTime,
    (opted, plain): (&Value, &Value),
    (agent_pod, agent_pid): (&str, u32),
    findings: &mut Findings,
    mark: &mut dyn FnMut(&str),
) {
    use monitoring::*;
    const DISCONNECTED: &str = "LifelineClientDisconnected";
    let (opted_pod, plain_pod) = (name_of(opted), name_of(plain));
    // The pod left disconnected: the rule fires `for: 1m` after the agent's judgement, with the
    // client's labels (honorLabels) and the node's (the PodMonitor's relabeling).
    let alert = wait_alert(prom, DISCONNECTED, &[("pod", &plain_pod)], "firing", secs(120));
    check_client_labels(&alert, NS, &plain_pod, "ll-stuck", &node.name, findings);
    mark("LifelineClientDisconnected firing in Prometheus");
    if let Some(am) = wait_alertmanager(prom, DISCONNECTED, &[("pod", &plain_pod)], true, secs(30)) {
        check_client_labels(&am, NS, &plain_pod, "ll-stuck", &node.name, findings);
    }
    mark("LifelineClientDisconnected in Alertmanager");

    // Every dashboard panel, the incident still on (the pod without opt-in), once the kubectl
    // pods watch's gauge is scraped.
    let watches = format!(
        "lifeline_client_watches{{node=\"{}\", resource=\"pods\"}} > 0",
        node.name
    );
    wait_series(prom, &watches, "the kubectl pods watch in Prometheus", secs(60));
    check_panels(prom, &workspace(), &node.name, NS, incident, findings);
    mark("dashboard panels queried");

    // The opted-in pod was evicted within the rule's `for: 1m`: its alert was pending, never
    // fired, and is gone. Nothing else fired; the apiserver was down for seconds, so
    // LifelineApiserverOutage (`for: 30s`) may have been pending, no more.
    let history = alert_history(prom, incident);
    eprintln!("ALERTS since the SIGKILL (alertname, alertstate, pod): {history:?}");
    findings.check(
        history.contains(&(DISCONNECTED.into(), "pending".into(), opted_pod.clone())),
        || format!("{DISCONNECTED} was never pending for the opted-in pod {opted_pod}: {history:?}"),
    );
    findings.check(
        !history.contains(&(DISCONNECTED.into(), "firing".into(), opted_pod.clone())),
        || format!("{DISCONNECTED} fired for {opted_pod}, evicted within the rule's `for: 1m`: {history:?}"),
    );
    let active = prom.alerts().unwrap_or_default();
    findings.check(
        !active.iter().any(|a| a["labels"]["pod"] == opted_pod.as_str()),
        || format!("an alert for the evicted pod {opted_pod} is still active: {active:#?}"),
    );
    for (name, state, pod) in &history {
        let expected = name == DISCONNECTED && (*pod == opted_pod || *pod == plain_pod);
        let brief = name == "LifelineApiserverOutage" && state == "pending";
        findings.check(expected || brief, || {
            format!("{name} ({state}, pod {pod:?}) during the incident: it implies only {DISCONNECTED} for the two ll-stuck pods")
        });
    }

    // Resolution: the pod without opt-in deleted by hand, its alert resolves in both.
    cp.kubectl_ok(&["-n", NS, "delete", "pod", &plain_pod, "--wait=false"]);
    wait_alert_gone(prom, DISCONNECTED, &[("pod", &plain_pod)], secs(60));
    wait_alertmanager(prom, DISCONNECTED, &[("pod", &plain_pod)], false, secs(30));
    mark("LifelineClientDisconnected resolved in Prometheus and Alertmanager");

    // LifelineAgentDown, its first way (`up == 0`): the agent stopped (SIGSTOP: its scrapes
    // time out) makes it pending for its pod and node, and SIGCONT clears it (its firing after
    // `for: 5m` is promtool's unit test; the second way below waits it out).
    const DOWN: &str = "LifelineAgentDown";
    // SAFETY: signals to the agent's pid, read from containerd.
    unsafe { libc::kill(agent_pid as i32, libc::SIGSTOP) };
    let down = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_alert(prom, DOWN, &[("pod", agent_pod)], "pending", secs(20))
    }));
    unsafe { libc::kill(agent_pid as i32, libc::SIGCONT) };
    let down = down.unwrap_or_else(|e| std::panic::resume_unwind(e));
    check_agent_labels(&down, &node.name, findings);
    wait_alert_gone(prom, DOWN, &[("pod", agent_pod)], secs(30));
    mark("LifelineAgentDown pending while the agent is stopped, cleared after");

    // Its second way: the agent pod deleted while its replacement cannot be placed (the
    // scheduler stopped: the DaemonSet's pod waits, Pending, without a node or an address).
    // The node has no agent pod: once the old pod's target went (its `up` series stale), the
    // rule matches for the node (no pod) and LifelineAgentDown goes pending. (Its firing
    // `for: 5m` later is promtool's unit test, minute by minute; waiting it out here cost
    // five minutes of CI, and the Alertmanager path is the one LifelineClientDisconnected
    // took above.) The scheduler back, the replacement runs, is scraped, and the alert clears.
    let scheduler_server = cp.options().scheduler_server.clone().unwrap_or(cp.url());
    cp.stop_component("kube-scheduler");
    let selector = "app.kubernetes.io/name=lifeline";
    cp.kubectl_ok(&[
        "-n",
        AGENT_NS,
        "delete",
        "pod",
        agent_pod,
        "--wait=true",
        "--timeout=120s",
    ]);
    let gone = Instant::now();
    let pending = wait_until(
        secs(60),
        "the DaemonSet's replacement Pending, unscheduled",
        || {
            let pods = live_pods(cp, AGENT_NS, selector);
            match pods.as_slice() {
                [p] if name_of(p) != agent_pod
                    && p["status"]["phase"] == "Pending"
                    && p["spec"]["nodeName"].is_null()
                    && p["status"]["podIP"].is_null() =>
                {
                    Ok(name_of(p))
                }
                _ => Err(Shown(format!("{pods:#?}"))),
            }
        },
    );
    mark("agent pod deleted, its replacement unscheduled");
    let node_only = [("node", node.name.as_str()), ("pod", "")];
    // The old target leaves discovery within a second of the pod object; its `up` goes stale
    // at the next scrape, and an evaluation later the rule matches.
    let nodes_alert = wait_alert(prom, DOWN, &node_only, "pending", secs(60));
    let after = gone.elapsed();
    eprintln!("{DOWN} pending for the node {after:?} after the agent pod was deleted");
    check_agent_labels(&nodes_alert, &node.name, findings);
    mark("LifelineAgentDown pending for the node without an agent pod");
    cp.start_scheduler("kube-scheduler", &scheduler_server);
    let new = wait_one_ready_pod(cp, AGENT_NS, selector, |p| name_of(p) == pending);
    let up = format!(
        "up{{job=\"lifeline\", pod=\"{}\", node=\"{}\"}} == 1",
        name_of(&new),
        node.name
    );
    wait_series(
        prom,
        &up,
        "Prometheus scraping the replacement agent pod",
        secs(30),
    );
    wait_alert_gone(prom, DOWN, &[("node", node.name.as_str())], secs(30));
    mark("scheduler back: the replacement scraped, LifelineAgentDown cleared");
}

/// Checks an agent alert's labels: the node's, the agent's job and namespace, and a label set
/// promtool's unit test expects.
fn check_agent_labels(alert: &Value, node: &str, findings: &mut Findings) {
    for (name, want) in [("node", node), ("namespace", AGENT_NS), ("job", "lifeline")] {
        findings.check(alert["labels"][name] == want, || {
            format!(
                "{}: label {name} is {}, not {want}: {alert:#}",
                alert["labels"]["alertname"], alert["labels"][name]
            )
        });
    }
    monitoring::check_unit_tested_labels(alert, &workspace(), findings);
}
