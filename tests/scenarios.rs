//! Fault-injection scenarios: the seeds of `shared/docs/incidents.md` reproduced with a fake
//! apiserver that behaves like the real one on the wire (`ll-apiserver`), real clients (kubectl
//! 1.20 in a re-dial loop, python3-kubernetes, the kube crate's watcher, and `ll-stuck`, which
//! never dials again like the x/net/http2 bug), haproxy as an HTTP/2 gateway, and hosts that are
//! network namespaces on one bridge. Each scenario asserts the state, the process, the alert the
//! webhook sink received, and a detection bound.
//!
//! Thresholds are shortened for test speed (passed as flags, so the config file's parsing is
//! exercised too); every bound is the threshold plus the 2 s the issue allows.
use std::{
    thread,
    time::{Instant, SystemTime},
};

use lifeline_integration::{scenario::*, *};
use serde_json::Value;

/// `ll-stuck`, the kube watcher and the python watch on host `client`, talking to `api`, once
/// all three are judged healthy.
fn stuck_and_redialers(lab: &Lab, agent: &Agent) -> [Watched; 3] {
    let clients = [Kind::Stuck, Kind::KubeWatch, Kind::PyWatch].map(|kind| lab.client("client", kind, "api"));
    wait_healthy_clients(agent, &clients.each_ref().map(Watched::pid));
    clients
}

/// a. apiserver restart with clients that re-dial → no alert at all, all stay healthy.
#[test]
fn a_apiserver_restart_with_redialing_clients_raises_nothing() {
    init!();
    let lab = Lab::new(&["api", "client"]);
    let mut api = lab.apiserver("api");
    let agent = lab.agent(&[]);
    let kube = lab.client("client", Kind::KubeWatch, "api");
    let py = lab.client("client", Kind::PyWatch, "api");
    let _kubectl = lab.client("client", Kind::KubectlLoop, "api");
    wait_healthy_clients(&agent, &[kube.pid(), py.pid()]);

    api.kill();
    thread::sleep(secs(1));
    let _api = lab.apiserver("api");
    // Longer than the grace and the alert settle delay together.
    hold(
        secs(GRACE + SETTLE + 3),
        "no alert and no unhealthy client",
        || {
            let clients = agent.clients();
            let unhealthy: Vec<&Value> = clients.iter().filter(|c| c["state"] != "healthy").collect();
            if !lab.sink.alerts().is_empty() || !unhealthy.is_empty() {
                return Err((lab.sink.alerts(), format!("{:?}", Pretty(&clients))));
            }
            Ok(())
        },
    );
    // They re-dialed: connected again.
    wait_healthy_clients(&agent, &[kube.pid(), py.pid()]);
}

/// b. apiserver restart with the never-redial client → it is disconnected within grace + 2 s
///    and alerted; the re-dialing clients stay healthy and silent.
#[test]
fn b_never_redialing_client_is_disconnected_after_restart() {
    init!();
    let lab = Lab::new(&["api", "client"]);
    let mut api = lab.apiserver("api");
    let agent = lab.agent(&[]);
    let [stuck, kube, py] = stuck_and_redialers(&lab, &agent);

    api.kill();
    let fault = SystemTime::now();
    thread::sleep(secs(1));
    let _api = lab.apiserver("api");
    let (c, at) = wait_state(&agent, stuck.pid(), "disconnected", secs(GRACE + 5));
    assert_detected(
        "ll-stuck disconnected",
        fault,
        at,
        GRACE as f64 - 0.5,
        GRACE as f64 + 2.0,
    );
    assert_eq!(c["comm"], "ll-stuck");
    assert!(connections(&c).is_empty(), "it holds no connection: {c}");
    let alert = wait_alert(
        &lab.sink,
        "LifelineClientDisconnected",
        "ll-stuck",
        secs(SETTLE + 5),
    );
    assert_eq!(alert["labels"]["severity"], "critical");
    assert_eq!(alert["labels"]["node"], "lab");
    assert_eq!(
        alert["labels"]["endpoint"],
        lab.topo.host("api").addr(PORT).to_string()
    );
    assert_eq!(
        alert["annotations"]["description"]
            .as_str()
            .map(|d| d.contains("has not reconnected")),
        Some(true)
    );

    let clients = agent.clients();
    for pid in [kube.pid(), py.pid()] {
        let c = find_pid(&clients, pid).expect("re-dialing client listed");
        assert_eq!(c["state"], "healthy", "{c}");
    }
    let others: Vec<Value> = lab
        .sink
        .alerts()
        .into_iter()
        .filter(|a| a["labels"]["comm"] != "ll-stuck")
        .collect();
    assert!(others.is_empty(), "only ll-stuck alerts: {others:#?}");
}

