//! The JSON bodies receivers get. Pure: every function takes the send time.
//!
//! - Alertmanager API v2 `POST /api/v2/alerts`: an array of postable alerts. A firing alert
//!   carries `endsAt = now + 4 × resend_interval` (as Prometheus does), so Alertmanager keeps it
//!   while we re-send and resolves it by itself if we stop; a resolved one carries its resolve
//!   time.
//! - Webhook: the body Alertmanager's webhook notifier posts (payload version "4"), one per
//!   alert name, so receivers written for Alertmanager work unchanged.
use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use crate::{
    act::alerts::{Alert, Labels, Status},
    times::rfc3339,
};

/// How Go (and so Alertmanager) writes the zero time: `endsAt` of a firing webhook alert.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// One alert of `POST /api/v2/alerts`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PostableAlert<'a> {
    pub labels: &'a Labels,
    pub annotations: &'a BTreeMap<String, String>,
    pub starts_at: String,
    pub ends_at: String,
    /// Omitted when empty: Alertmanager validates it as a URI.
    #[serde(rename = "generatorURL", skip_serializing_if = "str::is_empty")]
    pub generator_url: &'a str,
}

/// The Alertmanager v2 body for `alerts`, sent at `now`.
pub fn alertmanager_body<'a>(
    alerts: &'a [Alert],
    now: SystemTime,
    resend_interval: Duration,
    generator_url: &'a str,
) -> Vec<PostableAlert<'a>> {
    alerts
        .iter()
        .map(|a| PostableAlert {
            labels: &a.labels,
            annotations: &a.annotations,
            starts_at: rfc3339(a.starts_at),
            ends_at: rfc3339(a.ends_at.unwrap_or(now + 4 * resend_interval)),
            generator_url,
        })
        .collect()
}

/// Alertmanager's webhook message, version 4.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookMessage<'a> {
    pub version: &'static str,
    pub group_key: String,
    pub truncated_alerts: u64,
    pub status: &'static str,
    pub receiver: &'a str,
    pub group_labels: Labels,
    pub common_labels: Labels,
    pub common_annotations: BTreeMap<String, String>,
    #[serde(rename = "externalURL")]
    pub external_url: &'a str,
    pub alerts: Vec<WebhookAlert<'a>>,
}

/// One alert of a webhook message.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAlert<'a> {
    pub status: &'static str,
    pub labels: &'a Labels,
    pub annotations: &'a BTreeMap<String, String>,
    pub starts_at: String,
    pub ends_at: String,
    #[serde(rename = "generatorURL")]
    pub generator_url: &'a str,
    pub fingerprint: String,
}

/// Splits alerts into webhook groups by `alertname`, in order of first appearance.
pub fn webhook_groups(alerts: Vec<Alert>) -> Vec<Vec<Alert>> {
    let mut groups: Vec<Vec<Alert>> = Vec::new();
    for alert in alerts {
        match groups.iter_mut().find(|g| g[0].name() == alert.name()) {
            Some(group) => group.push(alert),
            None => groups.push(vec![alert]),
        }
    }
    groups
}

/// The webhook message for one group (alerts sharing `alertname`), as receiver `receiver`.
/// Grouped by `alertname` and `node`, like an Alertmanager route with
/// `group_by: [alertname, node]`.
pub fn webhook_message<'a>(
    receiver: &'a str,
    alerts: &'a [Alert],
    external_url: &'a str,
) -> WebhookMessage<'a> {
    let group_labels: Labels = ["alertname", "node"]
        .into_iter()
        .filter_map(|name| {
            let first = alerts.first()?.labels.get(name)?;
            Some((name.to_owned(), first.clone()))
        })
        .collect();
    let firing = alerts.iter().any(|a| a.status() == Status::Firing);
    WebhookMessage {
        version: "4",
        group_key: format!("{{}}:{}", label_set_string(&group_labels)),
        truncated_alerts: 0,
        status: if firing { "firing" } else { "resolved" },
        receiver,
        common_labels: common(alerts.iter().map(|a| &a.labels)),
        common_annotations: common(alerts.iter().map(|a| &a.annotations)),
        group_labels,
        external_url,
        alerts: alerts
            .iter()
            .map(|a| WebhookAlert {
                status: a.status().as_str(),
                labels: &a.labels,
                annotations: &a.annotations,
                starts_at: rfc3339(a.starts_at),
                ends_at: a.ends_at.map_or_else(|| ZERO_TIME.to_owned(), rfc3339),
                generator_url: external_url,
                fingerprint: fingerprint(&a.labels),
            })
            .collect(),
    }
}

/// The pairs every map has with the same value.
fn common<'a>(mut maps: impl Iterator<Item = &'a BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let Some(first) = maps.next() else {
        return BTreeMap::new();
    };
    let mut out = first.clone();
    for map in maps {
        out.retain(|k, v| map.get(k) == Some(v));
    }
    out
}

/// Prometheus' `LabelSet.String()`: `{a="1", b="2"}`.
fn label_set_string(labels: &Labels) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", pairs.join(", "))
}

