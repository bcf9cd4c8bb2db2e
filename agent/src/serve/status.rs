//! `lifeline status`: asks a running agent for its client list and prints it. Every field
//! is shown with its control characters escaped: process names and command lines are chosen
//! by whoever starts a process, and must not drive the operator's terminal.
use std::{fmt::Write as _, path::Path};

use chrono::{DateTime, Utc};
use http_body_util::{BodyExt, Empty};
use hyper::{body::Bytes, header::AUTHORIZATION, Request};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

use crate::{host::redact::escape_controls, serve::views::ClientView};

/// How `lifeline status` prints (`-o`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Output {
    Table,
    /// The table, then every client's streams: what each process watches and requests.
    Wide,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--server {0:?} is not an http:// URL")]
    Url(String),
    #[error("cannot reach the agent at {url}: {source}")]
    Request {
        url: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("reading the answer from {url}: {source}")]
    Body { url: String, source: hyper::Error },
    #[error("the agent at {url} answered {status}: {body}")]
    Status {
        url: String,
        status: hyper::StatusCode,
        body: String,
    },
    #[error("--token-file {path}: {source}")]
    TokenFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the agent at {url} sent JSON that is not a client list: {source}")]
    Json { url: String, source: serde_json::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The client list of the agent at `server`, with the bearer token of `token_file` if given.
pub async fn fetch_clients(server: &str, token_file: Option<&Path>) -> Result<(Vec<ClientView>, String)> {
    let url = format!("{}/api/v1/clients", server.trim_end_matches('/'));
    let uri: hyper::Uri = url.parse().map_err(|_| Error::Url(server.to_owned()))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(Error::Url(server.to_owned()));
    }
    let mut request = Request::get(uri);
    if let Some(path) = token_file {
        let token = std::fs::read_to_string(path).map_err(|source| Error::TokenFile {
            path: path.into(),
            source,
        })?;
        request = request.header(AUTHORIZATION, format!("Bearer {}", token.trim()));
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|_| Error::Url(server.to_owned()))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client.request(request).await.map_err(|source| Error::Request {
        url: url.clone(),
        source,
    })?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|source| Error::Body {
            url: url.clone(),
            source,
        })?;
    if !status.is_success() {
        let bytes = body.to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        let body = escape_controls(text.trim()).chars().take(512).collect();
        return Err(Error::Status { url, status, body });
    }
    let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    let clients = serde_json::from_str(&text).map_err(|source| Error::Json { url, source })?;
    Ok((clients, text))
}

pub async fn run(server: &str, token_file: Option<&Path>, output: Output) -> Result<String> {
    let (clients, raw) = fetch_clients(server, token_file).await?;
    Ok(match output {
        Output::Json => raw,
        Output::Table => table(&clients, Utc::now()),
        Output::Wide => {
            let now = Utc::now();
            format!("{}\n{}", table(&clients, now), streams_table(&clients, now))
        }
    })
}