/// c. seed 002: the gateway's upstream is blackholed; the client's connection to the gateway
///    stays ESTABLISHED and the gateway answers its HTTP/2 PINGs, but no payload arrives → stale
///    within stale_after + 2 s. The PING answers grow the bytes received but are not payload.
#[test]
fn c_gateway_upstream_blackholed_makes_the_client_stale() {
    init!();
    const STALE: u64 = 40;
    let lab = Lab::new(&["api1", "api2", "gw", "client", "other"]);
    let _api1 = lab.apiserver("api1");
    let _api2 = lab.apiserver("api2");
    let pem = lab.dir.path().join("gateway.pem");
    let certs = lab.certs();
    let mut combined = std::fs::read(certs.join("server.pem")).expect("server.pem");
    combined.extend(std::fs::read(certs.join("server-key.pem")).expect("server-key.pem"));
    std::fs::write(&pem, combined).expect("gateway pem");
    let backends = [lab.topo.host("api1").addr(PORT), lab.topo.host("api2").addr(PORT)];
    let _gw = Gateway::start(lab.topo.host("gw"), PORT, &backends, &pem, lab.dir.path());
    let stale_flag = format!("{STALE}s");
    let agent = lab.agent(&["--stale-after", &stale_flag]);
    let _kubectl = lab.client("client", Kind::KubectlLoop, "gw");
    // Healthy clients elsewhere, so one stale client is not a node-wide outage.
    let kube = lab.client("other", Kind::KubeWatch, "api2");
    let py = lab.client("other", Kind::PyWatch, "api2");
    let kubectl = pid_of_comm(&agent, "kubectl");
    wait_healthy_clients(&agent, &[kubectl, kube.pid(), py.pid()]);
    let bytes_at = |clients: &[Value]| -> u64 {
        find_pid(clients, kubectl).map_or(0, |c| {
            connections(c)
                .iter()
                .filter_map(|k| k["bytes_received"].as_u64())
                .sum()
        })
    };

    let gw = lab.topo.host("gw");
    let api1 = lab.topo.host("api1").ip.to_string();
    gw.iptables(&["OUTPUT", "-d", &api1, "-j", "DROP"]);
    gw.iptables(&["INPUT", "-s", &api1, "-j", "DROP"]);
    let fault = SystemTime::now();
    thread::sleep(secs(2));
    let bytes_after_fault = bytes_at(&agent.clients());

    let (c, at) = wait_state(&agent, kubectl, "stale", secs(STALE + 10));
    assert_detected(
        "kubectl behind the gateway stale",
        fault,
        at,
        STALE as f64 - 2.0,
        STALE as f64 + 2.0,
    );
    let k = &connections(&c)[0];
    assert_eq!(
        k["tcp_state"], "ESTABLISHED",
        "the connection to the gateway looks fine: {c}"
    );
    assert_eq!(k["endpoint"], gw.addr(PORT).to_string());
    assert!(
        bytes_at(std::slice::from_ref(&c)) > bytes_after_fault,
        "the gateway answered client-go's PINGs (bytes grew) yet the client is stale: {c}"
    );
    let alert = wait_alert(&lab.sink, "LifelineClientStale", "kubectl", secs(SETTLE + 5));
    assert_eq!(alert["labels"]["severity"], "warning");
    assert_still_healthy(&agent, &[kube.pid(), py.pid()]);
}

