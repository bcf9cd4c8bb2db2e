//! `ll-stuck`: a client with the x/net/http2 `ErrNoCachedConn` bug (seeds 000/004). It dials the
//! apiserver ONCE (TLS, ALPN h2, server and CA from the kubeconfig), lists and watches Pods on
//! that HTTP/2 connection (re-watching on it when a watch ends), and when the connection is lost
//! it never dials again: it stays alive, logging `http2: no cached connection was available` to
//! stderr every `--retry-interval`, without opening any socket.
//!
//! ```text
//! ll-stuck --kubeconfig PATH [--namespace NS(default)] [--retry-interval DUR(2s)]
//!          [--timeout-seconds N(300)]
//! ```
//!
//! DUR is as for `ll-apiserver`: `500ms`, `2s`, `1.5s`, `1m`.
//!
//! stdout: `DIALED <local> <remote>` (once), `LIST <rv> <count>`, one `EVENT <type> <name> <rv>`
//! per watch event (`-` as the name of a bookmark), `WATCH_END <rv>` when the server ends a
//! watch, `LOST` when the connection is gone. stderr: diagnostics and the endless retry lines.
use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lifeline_integration::apiserver::util::parse_duration;
use lifeline_integration::kube_client::{client_main, kube_config};
use rustls::pki_types::{CertificateDer, ServerName};
use secrecy::ExposeSecret;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const USAGE: &str =
    "usage: ll-stuck --kubeconfig PATH [--namespace NS] [--retry-interval DUR] [--timeout-seconds N]";

struct Args {
    kubeconfig: String,
    namespace: String,
    retry: Duration,
    timeout_seconds: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut kubeconfig = None;
    let mut args = Args {
        kubeconfig: String::new(),
        namespace: "default".into(),
        retry: Duration::from_secs(2),
        timeout_seconds: 300,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--kubeconfig" => kubeconfig = Some(value),
            "--namespace" => args.namespace = value,
            "--retry-interval" => args.retry = parse_duration(&value)?,
            "--timeout-seconds" => {
                args.timeout_seconds = value
                    .parse()
                    .map_err(|_| format!("bad --timeout-seconds {value:?}"))?
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    args.kubeconfig = kubeconfig.ok_or("--kubeconfig is required")?;
    Ok(args)
}

/// The one HTTP/2 connection and what requests on it need.
struct Conn {
    sender: SendRequest<Empty<Bytes>>,
    base: String,
    token: Option<String>,
}

enum WatchEnd {
    /// The server ended the watch (its timeout); the newest resourceVersion seen.
    Clean(String),
    /// The server answered 410 Expired: list again.
    Expired,
}

impl Conn {
    async fn get(&mut self, path: &str) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let mut req = Request::get(format!("{}{path}", self.base))
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                "ll-stuck/0.1 (x/net/http2 ErrNoCachedConn model)",
            );
        if let Some(token) = &self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req.body(Empty::new()).map_err(|e| e.to_string())?;
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let resp = self.sender.send_request(req).await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("GET {path}: HTTP {}", resp.status()));
        }
        Ok(resp)
    }

    async fn list(&mut self, ns: &str) -> Result<String, String> {
        let resp = self
            .get(&format!("/api/v1/namespaces/{ns}/pods?limit=500"))
            .await?;
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let list: Value = serde_json::from_slice(&body).map_err(|e| format!("decode PodList: {e}"))?;
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let count = list["items"].as_array().map_or(0, Vec::len);
        println!("LIST {rv} {count}");
        Ok(rv)
    }

    async fn watch(&mut self, ns: &str, rv: &str, timeout: u64) -> Result<WatchEnd, String> {
        let path = format!(
            "/api/v1/namespaces/{ns}/pods?allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds={timeout}&watch=true"
        );
        let mut body = self.get(&path).await?.into_body();
        let mut newest = rv.to_string();
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("watch stream: {e}"))?;
            let Ok(data) = frame.into_data() else { continue };
            buf.extend_from_slice(&data);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line = buf.split_to(nl + 1);
                let event: Value = match serde_json::from_slice(line.chunk()) {
                    Ok(v) => v,
                    Err(e) => {
                        eprintln!("ll-stuck: undecodable watch line: {e}");
                        continue;
                    }
                };
                let kind = event["type"].as_str().unwrap_or("?");
                let object = &event["object"];
                if kind == "ERROR" {
                    eprintln!("ll-stuck: watch error: {object}");
                    if object["code"] == 410 {
                        return Ok(WatchEnd::Expired);
                    }
                    continue;
                }
                let meta = &object["metadata"];
                if let Some(v) = meta["resourceVersion"].as_str() {
                    newest = v.to_string();
                }
                println!("EVENT {kind} {} {newest}", meta["name"].as_str().unwrap_or("-"));
            }
        }
        println!("WATCH_END {newest}");
        Ok(WatchEnd::Clean(newest))
    }
}

