//! Foundation suite: the agent finds, attributes and forgets TCP connections to the configured
//! apiserver endpoints, in every network namespace. Root only; each test has its own agent,
//! ports and namespaces, so tests may run in parallel.
//!
//! Run: `cargo build -p lifeline && cargo test -p lifeline-integration --test foundation`
use std::net::Ipv4Addr;
use std::thread;
use std::time::{Duration, Instant};

use lifeline_integration::*;
use serde_json::Value;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn loopback_server() -> Server {
    Server::spawn(None, "127.0.0.1:0")
}

/// `bytes_received` and `last_receive_age_seconds` of `conn`, if listed.
fn inbound(clients: &[Value], pid: u32, conn: Conn) -> Option<(u64, Option<f64>)> {
    let k = find_conn(find_pid(clients, pid)?, conn);
    let bytes = k["bytes_received"].as_u64().expect("bytes_received");
    Some((bytes, k["last_receive_age_seconds"].as_f64()))
}

/// Asserts that every connection listed for `pid` reports `endpoint`.
fn assert_endpoint(clients: &[Value], pid: u32, endpoint: &str) {
    let c = find_pid(clients, pid).expect("client listed");
    for k in connections(c) {
        assert_eq!(k["endpoint"], endpoint, "endpoint of {k}");
    }
}

/// 1. A connection to an endpoint is listed within 1 s with its owner's identity; a connection
///    to another port never is.
#[test]
fn endpoint_connection_is_listed_with_its_process() {
    init!();
    let server = loopback_server();
    let elsewhere = loopback_server();
    let agent = Agent::start(&[server.addr.to_string()]);
    let _bystander = Client::spawn(None, &[elsewhere.addr]);

    let mut client = Client::spawn(None, &[]);
    let conn = client.connect(server.addr);
    let connected = Instant::now();
    let clients = agent.wait_table(secs(1.0), &expected(&[&client]));
    eprintln!("listed {:?} after connect", connected.elapsed());

    let c = find_pid(&clients, client.pid()).unwrap();
    assert_client_schema(c);
    assert_eq!(c["comm"], "ll-client", "comm is the process's, not a thread's");
    assert_eq!(c["cmdline"], client.cmdline());
    assert_eq!(c["netns"], netns_inode(client.pid()));
    assert_eq!(c["cgroup"], cgroup_path(client.pid()));
    for key in ["container_id", "namespace", "pod", "container"] {
        assert!(c[key].is_null(), "{key} of a plain host process: {c:#}");
    }
    assert_eq!(c["connect_failures"], 0);
    let k = find_conn(c, conn);
    assert_eq!(k["endpoint"], server.addr.to_string());
    assert_eq!(k["tcp_state"], "ESTABLISHED");
    assert!(
        k["established_at"].as_str().is_some_and(is_rfc3339),
        "established_at: {k}"
    );
    assert_eq!(k["bytes_received"], 0);
    assert!(
        k["last_receive_age_seconds"].is_null(),
        "nothing received yet: {k}"
    );

    // The bystander (connected before the client) stays unlisted.
    agent.hold_table(secs(2.0), &expected(&[&client]));
}

/// 2. A connection made in another network namespace, over a veth link, is attributed to its
///    process and that process's namespace.
#[test]
fn connection_from_another_netns_is_attributed() {
    init!();
    let net = VethPair::new();
    let server = Server::spawn(Some(&net.b), "0.0.0.0:0");
    let target = server.at(net.b_ip);
    let agent = Agent::start(&[target.to_string()]);

    let client = Client::spawn(Some(&net.a), &[target, target]);
    let clients = agent.wait_table(secs(2.0), &expected(&[&client]));

    let c = find_pid(&clients, client.pid()).unwrap();
    assert_client_schema(c);
    assert_eq!(c["comm"], "ll-client");
    assert_eq!(netns_inode(client.pid()), net.a.inode());
    assert_ne!(net.a.inode(), netns_inode(std::process::id()));
    assert_eq!(c["netns"], net.a.inode(), "netns of the client in {}", net.a.name);
    assert_endpoint(&clients, client.pid(), &target.to_string());
}

