//! Kubernetes scenarios: the agent pointed at a cluster (the `ll-apiserver` fixture, of either
//! API generation) with no `--endpoint`: it discovers the apiservers from the `default/kubernetes`
//! Service and its EndpointSlices (or Endpoints), names pods by their container cgroups, leaves
//! Events, and remediates only where allowed. Clients run in cgroups named like containerd
//! containers that match the fixture's pods on node `node-a`.
use std::{net::IpAddr, thread};

use lifeline_integration::{scenario::*, *};
use serde_json::{json, Value};

/// A pod on node-a whose one container is `cgroup`'s.
fn pod(name: &str, cgroup: &ContainerCgroup, remediate: bool) -> Value {
    let annotations = if remediate {
        json!({"lifeline.dev/remediate": "true"})
    } else {
        json!({})
    };
    json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"), "annotations": annotations,
                     "labels": {"app": name}},
        "spec": {"nodeName": "node-a", "containers": [{"name": name, "image": "example/client"}]},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": name, "containerID": format!("containerd://{}", cgroup.id), "ready": true,
            "restartCount": 0, "image": "example/client", "imageID": "", "started": true,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
    })
}

fn options(generation: Generation, pods: Vec<Value>, endpoint_ips: Vec<IpAddr>) -> ApiServerOptions {
    ApiServerOptions {
        pods,
        endpoint_ips,
        ..ApiServerOptions::new(generation)
    }
}

/// Every `lifeline_remediations_total` line with `action`.
fn remediations(agent: &Agent, action: &str) -> Vec<String> {
    let (_, metrics) = agent.get("/metrics");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("lifeline_remediations_total{") && l.contains(&format!("action=\"{action}\""))
        })
        .map(str::to_owned)
        .collect()
}

/// `/api/v1/endpoints` as (endpoint, every source).
fn endpoint_sources(agent: &Agent) -> Vec<(String, Vec<String>)> {
    let (_, body) = agent.get("/api/v1/endpoints");
    let doc: Value = serde_json::from_str(&body).expect("endpoints JSON");
    doc["endpoints"]
        .as_array()
        .expect("endpoints array")
        .iter()
        .map(|e| {
            let sources = e["sources"].as_array().expect("sources").iter();
            (
                e["endpoint"].as_str().unwrap_or("").to_owned(),
                sources.map(|s| s.as_str().unwrap_or("").to_owned()).collect(),
            )
        })
        .collect()
}

/// Each Event's reason and message (events.k8s.io/v1 calls it `note`).
fn events(api: &ApiServer) -> Vec<(String, String)> {
    api.events()
        .iter()
        .map(|e| {
            let text = |f: &str| e.object[f].as_str().unwrap_or("").to_owned();
            (text("reason"), text("note") + &text("message"))
        })
        .collect()
}

fn event_reasons(api: &ApiServer) -> Vec<String> {
    events(api).into_iter().map(|(reason, _)| reason).collect()
}

