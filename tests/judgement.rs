//! The judgement against the real kernel: real sockets in network namespaces, the real eBPF
//! programs and `tcp_info`, short thresholds. Each test is one rule of docs/states-and-streams.md's
//! state table that only the kernel can prove (the pure rules are unit-tested in
//! `agent/src/health`): dual-stack sockets, a client's own idle close, peer closes across an agent
//! restart, connects into a blackhole, drops on the client's own path, requests left unanswered,
//! silence beyond a learned rhythm, forked children, removed endpoints and the failure reasons; and
//! an OpenSSL client's requests (python3-kubernetes): a hung watch named, no secret in any output.
use std::{
    fs,
    net::SocketAddr,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use lifeline_integration::{
    scenario::{assert_detected, sibling_bin, wait_alert, WebhookSink},
    *,
};
use serde_json::Value;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// disconnect_grace, seconds.
const GRACE: f64 = 4.0;
/// stale_after, seconds.
const STALE: f64 = 6.0;
/// blackhole_after, seconds.
const BLACKHOLE: f64 = 5.0;

/// The agent watching `endpoints`, alerting to `sink`, with short thresholds and `extra`
/// config lines (under the top level) and flags.
fn agent(endpoints: &[String], sink: &WebhookSink, config_tail: &str, flags: &[&str]) -> (Agent, TempDir) {
    let dir = TempDir::new();
    let config = dir.path().join("lifeline.yaml");
    let list: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    std::fs::write(
        &config,
        format!(
            "endpoints: [{}]\nthresholds:\n  disconnect_grace: {GRACE}s\n  min_client_age: 2s\n  stale_after: {STALE}s\n  \
blackhole_after: {BLACKHOLE}s\n  outage_after: 5m\nreceivers:\n  - {{ name: sink, webhook: {{ url: \"{}\" }} }}\n{config_tail}",
            list.join(", "),
            sink.url
        ),
    )
    .expect("write config");
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    args.extend(flags.iter().map(|f| (*f).to_owned()));
    (Agent::start_with(&args), dir)
}

/// A server on 127.0.0.1 and the agent watching it (as [`agent`] starts it): the server, its
/// endpoint, the agent and the agent's config directory.
fn local_server(sink: &WebhookSink, config_tail: &str, flags: &[&str]) -> (Server, String, Agent, TempDir) {
    let server = Server::spawn(None, "127.0.0.1:0");
    let endpoint = format!("127.0.0.1:{}", server.port());
    let (agent, dir) = agent(std::slice::from_ref(&endpoint), sink, config_tail, flags);
    (server, endpoint, agent, dir)
}

/// [`local_server`] and one ll-client connected to it, judged healthy: the server, the agent,
/// the client and its connection, and the agent's config directory.
fn local_client(sink: &WebhookSink) -> (Server, Agent, Client, Conn, TempDir) {
    let (server, endpoint, agent, dir) = local_server(sink, "", &[]);
    let client = Client::spawn(None, &[endpoint.parse().unwrap()]);
    wait_state(&agent, client.pid(), "healthy", secs(5.0));
    let conn = client.conns[0];
    (server, agent, client, conn, dir)
}

/// Ok while `pid` is listed healthy and no alert came.
fn healthy_no_alerts(agent: &Agent, sink: &WebhookSink, pid: u32) -> Result<(), (Option<Value>, Vec<Value>)> {
    let clients = agent.clients();
    match find_pid(&clients, pid) {
        Some(c) if c["state"] == "healthy" && sink.alerts().is_empty() => Ok(()),
        other => Err((other.cloned(), sink.alerts())),
    }
}

/// A server on every address of `net.b` and the agent watching it at `net.b_ip`: the server,
/// that address, the agent and the agent's config directory.
fn server_across(net: &VethPair, sink: &WebhookSink) -> (Server, SocketAddr, Agent, TempDir) {
    let server = Server::spawn(Some(&net.b), "0.0.0.0:0");
    let target = server.at(net.b_ip);
    let (agent, dir) = agent(&[target.to_string()], sink, "", &[]);
    (server, target, agent, dir)
}

/// Waits until `pid` is judged (a client, past min_client_age) and in `state`; returns its
/// object and when it was seen so. A process listed before its connection is (its connect
/// seen, not its establishment) is "not a client yet": not judged either.
fn wait_state(agent: &Agent, pid: u32, state: &str, timeout: Duration) -> (Value, SystemTime) {
    let c = agent.wait_clients(timeout, &format!("pid {pid} {state}"), |clients| {
        find_pid(clients, pid)
            .filter(|c| c["state"] == state && judged(c))
            .cloned()
    });
    (c, SystemTime::now())
}

fn metrics_lines(agent: &Agent, prefix: &str) -> Vec<String> {
    let (_, text) = agent.get("/metrics");
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

fn reason(c: &Value) -> &str {
    c["reason"].as_str().unwrap_or("")
}

/// A JVM's connection to an IPv4 apiserver is an AF_INET6 socket to `::ffff:a.b.c.d`: listed
/// in that form, sampled, kept, judged from its requests, and reset by `SOCK_DESTROY`.
#[test]
fn a_dual_stack_socket_is_listed_sampled_judged_and_reset() {
    init!();
    let sink = WebhookSink::start();
    let tail = "select:\n  comm: [\"ll-client\"]\nremediation:\n  mode: reset\n  cooldown: 1m\n";
    let (mut server, endpoint, agent, _dir) = local_server(&sink, tail, &[]);
    let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{}", server.port()).parse().unwrap();
    let mut client = Client::spawn(None, &[mapped]);
    let conn = client.conns[0];
    assert!(conn.local.is_ipv6(), "an AF_INET6 socket: {conn:?}");

    let clients = agent.wait_table(secs(2.0), &expected(&[&client]));
    let k = find_conn(find_pid(&clients, client.pid()).unwrap(), conn);
    assert_eq!(k["remote"], mapped.to_string(), "its own form");
    assert_eq!(k["endpoint"], endpoint.as_str(), "matched to the IPv4 endpoint");
    // Sampled in that form: still there seconds later, and its inbound bytes counted.
    agent.hold_table(secs(3.0), &expected(&[&client]));
    assert!(server.send(500) >= 1);
    agent.wait_clients(secs(3.0), "500 bytes received on the mapped socket", |clients| {
        let c = find_pid(clients, client.pid())?;
        (find_conn(c, conn)["bytes_received"].as_u64() >= Some(500)).then_some(())
    });
    // A request left unanswered: stale, then its socket is reset in its own form.
    client.send(conn, 300);
    let sent = SystemTime::now();
    let (_, at) = wait_state(&agent, client.pid(), "stale", secs(STALE + 5.0));
    assert_detected("stale", sent, at, STALE - 1.0, STALE + 2.0);
    // The reset follows in the same tick.
    agent.wait_clients(
        secs(10.0),
        "the mapped socket destroyed by the reset",
        |clients| {
            let c = find_pid(clients, client.pid())?;
            connections(c).is_empty().then_some(())
        },
    );
    // The runner counts the reset once the destroy returned: on a slow guest (5.10 under TCG)
    // the table can see the socket gone before the count is written.
    wait_until(secs(5.0), "one reset counted as done", || {
        let done = metrics_lines(
            &agent,
            "lifeline_remediations_total{action=\"reset\",result=\"done\"}",
        );
        (done.len() == 1 && done[0].ends_with(" 1"))
            .then_some(())
            .ok_or(done)
    });
}

/// A client closing its own idle connection (Go's IdleConnTimeout) stays healthy and raises
/// nothing; a client whose connection the peer closed is `disconnected` after the grace.
#[test]
fn an_idle_close_of_its_own_is_not_a_loss_a_peer_close_is() {
    init!();
    let sink = WebhookSink::start();
    let (server, endpoint, agent, _dir) = local_server(&sink, "", &[]);
    let target: SocketAddr = endpoint.parse().unwrap();
    let mut idle = Client::spawn(None, &[target]);
    wait_state(&agent, idle.pid(), "healthy", secs(5.0));
    let conn = idle.conns[0];
    idle.close(conn);
    hold(secs(GRACE + 5.0), "the idle closer healthy, no alert", || {
        let clients = agent.clients();
        match find_pid(&clients, idle.pid()) {
            Some(c) if c["state"] == "healthy" && sink.alerts().is_empty() => Ok(()),
            other => Err((other.cloned(), sink.alerts())),
        }
    });

    let other = Client::spawn(None, &[target]);
    wait_state(&agent, other.pid(), "healthy", secs(5.0));
    drop(server); // the apiserver side goes away: FIN, the client never closes (CLOSE_WAIT)
    let lost = SystemTime::now();
    let (c, at) = wait_state(&agent, other.pid(), "disconnected", secs(GRACE + 5.0));
    assert_detected("disconnected", lost, at, GRACE - 0.5, GRACE + 2.0);
    assert!(reason(&c).contains("closed by the apiserver side"), "{c}");
    let idle_state = find_pid(&agent.clients(), idle.pid()).map(|c| c["state"].clone());
    assert_eq!(
        idle_state,
        Some(Value::from("healthy")),
        "the idle closer lost nothing"
    );
}

/// Issue 15: the client's own close is not a loss, whatever the peer sends after it: a peer
/// still writing gets an RST for its next write, and the agent's own probe, which the server
/// closes every few seconds (`ll-server` closes a TLS handshake at once), says nothing about
/// the endpoint going away.
#[test]
fn the_clients_own_close_is_no_loss_whatever_the_peer_sends_after_it() {
    init!();
    let sink = WebhookSink::start();
    let (mut server, agent, mut client, conn, _dir) = local_client(&sink);
    assert!(server.send(600) >= 1);
    client.close(conn);
    for _ in 0..5 {
        server.send(600);
        thread::sleep(Duration::from_millis(200));
    }
    hold(
        secs(GRACE + 6.0),
        "the client that closed healthy, no alert",
        || {
            let clients = agent.clients();
            match find_pid(&clients, client.pid()) {
                Some(c) if c["state"] == "healthy" && sink.alerts().is_empty() => Ok(()),
                other => Err((other.cloned(), sink.alerts())),
            }
        },
    );
}

/// A client whose connection is lost and whose new connect goes into a blackhole (its SYNs
/// unanswered, a connect takes minutes to fail) is trying: `unreachable`, never `disconnected`.
#[test]
fn retrying_into_a_blackhole_is_unreachable_not_disconnected() {
    init!();
    let sink = WebhookSink::start();
    let net = VethPair::new();
    let (server, target, agent, _dir) = server_across(&net, &sink);
    let mut client = Client::spawn_with(Some(&net.a), &[target], &["--connect-timeout", "120"]);
    client.go();
    wait_state(&agent, client.pid(), "healthy", secs(5.0));
    // New connects are dropped; the established one is closed by the peer.
    let port = target.port().to_string();
    net.b.run(&[
        "iptables", "-w", "-A", "INPUT", "-p", "tcp", "--syn", "--dport", &port, "-j", "DROP",
    ]);
    drop(server);
    let lost = SystemTime::now();
    thread::sleep(secs(0.5));
    client.start_connect(target);
    let deadline = Instant::now() + secs(GRACE + 5.0);
    let c = loop {
        let clients = agent.clients();
        let c = find_pid(&clients, client.pid()).cloned().expect("listed");
        assert_ne!(
            c["state"], "disconnected",
            "a client retrying is never disconnected: {c}"
        );
        if c["state"] == "unreachable" {
            break c;
        }
        assert!(Instant::now() < deadline, "not unreachable in time: {c}");
        thread::sleep(secs(0.2));
    };
    assert_detected("unreachable", lost, SystemTime::now(), GRACE - 0.5, GRACE + 2.0);
    assert!(reason(&c).contains("unanswered"), "{c}");
    assert!(
        connections(&c).iter().any(|k| k["tcp_state"] == "SYN_SENT"),
        "the attempt in flight is listed: {c}"
    );
}

/// Segments dropped on the client's own path (iptables OUTPUT DROP in its namespace, the
/// seed-002 reproduction) fire no retransmit tracepoint here; `tcp_info` shows them.
#[test]
fn drops_on_the_clients_own_path_are_a_blackhole() {
    init!();
    let sink = WebhookSink::start();
    let net = VethPair::new();
    let (_server, target, agent, _dir) = server_across(&net, &sink);
    let mut client = Client::spawn(Some(&net.a), &[target]);
    wait_state(&agent, client.pid(), "healthy", secs(5.0));
    let b_ip = net.b_ip.to_string();
    net.a
        .run(&["iptables", "-w", "-A", "OUTPUT", "-d", &b_ip, "-j", "DROP"]);
    let conn = client.conns[0];
    client.send(conn, 100);
    let sent = SystemTime::now();
    let (c, at) = wait_state(&agent, client.pid(), "blackholed", secs(BLACKHOLE + 6.0));
    // The first retransmit is one RTO (>= 200 ms) after the send; seen within a sample.
    assert_detected("blackholed", sent, at, BLACKHOLE, BLACKHOLE + 3.0);
    assert!(reason(&c).contains("no acknowledgement"), "{c}");
    let alert = wait_until(secs(5.0), "the blackholed alert", || {
        let a = sink.named("LifelineClientBlackholed");
        a.first().cloned().ok_or_else(|| sink.alerts())
    });
    assert_eq!(alert["labels"]["endpoint"], target.to_string());
}

/// Clients whose apiserver socket sits in CLOSE_WAIT (the peer closed it, the process never
/// did: seeds 000/004, the apiserver restarted and they never re-dial) are `disconnected`;
/// after the agent is killed and started again they are `disconnected` again within the grace,
/// and their alert fires again.
#[test]
fn an_agent_restart_does_not_forgive_a_connection_the_peer_closed() {
    init!();
    let sink = WebhookSink::start();
    let (server, endpoint, agent1, dir) = local_server(&sink, "", &[]);
    let target: SocketAddr = endpoint.parse().unwrap();
    let clients = [Client::spawn(None, &[target]), Client::spawn(None, &[target])];
    for c in &clients {
        wait_state(&agent1, c.pid(), "healthy", secs(5.0));
    }
    // The apiserver restarts; the clients never dial again.
    drop(server);
    let _server = Server::spawn(None, &endpoint);
    for c in &clients {
        wait_state(&agent1, c.pid(), "disconnected", secs(GRACE + 5.0));
    }
    wait_until(secs(5.0), "the disconnected alert", || {
        let a = sink.named("LifelineClientDisconnected");
        (!a.is_empty()).then_some(()).ok_or_else(|| sink.alerts())
    });
    let before = sink.named("LifelineClientDisconnected").len();
    let config = dir.path().join("lifeline.yaml").display().to_string();
    unsafe_kill(agent1.pid());
    drop(agent1);

    let agent2 = Agent::start_with(&["--config".to_owned(), config]);
    let started = SystemTime::now();
    for c in &clients {
        let (c, at) = wait_state(&agent2, c.pid(), "disconnected", secs(GRACE + 5.0));
        assert_detected("disconnected again", started, at, GRACE - 1.0, GRACE + 2.0);
        assert!(reason(&c).contains("found closed"), "{c}");
    }
    wait_until(secs(5.0), "the alert sent again", || {
        let now = sink.named("LifelineClientDisconnected");
        (now.len() > before && now.last().is_some_and(|a| a["status"] == "firing"))
            .then_some(())
            .ok_or_else(|| sink.alerts())
    });
}

/// SIGKILL, as a liveness probe or a rollout does.
fn unsafe_kill(pid: u32) {
    // SAFETY: plain syscall on a pid this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Rule A: a quiet connection is healthy past stale_after; a request left unanswered is stale
/// within stale_after + 2 s; an answer heals it. The connection is quiet long enough to be
/// sampled only every few seconds (unchanged for 10 s): the request after the quiet spell is
/// timed by `tcp_info`, not by when the next sample came.
#[test]
fn a_request_left_unanswered_is_stale_and_quiet_is_healthy() {
    init!();
    let sink = WebhookSink::start();
    let (mut server, agent, mut client, conn, _dir) = local_client(&sink);
    hold(secs(STALE + 10.0), "a quiet connection healthy", || {
        let clients = agent.clients();
        match find_pid(&clients, client.pid()) {
            Some(c) if c["state"] == "healthy" => Ok(()),
            other => Err(other.cloned()),
        }
    });
    client.send(conn, 300);
    let sent = SystemTime::now();
    let (c, at) = wait_state(&agent, client.pid(), "stale", secs(STALE + 5.0));
    assert_detected("stale", sent, at, STALE - 1.0, STALE + 2.0);
    assert!(reason(&c).contains("sent a request"), "{c}");
    assert!(server.send(600) >= 1);
    wait_state(&agent, client.pid(), "healthy", secs(3.0));
}

/// Ordered evidence (issue 15): a request, its answer, and the client's small reply to the
/// answer (flow control) within milliseconds is no wait, however the sampler's counters sum
/// them. Today's JVM watch did exactly this and was called `stale` forever.
#[test]
fn an_answer_and_the_clients_reply_to_it_are_no_wait() {
    init!();
    let sink = WebhookSink::start();
    let (mut server, agent, mut client, conn, _dir) = local_client(&sink);
    client.send(conn, 300);
    // (The agent's own probe holds a connection to the server too.)
    assert!(server.send(3400) >= 1);
    client.send(conn, 40);
    hold(secs(STALE + 4.0), "the answered client healthy", || {
        healthy_no_alerts(&agent, &sink, client.pid())
    });
}

/// Ordered evidence (issue 15): behind a gateway that sends its own keepalive-sized records
/// (HTTP/2 PINGs every 4 s, each acked by the client at once) and answers no request, a
/// client that sends a request every 3 s is `stale` `stale_after` after the first one: the
/// peer's PINGs are no answer.
#[test]
fn a_peers_pings_the_client_acks_are_no_answer() {
    init!();
    let sink = WebhookSink::start();
    let (mut server, endpoint, agent, _dir) = local_server(&sink, "", &[]);
    let mut client = Client::spawn_with(None, &[endpoint.parse().unwrap()], &["--ack-small"]);
    client.go();
    wait_state(&agent, client.pid(), "healthy", secs(5.0));
    let conn = client.conns[0];
    let start = Instant::now();
    let mut first = None;
    let mut stale = None;
    let mut tick = 0u64;
    while start.elapsed() < secs(STALE + 6.0) && stale.is_none() {
        if tick.is_multiple_of(3) {
            client.send(conn, 200);
            first.get_or_insert_with(SystemTime::now);
        }
        if tick % 4 == 2 {
            assert!(server.send(38) >= 1, "the gateway's PING");
        }
        tick += 1;
        let until = start + secs(tick as f64);
        while Instant::now() < until {
            let clients = agent.clients();
            if let Some(c) = find_pid(&clients, client.pid()).filter(|c| c["state"] == "stale") {
                stale = Some((c.clone(), SystemTime::now()));
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    let (c, at) = stale.expect("stale while only PINGs came back");
    assert_detected("stale", first.expect("a request"), at, STALE - 1.0, STALE + 2.0);
    assert!(reason(&c).contains("sent a request"), "{c}");
}

/// Ordered evidence through the real kernel program: the start of a go1.24 informer in the
/// real-cluster soak, where byte order once took flow control for a PING's ack. A LIST and its
/// answer; a watch asked at once and its HEADERS back as one 35-byte record (a 13-byte frame
/// once HPACK indexed every header); then the client hands back the LIST's credit, 35 bytes
/// (the size of that record), and nothing more comes. Healthy past stale_after; a request
/// nothing answers after that is `stale` (the connection is followed all along).
#[test]
fn flow_control_after_a_watchs_small_headers_is_no_ping_ack() {
    init!();
    let sink = WebhookSink::start();
    let (mut server, agent, mut client, conn, _dir) = local_client(&sink);
    let gap = Duration::from_millis(30);
    client.send(conn, 200); // the LIST
    thread::sleep(gap);
    assert!(server.send(4000) >= 1, "the LIST's answer");
    thread::sleep(gap);
    client.send(conn, 115); // the watch
    thread::sleep(gap);
    assert!(server.send(35) >= 1, "the watch's HEADERS");
    thread::sleep(gap);
    client.send(conn, 35); // WINDOW_UPDATE for the LIST's answer, read late
    hold(
        secs(STALE + 4.0),
        "a watch answered with HEADERS, then quiet, healthy",
        || healthy_no_alerts(&agent, &sink, client.pid()),
    );
    client.send(conn, 200);
    let asked = SystemTime::now();
    let (c, at) = wait_state(&agent, client.pid(), "stale", secs(STALE + 5.0));
    assert_detected("stale", asked, at, STALE - 1.0, STALE + 2.0);
    assert!(reason(&c).contains("sent a request"), "{c}");
}

/// Rule B: a client whose requests came every ~2 s is stale once it has neither sent nor
/// received for silence_floor (twice its rhythm is less).
#[test]
fn silence_beyond_the_learned_rhythm_is_stale() {
    init!();
    const FLOOR: f64 = 6.0;
    let sink = WebhookSink::start();
    let (mut server, endpoint, agent, _dir) = local_server(
        &sink,
        "",
        &[
            "--silence-floor",
            "6s",
            "--silence-max",
            "10m",
            "--stale-after",
            "1m",
        ],
    );
    let mut client = Client::spawn(None, &[endpoint.parse().unwrap()]);
    wait_state(&agent, client.pid(), "healthy", secs(5.0));
    for _ in 0..4 {
        client.send(client.conns[0], 300);
        thread::sleep(secs(0.3));
        assert!(server.send(600) >= 1);
        thread::sleep(secs(1.7));
    }
    let last = SystemTime::now() - secs(1.7);
    let (c, at) = wait_state(&agent, client.pid(), "stale", secs(FLOOR + 5.0));
    assert_detected("stale by silence", last, at, FLOOR - 1.0, FLOOR + 2.5);
    assert!(reason(&c).contains("silence_floor"), "{c}");
}

/// A process that forks and exits leaves its socket to the child: the child is listed with it
/// and is not `disconnected`.
#[test]
fn a_forked_child_keeps_the_socket_its_parent_leaves() {
    init!();
    let sink = WebhookSink::start();
    let (server, _, agent, _dir) = local_server(&sink, "", &[]);
    let script = format!(
        "import socket, os, sys, time\n\
s = socket.create_connection(('127.0.0.1', {port}))\n\
time.sleep(3)\n\
pid = os.fork()\n\
if pid:\n    print(pid, flush=True)\n    os._exit(0)\n\
time.sleep(60)\n",
        port = server.port()
    );
    let mut out = Command::new(SYSTEM_PYTHON)
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let parent = out.id();
    // The child keeps the pipe open: read the one line, then reap the parent.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(out.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("child pid line");
    out.wait().expect("parent exits");
    let child: u32 = line.trim().parse().expect("child pid");
    let _reap = KillOnDrop(child);
    let gone = SystemTime::now();
    let c = agent.wait_clients(secs(5.0), "the child listed with the socket", |clients| {
        find_pid(clients, child)
            .filter(|c| connections(c).iter().any(|k| k["tcp_state"] == "ESTABLISHED"))
            .cloned()
    });
    assert!(
        find_pid(&agent.clients(), parent).is_none(),
        "the parent is forgotten"
    );
    thread::sleep(
        secs(GRACE + 2.0).saturating_sub(SystemTime::now().duration_since(gone).unwrap_or_default()),
    );
    let c2 = find_pid(&agent.clients(), child).cloned().unwrap_or(c);
    assert_eq!(c2["state"], "healthy", "{c2}");
    assert!(sink.alerts().is_empty(), "{:?}", sink.alerts());
}

struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        unsafe_kill(self.0);
    }
}

/// Removing an endpoint from the set (SIGHUP) forgets its clients: no `disconnected`, no alert.
#[test]
fn removing_an_endpoint_does_not_disconnect_its_clients() {
    init!();
    let sink = WebhookSink::start();
    let (s1, s2) = (
        Server::spawn(None, "127.0.0.1:0"),
        Server::spawn(None, "127.0.0.1:0"),
    );
    let (e1, e2) = (
        format!("127.0.0.1:{}", s1.port()),
        format!("127.0.0.1:{}", s2.port()),
    );
    let (agent, dir) = agent(&[e1.clone(), e2.clone()], &sink, "", &[]);
    let client = Client::spawn(None, &[e1.parse().unwrap()]);
    wait_state(&agent, client.pid(), "healthy", secs(5.0));
    let config = dir.path().join("lifeline.yaml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, text.replace(&format!("\"{e1}\", "), "")).expect("rewrite config");
    // SAFETY: plain syscall on the agent this test started.
    unsafe { libc::kill(agent.pid() as i32, libc::SIGHUP) };
    agent.wait_clients(
        secs(5.0),
        "the client of the removed endpoint unlisted",
        |clients| find_pid(clients, client.pid()).is_none().then_some(()),
    );
    thread::sleep(secs(GRACE + 3.0));
    assert!(find_pid(&agent.clients(), client.pid()).is_none());
    assert!(sink.alerts().is_empty(), "{:?}", sink.alerts());
}

/// Failed connects carry the reason the kernel recorded: nothing listening (refused), an ICMP
/// host unreachable (unreachable), accepted then reset (reset).
#[test]
fn failed_connects_carry_refused_unreachable_and_reset() {
    init!();
    let sink = WebhookSink::start();
    let net = VethPair::new();
    let ports: [u16; 3] = [free_port(), free_port(), free_port()];
    let [refused, unreachable, reset] = ports.map(|p| SocketAddr::new(net.b_ip, p));
    net.b.run(&[
        "iptables",
        "-w",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        &ports[1].to_string(),
        "-j",
        "REJECT",
        "--reject-with",
        "icmp-host-unreachable",
    ]);
    // Accepts, then closes with SO_LINGER 0: a reset right after the handshake.
    let rst_script = format!(
        "import socket, struct\n\
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
l.bind(('{ip}', {port})); l.listen(16); print('listening', flush=True)\n\
while True:\n    c, _ = l.accept()\n    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))\n    c.close()\n",
        ip = net.b_ip,
        port = ports[2]
    );
    let mut rst = net.b.command(SYSTEM_PYTHON);
    rst.args(["-c", &rst_script]);
    let mut rst = Proc::spawn(rst);
    rst.expect(&["listening"]);
    let endpoints: Vec<String> = [refused, unreachable, reset]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let (agent, _dir) = agent(&endpoints, &sink, "", &[]);
    let mut client = Client::spawn(Some(&net.a), &[]);
    for target in [refused, unreachable] {
        client.start_connect(target);
        assert!(client.connected().is_err(), "{target} must fail");
    }
    client.start_connect(reset);
    let _ = client.connected();
    wait_until(secs(5.0), "failures counted by reason", || {
        let lines = metrics_lines(&agent, "lifeline_client_connect_failures_total{");
        let all = ["refused", "unreachable", "reset"]
            .iter()
            .all(|r| lines.iter().any(|l| l.contains(&format!("reason=\"{r}\""))));
        if all {
            Ok(())
        } else {
            Err(lines)
        }
    });
}