/// 3a. An IPv6 endpoint.
#[test]
fn ipv6_endpoint() {
    init!();
    let server = Server::spawn(None, "[::1]:0");
    let endpoint = format!("[::1]:{}", server.port());
    let agent = Agent::start(&[&endpoint]);

    let client = Client::spawn(None, &[server.addr]);
    let clients = agent.wait_table(secs(2.0), &expected(&[&client]));
    assert_endpoint(&clients, client.pid(), &endpoint);
    let k = &connections(find_pid(&clients, client.pid()).unwrap())[0];
    assert_eq!(k["remote"], endpoint);
    assert_eq!(k["local"], format!("[::1]:{}", client.conns[0].local.port()));
}

/// 3b. A CIDR endpoint matches every address in it (and only on its port) and is reported as
///     written.
#[test]
fn cidr_endpoint() {
    init!();
    let server = Server::spawn(None, "0.0.0.0:0");
    let elsewhere = Server::spawn(None, "0.0.0.0:0");
    let endpoint = format!("127.0.0.0/8:{}", server.port());
    let agent = Agent::start(&[&endpoint]);

    let ips = [[127, 0, 0, 1], [127, 0, 0, 2], [127, 1, 2, 3]].map(Ipv4Addr::from);
    let client = Client::spawn(None, &ips.map(|ip| server.at(ip)));
    let _bystander = Client::spawn(None, &ips.map(|ip| elsewhere.at(ip)));
    let want = expected(&[&client]);
    let clients = agent.wait_table(secs(2.0), &want);
    assert_endpoint(&clients, client.pid(), &endpoint);
    agent.hold_table(secs(1.0), &want);
}

/// 3c. An IPv6 CIDR endpoint, across network namespaces.
#[test]
fn ipv6_cidr_endpoint_across_netns() {
    init!();
    let net = VethPair::new();
    let server = Server::spawn(Some(&net.b), "[::]:0");
    let endpoint = format!("[{}]:{}", net.cidr6, server.port());
    let agent = Agent::start(&[&endpoint]);

    let client = Client::spawn(Some(&net.a), &[server.at(net.b_ip6)]);
    let _over_ipv4 = Client::spawn(Some(&net.a), &[server.at(net.b_ip)]);
    let clients = agent.wait_table(secs(2.0), &expected(&[&client]));
    assert_endpoint(&clients, client.pid(), &endpoint);
    assert_eq!(find_pid(&clients, client.pid()).unwrap()["netns"], net.a.inode());
}

/// 3d. A host-name endpoint (`localhost:PORT`) matches connections to what it resolves to.
#[test]
fn localhost_endpoint() {
    init!();
    let server = loopback_server();
    let agent = Agent::start(&[format!("localhost:{}", server.port())]);
    let client = Client::spawn(None, &[server.addr]);
    agent.wait_table(secs(2.0), &expected(&[&client]));
}

/// 4. A connection opened before the agent started is listed as soon as it is ready.
#[test]
fn connection_opened_before_start_is_listed_when_ready() {
    init!();
    let server = loopback_server();
    let client = Client::spawn(None, &[server.addr, server.addr]);
    let agent = Agent::start(&[server.addr.to_string()]);

    let clients = agent.clients();
    assert_eq!(
        table(&clients),
        expected(&[&client]),
        "first answer after /readyz: {:?}",
        Pretty(&clients)
    );
    let c = find_pid(&clients, client.pid()).unwrap();
    assert_eq!(c["comm"], "ll-client");
    assert_endpoint(&clients, client.pid(), &server.addr.to_string());
}