/// No `--endpoint`: the apiserver endpoints come from the cluster, the API versions in use are
/// reported, pods are named, and an EndpointSlice change is followed without a restart.
fn discovery(generation: Generation) {
    init!();
    let lab = Lab::new(&["api1", "api2", "node"]);
    let ip = |h: &str| lab.topo.host(h).ip;
    let cg = ContainerCgroup::new();
    let api1 = lab.apiserver_with(
        "api1",
        options(generation, vec![pod("watcher", &cg, false)], vec![ip("api1")]),
    );
    let agent = lab.agent_in_cluster("api1", "", &[]);
    let backends = if generation == Generation::New {
        "endpointslice"
    } else {
        "endpoints"
    };
    let api1_ep = lab.topo.host("api1").addr(PORT).to_string();
    wait_until(secs(15), "discovered endpoints", || {
        let eps = endpoint_sources(&agent);
        let has = |ep: &str, source: &str| eps.iter().any(|(e, s)| e == ep && s.iter().any(|x| x == source));
        if has(&api1_ep, backends) && has("10.96.0.1:443", "service") {
            Ok(())
        } else {
            Err(eps)
        }
    });
    let (_, body) = agent.get("/api/v1/endpoints");
    let doc: Value = serde_json::from_str(&body).expect("endpoints JSON");
    let versions = doc["api_versions"].to_string();
    let eviction = if generation == Generation::New {
        "\"policy/v1\""
    } else {
        "v1beta1"
    };
    assert!(
        versions.contains(eviction),
        "API versions in use for {generation:?}: {versions}"
    );

    let watcher = lab.client_in("node", Kind::KubeWatch, "api1", Some(&cg));
    let c = agent.wait_clients(secs(15), "the watcher named by its pod", |clients| {
        find_pid(clients, watcher.pid())
            .filter(|c| c["pod"] == "watcher")
            .cloned()
    });
    assert_eq!(
        (c["namespace"].as_str(), c["container"].as_str()),
        (Some("team-a"), Some("watcher"))
    );
    assert_eq!(c["container_id"], cg.id);

    // The apiserver set grows: the new address is watched without a restart.
    let _api2 = lab.apiserver_with("api2", options(generation, vec![], vec![ip("api1"), ip("api2")]));
    api1.set_endpoint_ips(&[ip("api1"), ip("api2")]);
    let api2_ep = lab.topo.host("api2").addr(PORT).to_string();
    wait_until(secs(10), "the new apiserver address in force", || {
        let eps = agent.endpoints();
        if eps.iter().any(|(e, _)| *e == api2_ep) {
            Ok(())
        } else {
            Err(eps)
        }
    });
    let second = lab.client("node", Kind::PyWatch, "api2");
    agent.wait_clients(secs(10), "a client of the new address listed", |clients| {
        find_pid(clients, second.pid())
            .filter(|c| connections(c).iter().any(|k| k["endpoint"] == api2_ep.as_str()))
            .map(|_| ())
    });
}

#[test]
fn discovery_and_pods_current_apiserver() {
    discovery(Generation::New);
}

#[test]
fn discovery_and_pods_1_18_apiserver() {
    discovery(Generation::Old);
}