/// The fixture apiserver with a pod whose labels are a secret's stand-in, `hang` among its
/// flags (`--hang-watches pods`, `--hang-lists pods`, `--watch-timeout 300s`), and the agent watching it with
/// `flags`: what the Go stream tests share.
struct StreamFixture {
    sink: WebhookSink,
    dir: TempDir,
    _api: ApiServer,
    endpoint: String,
    agent: Agent,
    _config: TempDir,
}

impl StreamFixture {
    fn start(hang: &[&str], flags: &[&str]) -> StreamFixture {
        let sink = WebhookSink::start();
        let dir = TempDir::new();
        let mut options = ApiServerOptions::new(Generation::Old);
        options.pods = vec![serde_json::json!({
            "metadata": { "name": "db", "labels": { "app": "secret-pod-data-xyz" } }
        })];
        options.extra = hang.iter().map(|h| (*h).to_owned()).collect();
        let args = options.args(dir.path());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let api = ApiServer::start(
            &sibling_bin("ll-apiserver"),
            "127.0.0.1:0".parse().unwrap(),
            &dir.path().join("certs"),
            &args,
        );
        let endpoint = api.addr().to_string();
        let (agent, config) = agent(std::slice::from_ref(&endpoint), &sink, "", flags);
        StreamFixture {
            sink,
            dir,
            _api: api,
            endpoint,
            agent,
            _config: config,
        }
    }

