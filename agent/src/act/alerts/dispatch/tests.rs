use std::collections::BTreeMap;

use prometheus::Opts;
use serde_json::Value;

use super::*;
use crate::{
    act::alerts::{
        sink::{free_addr, Sink},
        Alert, Dispatcher, Error, Labels, Options,
    },
    times::rfc3339,
};

const WAIT: Duration = Duration::from_secs(5);

fn counter() -> IntCounterVec {
    IntCounterVec::new(Opts::new("sent", "sent"), &["receiver", "result"]).unwrap()
}

fn count(sent: &IntCounterVec, receiver: &str, result: &str) -> u64 {
    sent.with_label_values(&[receiver, result]).get()
}

fn fast() -> Options {
    Options {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        timeout: Duration::from_secs(2),
        ..Options::default()
    }
}

fn webhook(url: &str, sent: &IntCounterVec, options: Options) -> Dispatcher {
    Dispatcher::start(&[], &[url.to_owned()], &[], sent, options).unwrap()
}

fn alertmanager(url: &str, sent: &IntCounterVec, options: Options) -> Dispatcher {
    Dispatcher::start(&[], &[], &[url.to_owned()], sent, options).unwrap()
}

fn at_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + ms)
}

fn firing(pod: &str) -> Alert {
    Alert {
        labels: Labels::from([
            ("alertname".to_owned(), "LifelineClientStale".to_owned()),
            ("severity".to_owned(), "warning".to_owned()),
            ("node".to_owned(), "n1".to_owned()),
            ("pod".to_owned(), pod.to_owned()),
        ]),
        annotations: BTreeMap::from([("summary".to_owned(), format!("{pod} is stale"))]),
        starts_at: at_ms(0),
        ends_at: None,
    }
}

fn resolved(pod: &str, at: SystemTime) -> Alert {
    Alert {
        ends_at: Some(at),
        ..firing(pod)
    }
}