/// Seed 002 with `reset`: the client behind the gateway goes stale, its socket is destroyed, it
/// re-dials through the gateway to the healthy apiserver and is healthy again, same process, no
/// restart; the actions leave Events on its pod.
#[test]
fn reset_fixes_the_stale_gateway_client() {
    init!();
    let lab = Lab::new(&["api1", "api2", "gw", "node", "other"]);
    let ip = |h: &str| lab.topo.host(h).ip;
    let cg = ContainerCgroup::new();
    let pods = vec![pod("behind-gw", &cg, true)];
    let api1 = lab.apiserver_with(
        "api1",
        options(Generation::New, pods.clone(), vec![ip("api1"), ip("api2")]),
    );
    let _api2 = lab.apiserver_with(
        "api2",
        options(Generation::New, pods, vec![ip("api1"), ip("api2")]),
    );
    let pem = lab.dir.path().join("gateway.pem");
    let mut combined = std::fs::read(lab.certs().join("server.pem")).expect("server.pem");
    combined.extend(std::fs::read(lab.certs().join("server-key.pem")).expect("server-key.pem"));
    std::fs::write(&pem, combined).expect("gateway pem");
    let backends = [lab.topo.host("api1").addr(PORT), lab.topo.host("api2").addr(PORT)];
    let _gw = Gateway::start(lab.topo.host("gw"), PORT, &backends, &pem, lab.dir.path());
    let gw_ep = lab.topo.host("gw").addr(PORT).to_string();
    let tail = format!("endpoints: [\"{gw_ep}\"]\nremediation:\n  mode: reset\n  cooldown: 1m\n");
    let agent = lab.agent_in_cluster("api1", &tail, &[]);
    // Lease-like requests every second: the one in flight when the upstream dies is never
    // answered (seed 002); a watch that only waits sends nothing to go unanswered.
    let client = lab.client_in("node", Kind::PyLease, "gw", Some(&cg));
    let ok1 = lab.client("other", Kind::KubeWatch, "api2");
    let ok2 = lab.client("other", Kind::PyWatch, "api2");
    wait_healthy_clients(&agent, &[client.pid(), ok1.pid(), ok2.pid()]);

    let api1_ip = ip("api1").to_string();
    lab.topo
        .host("gw")
        .iptables(&["OUTPUT", "-d", &api1_ip, "-j", "DROP"]);
    lab.topo
        .host("gw")
        .iptables(&["INPUT", "-s", &api1_ip, "-j", "DROP"]);
    // Stale 15 s after the request that went to the dead upstream, reset in the same tick,
    // healthy again at once: the stale state may be too short to be polled; the reset is not.
    wait_until(secs(15 + 10), "a reset done", || {
        let resets = remediations(&agent, "reset");
        if resets.iter().any(|l| l.contains("result=\"done\"")) {
            Ok(())
        } else {
            Err(resets)
        }
    });
    agent.wait_clients(
        secs(20),
        "the same process healthy again through the gateway",
        |clients| {
            find_pid(clients, client.pid())
                .filter(|c| {
                    c["state"] == "healthy"
                        && connections(c)
                            .iter()
                            .any(|k| k["endpoint"] == gw_ep.as_str() && k["tcp_state"] == "ESTABLISHED")
                })
                .map(|_| ())
        },
    );
    let resets = remediations(&agent, "reset");
    assert!(
        resets.iter().any(|l| l.contains("result=\"done\"")),
        "a reset was done: {resets:?}"
    );
    assert!(
        remediations(&agent, "restart")
            .iter()
            .all(|l| !l.contains("result=\"done\"")),
        "no restart"
    );
    assert!(api1.evictions().is_empty(), "no eviction: {:?}", api1.evictions());
    wait_until(secs(10), "Events on the pod", || {
        let reasons = event_reasons(&api1);
        if reasons.iter().any(|r| r == "LifelineClientStale")
            && reasons.iter().any(|r| r.starts_with("LifelineReset"))
        {
            Ok(())
        } else {
            Err(reasons)
        }
    });
}

/// Issue 16 with `reset`: a python3-kubernetes watch (followed through OpenSSL) whose
/// apiserver sends its headers and then nothing, past the watch's own timeoutSeconds, is
/// stale with the stream named; the reset ends it, the same process dials again, its new
/// watch is answered, and it is healthy; Events on its pod say both.
#[test]
fn reset_ends_a_stuck_watch_and_the_client_watches_again() {
    init!();
    let lab = Lab::new(&["api1", "node"]);
    let ip = |h: &str| lab.topo.host(h).ip;
    let cg = ContainerCgroup::new();
    let mut opts = options(Generation::New, vec![pod("watcher", &cg, true)], vec![ip("api1")]);
    // Only the client's watch of namespace default hangs, and only the first one.
    opts.extra
        .extend(["--hang-watches", "default/pods", "--hang-first", "1"].map(String::from));
    let api = lab.apiserver_with("api1", opts);
    let tail = "remediation:\n  mode: reset\n  cooldown: 1m\n";
    // The shipped watch_grace is 2 min; the stuck rule itself is the judgement suite's.
    let agent = lab.agent_in_cluster("api1", tail, &["--watch-grace", "3s"]);
    // py-watch.py: lists, waits 3 s, watches with timeoutSeconds=60, dials again 1 s after
    // any error.
    let client = lab.client_in("node", Kind::PyWatchSettled, "api1", Some(&cg));
    let pid = client.pid();
    let before = agent.wait_clients(secs(20), "the client followed at stream level", |clients| {
        find_pid(clients, pid)
            .filter(|c| c["visibility"] == "streams" && !connections(c).is_empty())
            .map(|c| {
                connections(c)
                    .iter()
                    .map(|k| k["local"].clone())
                    .collect::<Vec<_>>()
            })
    });
    // Stale once its watch is 60 s + watch_grace old; reset in the same tick (so the stale
    // state itself may be too short to be polled, and too short for an alert to settle: the
    // Event on the pod says it).
    wait_until(secs(60 + 3 + 20), "a reset done", || {
        let resets = remediations(&agent, "reset");
        if resets.iter().any(|l| l.contains("result=\"done\"")) {
            Ok(())
        } else {
            Err(resets)
        }
    });
    let c = agent.wait_clients(
        secs(20),
        "the same process healthy on a new connection, its watch listed",
        |clients| {
            find_pid(clients, pid)
                .filter(|c| {
                    c["state"] == "healthy"
                        && connections(c)
                            .iter()
                            .any(|k| k["tcp_state"] == "ESTABLISHED" && !before.contains(&k["local"]))
                        && c["streams"]
                            .as_array()
                            .is_some_and(|s| s.iter().any(|s| s["resource"] == "pods" && s["stuck"] == false))
                })
                .cloned()
        },
    );
    let errors: Vec<String> = client
        .lines()
        .into_iter()
        .filter(|l| l.stderr && l.text.starts_with("ERROR "))
        .map(|l| l.text)
        .collect();
    assert!(!errors.is_empty(), "the client saw no end of its connection: {c}");
    eprintln!("the client after the reset: {errors:?}");
    assert!(api.evictions().is_empty(), "no eviction: {:?}", api.evictions());
    // The Events name the stuck watch, not the connection's bytes.
    wait_until(secs(10), "Events on the pod naming the watch", || {
        let events = events(&api);
        let named = |reason: fn(&str) -> bool| {
            events
                .iter()
                .any(|(r, message)| reason(r) && message.contains("watch pods in default: open "))
        };
        if named(|r| r == "LifelineClientStale") && named(|r| r.starts_with("LifelineReset")) {
            Ok(())
        } else {
            Err(events)
        }
    });
}