/// Dials once and serves list/watch on that connection until it breaks; returns why it broke.
async fn use_one_connection(args: &Args, config: &kube::Config) -> Result<Infallible, String> {
    let uri: &Uri = &config.cluster_url;
    let host = uri
        .host()
        .ok_or("no host in the server URL")?
        .trim_matches(|c| c == '[' || c == ']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let mut roots = rustls::RootCertStore::empty();
    for der in config.root_cert.clone().unwrap_or_default() {
        roots
            .add(CertificateDer::from(der))
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let name = config.tls_server_name.clone().unwrap_or(host.clone());
    let server_name = ServerName::try_from(name).map_err(|e| format!("server name: {e}"))?;

    // The one and only dial.
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("dial {host}:{port}: {e}"))?;
    let (local, remote) = (
        tcp.local_addr().map_err(|e| e.to_string())?,
        tcp.peer_addr().map_err(|e| e.to_string())?,
    );
    println!("DIALED {local} {remote}");
    eprintln!("ll-stuck: dialed {local} -> {remote}; this is the only dial this process makes");
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(server_name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let alpn = stream
        .get_ref()
        .1
        .alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    if alpn.as_deref() != Some("h2") {
        return Err(format!("the server did not negotiate h2 (ALPN {alpn:?})"));
    }
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(async move {
        match connection.await {
            Ok(()) => eprintln!("ll-stuck: HTTP/2 connection closed"),
            Err(e) => eprintln!("ll-stuck: HTTP/2 connection failed: {e}"),
        }
    });
    let mut conn = Conn {
        sender,
        base: format!(
            "https://{}",
            uri.authority().ok_or("no authority in the server URL")?
        ),
        token: bearer_token(&config.auth_info)?,
    };
    let mut rv = None;
    loop {
        let from = match rv.take() {
            Some(rv) => rv,
            None => conn.list(&args.namespace).await?,
        };
        match conn.watch(&args.namespace, &from, args.timeout_seconds).await? {
            WatchEnd::Clean(newest) => {
                eprintln!("ll-stuck: watch ended; watching again on the cached connection");
                rv = Some(newest);
            }
            WatchEnd::Expired => eprintln!("ll-stuck: resourceVersion expired; listing again"),
        }
    }
}

/// The kubeconfig user's bearer token: `token`, else the contents of `tokenFile` (as in a pod,
/// where the kubelet mounts the service account's token), read once, at the one dial.
fn bearer_token(user: &kube::config::AuthInfo) -> Result<Option<String>, String> {
    if let Some(token) = &user.token {
        return Ok(Some(token.expose_secret().to_string()));
    }
    match &user.token_file {
        Some(path) => std::fs::read_to_string(path)
            .map(|t| Some(t.trim().to_owned()))
            .map_err(|e| format!("tokenFile {path}: {e}")),
        None => Ok(None),
    }
}

async fn run(args: Args) -> Result<Infallible, String> {
    let config = kube_config(&args.kubeconfig).await?;
    let why = match use_one_connection(&args, &config).await {
        Ok(never) => match never {},
        Err(why) => why,
    };
    println!("LOST");
    eprintln!(
        "ll-stuck: connection lost ({why}); like x/net/http2 with ErrNoCachedConn, it is never dialed again"
    );
    let url = format!(
        "{}/api/v1/namespaces/{}/pods?limit=500&resourceVersion=0",
        config.cluster_url.to_string().trim_end_matches('/'),
        args.namespace
    );
    loop {
        eprintln!(
            "ll-stuck: failed to list *v1.Pod: Get \"{url}\": http2: no cached connection was available"
        );
        tokio::time::sleep(args.retry).await;
    }
}

fn main() -> ExitCode {
    client_main("ll-stuck", USAGE, parse_args(), run)
}