    /// `kubectl ARGS` of the binary at `path` against the fixture, with the secret token.
    fn kubectl(&self, path: &str, args: &[&str]) -> Watched {
        let mut cmd = Command::new(path);
        cmd.args([
            "--server",
            &format!("https://{}", self.endpoint),
            "--insecure-skip-tls-verify",
            "--token",
            "secret-token-xyz",
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        Watched::spawn("kubectl", cmd)
    }

    /// Waits until `pid`'s streams are followed; its client object.
    fn followed(&self, pid: u32, what: &str) -> Value {
        self.followed_within(pid, what, secs(30.0))
    }

    /// [`followed`](Self::followed), waiting up to `within`.
    fn followed_within(&self, pid: u32, what: &str, within: Duration) -> Value {
        wait_until(within, &format!("{what}'s streams followed"), || match find_pid(
            &self.agent.clients(),
            pid,
        )
        .cloned()
        {
            Some(c) if c["visibility"] == "streams" => Ok(c),
            other => Err(other),
        })
    }
}

/// Streams (issues 16, 23): each real Go client below (stripped: the uprobes go on the
/// functions found in its `.gopclntab`; adding one is one line) holds a quiet minute watching
/// nodes (healthy, nothing stuck, the watch named), then watches pods with
/// `timeoutSeconds=3` through an apiserver whose pod watches hang (headers and the initial
/// events, then nothing, never the end). The watch is `stuck` once its own deadline and
/// `watch_grace` (3 s) have passed, the client `stale` with a reason naming the stream, the
/// alert carries `resource="pods"`, the metrics count it, and a second kubectl watching nodes
/// on the same apiserver stays healthy with its watch listed. Of the client's plaintext only
/// stream metadata leaves: its bearer token, its label selector's value and the pods' data
/// appear in no API answer, metric, log line or alert.
macro_rules! go_clients {
    ($($test:ident: $kubectl:expr, $go:literal;)*) => {$(
        #[test]
        fn $test() {
            init!();
            go_clients_hung_watch_is_stuck_and_named_and_no_secret_leaves($kubectl, $go);
        }
    )*};
}

go_clients! {
    // Debian's kubectl 1.20: Go 1.19, the net/http bundle and Kubernetes' vendored x/net.
    a_go_clients_hung_watch_is_stuck_and_named_and_no_secret_leaves: KUBECTL_1_20, "go1.19";
    // The image's kubectl 1.32: Go 1.23, x/net/http2 as a module.
    kubectl_1_32_go_1_23_hung_watch_is_stuck_and_named: KUBECTL_1_32_ITSELF, "go1.23";
    // sid's kubectl 1.36: Go 1.27, net/http/internal/http2, no text start in .gopclntab.
    kubectl_1_36_go_1_27_hung_watch_is_stuck_and_named: KUBECTL_1_36, "go1.27";
}

/// The test above with `kubectl`, which must have been built with Go release `go` (`go1.19`).
fn go_clients_hung_watch_is_stuck_and_named_and_no_secret_leaves(kubectl_path: &str, go: &str) {
    assert!(
        std::path::Path::new(kubectl_path).exists(),
        "{kubectl_path} is missing: run `cargo xtask setup`"
    );
    // Watches end after 300 s, not the fixture's 60 s: `kubectl get --watch` exits when its
    // watch ends, and its nodes watch is held through a quiet minute.
    let f = StreamFixture::start(
        &["--hang-watches", "pods", "--watch-timeout", "300s"],
        &["--watch-grace", "3s"],
    );
    let (agent, sink) = (&f.agent, &f.sink);
    let kubectl = |args: &[&str]| f.kubectl(kubectl_path, args);
    // The first kubectl: its binary gets the probes (they stay while it runs).
    let nodes = kubectl(&["get", "nodes", "--watch"]);
    let (c, _) = wait_state(agent, nodes.pid(), "healthy", secs(20.0));
    let probed = f.followed(nodes.pid(), "kubectl");
    assert!(
        probed["visibility_reason"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("({go}")),
        "{probed} / {c}"
    );
    // A quiet minute for its nodes watch, open (kubectl sends no timeoutSeconds) and silent:
    // healthy with nothing stuck, the watch named (it was probed as it started).
    hold_a_quiet_minute(agent, &[(nodes.pid(), "kubectl get nodes --watch")]);

    let pods = kubectl(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=3&labelSelector=app%3Dsecret-selector-xyz",
    ]);
    let started = SystemTime::now();
    let (c, at) = wait_state(agent, pods.pid(), "stale", secs(20.0));
    // Deadline 3 s + grace 3 s, judged within a tick; the watch started after the spawn.
    assert_detected("the hung watch stuck", started, at, 6.0, 9.0);
    let why = reason(&c);
    assert!(
        why.starts_with("watch pods in default: open") && why.contains("due to end after 3s"),
        "{c}"
    );
    let streams = c["streams"].as_array().cloned().unwrap_or_default();
    let stuck: Vec<&Value> = streams.iter().filter(|s| s["stuck"] == true).collect();
    assert_eq!(stuck.len(), 1, "{c}");
    assert_eq!(stuck[0]["resource"], "pods");
    assert_eq!(stuck[0]["kind"], "watch");
    assert_eq!(stuck[0]["namespace"], "default");
    assert_eq!(
        stuck[0]["path"],
        "/api/v1/namespaces/default/pods?labelSelector=REDACTED&timeoutSeconds=3&watch=true"
    );
    // The process's comm: its file name, cut to 15 bytes (`kubectl.1.32`).
    let comm: String = std::path::Path::new(kubectl_path)
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(15).collect())
        .unwrap_or_default();
    let alert = wait_alert(sink, "LifelineClientStale", &comm, secs(10.0));
    assert_eq!(alert["labels"]["resource"], "pods", "{alert}");
    let stuck_metric = metrics_lines(agent, "lifeline_client_stream_stuck{");
    assert!(
        stuck_metric
            .iter()
            .any(|l| l.contains("resource=\"pods\"") && l.ends_with(" 1")),
        "{stuck_metric:?}"
    );