/// Alertmanager's alert fingerprint: FNV-1a 64 over the sorted label names and values, each
/// followed by the byte 0xff, as 16 hex digits (prometheus/common `LabelSet.Fingerprint`).
/// Labels with empty values are left out, as Alertmanager drops them on receipt (an empty
/// label is an absent label), so the webhook carries the fingerprint Alertmanager would show.
pub fn fingerprint(labels: &Labels) -> String {
    const OFFSET: u64 = 14_695_981_039_346_656_037;
    const PRIME: u64 = 1_099_511_628_211;
    let mut hash = OFFSET;
    let mut add = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    for (name, value) in labels.iter().filter(|(_, v)| !v.is_empty()) {
        add(name.as_bytes());
        add(&[0xff]);
        add(value.as_bytes());
        add(&[0xff]);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn alert(name: &str, pod: &str, ends_at: Option<SystemTime>) -> Alert {
        Alert {
            labels: Labels::from([
                ("alertname".into(), name.into()),
                ("node".into(), "n1".into()),
                ("pod".into(), pod.into()),
                ("endpoint".into(), String::new()),
            ]),
            annotations: BTreeMap::from([
                ("summary".into(), format!("{pod} is down")),
                ("description".into(), "same".into()),
            ]),
            starts_at: at(1_700_000_000),
            ends_at,
        }
    }

    #[test]
    fn alertmanager_body_has_v2_fields_and_ends_at_rules() {
        let alerts = [alert("A", "p1", None), alert("A", "p2", Some(at(1_700_000_100)))];
        let now = at(1_700_000_050);
        let body =
            serde_json::to_value(alertmanager_body(&alerts, now, Duration::from_secs(60), "")).unwrap();
        assert_eq!(
            body,
            json!([
                {
                    "labels": {"alertname": "A", "endpoint": "", "node": "n1", "pod": "p1"},
                    "annotations": {"summary": "p1 is down", "description": "same"},
                    "startsAt": "2023-11-14T22:13:20.000Z",
                    "endsAt": "2023-11-14T22:18:10.000Z",
                },
                {
                    "labels": {"alertname": "A", "endpoint": "", "node": "n1", "pod": "p2"},
                    "annotations": {"summary": "p2 is down", "description": "same"},
                    "startsAt": "2023-11-14T22:13:20.000Z",
                    "endsAt": "2023-11-14T22:15:00.000Z",
                }
            ])
        );
        let with_url = serde_json::to_value(alertmanager_body(
            &alerts[..1],
            now,
            Duration::from_secs(60),
            "http://x/",
        ))
        .unwrap();
        assert_eq!(with_url[0]["generatorURL"], "http://x/");
    }

    #[test]
    fn webhook_message_is_alertmanagers_v4_body() {
        let alerts = [alert("A", "p1", None), alert("A", "p2", Some(at(1_700_000_100)))];
        let body: Value = serde_json::to_value(webhook_message("hook", &alerts, "")).unwrap();
        assert_eq!(
            body,
            json!({
                "version": "4",
                "groupKey": "{}:{alertname=\"A\", node=\"n1\"}",
                "truncatedAlerts": 0,
                "status": "firing",
                "receiver": "hook",
                "groupLabels": {"alertname": "A", "node": "n1"},
                "commonLabels": {"alertname": "A", "endpoint": "", "node": "n1"},
                "commonAnnotations": {"description": "same"},
                "externalURL": "",
                "alerts": [
                    {
                        "status": "firing",
                        "labels": {"alertname": "A", "endpoint": "", "node": "n1", "pod": "p1"},
                        "annotations": {"summary": "p1 is down", "description": "same"},
                        "startsAt": "2023-11-14T22:13:20.000Z",
                        "endsAt": "0001-01-01T00:00:00Z",
                        "generatorURL": "",
                        "fingerprint": fingerprint(&alerts[0].labels),
                    },
                    {
                        "status": "resolved",
                        "labels": {"alertname": "A", "endpoint": "", "node": "n1", "pod": "p2"},
                        "annotations": {"summary": "p2 is down", "description": "same"},
                        "startsAt": "2023-11-14T22:13:20.000Z",
                        "endsAt": "2023-11-14T22:15:00.000Z",
                        "generatorURL": "",
                        "fingerprint": fingerprint(&alerts[1].labels),
                    }
                ]
            })
        );
        let resolved = [alert("A", "p2", Some(at(1)))];
        assert_eq!(webhook_message("hook", &resolved, "").status, "resolved");
    }

    #[test]
    fn webhook_groups_split_by_alertname_in_order() {
        let groups = webhook_groups(vec![
            alert("B", "1", None),
            alert("A", "2", None),
            alert("B", "3", None),
        ]);
        let pods: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.iter().map(|a| a.labels["pod"].as_str()).collect())
            .collect();
        assert_eq!(pods, [vec!["1", "3"], vec!["2"]]);
    }

    #[test]
    fn fingerprint_matches_prometheus_and_ignores_empty_labels() {
        // FNV-1a 64 of the empty input is the offset basis.
        assert_eq!(fingerprint(&Labels::new()), "cbf29ce484222325");
        let a = Labels::from([("alertname".into(), "A".into())]);
        let mut b = a.clone();
        b.insert("endpoint".into(), String::new());
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let mut c = a.clone();
        c.insert("pod".into(), "x".into());
        assert_ne!(fingerprint(&a), fingerprint(&c));
        assert_eq!(fingerprint(&a).len(), 16);
    }
}
