//! `lifeline status`: asks a running agent for its client list and prints it.
use std::fmt::Write as _;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

use crate::{cli::Output, views::ClientView};

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
    #[error("the agent at {url} answered {status}")]
    Status { url: String, status: hyper::StatusCode },
    #[error("the agent at {url} sent JSON that is not a client list: {source}")]
    Json { url: String, source: serde_json::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub async fn fetch_clients(server: &str) -> Result<(Vec<ClientView>, String)> {
    let url = format!("{}/api/v1/clients", server.trim_end_matches('/'));
    let uri: hyper::Uri = url.parse().map_err(|_| Error::Url(server.to_owned()))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(Error::Url(server.to_owned()));
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client.get(uri).await.map_err(|source| Error::Request {
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
        return Err(Error::Status { url, status });
    }
    let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    let clients = serde_json::from_str(&text).map_err(|source| Error::Json { url, source })?;
    Ok((clients, text))
}

pub async fn run(server: &str, output: Output) -> Result<String> {
    let (clients, raw) = fetch_clients(server).await?;
    Ok(match output {
        Output::Json => raw,
        Output::Table => table(&clients),
    })
}

/// One row per connection (a client without connections gets one row of dashes).
pub fn table(clients: &[ClientView]) -> String {
    let header = [
        "PID", "COMM", "STATE", "POD", "LOCAL", "REMOTE", "ENDPOINT", "TCP", "RX_BYTES", "RX_AGE", "RETRANS",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for c in clients {
        let pod = match (&c.namespace, &c.pod) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
            _ => "-".to_owned(),
        };
        let lead = [c.pid.to_string(), c.comm.clone(), c.state.clone(), pod];
        if c.connections.is_empty() {
            rows.push(
                lead.iter()
                    .cloned()
                    .chain(std::iter::repeat_n("-".to_owned(), 7))
                    .collect(),
            );
        }
        for k in &c.connections {
            let age = k
                .last_receive_age_seconds
                .map_or("-".to_owned(), |a| format!("{a:.0}s"));
            rows.push(
                lead.iter()
                    .cloned()
                    .chain([
                        k.local.clone(),
                        k.remote.clone(),
                        k.endpoint.clone(),
                        k.tcp_state.clone(),
                        k.bytes_received.to_string(),
                        age,
                        k.retransmits.to_string(),
                    ])
                    .collect(),
            );
        }
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
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
    if clients.is_empty() {
        out.push_str("(no client holds an apiserver connection)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::ConnectionView;

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
            state_since: String::new(),
            reason: String::new(),
            connections,
            connect_failures: 0,
        };
        let text = table(&[client(7, vec![conn(40000), conn(40001)]), client(12345, vec![])]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("PID    COMM"), "{text}");
        assert!(
            lines[1].starts_with("7      ll-client  healthy") && lines[1].contains("2s"),
            "{text}"
        );
        assert!(lines[3].starts_with("12345") && lines[3].ends_with('-'), "{text}");
        assert!(table(&[]).contains("no client"));
    }
}