    // The nodes watch of the other kubectl flows and is listed, not stuck.
    let clients = agent.clients();
    let other = find_pid(&clients, nodes.pid()).expect("the nodes watcher listed");
    assert_eq!(other["state"], "healthy", "{other}");

    // Nothing of the plaintext but stream metadata anywhere.
    let (_, metrics) = agent.get("/metrics");
    // The command line kubectl was given holds the selector and the token: every channel,
    // command lines included, shows them redacted.
    let api = agent.clients();
    let pods_cmdline = find_pid(&api, pods.pid())
        .map(|c| c["cmdline"].to_string())
        .unwrap_or_default();
    assert!(
        pods_cmdline.contains("labelSelector=<redacted>") && pods_cmdline.contains("timeoutSeconds=3"),
        "the watch's command line, its path's query redacted as a stream's: {pods_cmdline}"
    );
    let outputs = [
        ("the API", Value::Array(api).to_string()),
        ("the metrics", metrics),
        ("the log", agent.stderr()),
        ("the alerts", Value::Array(sink.alerts()).to_string()),
    ];
    for (what, text) in &outputs {
        for secret in ["secret-token-xyz", "secret-selector-xyz", "secret-pod-data-xyz"] {
            assert!(!text.contains(secret), "{what} contains {secret:?}");
        }
    }
    drop(pods);
    drop(nodes);
}