/// 5. A closed connection leaves the list within 2 s while its process keeps another one; a
///    process that exits (or is killed) leaves it entirely within 2 s.
#[test]
fn closed_connections_and_exited_processes_disappear() {
    init!();
    let server = loopback_server();
    let agent = Agent::start(&[server.addr.to_string()]);
    let mut keeper = Client::spawn(None, &[server.addr, server.addr]);
    let leaver = Client::spawn(None, &[server.addr]);
    let killed = Client::spawn(None, &[server.addr]);
    agent.wait_table(secs(2.0), &expected(&[&keeper, &leaver, &killed]));

    let first = keeper.conns[0];
    keeper.close(first);
    agent.wait_table(secs(2.0), &expected(&[&keeper, &leaver, &killed]));

    leaver.exit();
    agent.wait_table(secs(2.0), &expected(&[&keeper, &killed]));

    drop(killed); // SIGKILL
    agent.wait_table(secs(2.0), &expected(&[&keeper]));
}

/// 6. Two processes with three connections each: exactly those, each with its own ports.
#[test]
fn two_processes_three_connections_each() {
    init!();
    let server = loopback_server();
    let agent = Agent::start(&[server.addr.to_string()]);
    let a = Client::spawn(None, &[server.addr; 3]);
    let b = Client::spawn(None, &[server.addr; 3]);
    agent.wait_table(secs(2.0), &expected(&[&a, &b]));
}

/// 7. A process in a cgroup named like a containerd container reports that container's id.
#[test]
fn containerd_cgroup_gives_container_id() {
    init!();
    let cgroup = ContainerCgroup::new();
    let server = loopback_server();
    let agent = Agent::start(&[server.addr.to_string()]);

    let mut client = Client::spawn_paused(None, &[server.addr]);
    cgroup.add(client.pid());
    assert_eq!(cgroup_path(client.pid()), cgroup.path);
    client.go();

    let clients = agent.wait_table(secs(2.0), &expected(&[&client]));
    let c = find_pid(&clients, client.pid()).unwrap();
    assert_eq!(c["container_id"], cgroup.id.as_str(), "{c:#}");
    assert_eq!(c["cgroup"], cgroup.path.as_str());
}

/// 8. `bytes_received` grows and `last_receive_age_seconds` resets when the server sends.
#[test]
fn bytes_received_and_last_receive_age() {
    init!();
    let mut server = loopback_server();
    let agent = Agent::start(&[server.addr.to_string()]);
    let client = Client::spawn(None, &[server.addr]);
    let (pid, conn) = (client.pid(), client.conns[0]);
    let clients = agent.wait_table(secs(2.0), &expected(&[&client]));
    assert_eq!(
        inbound(&clients, pid, conn),
        Some((0, None)),
        "before anything was sent"
    );

    // The agent's own reachability probe may hold a connection to the server too. 100 bytes
    // in one segment are payload (more than one keepalive-sized record).
    assert!(server.send(100) >= 1);
    let (bytes, _) = agent.wait_clients(secs(3.0), "the first 100 bytes to be counted", |c| {
        inbound(c, pid, conn).filter(|(bytes, age)| *bytes >= 100 && age.is_some())
    });
    assert_eq!(bytes, 100);

    thread::sleep(secs(3.0));
    let clients = agent.clients();
    let (idle_bytes, idle_age) = inbound(&clients, pid, conn).expect("still listed");
    assert_eq!(idle_bytes, 100, "{:?}", Pretty(&clients));
    assert!(
        idle_age.is_some_and(|age| age >= 2.0),
        "age after 3 s without traffic: {idle_age:?}"
    );

    assert!(server.send(1000) >= 1);
    agent.wait_clients(secs(3.0), "1000 more bytes and an age under 2 s", |c| {
        inbound(c, pid, conn)
            .filter(|(bytes, age)| *bytes >= idle_bytes + 1000 && age.is_some_and(|a| a < 2.0))
    });
}

