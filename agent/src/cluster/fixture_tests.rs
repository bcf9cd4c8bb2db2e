//! The I/O side against the fake apiserver `ll-apiserver` (tests/src/bin/ll-apiserver.rs),
//! as each API generation: discovery, live endpoints, the pod index, evictions, events and
//! the reachability probe. Run by `cargo xtask test` (which builds the fixture), or by hand:
//! `cargo build -p lifeline-integration --bin ll-apiserver` then
//! `cargo test -p lifeline cluster::fixture_tests -- --ignored`.
use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::discovery::{EndpointsApi, EventsApi};
use super::*;
use crate::endpoint::Source;

const NODE: &str = "lifeline-node-1";
const APP_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// `ll-apiserver`: `$LL_APISERVER`, else beside this test's own build (`target/debug/`; the
/// test executable lives in `target/debug/deps/`).
fn fixture_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LL_APISERVER") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>")
        .join("ll-apiserver")
}

/// A running fixture, killed (by its pid) and its directory removed on drop.
struct Fixture {
    child: Child,
    dir: PathBuf,
    kubeconfig: PathBuf,
    addr: String,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Fixture {
    fn start(generation: &str) -> Fixture {
        let dir = std::env::temp_dir().join(format!("lifeline-cluster-{generation}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("fixture dir");
        let pods = json!([
            {
                "metadata": {"name": "notifier", "namespace": "ops", "labels": {"app": "notifier"},
                             "annotations": {"lifeline.dev/remediate": "true"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "notifier", "image": "n:1"}]},
                "status": {"phase": "Running", "containerStatuses": [{
                    "name": "notifier", "ready": true, "restartCount": 0, "image": "n:1",
                    "imageID": "n@sha256:00", "containerID": format!("containerd://{APP_ID}"),
                    "state": {"running": {"startedAt": "2025-05-01T10:00:00Z"}}
                }]}
            },
            {
                "metadata": {"name": "guarded", "namespace": "ops", "labels": {"app": "guarded"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "g", "image": "g:1"}]}
            },
            {
                "metadata": {"name": "elsewhere", "namespace": "ops"},
                "spec": {"nodeName": "other-node", "containers": [{"name": "e", "image": "e:1"}]},
                "status": {"phase": "Running", "containerStatuses": [{
                    "name": "e", "ready": true, "restartCount": 0, "image": "e:1", "imageID": "e@sha256:00",
                    "containerID": format!("containerd://{}", "f".repeat(64)),
                    "state": {"running": {"startedAt": "2025-05-01T10:00:00Z"}}
                }]}
            }
        ]);
        let pdbs = json!([{
            "metadata": {"name": "guarded", "namespace": "ops"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
        }]);
        std::fs::write(dir.join("pods.json"), pods.to_string()).expect("pods file");
        std::fs::write(dir.join("pdbs.json"), pdbs.to_string()).expect("pdbs file");
        let binary = fixture_binary();
        let mut child = Command::new(&binary)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--generation",
                generation,
                "--endpoint-ip",
                "127.0.0.9",
            ])
            .arg("--cert-dir")
            .arg(dir.join("certs"))
            .arg("--pods")
            .arg(dir.join("pods.json"))
            .arg("--pdbs")
            .arg(dir.join("pdbs.json"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                let _ = std::fs::remove_dir_all(&dir);
                panic!("starting {}: {e} (build it first)", binary.display())
            });
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        stdout.read_line(&mut line).expect("fixture stdout");
        // Keep reading, so that the fixture never writes into a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("fixture said {line:?}"))
            .to_owned();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: f\ncontexts:\n- name: f\n  context: {{cluster: f, user: f}}\n\
                 clusters:\n- name: f\n  cluster: {{server: \"https://{addr}\", certificate-authority: \"{}\"}}\n\
                 users:\n- name: f\n  user: {{token: lifeline-test-token}}\n",
                dir.join("certs/ca.pem").display()
            ),
        )
        .expect("kubeconfig");
        Fixture {
            child,
            dir,
            kubeconfig,
            addr,
        }
    }
}

async fn raw(cluster: &Cluster, method: http::Method, path: &str, body: Option<Value>) -> Value {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Vec::new, |b| b.to_string().into_bytes()))
        .expect("request");
    let text = cluster.inner.client.request_text(request).await.expect(path);
    serde_json::from_str(&text).expect("json")
}

/// Polls `check` every 100 ms until it gives `Some`, for at most 15 s.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn has(set: &EndpointSet, endpoint: &str, source: Source) -> bool {
    set.iter()
        .any(|(e, s)| e.to_string() == endpoint && s.contains(&source))
}