/// d. The client's own path is blackholed (packets vanish on the way, as behind a broken link
///    or a firewall that drops): its requests are retransmitted with no ACK → blackholed within
///    blackhole_after + 2 s of the first retransmit.
#[test]
fn d_blackholed_client_path() {
    init!();
    const BLACKHOLE: u64 = 8;
    let lab = Lab::new(&["api", "client", "other"]);
    let _api = lab.apiserver("api");
    let flag = format!("{BLACKHOLE}s");
    let agent = lab.agent(&["--blackhole-after", &flag]);
    let lease = lab.client("client", Kind::PyLease, "api");
    let kube = lab.client("other", Kind::KubeWatch, "api");
    let py = lab.client("other", Kind::PyWatch, "api");
    wait_healthy_clients(&agent, &[lease.pid(), kube.pid(), py.pid()]);

    // Dropped at the far end of the path: the client's segments leave it and are never
    // answered (other clients of the same apiserver are unaffected).
    let api = lab.topo.host("api");
    let client = lab.topo.host("client").ip.to_string();
    api.iptables(&["INPUT", "-s", &client, "-j", "DROP"]);
    api.iptables(&["OUTPUT", "-d", &client, "-j", "DROP"]);
    let first_retransmit = agent.wait_clients(secs(10), "a retransmit on the lease client", |clients| {
        find_pid(clients, lease.pid())
            .filter(|c| connections(c).iter().any(|k| k["retransmits"].as_u64() > Some(0)))
            .map(|_| SystemTime::now())
    });
    let (c, at) = wait_state(&agent, lease.pid(), "blackholed", secs(BLACKHOLE + 10));
    // The retransmit was seen up to one poll after it happened, so the lower bound allows that.
    assert_detected(
        "lease client blackholed",
        first_retransmit,
        at,
        BLACKHOLE as f64 - 1.0,
        BLACKHOLE as f64 + 2.0,
    );
    assert_eq!(c["comm"], "python3");
    assert!(
        c["reason"].as_str().unwrap_or("").contains("no acknowledgement"),
        "{c}"
    );
    let alert = wait_alert(&lab.sink, "LifelineClientBlackholed", "python3", secs(SETTLE + 5));
    assert_eq!(
        alert["labels"]["endpoint"],
        lab.topo.host("api").addr(PORT).to_string()
    );
    assert_still_healthy(&agent, &[kube.pid(), py.pid()]);
}

/// e. seed 003: an endpoint with nothing listening (refused) and one whose SYNs are dropped
///    (timeout) → the processes trying them are unreachable, with the failures counted by reason.
#[test]
fn e_failing_connects_make_clients_unreachable() {
    init!();
    let lab = Lab::new(&["down", "dropping", "api", "client", "other"]);
    let _api = lab.apiserver("api");
    let dropping = lab.topo.host("dropping");
    dropping.iptables(&["INPUT", "-p", "tcp", "--dport", &PORT.to_string(), "-j", "DROP"]);
    // A connect whose SYNs go unanswered gives up after ~3 s instead of ~2 min.
    lab.topo
        .host("client")
        .ns
        .run(&["sysctl", "-qw", "net.ipv4.tcp_syn_retries=1"]);
    let agent = lab.agent(&[]);
    // Healthy clients elsewhere, so two unreachable clients are not most of the node.
    let ok1 = lab.client("other", Kind::KubeWatch, "api");
    let ok2 = lab.client("other", Kind::PyWatch, "api");
    let refused = lab.client("client", Kind::PyWatch, "down");
    let started = SystemTime::now();
    let timeout = lab.client("client", Kind::KubeWatch, "dropping");

    let (c, at) = wait_state(&agent, refused.pid(), "unreachable", secs(30));
    assert_detected("refused client unreachable", started, at, 0.0, 15.0);
    assert!(c["connect_failures"].as_u64() >= Some(3), "{c}");
    assert!(
        c["reason"]
            .as_str()
            .unwrap_or("")
            .contains(&lab.topo.host("down").addr(PORT).to_string()),
        "{c}"
    );
    let (c, _) = wait_state(&agent, timeout.pid(), "unreachable", secs(40));
    assert!(c["connect_failures"].as_u64() >= Some(3), "{c}");
    let alert = wait_alert(
        &lab.sink,
        "LifelineClientUnreachable",
        "python3",
        secs(SETTLE + 5),
    );
    assert_eq!(
        alert["labels"]["endpoint"],
        lab.topo.host("down").addr(PORT).to_string()
    );
    let alert = wait_alert(
        &lab.sink,
        "LifelineClientUnreachable",
        "ll-kube-watch",
        secs(SETTLE + 5),
    );
    assert_eq!(alert["labels"]["endpoint"], dropping.addr(PORT).to_string());
    let (_, metrics) = agent.get("/metrics");
    for reason in ["refused", "timeout"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("lifeline_client_connect_failures_total{")
                    && l.contains(&format!("reason=\"{reason}\""))),
            "connect failures with reason {reason} counted:\n{metrics}"
        );
    }
    assert_still_healthy(&agent, &[ok1.pid(), ok2.pid()]);
}