/// 9. Endpoints are added and removed at run time by editing the config file and sending
///    SIGHUP; flag endpoints stay.
#[test]
fn endpoints_follow_config_reload() {
    init!();
    let [s0, s1, s2] = [(); 3].map(|_| loopback_server());
    let [e0, e1, e2] = [&s0, &s1, &s2].map(|s| s.addr.to_string());
    let dir = TempDir::new();
    let config = dir.path().join("lifeline.yaml");
    write_config(&config, &[&e1]);
    let agent = Agent::start_with(&[
        "--endpoint".into(),
        e0.clone(),
        "--config".into(),
        config.display().to_string(),
    ]);
    let sources = |list: &[(&String, &str)]| {
        let mut v: Vec<_> = list.iter().map(|(e, s)| (e.to_string(), s.to_string())).collect();
        v.sort();
        v
    };
    assert_eq!(agent.endpoints(), sources(&[(&e0, "flag"), (&e1, "config")]));

    let [c0, c1, c2] = [&s0, &s1, &s2].map(|s| Client::spawn(None, &[s.addr]));
    let want = expected(&[&c0, &c1]);
    agent.wait_table(secs(2.0), &want);
    agent.hold_table(secs(1.0), &want);

    write_config(&config, &[&e1, &e2]);
    agent.signal(libc::SIGHUP);
    agent.wait_table(secs(2.0), &expected(&[&c0, &c1, &c2]));
    assert_eq!(
        agent.endpoints(),
        sources(&[(&e0, "flag"), (&e1, "config"), (&e2, "config")])
    );

    write_config(&config, &[&e2]);
    agent.signal(libc::SIGHUP);
    agent.wait_table(secs(2.0), &expected(&[&c0, &c2]));
    assert_eq!(agent.endpoints(), sources(&[(&e0, "flag"), (&e2, "config")]));
}

/// 10. The command line: bad values exit 2 naming them, `check` passes, `status` shows what the
///     API shows, SIGTERM and SIGINT exit 0.
#[test]
fn command_line() {
    init!();
    let listen = format!("127.0.0.1:{}", free_port());
    for bad in ["nonsense:port", "127.0.0.1:99999", "10.250.0.0/33:6443"] {
        let out = lifeline(&["run", "--endpoint", bad, "--listen", &listen]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--endpoint {bad}; stderr:\n{stderr}");
        assert!(stderr.contains(bad), "stderr should name {bad}:\n{stderr}");
    }
    let out = lifeline(&[
        "run",
        "--endpoint",
        "127.0.0.1:6443",
        "--no-such-flag",
        "--listen",
        &listen,
    ]);
    assert_eq!(out.status.code(), Some(2), "unknown flag");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));

    let out = lifeline(&["check"]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lifeline check: {}\n{report}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!report.trim().is_empty(), "lifeline check printed nothing");

    let server = loopback_server();
    let agent = Agent::start(&[server.addr.to_string()]);
    let client = Client::spawn(None, &[server.addr]);
    let want = expected(&[&client]);
    agent.wait_table(secs(2.0), &want);

    let out = lifeline(&["status", "--server", &agent.url(), "-o", "json"]);
    assert!(out.status.success(), "status -o json: {}", out.status);
    let json: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status -o json is not a JSON array ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(table(&json), want);

    let out = lifeline(&["status", "--server", &agent.url()]);
    assert!(out.status.success(), "status: {}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().unwrap_or_default();
    assert!(
        header.contains("PID") && header.contains("COMM"),
        "header: {text}"
    );
    let pid = client.pid().to_string();
    let rows: Vec<_> = lines.filter(|l| l.split_whitespace().any(|w| w == pid)).collect();
    assert_eq!(rows.len(), 1, "one row for pid {pid} (one connection):\n{text}");
    assert!(rows[0].contains("ll-client"), "row: {}", rows[0]);
    agent.stop();

    Agent::start(&[server.addr.to_string()]).stop_with(libc::SIGINT);
}