/// The never-redial client (`ll-stuck`) in pod `team-a/stuck` on node-a, next to two healthy
/// re-dialing clients (so one unhealthy client is no outage), after an apiserver restart left it
/// `disconnected`. Kept alive for the assertions.
struct StuckPod {
    api: ApiServer,
    agent: Agent,
    _clients: [Watched; 3],
    _cgroup: ContainerCgroup,
    _lab: Lab,
}

fn stuck_pod_disconnected(
    generation: Generation,
    remediate: bool,
    config_tail: &str,
    extra: &[&str],
) -> StuckPod {
    let lab = Lab::new(&["api", "node", "other"]);
    let cg = ContainerCgroup::new();
    let opts = || options(generation, vec![pod("stuck", &cg, remediate)], vec![]);
    let mut api = lab.apiserver_with("api", opts());
    let agent = lab.agent_in_cluster("api", config_tail, extra);
    let stuck = lab.client_in("node", Kind::Stuck, "api", Some(&cg));
    let ok1 = lab.client("other", Kind::KubeWatch, "api");
    let ok2 = lab.client("other", Kind::PyWatch, "api");
    wait_healthy_clients(&agent, &[stuck.pid(), ok1.pid(), ok2.pid()]);
    api.kill();
    thread::sleep(secs(1));
    let api = lab.apiserver_with("api", opts());
    wait_state(&agent, stuck.pid(), "disconnected", secs(GRACE + 5));
    StuckPod {
        api,
        agent,
        _clients: [stuck, ok1, ok2],
        _cgroup: cg,
        _lab: lab,
    }
}