/// Issue 23: a Go client's LIST whose response began and then stopped (a gateway whose
/// upstream died mid-answer: seed 003's cache-sync that waits forever) is stuck once nothing
/// came for stale_after, named in the reason; the same client's flowing watch is not.
#[test]
fn a_go_clients_list_held_mid_answer_is_stuck_and_named() {
    init!();
    let f = StreamFixture::start(&["--hang-lists", "pods"], &[]);
    let agent = &f.agent;
    let kubectl = |args: &[&str]| f.kubectl(KUBECTL_1_20, args);
    // The first kubectl gets the binary probed (the probes stay while it runs).
    let nodes = kubectl(&["get", "nodes", "--watch"]);
    wait_state(agent, nodes.pid(), "healthy", secs(20.0));
    f.followed(nodes.pid(), "kubectl");
    let list = kubectl(&["get", "--raw", "/api/v1/namespaces/default/pods?limit=500"]);
    let started = SystemTime::now();
    let (c, at) = wait_state(agent, list.pid(), "stale", secs(30.0));
    // The response's first half comes at once; stale_after of nothing, judged within a tick.
    assert_detected("the list held mid-answer stuck", started, at, STALE, STALE + 4.0);
    let why = reason(&c);
    assert!(
        why.starts_with("list pods in default: open") && why.contains("its response begun and unfinished"),
        "{c}"
    );
    let streams = c["streams"].as_array().cloned().unwrap_or_default();
    let stuck: Vec<&Value> = streams.iter().filter(|s| s["stuck"] == true).collect();
    assert_eq!(stuck.len(), 1, "{c}");
    assert_eq!(stuck[0]["resource"], "pods");
    assert_eq!(stuck[0]["kind"], "list");
    assert_eq!(stuck[0]["response_headers"], true, "its response began: {c}");
    // The watch flows (bookmarks, events): healthy, its stream not stuck, past stale_after.
    let other = find_pid(&agent.clients(), nodes.pid())
        .cloned()
        .expect("the nodes watcher listed");
    assert_eq!(other["state"], "healthy", "{other}");
    assert!(
        other["streams"]
            .as_array()
            .is_some_and(|s| s.iter().all(|s| s["stuck"] == false)),
        "{other}"
    );
    drop(list);
    drop(nodes);
}

/// Where `cargo xtask setup` (`xtask/src/gomatrix.rs`) writes the Go release matrix's clients
/// and their `MANIFEST`.
const GO_MATRIX: &str = "/var/tmp/lifeline-go/clients";
/// The matrix's quiet spell, seconds: past the end of each client's first nodes watch (60 s).
const QUIET_MINUTE: f64 = 70.0;

/// A quiet minute ([`QUIET_MINUTE`]) for each of `clients` (pid, name), all watching nodes on
/// the fixture, which sends nothing on an open watch: healthy with nothing stuck at every
/// poll (each second), though far past stale_after, and its nodes watch named at some poll.
fn hold_a_quiet_minute(agent: &Agent, clients: &[(u32, &str)]) {
    let quiet = std::time::Instant::now();
    let mut named = std::collections::BTreeSet::new();
    while quiet.elapsed() < secs(QUIET_MINUTE) {
        let listed = agent.clients();
        for (pid, name) in clients {
            let c = find_pid(&listed, *pid).cloned().unwrap_or_default();
            let streams = c["streams"].as_array().cloned().unwrap_or_default();
            assert!(
                c["state"] == "healthy" && streams.iter().all(|s| s["stuck"] == false),
                "{name} in a quiet minute: {c}"
            );
            if streams
                .iter()
                .any(|s| s["kind"] == "watch" && s["resource"] == "nodes")
            {
                named.insert(*name);
            }
        }
        std::thread::sleep(secs(1.0));
    }
    let unnamed: Vec<&str> = clients
        .iter()
        .map(|c| c.1)
        .filter(|name| !named.contains(name))
        .collect();
    assert!(
        unnamed.is_empty(),
        "no nodes watch named in a quiet minute: {unnamed:?}"
    );
}