/// 11. With endpoint clients and unrelated connections in several namespaces, exactly the
///     endpoint clients are listed, each with only its endpoint connections.
#[test]
fn exactly_the_endpoint_clients_across_namespaces() {
    init!();
    let net = VethPair::new();
    let remote = Server::spawn(Some(&net.b), "0.0.0.0:0");
    let remote_other = Server::spawn(Some(&net.b), "0.0.0.0:0");
    let local = loopback_server();
    let local_other = loopback_server();
    assert_ne!(
        remote.port(),
        local.port(),
        "port collision across namespaces: rerun"
    );
    let cidr_endpoint = format!("{}:{}", net.cidr, remote.port());
    let agent = Agent::start(&[cidr_endpoint.clone(), local.addr.to_string()]);

    let in_a = Client::spawn(Some(&net.a), &[remote.at(net.b_ip); 2]);
    let on_host = Client::spawn(None, &[local.addr; 2]);
    let mut mixed = Client::spawn(None, &[local_other.addr]);
    let mixed_conn = mixed.connect(local.addr);
    let _unrelated = [
        Client::spawn(Some(&net.a), &[remote_other.at(net.b_ip)]),
        Client::spawn(None, &[local_other.addr; 2]),
        // B's own loopback on the endpoint's port: outside the CIDR.
        Client::spawn(Some(&net.b), &[remote.at(Ipv4Addr::LOCALHOST)]),
    ];

    let mut want = expected(&[&in_a, &on_host]);
    want.insert(mixed.pid(), [mixed_conn].into());
    let clients = agent.wait_table(secs(2.0), &want);
    assert_endpoint(&clients, in_a.pid(), &cidr_endpoint);
    assert_endpoint(&clients, on_host.pid(), &local.addr.to_string());
    assert_endpoint(&clients, mixed.pid(), &local.addr.to_string());
    assert_eq!(find_pid(&clients, in_a.pid()).unwrap()["netns"], net.a.inode());
    agent.hold_table(secs(2.0), &want);
}

/// 12. `/metrics` carries the SPEC names, labels clients by namespace/pod/container/comm and
///     never by pid, and drops a client's series once its process exits.
#[test]
fn metrics_carry_spec_names_without_pid() {
    init!();
    let server = loopback_server();
    let agent = Agent::start(&[server.addr.to_string()]);
    let client = Client::spawn(None, &[server.addr]);
    agent.wait_table(secs(1.0), &expected(&[&client]));
    let metrics = wait_until(secs(3.0), "client series in /metrics", || {
        let (status, body) = agent.get("/metrics");
        assert_eq!(status, 200);
        if body.contains(r#"comm="ll-client""#) && body.contains("lifeline_client_connections{") {
            Ok(body)
        } else {
            Err(body)
        }
    });
    for family in [
        "lifeline_build_info{",
        "lifeline_client_state{",
        "lifeline_client_connections{",
        "lifeline_ebpf_events_total{kind=\"state_change\"}",
        "lifeline_ebpf_events_lost_total ",
        "lifeline_detection_seconds_bucket{",
    ] {
        assert!(metrics.contains(family), "{family} missing from:\n{metrics}");
    }
    let state_line =
        r#"lifeline_client_state{comm="ll-client",container="",namespace="",pod="",state="healthy"} 1"#;
    assert!(
        metrics.contains(state_line),
        "{state_line} missing from:\n{metrics}"
    );
    let connections = format!(
        r#"lifeline_client_connections{{comm="ll-client",container="",endpoint="{}",namespace="",pod=""}} 1"#,
        server.addr
    );
    assert!(
        metrics.contains(&connections),
        "{connections} missing from:\n{metrics}"
    );
    assert!(!metrics.contains("pid="), "no pid label:\n{metrics}");

    client.exit();
    wait_until(secs(3.0), "client series removed", || {
        let (_, body) = agent.get("/metrics");
        if body.contains(r#"comm="ll-client""#) {
            Err(body)
        } else {
            Ok(())
        }
    });
}

