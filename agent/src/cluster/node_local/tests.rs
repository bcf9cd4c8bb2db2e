use super::*;
use crate::testkit::FakeProc;

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

fn listener(local: &str, pid: u32, comm: &str) -> Listener {
    Listener {
        local: sa(local),
        owner: Some(Owner {
            pid,
            comm: comm.into(),
        }),
    }
}

fn shown(found: &BTreeMap<Endpoint, String>) -> Vec<String> {
    found.keys().map(ToString::to_string).collect()
}

#[test]
fn kubeconfig_flag_forms() {
    let cmd = |args: &[&str]| args.join("\0").into_bytes();
    assert_eq!(
        kubeconfig_flag(&cmd(&[
            "/usr/bin/kubelet",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--v=2"
        ])),
        Some("/etc/kubernetes/kubelet.conf".into())
    );
    assert_eq!(
        kubeconfig_flag(&cmd(&[
            "kubelet",
            "--kubeconfig",
            "kubelet.kubeconfig",
            "--node-ip",
            "10.0.0.1"
        ])),
        Some("kubelet.kubeconfig".into())
    );
    // The last one wins; --bootstrap-kubeconfig is another flag; a trailing NUL is harmless.
    assert_eq!(
        kubeconfig_flag(b"kubelet\0--bootstrap-kubeconfig=/b.conf\0--kubeconfig=/a\0-kubeconfig=/c\0"),
        Some("/c".into())
    );
    assert_eq!(
        kubeconfig_flag(&cmd(&["kubelet", "--config=/var/lib/kubelet/config.yaml"])),
        None
    );
    assert_eq!(kubeconfig_flag(&cmd(&["kubelet", "--kubeconfig"])), None);
    assert_eq!(kubeconfig_flag(&cmd(&["kubelet", "--kubeconfig="])), None);
}

/// kubeadm's kubelet.conf (abridged: the client certificate is a file reference).
const KUBEADM_KUBELET_CONF: &str = r#"apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    server: https://127.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: system:node:cp-1
  name: system:node:cp-1@kubernetes
current-context: system:node:cp-1@kubernetes
kind: Config
preferences: {}
users:
- name: system:node:cp-1
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
"#;

/// k3s' agent kubeconfig: the client-side load balancer on 127.0.0.1:6444.
const K3S_KUBELET_KUBECONFIG: &str = r#"apiVersion: v1
clusters:
- cluster:
    server: https://127.0.0.1:6444
    certificate-authority: /var/lib/rancher/k3s/agent/server-ca.crt
  name: local
contexts:
- context:
    cluster: local
    namespace: default
    user: user
  name: Default
current-context: Default
kind: Config
preferences: {}
users:
- name: user
  user:
    client-certificate: /var/lib/rancher/k3s/agent/client-kubelet.crt
    client-key: /var/lib/rancher/k3s/agent/client-kubelet.key
"#;

#[test]
fn kubeconfig_servers_and_bad_files() {
    let p = Path::new("/etc/kubernetes/kubelet.conf");
    assert_eq!(
        kubeconfig_server(p, KUBEADM_KUBELET_CONF).expect("kubeadm"),
        "https://127.0.0.1:6443"
    );
    assert_eq!(
        kubeconfig_server(p, K3S_KUBELET_KUBECONFIG).expect("k3s"),
        "https://127.0.0.1:6444"
    );
    for (text, needle) in [
        ("{not yaml", "is not a kubeconfig"),
        (
            &KUBEADM_KUBELET_CONF.replace("current-context: system:node:cp-1@kubernetes", "")[..],
            "has no current-context",
        ),
        (
            &KUBEADM_KUBELET_CONF.replace(
                "current-context: system:node:cp-1@kubernetes",
                "current-context: other",
            )[..],
            "current-context \"other\" is not among its contexts",
        ),
        (
            &KUBEADM_KUBELET_CONF.replace("    cluster: kubernetes", "    cluster: elsewhere")[..],
            "names cluster \"elsewhere\", which has no server",
        ),
    ] {
        let err = kubeconfig_server(p, text).expect_err(needle).to_string();
        assert!(
            err.contains(needle) && err.contains("/etc/kubernetes/kubelet.conf"),
            "{err}"
        );
    }
}