/// f. Every apiserver down → one LifelineApiserverOutage alert, not one per client.
#[test]
fn f_full_outage_raises_one_node_alert() {
    init!();
    let lab = Lab::new(&["api", "client"]);
    let mut api = lab.apiserver("api");
    let agent = lab.agent(&[]);
    let [stuck, kube, py] = stuck_and_redialers(&lab, &agent);

    api.kill();
    let outage = wait_until(secs(GRACE + 10), "LifelineApiserverOutage", || {
        let found = lab.sink.named("LifelineApiserverOutage");
        found.first().cloned().ok_or_else(|| lab.sink.alerts())
    });
    assert_eq!(outage["status"], "firing");
    assert_eq!(outage["labels"]["node"], "lab");
    assert_eq!(outage["labels"]["severity"], "critical");
    // Every client ends up unhealthy, and still no per-client alert.
    agent.wait_clients(secs(GRACE + 5), "all three clients unhealthy", |clients| {
        [stuck.pid(), kube.pid(), py.pid()]
            .iter()
            .all(|pid| find_pid(clients, *pid).is_some_and(|c| c["state"] != "healthy"))
            .then_some(())
    });
    thread::sleep(secs(SETTLE + 1));
    let per_client: Vec<Value> = lab
        .sink
        .alerts()
        .into_iter()
        .filter(|a| a["labels"]["alertname"] != "LifelineApiserverOutage")
        .collect();
    assert!(
        per_client.is_empty(),
        "no per-client alert during the outage: {per_client:#?}"
    );
    assert_eq!(
        lab.sink.named("LifelineApiserverOutage").len(),
        1,
        "exactly one outage alert"
    );
}

/// g. The agent restarted mid-run: the new one lists every client and connection at once, and
///    raises nothing.
#[test]
fn g_agent_restart_loses_no_client() {
    init!();
    let lab = Lab::new(&["api", "client"]);
    let _api = lab.apiserver("api");
    let agent = lab.agent(&[]);
    let clients = stuck_and_redialers(&lab, &agent);
    let pids = clients.each_ref().map(Watched::pid);
    let before = table(&agent.clients());
    agent.stop();

    let started = Instant::now();
    let agent = lab.agent(&[]);
    let first = table(&agent.clients());
    eprintln!("restarted agent ready in {:?}", started.elapsed());
    for pid in pids {
        assert_eq!(
            first.get(&pid),
            before.get(&pid),
            "pid {pid}: same connections right after the restart"
        );
    }
    hold(
        secs(MIN_AGE + SETTLE + 3),
        "no alert and every client healthy",
        || {
            let clients = agent.clients();
            let bad: Vec<&Value> = clients.iter().filter(|c| c["state"] != "healthy").collect();
            if lab.sink.alerts().is_empty() && bad.is_empty() {
                Ok(())
            } else {
                Err((lab.sink.alerts(), format!("{:?}", Pretty(&clients))))
            }
        },
    );
}