/// 13. A suite leaves the host's iptables rules and routes as it found them (issue 18): after
///     its tests pass, fail, or it is interrupted (SIGINT, SIGTERM); a suite killed outright
///     leaves its rules to the next suite, which removes them when it ends, or to `xtask`'s
///     clearing before its first suite (never while a suite holds them); while two overlap,
///     the first to end leaves the rules to the other; a REJECT of all of 10.0.0.0/8 that
///     earlier versions left is removed; a host whose default gateway is in a test range is
///     refused and left untouched. Each "suite" is this binary running `containment_child`
///     alone in a namespace of its own that looks like a host (a default route), so the
///     comparison is exact while other suites use the real host.
#[test]
fn suites_leave_the_host_as_they_found_it() {
    use lifeline_integration::{
        containment::network_state,
        containment_state::{CHAIN, ROUTE_PROTO},
        network_state::changes as state_changes,
    };
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    init!();
    let host = |addr: &str, gateway: &str| {
        let ns = NetNs::new();
        // A link with the host's address and gateway (a veth pair within the namespace).
        ns.run(&["ip", "link", "add", "ll0", "type", "veth", "peer", "name", "ll1"]);
        for dev in ["ll0", "ll1"] {
            // No IPv6 link-local address: its routes would appear only after DAD, mid-comparison.
            ns.run(&["ip", "link", "set", dev, "addrgenmode", "none"]);
            ns.run(&["ip", "link", "set", dev, "up"]);
        }
        ns.run(&["ip", "addr", "add", addr, "dev", "ll0"]);
        ns.run(&["ip", "route", "add", "default", "via", gateway]);
        ns
    };
    let suite = |ns: &NetNs, mode: &str| {
        let mut cmd = ns.command(std::env::current_exe().expect("this test binary"));
        cmd.args(["containment_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("LL_CONTAINMENT_CHILD", mode)
            .stdin(Stdio::null());
        // Signals this test sends end the child even where this process ignores them (a
        // background job ignores SIGINT; the harness then installs no handler, rightly).
        // SAFETY: signal(2) is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            })
        };
        cmd
    };
    let finished = |ns: &NetNs, mode: &str| {
        let out = suite(ns, mode).output().expect("run the child suite");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    // A suite that waits once contained.
    let started = |ns: &NetNs| {
        let mut child = suite(ns, "wait")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child suite");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut seen = Vec::new();
        // libtest prints `test containment_child ... ` on the same line first.
        while !seen.last().is_some_and(|l: &String| l.ends_with(CONTAINED)) {
            match rx.recv_timeout(secs(30.0)) {
                Ok(line) => seen.push(line),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the child suite was not contained ({e}): {seen:?}");
                }
            }
        }
        child
    };
    let unchanged = |ns: &NetNs, before: &str, after_what: &str| {
        let changes = state_changes(before, &network_state(Some(ns)));
        assert!(
            changes.is_empty(),
            "{after_what}, the namespace changed: {changes:#?}"
        );
    };
    let contained = |ns: &NetNs| {
        let routes = ns.run(&["ip", "route", "show", "proto", ROUTE_PROTO]).stdout;
        !routes.is_empty()
    };

    let ns = host("198.51.100.2/24", "198.51.100.1");
    let before = network_state(Some(&ns));

    let (passed, out) = finished(&ns, "pass");
    assert!(passed && out.contains(CONTAINED), "{out}");
    unchanged(&ns, &before, "after a passing suite");

    let (passed, out) = finished(&ns, "panic");
    assert!(!passed && out.contains(CONTAINED), "{out}");
    unchanged(&ns, &before, "after a failing suite");

    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let mut child = started(&ns);
        // SAFETY: plain syscall on the child this test started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().expect("wait for the child suite");
        assert!(!status.success(), "{name}: {status}");
        unchanged(&ns, &before, &format!("after a suite ended by {name}"));
    }

    let mut killed = started(&ns);
    killed.kill().expect("SIGKILL the child suite");
    killed.wait().expect("wait for the child suite");
    assert!(contained(&ns), "a suite killed outright cannot remove its rules");
    let (passed, out) = finished(&ns, "pass");
    assert!(passed, "{out}");
    unchanged(&ns, &before, "after a suite that followed a killed one");

    // What a killed suite left, cleared before any suite runs (xtask, before its snapshot)...
    let mut killed = started(&ns);
    killed.kill().expect("SIGKILL the child suite");
    killed.wait().expect("wait for the child suite");
    let (cleared, out) = finished(&ns, "clear");
    assert!(
        cleared && out.contains(CLEARED) && out.contains("blackhole 10.250.0.0/16") && out.contains(CHAIN),
        "{out}"
    );
    unchanged(&ns, &before, "after clearing what a killed suite left");
    // ...but never while a suite holds it.
    let mut running = started(&ns);
    let (cleared, out) = finished(&ns, "clear");
    assert!(cleared && out.contains(&format!("{CLEARED} []")), "{out}");
    assert!(
        contained(&ns),
        "clearing took the rules of a suite still running: {out}"
    );
    // SAFETY: as above.
    unsafe { libc::kill(running.id() as i32, libc::SIGTERM) };
    running.wait().expect("wait for the child suite");
    unchanged(&ns, &before, "after a suite that outlived a clearing");

    let mut first = started(&ns);
    let (passed, out) = finished(&ns, "pass");
    assert!(passed, "{out}");
    assert!(
        contained(&ns),
        "a suite ending left another one without its rules"
    );
    // SAFETY: as above.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    first.wait().expect("wait for the child suite");
    unchanged(&ns, &before, "after two overlapping suites");

    // What earlier versions installed (in this namespace only: it would cut the host's resolver
    // off if it is in 10.0.0.0/8).
    ns.run(&[
        "iptables",
        "-w",
        "-I",
        "OUTPUT",
        "-o",
        "ll0",
        "-d",
        "10.0.0.0/8",
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "DNAT",
        "-j",
        "REJECT",
    ]);
    let (passed, out) = finished(&ns, "pass");
    assert!(passed, "{out}");
    unchanged(
        &ns,
        &before,
        "after a suite on a host with the old REJECT of 10.0.0.0/8",
    );

    let refused = host("10.250.255.2/24", "10.250.255.1");
    let before = network_state(Some(&refused));
    let (passed, out) = finished(&refused, "pass");
    assert!(
        !passed && out.contains("the default gateway 10.250.255.1 is in 10.250.0.0/16"),
        "{out}"
    );
    unchanged(&refused, &before, "after a suite refused to run");

    // The host itself, as this suite runs: contained, its resolver not.
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    for resolver in resolv.lines().filter_map(|l| l.trim().strip_prefix("nameserver")) {
        let route = run(Command::new("ip").args(["route", "get", resolver.trim()]));
        let route = String::from_utf8_lossy(&route.stdout).into_owned();
        assert!(!route.starts_with("blackhole"), "{resolver}: {route}");
    }
}

