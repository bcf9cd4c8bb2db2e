//! The delivery path against the real Alertmanager (Debian `prometheus-alertmanager`): the
//! policy's alerts go through a [`Dispatcher`] and show up as active in Alertmanager, with our
//! labels and the fingerprint the webhook body carries; the resolve makes them inactive.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, SystemTime},
};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use prometheus::{IntCounterVec, Opts};
use serde_json::Value;

use super::{sink::free_addr, wire::fingerprint};
use crate::{
    act::alerts::{AlertBook, ClientInput, ClientLabels, Dispatcher, Options, DEFAULT_SETTLE},
    health::State,
};

const BINARY: &str = "/usr/bin/prometheus-alertmanager";

/// A running Alertmanager in a scratch directory; killed and cleaned up on drop.
struct Alertmanager {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Alertmanager {
    async fn start() -> Self {
        assert!(
            std::path::Path::new(BINARY).exists(),
            "{BINARY} is missing: apt-get install prometheus-alertmanager (cargo xtask setup does)"
        );
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("lifeline-am-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("alertmanager.yml");
        std::fs::write(
            &config,
            "route:\n  receiver: blackhole\n  group_wait: 1s\nreceivers:\n  - name: blackhole\n",
        )
        .unwrap();
        let addr = free_addr();
        let log = std::fs::File::create(dir.join("alertmanager.log")).unwrap();
        let child = Command::new(BINARY)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--cluster.listen-address=")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let am = Self {
            child,
            dir,
            url: format!("http://{addr}"),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok((200, _)) = get(&format!("{}/-/ready", am.url)).await {
                return am;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "alertmanager not ready: {}",
                std::fs::read_to_string(am.dir.join("alertmanager.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET /api/v2/alerts`: every alert Alertmanager holds that is not resolved.
    async fn alerts(&self) -> Vec<Value> {
        let (status, body) = get(&format!("{}/api/v2/alerts", self.url)).await.unwrap();
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Vec<Value>>(&body).unwrap()
    }

    /// Waits until `pick` finds what it wants in the alert list.
    async fn wait_for<T>(&self, what: &str, mut pick: impl FnMut(&[Value]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let alerts = self.alerts().await;
            if let Some(found) = pick(&alerts) {
                return found;
            }
            assert!(tokio::time::Instant::now() < deadline, "{what}: {alerts:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn get(url: &str) -> Result<(u16, String), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client
        .get(url.parse().unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok((status, String::from_utf8_lossy(&body.to_bytes()).into_owned()))
}

fn client(state: State, since: SystemTime) -> ClientInput {
    ClientInput {
        key: (4242, 1),
        is_client: true,
        state,
        since,
        reason: "lost its apiserver connection 20s ago and has not reconnected (disconnect_grace 15s)".into(),
        labels: ClientLabels {
            namespace: Some("kube-system".into()),
            pod: Some("notifier-7d9".into()),
            container: Some("notifier".into()),
            comm: "notifier".into(),
            resource: String::new(),
        },
        endpoint: None,
    }
}

fn ours(alerts: &[Value]) -> Option<&Value> {
    alerts.iter().find(|a| {
        a["labels"]["alertname"] == "LifelineClientDisconnected" && a["labels"]["pod"] == "notifier-7d9"
    })
}

#[tokio::test]
#[ignore = "needs prometheus-alertmanager: run by cargo xtask test"]
async fn alertmanager_shows_our_alert_active_then_resolved() {
    let am = Alertmanager::start().await;
    let sent = IntCounterVec::new(Opts::new("sent", "sent"), &["receiver", "result"]).unwrap();
    let dispatcher =
        Dispatcher::start(&[], &[], std::slice::from_ref(&am.url), &sent, Options::default()).unwrap();
    let mut book = AlertBook::new("node-1", DEFAULT_SETTLE);

    let now = SystemTime::now();
    let since = now - Duration::from_secs(5);
    let fired = book.tick(now, &[client(State::Disconnected, since)], &[]);
    assert_eq!(fired.len(), 1);
    let labels = fired[0].labels.clone();
    dispatcher.submit(fired);

    let active = am
        .wait_for("our alert active", |alerts| {
            ours(alerts).filter(|a| a["status"]["state"] == "active").cloned()
        })
        .await;
    for (name, value) in [
        ("alertname", "LifelineClientDisconnected"),
        ("severity", "critical"),
        ("node", "node-1"),
        ("namespace", "kube-system"),
        ("pod", "notifier-7d9"),
        ("container", "notifier"),
        ("comm", "notifier"),
    ] {
        assert_eq!(active["labels"][name], value, "{name}: {active:#}");
    }
    assert!(
        active["labels"].get("endpoint").is_none(),
        "Alertmanager drops empty labels (so our fingerprint skips them too): {active:#}"
    );
    assert!(
        active["annotations"]["description"]
            .as_str()
            .unwrap()
            .contains("has not reconnected"),
        "{active:#}"
    );
    assert!(active["annotations"]["summary"]
        .as_str()
        .unwrap()
        .contains("disconnected"));
    assert_eq!(
        active["fingerprint"].as_str().unwrap(),
        fingerprint(&labels),
        "the webhook body's fingerprint is Alertmanager's"
    );
    let starts: chrono::DateTime<chrono::Utc> = active["startsAt"].as_str().unwrap().parse().unwrap();
    let starts = SystemTime::from(starts);
    let skew = starts.duration_since(since).unwrap_or_else(|e| e.duration());
    assert!(skew < Duration::from_millis(2), "startsAt is the state's since");
    assert_eq!(sent.with_label_values(&["alertmanager-1", "ok"]).get(), 1);

    let resolved = book.tick(SystemTime::now(), &[client(State::Healthy, since)], &[]);
    assert_eq!(resolved.len(), 1);
    dispatcher.submit(resolved);
    am.wait_for("our alert no longer active", |alerts| match ours(alerts) {
        None => Some(()),
        Some(a) if a["status"]["state"] != "active" => Some(()),
        Some(_) => None,
    })
    .await;
    dispatcher.shutdown(Duration::from_secs(2)).await;
    assert_eq!(sent.with_label_values(&["alertmanager-1", "ok"]).get(), 2);
    assert_eq!(sent.with_label_values(&["alertmanager-1", "error"]).get(), 0);
}