/// The never-redial client in an opted-in pod with `restart`: evicted exactly once through the
/// generation's Eviction API, and not again within the cooldown.
fn restart_once(generation: Generation) {
    init!();
    let s = stuck_pod_disconnected(
        generation,
        true,
        "remediation:\n  mode: restart\n  cooldown: 10m\n",
        &[],
    );
    let evicted = wait_until(secs(20), "an eviction of the stuck pod", || {
        match s.api.evictions().as_slice() {
            [] => Err(Vec::<String>::new()),
            list => Ok(list.to_vec()),
        }
    });
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!(
        (evicted[0].namespace.as_str(), evicted[0].name.as_str()),
        ("team-a", "stuck")
    );
    assert_eq!(evicted[0].outcome, "evicted");
    let want = if generation == Generation::New {
        "policy/v1"
    } else {
        "policy/v1beta1"
    };
    assert_eq!(evicted[0].api_version, want);
    // The process lives on (nothing kills it here) and stays disconnected: no second eviction
    // within the cooldown.
    thread::sleep(secs(15));
    assert_eq!(
        s.api.evictions().len(),
        1,
        "evicted exactly once: {:?}",
        s.api.evictions()
    );
    let reasons = event_reasons(&s.api);
    assert!(
        reasons.iter().any(|r| r.starts_with("LifelineRestart")),
        "an Event for the restart: {reasons:?}"
    );
}

#[test]
fn restart_evicts_once_current_apiserver() {
    restart_once(Generation::New);
}

#[test]
fn restart_evicts_once_1_18_apiserver() {
    restart_once(Generation::Old);
}

/// Guards: the never-redial client's pod is disconnected, but no restart happens when it is not
/// opted in, or in `--dry-run` (logged and counted as dry_run).
fn guarded(remediate: bool, extra: &[&str]) -> (StuckPod, Vec<EvictionRecord>) {
    let s = stuck_pod_disconnected(
        Generation::New,
        remediate,
        "remediation:\n  mode: restart\n",
        extra,
    );
    thread::sleep(secs(8));
    let evictions = s.api.evictions();
    (s, evictions)
}

#[test]
fn no_opt_in_means_no_action() {
    init!();
    let (s, evictions) = guarded(false, &[]);
    assert!(evictions.is_empty(), "{evictions:?}");
    let restarts = remediations(&s.agent, "restart");
    assert!(
        restarts
            .iter()
            .all(|l| !l.contains("result=\"done\"") && !l.contains("result=\"dry_run\"")),
        "{restarts:?}"
    );
}

#[test]
fn dry_run_logs_and_does_nothing() {
    init!();
    let (s, evictions) = guarded(true, &["--dry-run"]);
    assert!(evictions.is_empty(), "{evictions:?}");
    let restarts = remediations(&s.agent, "restart");
    assert!(
        restarts.iter().any(|l| l.contains("result=\"dry_run\"")),
        "{restarts:?}"
    );
    assert!(
        restarts.iter().all(|l| !l.contains("result=\"done\"")),
        "{restarts:?}"
    );
    assert!(s.agent.stderr().contains("dry"), "the dry run is logged");
}

/// Every apiserver down: every client unhealthy at once; zero evictions even for opted-in pods.
#[test]
fn full_outage_means_no_restart() {
    init!();
    let lab = Lab::new(&["api", "node"]);
    let (cg1, cg2) = (ContainerCgroup::new(), ContainerCgroup::new());
    let opts = || {
        options(
            Generation::New,
            vec![pod("stuck", &cg1, true), pod("watch", &cg2, true)],
            vec![],
        )
    };
    let mut api = lab.apiserver_with("api", opts());
    let agent = lab.agent_in_cluster("api", "remediation:\n  mode: restart\n", &[]);
    let stuck = lab.client_in("node", Kind::Stuck, "api", Some(&cg1));
    let watch = lab.client_in("node", Kind::PyWatch, "api", Some(&cg2));
    wait_healthy_clients(&agent, &[stuck.pid(), watch.pid()]);
    api.kill();
    wait_state(&agent, stuck.pid(), "disconnected", secs(GRACE + 5));
    thread::sleep(secs(5));
    let restarts = remediations(&agent, "restart");
    assert!(
        restarts
            .iter()
            .all(|l| !l.contains("result=\"done\"") && !l.contains("result=\"failed\"")),
        "no restart attempted during the outage: {restarts:?}"
    );
    assert!(
        restarts.iter().any(|l| l.contains("result=\"skipped\"")),
        "skipped and counted: {restarts:?}"
    );
    // Back up: the fixture never saw an eviction.
    let api = lab.apiserver_with("api", opts());
    assert!(api.evictions().is_empty());
}