#[test]
fn kubelet_kubeconfig_from_its_flag_through_its_root() {
    let proc = FakeProc::new("flag");
    proc.command(1, "systemd", &["/sbin/init"])
        .command(
            812,
            "kubelet",
            &["/usr/bin/kubelet", "--kubeconfig=/etc/kubernetes/kubelet.conf"],
        )
        .seen_by(812, "/etc/kubernetes/kubelet.conf", KUBEADM_KUBELET_CONF)
        // A decoy in a usual place on the host's root: the flag wins.
        .seen_by(1, "/var/lib/kubelet/kubeconfig", K3S_KUBELET_KUBECONFIG);
    let found = kubelet_server(&proc.root).expect("read").expect("found");
    assert_eq!(found.found, Found::Flag { pid: 812 });
    assert_eq!(
        (found.host.clone(), found.port),
        (Host::Ip("127.0.0.1".parse().unwrap()), 6443)
    );
    assert_eq!(
        found.to_string(),
        "server https://127.0.0.1:6443 of /etc/kubernetes/kubelet.conf (--kubeconfig of the kubelet, pid 812)"
    );
    // A relative flag is resolved against the kubelet's working directory.
    let proc = FakeProc::new("relative");
    proc.command(1, "init", &["init"])
        .command(9, "kubelet", &["kubelet", "--kubeconfig", "kubelet.kubeconfig"])
        .seen_by(9, "kubelet.kubeconfig", K3S_KUBELET_KUBECONFIG);
    let found = kubelet_server(&proc.root).expect("read").expect("found");
    assert_eq!(found.port, 6444);
}

#[test]
fn kubelet_kubeconfig_in_a_usual_place_or_nowhere() {
    // k3s: no kubelet process (it runs inside k3s), the kubeconfig under the host's root.
    let proc = FakeProc::new("usual");
    proc.command(1, "systemd", &["/sbin/init"])
        .command(40, "k3s-agent", &["/usr/local/bin/k3s", "agent"])
        .seen_by(
            1,
            "/var/lib/rancher/k3s/agent/kubelet.kubeconfig",
            K3S_KUBELET_KUBECONFIG,
        );
    let found = kubelet_server(&proc.root).expect("read").expect("found");
    assert_eq!(found.found, Found::UsualPlace);
    assert_eq!(found.server, "https://127.0.0.1:6444");
    // Not a node.
    let proc = FakeProc::new("none");
    proc.command(1, "systemd", &["/sbin/init"]);
    assert_eq!(kubelet_server(&proc.root).expect("read"), None);
    // The kubelet names a file that cannot be read: an error naming it.
    let proc = FakeProc::new("missing");
    proc.command(1, "init", &["init"]).command(
        5,
        "kubelet",
        &["kubelet", "--kubeconfig=/etc/kubernetes/gone.conf"],
    );
    let err = kubelet_server(&proc.root).expect_err("unreadable").to_string();
    assert!(err.contains("/etc/kubernetes/gone.conf"), "{err}");
    // A broken one in a usual place is reported too, not skipped.
    let proc = FakeProc::new("broken");
    proc.command(1, "init", &["init"])
        .seen_by(1, "/etc/kubernetes/kubelet.conf", "current-context: x\n");
    let err = kubelet_server(&proc.root).expect_err("broken").to_string();
    assert!(err.contains("current-context \"x\""), "{err}");
}

#[test]
fn what_a_listener_accepts() {
    assert!(accepts(sa("0.0.0.0:6443"), sa("127.0.0.1:6443")));
    assert!(accepts(sa("0.0.0.0:6443"), sa("10.0.0.1:6443")));
    assert!(!accepts(sa("0.0.0.0:6443"), sa("[::1]:6443")));
    assert!(accepts(sa("[::]:6443"), sa("127.0.0.1:6443")));
    assert!(accepts(sa("[::]:6443"), sa("[::1]:6443")));
    assert!(accepts(sa("[::ffff:127.0.0.1]:6443"), sa("127.0.0.1:6443")));
    assert!(!accepts(sa("127.0.0.1:6443"), sa("127.0.0.1:6444")));
    assert!(!accepts(sa("10.0.0.1:6443"), sa("127.0.0.1:6443")));
    assert_eq!(loopback_accepted(sa("10.0.0.1:6443")), Vec::<IpAddr>::new());
    assert_eq!(
        loopback_accepted(sa("127.0.0.2:6443")),
        vec!["127.0.0.2".parse::<IpAddr>().unwrap()]
    );
}