/// What each client asks of the apiserver, one row per open stream (watches first), for
/// clients whose streams are read; one row saying why for the others.
pub fn streams_table(clients: &[ClientView], now: DateTime<Utc>) -> String {
    let header = [
        "PID",
        "COMM",
        "STREAM",
        "REQUEST",
        "STATE",
        "OPEN",
        "LAST_FRAME",
        "DEADLINE",
    ];
    let shown = |text: &str| escape_controls(text).into_owned();
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for c in clients {
        let lead = [c.pid.to_string(), shown(&c.comm)];
        if c.visibility != "streams" {
            let why = format!("(connection level: {})", c.visibility_reason);
            rows.push(
                lead.iter()
                    .cloned()
                    .chain(["-".into(), shown(&why)])
                    .chain(std::iter::repeat_n("-".to_owned(), 4))
                    .collect(),
            );
            continue;
        }
        if c.streams.is_empty() {
            rows.push(
                lead.iter()
                    .cloned()
                    .chain(["-".into(), "(no open stream seen yet)".into()])
                    .chain(std::iter::repeat_n("-".to_owned(), 4))
                    .collect(),
            );
        }
        for s in &c.streams {
            let request = match (&s.kind, &s.resource) {
                (Some(kind), Some(resource)) if !resource.is_empty() => match &s.namespace {
                    Some(ns) => format!("{kind} {resource} in {ns}"),
                    None if kind == "watch" || kind == "list" => {
                        format!("{kind} {resource} (all namespaces)")
                    }
                    None => format!("{kind} {resource}"),
                },
                (Some(kind), _) => format!("{kind} {}", s.path.as_deref().unwrap_or("-")),
                _ => "(opened before lifeline followed it)".to_owned(),
            };
            let state = if s.stuck {
                "stuck"
            } else if !s.judged {
                "not judged"
            } else if s.response_headers {
                "open"
            } else {
                "waiting"
            };
            rows.push(
                lead.iter()
                    .cloned()
                    .chain([
                        s.id.to_string(),
                        shown(&request),
                        state.to_owned(),
                        age(&s.started, now),
                        format!("{:.0}s", s.last_frame_age_seconds),
                        s.deadline.as_deref().map_or("-".to_owned(), |d| until(d, now)),
                    ])
                    .collect(),
            );
        }
    }
    aligned(&rows)
}

/// How long until `at` (RFC 3339): `in 4m`, or `4m ago` once past.
fn until(at: &str, now: DateTime<Utc>) -> String {
    let Ok(at) = DateTime::parse_from_rfc3339(at) else {
        return "-".to_owned();
    };
    let secs = (at.with_timezone(&Utc) - now).num_seconds();
    let span = |s: i64| match s {
        s if s < 120 => format!("{s}s"),
        s if s < 120 * 60 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    };
    if secs >= 0 {
        format!("in {}", span(secs))
    } else {
        format!("{} ago", span(-secs))
    }
}