/// The Go release matrix (issue 23): `tests/clients/go-watch`, a watch client, built by each
/// Go toolchain Debian ships, stripped, with the standard library's HTTP/2 client as an
/// executable and as a PIE, and with `golang.org/x/net/http2`'s (the list is
/// `xtask/src/gomatrix.rs`; adding a release is one line there). All run at once
/// against one agent and an apiserver whose pod watches hang: each is followed (visibility
/// `streams`, its own Go release in the reason), is healthy with nothing stuck through a quiet
/// minute in which its nodes watch ends and is named when sent again, and then, over a new
/// connection, watches pods with
/// `timeoutSeconds=3`: that watch is stuck within deadline + grace and named, and the token, the
/// selector's value and the pods' data leave in no output. (A connection older than the probes
/// whose reader waits in a read entered before them is not judged: docs/states-and-streams.md.)
#[test]
fn every_go_release_s_hung_watch_is_stuck_and_named() {
    init!();
    let manifest = std::path::Path::new(GO_MATRIX).join("MANIFEST");
    let manifest = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup`)", manifest.display()));
    let clients: Vec<(String, String)> = manifest
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(file, go)| (file.to_owned(), go.to_owned()))
        .collect();
    assert!(clients.len() >= 2, "{manifest}");
    let f = StreamFixture::start(&["--hang-watches", "pods"], &["--watch-grace", "3s"]);
    let (agent, sink, dir, endpoint) = (&f.agent, &f.sink, &f.dir, &f.endpoint);
    // The agent probes at most 16 binaries for one owner (a cgroup; MAX_PROBED_PER_OWNER), as
    // a node of many containers needs: each variant (exe, pie, xnet) runs in a container
    // cgroup of its own, joined before its exec, one binary per Go release in each. (All 21
    // of seven releases in the root cgroup: the 17th was refused for that bound, the agent
    // right and the test wrong.)
    let owners: std::collections::BTreeMap<&str, ContainerCgroup> = clients
        .iter()
        .filter_map(|(file, _)| file.rsplit_once('-'))
        .map(|(_, variant)| (variant, ContainerCgroup::new()))
        .collect();
    let running: Vec<(Watched, &str, &str, std::path::PathBuf)> = clients
        .iter()
        .map(|(file, go)| {
            let trigger = dir.path().join(format!("{file}.go"));
            let client = std::path::Path::new(GO_MATRIX).join(file);
            let owner = file.rsplit_once('-').map(|(_, variant)| &owners[variant]);
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
                .arg(&owner.expect("a variant in the file's name").dir)
                .arg(&client)
                .arg(format!("https://{endpoint}"))
                .arg(&trigger)
                .env("GO_WATCH_TOKEN", "secret-token-xyz");
            (Watched::spawn(file, cmd), file.as_str(), go.as_str(), trigger)
        })
        .collect();
    // The agent probes 4 new binaries of one owner at once, then one every 2 s
    // (`kernel/probed.rs`, OWNER_BURST, OWNER_INSPECTIONS_PER_SECOND): the 8 of one cgroup
    // take it ~10 s, the cgroups one after another at worst.
    let all_followed = std::time::Instant::now() + secs(30.0 + 2.0 * running.len() as f64);
    for (client, file, go, _) in &running {
        let within = all_followed.saturating_duration_since(std::time::Instant::now());
        let probed = f.followed_within(client.pid(), file, within);
        let why = probed["visibility_reason"].as_str().unwrap_or("");
        assert!(why.contains(&format!("({go}.")), "{file}: {probed}");
        eprintln!("{file}: {why}");
    }
    // A quiet minute: each client's nodes watch (timeoutSeconds=60) ends and is sent again;
    // every client stays healthy with nothing stuck, and has its nodes watch named (the first
    // one, sent before its probes went on, is not; its successor is).
    let quiet: Vec<(u32, &str)> = running.iter().map(|r| (r.0.pid(), r.1)).collect();
    hold_a_quiet_minute(agent, &quiet);
    let started = SystemTime::now();
    for (_, _, _, trigger) in &running {
        std::fs::write(trigger, "").expect("trigger");
    }
    for (client, file, _, _) in &running {
        let (c, at) = wait_state(agent, client.pid(), "stale", secs(20.0));
        assert_detected(&format!("{file}: the hung watch stuck"), started, at, 6.0, 9.5);
        let why = reason(&c);
        assert!(
            why.starts_with("watch pods in default: open") && why.contains("due to end after 3s"),
            "{file}: {c}"
        );
        let streams = c["streams"].as_array().cloned().unwrap_or_default();
        let stuck: Vec<&Value> = streams.iter().filter(|s| s["stuck"] == true).collect();
        assert_eq!(stuck.len(), 1, "{file}: {c}");
        assert_eq!(
            stuck[0]["path"],
            "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=3&labelSelector=REDACTED",
            "{file}"
        );
    }
    let (_, metrics) = agent.get("/metrics");
    let outputs = [
        ("the API", Value::Array(agent.clients()).to_string()),
        ("the metrics", metrics),
        ("the log", agent.stderr()),
        ("the alerts", Value::Array(sink.alerts()).to_string()),
    ];
    for (what, text) in &outputs {
        for secret in ["secret-token-xyz", "secret-selector-xyz", "secret-pod-data-xyz"] {
            assert!(!text.contains(secret), "{what} contains {secret:?}");
        }
    }
    drop(running);
    drop(owners);
}

/// A Go client that stops its own watches (closes a watch's response body before the server
/// ends it: the transport sends RST_STREAM, CANCEL, and keeps the connection) has each of them
/// end in the agent when it resets it: listed while open, gone once cancelled, nothing left
/// open, the client healthy. Its resets are seen by `go_reset_sent` where the binary writes
/// them through `writeStreamReset` (every build here: the bundle of Go 1.19, x/net 0.7, Go
/// 1.24's four-argument form, go1.27's internal copy); a watch whose reset went unseen would
/// stay listed, and be called stuck once its deadline passed.
#[test]
fn a_go_clients_cancelled_watches_end_with_its_resets() {
    init!();
    const CANCELS: usize = 3;
    let f = StreamFixture::start(&[], &["--watch-grace", "3s"]);
    let (agent, dir, endpoint) = (&f.agent, &f.dir, &f.endpoint);
    let owner = ContainerCgroup::new();
    let running: Vec<(Watched, &str, std::path::PathBuf)> = [
        "go-watch-1.19-exe",
        "go-watch-1.23-xnet",
        "go-watch-1.24-pie",
        "go-watch-1.27-exe",
    ]
    .into_iter()
    .map(|file| {
        let trigger = dir.path().join(format!("{file}.cancel"));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
            .arg(&owner.dir)
            .arg(std::path::Path::new(GO_MATRIX).join(file))
            .arg(format!("https://{endpoint}"))
            .arg(&trigger)
            .env("GO_WATCH_TOKEN", "secret-token-xyz")
            .env("GO_WATCH_CANCEL", CANCELS.to_string());
        (Watched::spawn(file, cmd), file, trigger)
    })
    .collect();
    for (client, file, _) in &running {
        client.wait_line(secs(20.0), "connected", |l| l.text == "connected");
        f.followed(client.pid(), file);
    }
    let is_watch = |s: &Value| s["path"] == "/api/v1/nodes?watch=true&timeoutSeconds=3600";
    for (client, file, trigger) in &running {
        std::fs::write(trigger, "").expect("trigger");
        // Each watch is listed while it is open (3 s: its HEADERS seen), and gone after its
        // reset.
        for i in 1..=CANCELS {
            client.wait_line(secs(10.0), "open", |l| l.text == format!("open {i}"));
            let id = wait_until(secs(2.5), &format!("{file}: watch {i} listed"), || {
                let listed: Vec<Value> = streams_of(agent, client.pid())
                    .into_iter()
                    .filter(is_watch)
                    .collect();
                match &listed[..] {
                    [watch] if watch["response_headers"] == true => Ok(watch["id"].clone()),
                    _ => Err(listed),
                }
            });
            // The next watch opens at once on the same connection, under another stream id.
            client.wait_line(secs(5.0), "cancelled", |l| l.text == format!("cancelled {i}"));
            wait_until(
                secs(3.0),
                &format!("{file}: watch {i} (stream {id}) gone after its reset"),
                || {
                    let streams = streams_of(agent, client.pid());
                    if streams.iter().any(|s| s["id"] == id) {
                        Err(streams)
                    } else {
                        Ok(())
                    }
                },
            );
        }
        client.wait_line(secs(5.0), "done", |l| l.text == "done");
        let c = find_pid(&agent.clients(), client.pid()).cloned().expect("listed");
        assert_eq!(c["state"], "healthy", "{file}: {c}");
        assert_eq!(c["streams"], Value::Array(vec![]), "{file}: {c}");
    }
    drop(running);
    drop(owner);
}

/// `ll-apiserver` on a free port of 127.0.0.1, its certificates in `certs`, with `flags`.
fn local_apiserver(certs: &TempDir, flags: &[&str]) -> ApiServer {
    ApiServer::start(
        bin!("ll-apiserver"),
        "127.0.0.1:0".parse().unwrap(),
        certs.path(),
        flags,
    )
}

/// A python3-kubernetes client (`tests/clients/py-streams.py`) against `ll-apiserver`: `args`
/// and `env` as the script takes them. After its first list it waits for
/// [`release_python_clients`].
fn python_client(api: &ApiServer, dir: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Watched {
    let kubeconfig = dir.path().join("kubeconfig");
    write_kubeconfig(&kubeconfig, &api.url(), &api.ca_pem());
    let mut cmd = Command::new(SYSTEM_PYTHON);
    cmd.arg(client_script("py-streams.py"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--go-when")
        .arg(dir.path().join("go"))
        .args(args)
        .envs(env.iter().copied());
    Watched::spawn("py-streams.py", cmd)
}

/// Waits until the agent follows `pids`' libssl (probed once a client is connected: what a
/// client sends before that goes unseen, and a hung watch is never sent again), then lets
/// the python clients of `dir` go on.
fn release_python_clients(agent: &Agent, dir: &TempDir, pids: &[u32]) {
    agent.wait_clients(secs(20.0), "the python clients' libssl probed", |clients| {
        pids.iter()
            .all(|pid| {
                find_pid(clients, *pid).is_some_and(|c| {
                    c["visibility"] == "streams"
                        && c["visibility_reason"]
                            .as_str()
                            .is_some_and(|r| r.starts_with("OpenSSL HTTP/1.1 client (libssl.so.3)"))
                })
            })
            .then_some(())
    });
    fs::write(dir.path().join("go"), "").expect("the python clients' go file");
}

/// The streams `/api/v1/clients` lists for `pid`.
fn streams_of(agent: &Agent, pid: u32) -> Vec<Value> {
    find_pid(&agent.clients(), pid)
        .and_then(|c| c["streams"].as_array().cloned())
        .unwrap_or_default()
}

/// watch_grace, seconds, for the stream tests.
const WATCH_GRACE: f64 = 3.0;

/// Issue 16, OpenSSL: a python3-kubernetes watch that the apiserver answers and then never
/// ends is stuck once its own timeoutSeconds and watch_grace are past, named in the reason; a
/// watch that flows is healthy with its stream listed, through its ends and the next watches.
#[test]
fn an_openssl_clients_hung_watch_is_stuck_and_a_flowing_one_is_listed() {
    init!();
    let certs = TempDir::new();
    let api = local_apiserver(&certs, &["--hang-watches", "pods"]);
    let sink = WebhookSink::start();
    let grace = format!("{WATCH_GRACE}s");
    let (agent, dir) = agent(&[api.addr().to_string()], &sink, "", &["--watch-grace", &grace]);
    let hung = python_client(&api, &dir, &["--resource", "pods", "--timeout-seconds", "4"], &[]);
    let flowing = python_client(
        &api,
        &dir,
        &["--resource", "namespaces", "--timeout-seconds", "3"],
        &[],
    );
    let (hung_pid, flowing_pid) = (hung.pid(), flowing.pid());
    release_python_clients(&agent, &dir, &[hung_pid, flowing_pid]);
    let c = agent.wait_clients(
        secs(20.0),
        "both python clients seen at stream level",
        |clients| {
            let seen = |pid| {
                find_pid(clients, pid).is_some_and(|c| {
                    c["visibility"] == "streams"
                        && c["visibility_reason"] == "OpenSSL HTTP/1.1 client (libssl.so.3)"
                })
            };
            (seen(hung_pid) && seen(flowing_pid)).then(|| clients.to_vec())
        },
    );
    assert!(c.len() >= 2);
    hung.wait_line(secs(20.0), "the hung watch started", |l| l.text == "WATCH_START");
    let started = SystemTime::now();
    let watch = agent.wait_clients(secs(10.0), "the hung watch listed", |_| {
        streams_of(&agent, hung_pid)
            .into_iter()
            .find(|s| s["kind"] == "watch" && s["resource"] == "pods")
    });
    assert_eq!(watch["method"], "GET");
    assert_eq!(watch["path"], "/api/v1/pods?timeoutSeconds=4&watch=True");
    assert_eq!(watch["response_headers"], true, "{watch}");
    let (c, at) = wait_state(&agent, hung_pid, "stale", secs(4.0 + WATCH_GRACE + 10.0));
    // Due 4 s after it started, stuck watch_grace later (the tick and the listing's own
    // delay on top).
    assert_detected(
        "stuck",
        started,
        at,
        4.0 + WATCH_GRACE - 1.5,
        4.0 + WATCH_GRACE + 3.0,
    );
    assert!(
        reason(&c).starts_with("watch pods (all namespaces): open ")
            && reason(&c).contains("due to end after 4s"),
        "{c}"
    );
    let stuck: Vec<Value> = streams_of(&agent, hung_pid)
        .into_iter()
        .filter(|s| s["stuck"] == true)
        .collect();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    // The flowing watch ended (chunked terminator) and started again several times meanwhile.
    let ends = flowing.lines().iter().filter(|l| l.text == "WATCH_END").count();
    assert!(ends >= 2, "the namespaces watch ended {ends} times");
    // Healthy throughout, never stuck, its watch listed — but for the instant between a
    // watch's end and the next request line, which a snapshot may fall into.
    let (mut polls, mut listed_polls) = (0, 0);
    let until = Instant::now() + secs(6.0);
    while Instant::now() < until {
        let clients = agent.clients();
        let c = find_pid(&clients, flowing_pid).expect("the flowing client listed");
        assert_eq!(c["state"], "healthy", "{c}");
        let listed = c["streams"].as_array().cloned().unwrap_or_default();
        assert!(listed.len() <= 1, "{c}");
        if let Some(s) = listed.first() {
            assert_eq!(s["kind"], "watch", "{c}");
            assert_eq!(s["resource"], "namespaces", "{c}");
            assert_eq!(s["stuck"], false, "{c}");
            listed_polls += 1;
        }
        polls += 1;
        thread::sleep(Duration::from_millis(200));
    }
    assert!(
        listed_polls * 10 >= polls * 8,
        "the watch listed in {listed_polls} of {polls} polls"
    );
}

/// Keep-alive HTTPS GETs through Python's `ssl` (the system libssl) to the address in argv[1]
/// for argv[2] requests; prints how many were answered, then the libssl it mapped.
const TLS_LOOP: &str = r#"
import http.client, ssl, sys
host, port = sys.argv[1].rsplit(":", 1)
conn = http.client.HTTPSConnection(host, int(port), context=ssl._create_unverified_context())
done = 0
for _ in range(int(sys.argv[2])):
    conn.request("GET", "/version")
    conn.getresponse().read()
    done += 1
print("DONE", done)
print("LIBSSL", next(l.split()[-1] for l in open("/proc/self/maps") if "/libssl.so" in l))
"#;

/// The libssl file process `pid` maps.
fn libssl_of(pid: u32) -> String {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("the client's maps");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| path.contains("/libssl.so"))
        .expect("the client maps a libssl")
        .to_owned()
}

/// Issue 26 item 4: a libssl is shared by every process of the node that speaks TLS. With a
/// python3-kubernetes client followed through it, another python process hammering TLS
/// through the same file, to a server that is no endpoint, runs none of the agent's probes:
/// the probes fire for their client processes only. Counted by the kernel (run counts of the
/// agent's uprobe programs); the client's own calls, counted the same way, show the count
/// works.
#[test]
fn a_process_that_is_no_client_runs_none_of_the_probes_on_its_shared_libssl() {
    init!();
    let certs = TempDir::new();
    let api = local_apiserver(&certs, &[]);
    let other_certs = TempDir::new();
    let other = local_apiserver(&other_certs, &[]);
    let sink = WebhookSink::start();
    let (agent, dir) = agent(&[api.addr().to_string()], &sink, "", &["--watch-grace", "3s"]);
    let py = python_client(
        &api,
        &dir,
        &["--resource", "namespaces", "--timeout-seconds", "2"],
        &[],
    );
    release_python_clients(&agent, &dir, &[py.pid()]);
    py.wait_line(secs(20.0), "the client watching", |l| l.text == "WATCH_START");
    let _stats = bpf_stats::Stats::enable();

    // The client stopped (still connected, still followed): the probes' runs meanwhile are
    // the other process's alone.
    py.signal(libc::SIGSTOP);
    thread::sleep(secs(0.5));
    let before = bpf_stats::uprobe_runs(agent.pid());
    const REQUESTS: usize = 500;
    let out = Command::new(SYSTEM_PYTHON)
        .args(["-c", TLS_LOOP, &other.addr().to_string(), &REQUESTS.to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    let runs = bpf_stats::uprobe_runs(agent.pid()) - before;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("DONE {REQUESTS}")),
        "the TLS loop: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client_libssl = libssl_of(py.pid());
    assert!(
        text.contains(&format!("LIBSSL {client_libssl}")),
        "the TLS loop maps the client's libssl ({client_libssl}): {text}"
    );
    assert_eq!(
        runs, 0,
        "{REQUESTS} requests (a write and reads each) of a process that is no client ran the probes {runs} times"
    );

    // The client again: its watches end every 2 s and start again, each through the probes.
    py.signal(libc::SIGCONT);
    let before = bpf_stats::uprobe_runs(agent.pid());
    wait_until(
        secs(10.0),
        "the client's own SSL calls counted (else the count is wrong)",
        || {
            let runs = bpf_stats::uprobe_runs(agent.pid()) - before;
            if runs > 0 {
                Ok(())
            } else {
                Err(runs)
            }
        },
    );
}

/// Issue 23, OpenSSL: a python3-kubernetes LIST whose chunked response began and then
/// stopped (`--hang-lists pods`: a gateway whose upstream died mid-answer) is stuck once
/// nothing came for stale_after, named. Neither healthy neighbour crosses the rule: the same
/// client idle after a small answer with a Content-Length (its end unseen), nor a client idle
/// after a chunked list that ended (`--chunk-lists events`, its terminator seen).
#[test]
fn an_openssl_clients_list_held_mid_answer_is_stuck_and_finished_ones_are_not() {
    init!();
    let certs = TempDir::new();
    let api = local_apiserver(&certs, &["--hang-lists", "pods", "--chunk-lists", "events"]);
    let sink = WebhookSink::start();
    let (agent, dir) = agent(&[api.addr().to_string()], &sink, "", &[]);
    let idle = format!("{}", STALE + 3.0);
    let held = python_client(
        &api,
        &dir,
        &["--resource", "pods", "--list-once", "--idle", &idle],
        &[],
    );
    let finished = python_client(&api, &dir, &["--resource", "events", "--list-once"], &[]);
    let (held_pid, finished_pid) = (held.pid(), finished.pid());
    release_python_clients(&agent, &dir, &[held_pid, finished_pid]);
    held.wait_line(secs(20.0), "the held client idle", |l| l.text == "IDLE");
    finished.wait_line(secs(20.0), "the finished list", |l| l.text == "LIST_END");
    // Both idle past stale_after with their last answer's end seen or not: healthy.
    let until = Instant::now() + secs(STALE + 2.0);
    while Instant::now() < until {
        let clients = agent.clients();
        for pid in [held_pid, finished_pid] {
            let c = find_pid(&clients, pid).expect("the python client listed");
            assert_eq!(c["state"], "healthy", "idle: {c}");
        }
        thread::sleep(Duration::from_millis(250));
    }
    held.wait_line(secs(10.0), "the held list sent", |l| l.text == "LIST_START");
    let started = SystemTime::now();
    let (c, at) = wait_state(&agent, held_pid, "stale", secs(STALE + 10.0));
    // Its first half comes at once; stale_after of nothing, judged within a tick.
    assert_detected("the list held mid-answer stuck", started, at, STALE, STALE + 4.0);
    let why = reason(&c);
    assert!(
        why.starts_with("list pods (all namespaces): open")
            && why.contains("its response begun and unfinished"),
        "{c}"
    );
    let stuck: Vec<Value> = streams_of(&agent, held_pid)
        .into_iter()
        .filter(|s| s["stuck"] == true)
        .collect();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0]["kind"], "list");
    assert_eq!(stuck[0]["response_headers"], true, "{stuck:?}");
    let other = find_pid(&agent.clients(), finished_pid).cloned().expect("listed");
    assert_eq!(other["state"], "healthy", "{other}");
}

/// Issue 16's secrets: the python client's bearer token (the line after the request line),
/// the body of its create and the watched object's data never appear in the agent's API
/// answers, metrics or log, though every one of those requests went through the probes.
#[test]
fn no_token_and_no_body_byte_of_an_openssl_client_leaves_the_kernel() {
    init!();
    const TOKEN: &str = "secret-token-xyz";
    const DATA: &str = "secret-data-xyz";
    let certs = TempDir::new();
    let api = local_apiserver(&certs, &[]);
    let sink = WebhookSink::start();
    let (agent, dir) = agent(&[api.addr().to_string()], &sink, "", &["--watch-grace", "3s"]);
    let py = python_client(
        &api,
        &dir,
        &[
            "--resource",
            "events",
            "--timeout-seconds",
            "2",
            "--create-event",
            "ll-secret",
        ],
        &[("PY_STREAMS_TOKEN", TOKEN), ("PY_STREAMS_NOTE", DATA)],
    );
    release_python_clients(&agent, &dir, &[py.pid()]);
    py.wait_line(secs(20.0), "the event created", |l| l.text == "CREATED");
    // The create went through the probes: its request line (token and body in the same
    // write) is the stream listed until the watch replaces it.
    let create = agent.wait_clients(secs(2.0), "the create listed", |_| {
        streams_of(&agent, py.pid())
            .into_iter()
            .find(|s| s["kind"] == "create" && s["resource"] == "events")
    });
    assert_eq!(create["method"], "POST");
    assert_eq!(create["path"], "/api/v1/namespaces/default/events");
    assert_eq!(create["response_headers"], true, "{create}");
    let added = py.wait_line(secs(10.0), "the watch's event with the data", |l| {
        l.text == "ADDED ll-secret"
    });
    assert!(!added.stderr);
    py.wait_line(secs(10.0), "a watch ended", |l| l.text == "WATCH_END");
    let watch = agent.wait_clients(secs(10.0), "the watch listed", |_| {
        streams_of(&agent, py.pid())
            .into_iter()
            .find(|s| s["kind"] == "watch" && s["resource"] == "events")
    });
    assert_eq!(watch["path"], "/api/v1/events?timeoutSeconds=2&watch=True");
    // Everything the agent says: its API, metrics, log (and what the sink got).
    let mut said = vec![agent.get("/api/v1/clients").1, agent.get("/metrics").1];
    said.push(agent.get("/api/v1/endpoints").1);
    said.push(agent.stderr());
    said.extend(sink.alerts().iter().map(Value::to_string));
    for text in &said {
        for secret in [TOKEN, DATA, "Bearer", "Authorization"] {
            assert!(!text.contains(secret), "{secret} in the agent's output:\n{text}");
        }
    }
}