#[test]
fn apiserver_processes_and_the_kubelets_proxy_only() {
    let listeners = [
        // kubeadm control plane: the apiserver on every address, IPv4 and IPv6.
        listener("[::]:6443", 100, "kube-apiserver"),
        // Its insecure port of old, on loopback.
        listener("127.0.0.1:8080", 100, "kube-apiserver"),
        // A node-local proxy where the kubelet points, on both loopbacks.
        listener("127.0.0.1:7445", 200, "haproxy"),
        listener("[::1]:7445", 200, "haproxy"),
        // The same proxy's stats port: not an apiserver address.
        listener("127.0.0.1:8404", 200, "haproxy"),
        // Other loopback listeners: never evidence by themselves, not even on 6444.
        listener("127.0.0.1:6444", 300, "some-daemon"),
        listener("127.0.0.1:10248", 400, "kubelet"),
        // An apiserver bound to one external address accepts no loopback address.
        listener("10.0.0.5:9443", 500, "kube-apiserver"),
        // Owner unknown: only the kubelet's address can make it count.
        Listener {
            local: sa("127.0.0.1:9999"),
            owner: None,
        },
    ];
    let found = local_apiservers(&listeners, &[sa("127.0.0.1:7445")]);
    assert_eq!(
        shown(&found),
        [
            "127.0.0.1:6443",
            "127.0.0.1:7445",
            "127.0.0.1:8080",
            "[::1]:6443",
            "[::1]:7445"
        ]
    );
    assert_eq!(
        found[&Endpoint::exact("::1".parse().unwrap(), 7445)],
        "haproxy (pid 200) listens on 127.0.0.1:7445, where the kubelet's kubeconfig points (127.0.0.1:7445); also listens on [::1]:7445"
    );
    assert_eq!(
        found[&Endpoint::exact("127.0.0.1".parse().unwrap(), 6443)],
        "kube-apiserver (pid 100) listens on [::]:6443"
    );
    // Without the kubelet's address, the proxy is not evidence.
    assert_eq!(
        shown(&local_apiservers(&listeners, &[])),
        ["127.0.0.1:6443", "127.0.0.1:8080", "[::1]:6443"]
    );
    // An unknown owner at the kubelet's address counts, alone.
    assert_eq!(
        shown(&local_apiservers(&listeners, &[sa("127.0.0.1:9999")])),
        ["127.0.0.1:6443", "127.0.0.1:8080", "127.0.0.1:9999", "[::1]:6443"]
    );
}

#[test]
fn findings_carry_both_sources() {
    let kubelet = KubeletServer {
        path: "/etc/kubernetes/kubelet.conf".into(),
        found: Found::UsualPlace,
        server: "https://localhost:6443".into(),
        host: Host::Name("localhost".into()),
        port: 6443,
    };
    let listeners = [listener("0.0.0.0:6443", 7, "kube-apiserver")];
    let ips: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    let f = findings(Some(&kubelet), &ips, &listeners);
    let got: Vec<String> = f
        .entries
        .keys()
        .map(|(e, s)| format!("{e} {}", s.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            "127.0.0.1:6443 kubelet-kubeconfig",
            "127.0.0.1:6443 local-apiserver",
            "[::1]:6443 kubelet-kubeconfig"
        ]
    );
    assert!(news(&f, &f).is_empty());
    assert_eq!(news(&Findings::default(), &f).len(), 3);
}

/// The agent's periodic look at the node: the kubelet's server name resolved, and a part
/// that cannot be read keeps its last answer.
#[tokio::test]
#[ignore = "needs root: sock_diag through setns"]
async fn the_node_watch_resolves_and_keeps_answers() {
    let proc = FakeProc::new("watch");
    proc.command(1, "systemd", &["/sbin/init"])
        .command(
            30,
            "kubelet",
            &["kubelet", "--kubeconfig=/etc/kubernetes/kubelet.conf"],
        )
        .seen_by(
            30,
            "/etc/kubernetes/kubelet.conf",
            &KUBEADM_KUBELET_CONF.replace("https://127.0.0.1:6443", "https://localhost:16443"),
        );
    // The host's network namespace is this process's own (owners stay unknown: the fake
    // /proc has no fds).
    std::fs::create_dir_all(proc.root.join("1/ns")).expect("ns dir");
    std::os::unix::fs::symlink("/proc/self/ns/net", proc.root.join("1/ns/net")).expect("ns link");
    let mut watch = NodeWatch::new(proc.root.clone());
    let first = watch.look().await;
    let kubelet: Vec<String> = first
        .entries
        .keys()
        .filter(|(_, s)| *s == Source::KubeletKubeconfig)
        .map(|(e, _)| e.to_string())
        .collect();
    assert!(kubelet.contains(&"127.0.0.1:16443".to_owned()), "{first:?}");
    assert!(
        first
            .entries
            .values()
            .any(|why| why.contains("--kubeconfig of the kubelet, pid 30")),
        "{first:?}"
    );
    // The kubeconfig becomes unreadable: the last answer stays.
    std::fs::write(through(&proc.root, 30, "/etc/kubernetes/kubelet.conf"), "{broken").expect("break");
    let second = watch.look().await;
    assert_eq!(first.entries(), second.entries());
}