/// Rows as columns padded to their widest cell.
fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// How long ago `since` (RFC 3339) was, like kubectl's AGE: `42s`, `5m`, `3h`, `2d`.
fn age(since: &str, now: DateTime<Utc>) -> String {
    let Ok(since) = DateTime::parse_from_rfc3339(since) else {
        return "-".to_owned();
    };
    let secs = (now - since.with_timezone(&Utc)).num_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 120 * 60 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// One row per connection (a client without connections gets one row of dashes); the state's
/// SINCE and REASON close each row.
pub fn table(clients: &[ClientView], now: DateTime<Utc>) -> String {
    let header = [
        "PID", "COMM", "STATE", "SINCE", "POD", "LOCAL", "REMOTE", "ENDPOINT", "TCP", "RX_BYTES", "RX_AGE",
        "RETRANS", "REASON",
    ];
    let shown = |text: &str| escape_controls(text).into_owned();
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for c in clients {
        let pod = match (&c.namespace, &c.pod) {
            (Some(ns), Some(pod)) => shown(&format!("{ns}/{pod}")),
            _ => "-".to_owned(),
        };
        let lead = [
            c.pid.to_string(),
            shown(&c.comm),
            shown(&c.state),
            age(&c.state_since, now),
            pod,
        ];
        let mut reason = if c.reason.is_empty() {
            "-".to_owned()
        } else {
            shown(&c.reason)
        };
        if let (Some(since), Some(why)) = (&c.evidence_incomplete_since, &c.evidence_reason) {
            reason = format!(
                "{reason} (evidence incomplete for {}: {})",
                age(since, now),
                shown(why)
            );
        }
        let connections: Vec<[String; 7]> = if c.connections.is_empty() {
            vec![std::array::from_fn(|_| "-".to_owned())]
        } else {
            c.connections
                .iter()
                .map(|k| {
                    [
                        shown(&k.local),
                        shown(&k.remote),
                        shown(&k.endpoint),
                        shown(&k.tcp_state),
                        k.bytes_received.to_string(),
                        k.last_receive_age_seconds
                            .map_or("-".to_owned(), |a| format!("{a:.0}s")),
                        k.retransmits.to_string(),
                    ]
                })
                .collect()
        };
        for connection in connections {
            rows.push(
                lead.iter()
                    .cloned()
                    .chain(connection)
                    .chain([reason.clone()])
                    .collect(),
            );
        }
    }
    let mut out = aligned(&rows);
    if clients.is_empty() {
        out.push_str("(no client holds an apiserver connection)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::views::ConnectionView;

    #[test]
    fn ages_read_like_kubectl() {
        let now = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        for (since, want) in [
            ("2026-01-02T03:04:05Z", "0s"),
            ("2026-01-02T03:03:00Z", "65s"),
            ("2026-01-02T02:54:05Z", "10m"),
            ("2026-01-01T03:04:05Z", "24h"),
            ("2025-12-20T03:04:05Z", "13d"),
            ("2026-01-02T04:00:00+01:00", "4m"),
            ("2026-01-02T03:05:00Z", "0s"),
            ("", "-"),
        ] {
            assert_eq!(age(since, now), want, "{since}");
        }
    }

    #[test]
    fn table_has_a_row_per_connection_and_aligned_columns() {
        let conn = |port: u16| ConnectionView {
            local: format!("127.0.0.1:{port}"),
            remote: "127.0.0.1:6443".into(),
            endpoint: "127.0.0.1:6443".into(),
            tcp_state: "ESTABLISHED".into(),
            established_at: None,
            last_receive_age_seconds: Some(2.4),
            bytes_received: 1000,
            retransmits: 0,
            evidence_gap: None,
        };
        let client = |pid: u32, connections| ClientView {
            pid,
            comm: "ll-client".into(),
            cmdline: String::new(),
            netns: None,
            cgroup: "/".into(),
            container_id: None,
            namespace: None,
            pod: None,
            container: None,
            state: "healthy".into(),
            state_since: "2026-01-02T03:03:00Z".into(),
            reason: "receiving from the apiserver".into(),
            connections,
            connect_failures: 0,
            visibility: "connection".into(),
            visibility_reason: String::new(),
            streams_judged: false,
            streams: Vec::new(),
            evidence: "complete".into(),
            evidence_incomplete_since: None,
            evidence_reason: None,
        };
        let now = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        let text = table(
            &[client(7, vec![conn(40000), conn(40001)]), client(12345, vec![])],
            now,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("PID    COMM       STATE    SINCE"), "{text}");
        assert!(lines[0].ends_with("REASON"), "{text}");
        assert!(
            lines[1].starts_with("7      ll-client  healthy  65s") && lines[1].contains("2s"),
            "{text}"
        );
        assert!(lines[1].ends_with("receiving from the apiserver"), "{text}");
        assert!(
            lines[3].starts_with("12345") && lines[3].ends_with("receiving from the apiserver"),
            "{text}"
        );
        assert!(table(&[], now).contains("no client"));
    }

    #[test]
    fn hostile_names_cannot_add_lines_or_drive_the_terminal() {
        let mut c: ClientView = serde_json::from_value(serde_json::json!({
            "pid": 9, "comm": "a\nERROR forged", "cmdline": "", "netns": null, "cgroup": "/",
            "container_id": null, "namespace": "ns\u{1b}[2J", "pod": "p", "container": null,
            "state": "stale", "state_since": "", "reason": "r\r\u{1b}]0;title\u{7}",
            "connections": [], "connect_failures": 0
        }))
        .unwrap();
        c.comm.push('\u{9b}');
        let text = table(&[c], Utc::now());
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.chars().any(|ch| ch.is_control() && ch != '\n'), "{text:?}");
        assert!(text.contains("a\\nERROR forged"), "{text}");
    }
}