/// What `containment_child` prints once contained.
const CONTAINED: &str = "test traffic contained";
/// What `containment_child` prints before the list of what it cleared (`LL_CONTAINMENT_CHILD=clear`).
const CLEARED: &str = "cleared:";

/// Run by [`suites_leave_the_host_as_they_found_it`] as a suite of its own: contained, it
/// prints [`CONTAINED`], then passes, panics or waits as `LL_CONTAINMENT_CHILD` says. Without
/// that variable (any ordinary run) it does nothing.
#[test]
fn containment_child() {
    let Ok(mode) = std::env::var("LL_CONTAINMENT_CHILD") else {
        return;
    };
    if mode == "clear" {
        // What xtask does before its first suite; not a suite itself (not contained).
        let removed = lifeline_integration::containment_state::clear_abandoned().expect("clear");
        println!("{CLEARED} {removed:?}");
        return;
    }
    init!();
    let routes = run(std::process::Command::new("ip").args(["route", "show", "table", "main"]));
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    assert!(routes.contains("blackhole 10.250.0.0/16 proto 76"), "{routes}");
    let chain = run(std::process::Command::new("iptables").args(["-w", "-S", "LIFELINE-TESTS"]));
    assert!(
        String::from_utf8_lossy(&chain.stdout).contains("-d 10.96.0.0/12"),
        "{chain:?}"
    );
    println!("{CONTAINED}");
    match mode.as_str() {
        "pass" => {}
        "panic" => panic!("a failing test (as asked)"),
        "wait" => thread::sleep(Duration::from_secs(600)),
        other => panic!("LL_CONTAINMENT_CHILD={other}?"),
    }
}