/// (pod, status) of every alert in webhook bodies, in order.
fn webhook_alerts(bodies: &[crate::act::alerts::sink::Received]) -> Vec<(String, String)> {
    bodies
        .iter()
        .flat_map(|r| r.body["alerts"].as_array().unwrap().clone())
        .map(|a| {
            (
                a["labels"]["pod"].as_str().unwrap().to_owned(),
                a["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pair(pod: &str, status: &str) -> (String, String) {
    (pod.to_owned(), status.to_owned())
}

#[tokio::test]
async fn webhook_gets_alertmanagers_v4_body_on_each_change() {
    let sink = Sink::start().await;
    let sent = counter();
    let d = webhook(&format!("{}/hook", sink.url), &sent, fast());
    d.submit(vec![firing("p1")]);
    let got = sink.wait_accepted(1, WAIT).await;
    assert_eq!(got[0].path, "/hook");
    let body = &got[0].body;
    assert_eq!(body["version"], "4");
    assert_eq!(body["receiver"], "webhook-1");
    assert_eq!(body["status"], "firing");
    assert_eq!(body["truncatedAlerts"], 0);
    assert_eq!(
        body["groupKey"],
        "{}:{alertname=\"LifelineClientStale\", node=\"n1\"}"
    );
    assert_eq!(body["groupLabels"]["alertname"], "LifelineClientStale");
    assert_eq!(body["commonLabels"]["pod"], "p1");
    assert_eq!(body["commonAnnotations"]["summary"], "p1 is stale");
    assert!(body["externalURL"].is_string());
    let alert = &body["alerts"][0];
    assert_eq!(alert["status"], "firing");
    assert_eq!(alert["startsAt"], rfc3339(at_ms(0)));
    assert_eq!(alert["endsAt"], "0001-01-01T00:00:00Z");
    assert_eq!(alert["fingerprint"].as_str().unwrap().len(), 16);
    assert!(alert["generatorURL"].is_string());

    d.submit(vec![resolved("p1", at_ms(5000))]);
    let got = sink.wait_accepted(2, WAIT).await;
    assert_eq!(got[1].body["status"], "resolved");
    assert_eq!(got[1].body["alerts"][0]["endsAt"], rfc3339(at_ms(5000)));
    assert_eq!(got[1].body["alerts"][0]["fingerprint"], alert["fingerprint"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sink.received().len(), 2, "a webhook is not re-sent");
    assert_eq!(
        (
            count(&sent, "webhook-1", "ok"),
            count(&sent, "webhook-1", "error")
        ),
        (2, 0)
    );
}

#[tokio::test]
async fn alertmanager_gets_v2_alerts_resent_while_firing_and_resolved_with_ends_at() {
    let sink = Sink::start().await;
    let sent = counter();
    let resend = Duration::from_millis(300);
    let d = alertmanager(
        &format!("{}/", sink.url),
        &sent,
        Options {
            resend_interval: resend,
            generator_url: "http://node-1:9477/api/v1/clients".into(),
            ..fast()
        },
    );
    let before = SystemTime::now();
    d.submit(vec![firing("p1")]);
    let got = sink.wait_accepted(1, WAIT).await;
    assert_eq!(got[0].path, "/api/v2/alerts");
    let Value::Array(alerts) = &got[0].body else {
        panic!("not an array: {}", got[0].body)
    };
    assert_eq!(alerts.len(), 1);
    let a = &alerts[0];
    assert_eq!(a["labels"]["pod"], "p1");
    assert_eq!(a["annotations"]["summary"], "p1 is stale");
    assert_eq!(a["startsAt"], rfc3339(at_ms(0)));
    assert_eq!(a["generatorURL"], "http://node-1:9477/api/v1/clients");
    let ends: chrono::DateTime<chrono::Utc> = a["endsAt"].as_str().unwrap().parse().unwrap();
    let ends = SystemTime::from(ends);
    assert!(
        ends >= before + 4 * resend - Duration::from_millis(1) && ends <= SystemTime::now() + 4 * resend,
        "endsAt is 4 resend intervals after sending"
    );
    // Re-sent while firing, each time with a later endsAt.
    let got = sink.wait_accepted(3, WAIT).await;
    for pair in got.windows(2) {
        assert_eq!(pair[1].body[0]["labels"]["pod"], "p1");
        let (a, b) = (
            pair[0].body[0]["endsAt"].as_str(),
            pair[1].body[0]["endsAt"].as_str(),
        );
        assert!(b > a, "{a:?} then {b:?}");
    }
    d.submit(vec![resolved("p1", at_ms(9000))]);
    let deadline = tokio::time::Instant::now() + WAIT;
    let resolved_at = loop {
        let got = sink.accepted();
        if let Some(i) = got
            .iter()
            .position(|r| r.body[0]["endsAt"] == rfc3339(at_ms(9000)))
        {
            break i;
        }
        assert!(tokio::time::Instant::now() < deadline, "no resolve: {got:#?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(3 * resend).await;
    assert_eq!(
        sink.accepted().len(),
        resolved_at + 1,
        "nothing re-sent after the resolve"
    );
    assert_eq!(count(&sent, "alertmanager-1", "ok") as usize, resolved_at + 1);
}

#[tokio::test]
async fn a_receiver_that_was_down_gets_the_newest_state_of_every_alert() {
    let addr = free_addr();
    let sent = counter();
    let d = webhook(&format!("http://{addr}/hook"), &sent, fast());
    d.submit(vec![firing("a"), firing("b")]);
    d.submit(vec![resolved("a", at_ms(1000)), firing("c")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let errors = count(&sent, "webhook-1", "error");
    assert!(errors >= 2, "failed attempts are counted: {errors}");
    assert_eq!(count(&sent, "webhook-1", "ok"), 0);
    let sink = Sink::start_on(addr).await;
    let got = sink.wait_accepted(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut alerts = webhook_alerts(&sink.accepted());
    alerts.sort();
    assert_eq!(
        alerts,
        [pair("a", "resolved"), pair("b", "firing"), pair("c", "firing")],
        "{got:#?}"
    );
    assert_eq!(count(&sent, "webhook-1", "ok"), 3);
    assert_eq!(count(&sent, "webhook-1", "dropped"), 0);
}

#[tokio::test]
async fn a_receiver_answering_503_is_retried_with_backoff_until_it_accepts() {
    let sink = Sink::start().await;
    sink.respond_with(503);
    let sent = counter();
    let d = alertmanager(&sink.url, &sent, fast());
    d.submit(vec![firing("a")]);
    tokio::time::sleep(Duration::from_millis(150)).await;
    d.submit(vec![resolved("a", at_ms(7000)), firing("b")]);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let refused = sink.received().len();
    assert!(refused >= 3, "retried: {refused}");
    // Backoff: 20, 40, 80, 100, 100 ms... so in 400 ms far fewer than one per ms.
    assert!(refused <= 10, "backs off: {refused}");
    assert_eq!(
        count(&sent, "alertmanager-1", "error") as usize,
        sink.received()
            .iter()
            .map(|r| r.body.as_array().unwrap().len())
            .sum::<usize>()
    );
    sink.respond_with(200);
    let got = sink.wait_accepted(1, WAIT).await;
    let mut alerts: Vec<(String, String)> = got[0]
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["labels"]["pod"].as_str().unwrap().to_owned(),
                a["endsAt"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    alerts.sort();
    assert_eq!(alerts.len(), 2, "{alerts:?}");
    assert_eq!(
        alerts[0],
        pair("a", &rfc3339(at_ms(7000))),
        "the resolve replaced the firing"
    );
    assert_eq!(alerts[1].0, "b");
    // The dispatcher counts an attempt once it has read the answer: after the sink did.
    let deadline = tokio::time::Instant::now() + WAIT;
    while count(&sent, "alertmanager-1", "ok") < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count(&sent, "alertmanager-1", "ok"), 2);
}

#[tokio::test]
async fn queue_overflow_drops_the_oldest_and_counts_it() {
    let addr = free_addr();
    let sent = counter();
    let d = webhook(
        &format!("http://{addr}/"),
        &sent,
        Options {
            queue_capacity: 3,
            ..fast()
        },
    );
    d.submit(["a", "b", "c", "d", "e"].map(firing).to_vec());
    assert_eq!(count(&sent, "webhook-1", "dropped"), 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sink = Sink::start_on(addr).await;
    sink.wait_accepted(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut alerts = webhook_alerts(&sink.accepted());
    alerts.sort();
    assert_eq!(
        alerts,
        [pair("c", "firing"), pair("d", "firing"), pair("e", "firing")]
    );
    assert_eq!(count(&sent, "webhook-1", "dropped"), 2);
}

#[tokio::test]
async fn submit_returns_at_once_while_the_receiver_hangs_and_shutdown_is_bounded() {
    let sink = Sink::start().await;
    sink.hang();
    let sent = counter();
    let d = alertmanager(
        &sink.url,
        &sent,
        Options {
            timeout: Duration::from_secs(30),
            ..fast()
        },
    );
    d.submit(vec![firing("first")]);
    tokio::time::sleep(Duration::from_millis(100)).await; // the request is now hanging
    let start = std::time::Instant::now();
    for i in 0..2000 {
        d.submit(vec![firing(&format!("p{i}"))]);
    }
    let took = start.elapsed();
    assert!(took < Duration::from_millis(500), "2000 submits took {took:?}");
    assert_eq!(
        count(&sent, "alertmanager-1", "dropped"),
        1000,
        "queue bound 1000"
    );
    let start = std::time::Instant::now();
    d.shutdown(Duration::from_millis(300)).await;
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
}

#[tokio::test]
async fn the_request_timeout_counts_as_a_failed_attempt() {
    let sink = Sink::start().await;
    sink.hang();
    let sent = counter();
    let d = webhook(
        &sink.url,
        &sent,
        Options {
            timeout: Duration::from_millis(100),
            ..fast()
        },
    );
    d.submit(vec![firing("a")]);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let errors = count(&sent, "webhook-1", "error");
    assert!(
        (2..=4).contains(&errors),
        "one error per 100 ms attempt plus backoff: {errors}"
    );
}

#[tokio::test]
async fn shutdown_flushes_what_is_queued() {
    let sink = Sink::start().await;
    let sent = counter();
    let d = webhook(&sink.url, &sent, fast());
    d.submit(vec![firing("a"), firing("b")]);
    d.shutdown(Duration::from_secs(2)).await;
    let mut alerts = webhook_alerts(&sink.accepted());
    alerts.sort();
    assert_eq!(alerts, [pair("a", "firing"), pair("b", "firing")]);
}

#[tokio::test]
async fn a_rejected_body_is_not_retried() {
    let sink = Sink::start().await;
    sink.respond_with(400);
    let sent = counter();
    let d = webhook(&sink.url, &sent, fast());
    d.submit(vec![firing("a")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.received().len(), 1);
    assert_eq!(count(&sent, "webhook-1", "error"), 1);
}

#[test]
fn receivers_come_from_the_file_then_the_flags_with_generated_names() {
    let file: Vec<receivers::Receiver> = serde_saphyr::from_str(
        r#"
- { name: am, alertmanager: { url: "http://alertmanager:9093/" } }
- { name: hook, webhook: { url: "http://sink:8080/hook", timeout: 2s } }
"#,
    )
    .unwrap();
    let specs = receiver_specs(
        &file,
        &["http://a/1".into(), "http://a/2".into()],
        &["http://am2:9093".into()],
    )
    .unwrap();
    let got: Vec<(&str, Kind, String, Option<Duration>)> = specs
        .iter()
        .map(|s| (s.name.as_str(), s.kind, s.target.to_string(), s.timeout))
        .collect();
    assert_eq!(
        got,
        [
            (
                "am",
                Kind::Alertmanager,
                "http://alertmanager:9093/api/v2/alerts".into(),
                None
            ),
            (
                "hook",
                Kind::Webhook,
                "http://sink:8080/hook".into(),
                Some(Duration::from_secs(2))
            ),
            ("webhook-1", Kind::Webhook, "http://a/1".into(), None),
            ("webhook-2", Kind::Webhook, "http://a/2".into(), None),
            (
                "alertmanager-1",
                Kind::Alertmanager,
                "http://am2:9093/api/v2/alerts".into(),
                None
            ),
        ]
    );
}

#[test]
fn bad_urls_credentials_in_urls_and_duplicate_names_are_refused_naming_them() {
    let err = |file: &[receivers::Receiver], hooks: &[&str]| {
        let hooks: Vec<String> = hooks.iter().map(|s| (*s).to_owned()).collect();
        receiver_specs(file, &hooks, &[]).unwrap_err()
    };
    let e = err(&[], &["https://admin:s3cret@secure/hook"]);
    assert!(matches!(e, Error::UserInfo { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("https://admin:<redacted>@secure/hook"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    let text = err(&[], &["ftp://x"]).to_string();
    assert!(text.contains("webhook-1") && text.contains("ftp://x"), "{text}");
    assert!(matches!(err(&[], &["http://"]), Error::Url { .. }));
    let file: Vec<receivers::Receiver> =
        serde_saphyr::from_str(r#"[{ name: webhook-1, webhook: { url: "http://x" } }]"#).unwrap();
    let text = err(&file, &["http://y"]).to_string();
    assert!(text.contains("\"webhook-1\" is used twice"), "{text}");
    let both: Vec<receivers::Receiver> = serde_saphyr::from_str(r#"[{ name: x }]"#).unwrap();
    assert!(matches!(err(&both, &[]), Error::Target { .. }));
}

/// A receiver from YAML (a `UrlTarget`), for the TLS and authentication tests.
fn receiver_yaml(yaml: &str) -> Vec<receivers::Receiver> {
    serde_saphyr::from_str(yaml).unwrap()
}

#[tokio::test]
async fn https_receivers_verify_against_the_ca_bundle_and_send_bearer_and_basic_auth() {
    let dir = std::env::temp_dir().join(format!("lifeline-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sink = Sink::start_tls(&dir).await;
    let ca = sink.ca_file.clone().unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "t0ken-1\n").unwrap();
    let password = dir.join("password");
    std::fs::write(&password, "pa55").unwrap();
    let file = receiver_yaml(&format!(
        r#"
- name: bearer
  webhook:
    url: "{url}/bearer"
    tls_config: {{ ca_file: "{ca}" }}
    authorization: {{ credentials_file: "{token}" }}
- name: basic
  alertmanager:
    url: "{url}"
    tls_config: {{ ca_file: "{ca}" }}
    basic_auth: {{ username: lifeline, password_file: "{password}" }}
"#,
        url = sink.url,
        ca = ca.display(),
        token = token.display(),
        password = password.display(),
    ));
    let sent = counter();
    let d = Dispatcher::start(&file, &[], &[], &sent, fast()).unwrap();
    d.submit(vec![firing("p1")]);
    let got = sink.wait_accepted(2, WAIT).await;
    let auth = |path: &str| {
        got.iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("no POST to {path}: {got:?}"))
            .authorization
            .clone()
    };
    assert_eq!(auth("/bearer").as_deref(), Some("Bearer t0ken-1"));
    // base64("lifeline:pa55")
    assert_eq!(
        auth("/api/v2/alerts").as_deref(),
        Some("Basic bGlmZWxpbmU6cGE1NQ==")
    );

    // A rotated token is read for the next request.
    std::fs::write(&token, "t0ken-2").unwrap();
    d.submit(vec![resolved("p1", at_ms(1))]);
    let got = sink.wait_accepted(4, WAIT).await;
    assert!(
        got.iter()
            .any(|r| r.authorization.as_deref() == Some("Bearer t0ken-2")),
        "{got:?}"
    );
    d.shutdown(WAIT).await;

    // Without the CA bundle, the system's roots do not know the sink: delivery fails.
    let untrusted = Dispatcher::start(&[], &[format!("{}/x", sink.url)], &[], &sent, fast()).unwrap();
    untrusted.submit(vec![firing("p2")]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(count(&sent, "webhook-1", "error") >= 1);
    assert!(!sink.received().iter().any(|r| r.path == "/x"));
    untrusted.shutdown(Duration::from_millis(10)).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unreadable_ca_bundles_and_credentials_are_refused_at_start_naming_them() {
    let dir = std::env::temp_dir().join(format!("lifeline-tls-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let start_err = |yaml: &str| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        Dispatcher::start(&receiver_yaml(yaml), &[], &[], &counter(), fast())
            .err()
            .expect(yaml)
            .to_string()
    };
    let text = start_err(&format!(
        r#"[{{ name: a, webhook: {{ url: "https://x", tls_config: {{ ca_file: "{}" }} }} }}]"#,
        not_pem.display()
    ));
    assert!(
        text.contains("receiver a: CA bundle") && text.contains("no PEM certificate"),
        "{text}"
    );
    let text = start_err(
        r#"[{ name: a, webhook: { url: "https://x", tls_config: { ca_file: /nonexistent/ca.pem } } }]"#,
    );
    assert!(text.contains("/nonexistent/ca.pem"), "{text}");
    let text = start_err(
        r#"[{ name: a, webhook: { url: "https://x", authorization: { credentials_file: /nonexistent/t } } }]"#,
    );
    assert!(
        text.contains("receiver a: credentials file /nonexistent/t"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn only_server_side_failures_are_retried() {
    let status = |code: u16| Error::Status {
        url: "u".into(),
        status: StatusCode::from_u16(code).unwrap(),
        body: String::new(),
    };
    assert!(status(503).is_retryable());
    assert!(status(429).is_retryable());
    assert!(status(408).is_retryable());
    assert!(!status(400).is_retryable());
    assert!(!status(404).is_retryable());
    let timeout = Error::Timeout {
        url: "u".into(),
        timeout: Duration::from_secs(1),
    };
    assert!(timeout.is_retryable());
}