/// A process that kills its child on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Real listeners in a fresh network namespace, held by processes named `kube-apiserver`,
/// `haproxy` and `nginx`: the sockets are found through sock_diag in that namespace, their
/// owners through /proc, and only the apiserver's and the kubelet's proxy's loopback
/// addresses are taken.
#[test]
#[ignore = "needs root: network namespaces"]
fn real_listeners_in_a_namespace() {
    let ns = crate::host::netns::TestNetns::new();
    let bin = std::env::temp_dir().join(format!("lifeline-listeners-{}", std::process::id()));
    std::fs::create_dir_all(&bin).expect("bin dir");
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "/usr/bin/python3 is needed for the listener processes"
    );
    // Each listener runs as `<name>`: a symlink to python3, so its comm is that name.
    let spawn = |name: &str, binds: &[(&str, u16)]| -> Running {
        let link = bin.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(python, &link).expect("symlink");
        let socks: Vec<String> = binds
            .iter()
            .map(|(host, port)| {
                let family = if host.contains(':') { "AF_INET6" } else { "AF_INET" };
                format!(
                    "s=socket.socket(socket.{family}); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); {} s.bind(('{host}', {port})); s.listen(); keep.append(s)",
                    if family == "AF_INET6" { "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0);" } else { "" }
                )
            })
            .collect();
        let script = format!(
            "import socket, time\nkeep=[]\n{}\ntime.sleep(120)\n",
            socks.join("\n")
        );
        Running(
            std::process::Command::new("ip")
                .args(["netns", "exec", &ns.name])
                .arg(&link)
                .args(["-c", &script])
                .spawn()
                .expect("spawn listener"),
        )
    };
    let _apiserver = spawn("kube-apiserver", &[("::", 6443)]);
    let _proxy = spawn("haproxy", &[("127.0.0.1", 7445), ("::1", 7445)]);
    let _other = spawn("nginx", &[("127.0.0.1", 6444)]);
    let procfs = Procfs::default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let found = loop {
        let all = listeners(&ns.path, &procfs).expect("listeners in the namespace");
        let owned = all.iter().filter(|l| l.owner.is_some()).count();
        if owned >= 4 {
            break all;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the four listeners with their owners did not show up: {all:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let comm_of = |port: u16| -> Vec<String> {
        found
            .iter()
            .filter(|l| l.local.port() == port)
            .filter_map(|l| l.owner.as_ref().map(|o| o.comm.clone()))
            .collect()
    };
    assert_eq!(comm_of(6443), ["kube-apiserver"]);
    assert_eq!(comm_of(6444), ["nginx"]);
    let f = findings(None, &[], &found);
    let only_apiserver: Vec<String> = f.entries.keys().map(|(e, _)| e.to_string()).collect();
    assert_eq!(only_apiserver, ["127.0.0.1:6443", "[::1]:6443"]);
    let kubelet = KubeletServer {
        path: "/var/lib/kubelet/kubeconfig".into(),
        found: Found::UsualPlace,
        server: "https://127.0.0.1:7445".into(),
        host: Host::Ip("127.0.0.1".parse().unwrap()),
        port: 7445,
    };
    let f = findings(Some(&kubelet), &["127.0.0.1".parse().unwrap()], &found);
    let got: Vec<String> = f
        .entries
        .keys()
        .map(|(e, s)| format!("{e} {}", s.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            "127.0.0.1:6443 local-apiserver",
            "127.0.0.1:7445 kubelet-kubeconfig",
            "127.0.0.1:7445 local-apiserver",
            "[::1]:6443 local-apiserver",
            "[::1]:7445 local-apiserver"
        ]
    );
    let _ = std::fs::remove_dir_all(&bin);
}