async fn exercise(generation: &str) {
    let fixture = Fixture::start(generation);
    let mut options = Options::new(Some(fixture.kubeconfig.clone()), NODE);
    options.event_limits.update_every = Duration::ZERO;
    let cluster = Cluster::start(options).await.expect("start");
    assert_eq!(cluster.inner.server, format!("https://{}/", fixture.addr));
    // The server's own address is there before anything was asked of it.
    assert!(has(
        &cluster.endpoints().borrow(),
        &fixture.addr,
        Source::Kubeconfig
    ));
    assert!(
        cluster.settled(Duration::from_secs(15)).await,
        "discovery and first lists"
    );

    let v = cluster.api_versions().expect("discovered");
    let (backends, expected) = match generation {
        "old" => (
            Source::Endpoints,
            (
                EndpointsApi::CoreV1,
                discovery::EvictionApi::PolicyV1beta1,
                EventsApi::CoreV1,
            ),
        ),
        _ => (
            Source::EndpointSlice,
            (
                EndpointsApi::EndpointSliceV1,
                discovery::EvictionApi::PolicyV1,
                EventsApi::EventsV1,
            ),
        ),
    };
    assert_eq!((v.endpoints, v.eviction, v.events), expected, "{v}");

    let mut rx = cluster.endpoints();
    {
        let set = rx.borrow_and_update();
        assert!(has(&set, "10.96.0.1:443", Source::Service), "{set:?}");
        assert!(has(&set, "127.0.0.9:6443", backends), "{set:?}");
    }
    // The apiserver's addresses change: the new one is watched, the old one retained.
    raw(
        &cluster,
        http::Method::POST,
        "/fixture/endpoint-ips",
        Some(json!(["127.0.0.10"])),
    )
    .await;
    tokio::time::timeout(
        Duration::from_secs(15),
        rx.wait_for(|s| has(s, "127.0.0.10:6443", backends)),
    )
    .await
    .expect("new endpoint in time")
    .expect("endpoints channel open");
    assert!(
        has(&rx.borrow(), "127.0.0.9:6443", backends),
        "removed endpoint retained"
    );

    // The pod index holds this node's pods only.
    let pod = eventually("the pod index", || {
        cluster.pod_of(&format!("containerd://{APP_ID}"))
    })
    .await;
    assert_eq!(
        (pod.namespace.as_str(), pod.pod.as_str(), pod.container.as_str()),
        ("ops", "notifier", "notifier")
    );
    assert!(pod.remediate && !pod.monitor);
    assert_eq!(cluster.pod_of(&"f".repeat(64)), None);

    // Events: created, then a repeat updates the count, both accepted by the validation.
    let target = EventTarget::Pod {
        namespace: "ops".into(),
        name: "notifier".into(),
        uid: pod.uid.clone(),
    };
    let reason = "LifelineClientDisconnected";
    assert_eq!(
        cluster.emit(target.clone(), reason, "lost its apiserver", EventType::Warning),
        Emitted::Queued
    );
    assert_eq!(
        cluster.emit(target, reason, "lost its apiserver", EventType::Warning),
        Emitted::Queued
    );
    let node = EventTarget::Node { name: NODE.into() };
    assert_eq!(
        cluster.emit(
            node,
            "LifelineApiserverOutage",
            "most clients lost it",
            EventType::Warning
        ),
        Emitted::Queued
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let events = loop {
        let log = raw(&cluster, http::Method::GET, "/fixture/log", None).await;
        let events = log["events"].as_array().cloned().unwrap_or_default();
        if events.len() >= 3 || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let summary: Vec<(String, String, i64)> = events
        .iter()
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or("").to_owned(),
                e["apiVersion"].as_str().unwrap_or("").to_owned(),
                e["code"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let api = v.events.api_version();
    assert_eq!(summary.len(), 3, "{events:#?}");
    assert!(
        summary
            .iter()
            .filter(|(verb, _, _)| verb == "create")
            .all(|(_, a, code)| a == api && *code == 201),
        "{events:#?}"
    );
    assert!(
        summary
            .iter()
            .any(|(verb, _, code)| verb == "patch" && *code == 200),
        "{events:#?}"
    );

    // Evictions: no budget → evicted; a budget allowing nothing → blocked; no pod → not found.
    assert_eq!(
        cluster.evict("ops", "notifier").await.expect("evict notifier"),
        EvictOutcome::Evicted
    );
    let blocked = cluster.evict("ops", "guarded").await.expect("evict guarded");
    assert!(
        matches!(&blocked, EvictOutcome::Blocked { reason } if reason.contains("disruption budget")),
        "{blocked:?}"
    );
    assert_eq!(
        cluster.evict("ops", "nobody").await.expect("evict nobody"),
        EvictOutcome::NotFound
    );
    let log = raw(&cluster, http::Method::GET, "/fixture/log", None).await;
    let versions: Vec<&str> = log["evictions"]
        .as_array()
        .expect("evictions")
        .iter()
        .map(|e| e["apiVersion"].as_str().unwrap_or(""))
        .collect();
    assert!(versions.iter().all(|a| *a == v.eviction.api_version()), "{log:#}");
    // The evicted pod leaves the index.
    eventually("the evicted pod to leave the index", || {
        cluster.pod_of(APP_ID).is_none().then_some(())
    })
    .await;

    assert!(eventually("a probe verdict", || cluster.apiserver_reachable()).await);
    // The apiserver dies: the probe says so, and the endpoints stay as they were.
    let mut fixture = fixture;
    fixture.child.kill().expect("kill the fixture");
    let _ = fixture.child.wait();
    eventually("the probe to fail", || {
        (cluster.apiserver_reachable() == Some(false)).then_some(())
    })
    .await;
    assert!(has(&cluster.endpoints().borrow(), "127.0.0.10:6443", backends));
    cluster.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the fixture: run by cargo xtask test"]
async fn against_a_current_apiserver() {
    exercise("new").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the fixture: run by cargo xtask test"]
async fn against_a_1_18_apiserver() {
    exercise("old").await;
}
