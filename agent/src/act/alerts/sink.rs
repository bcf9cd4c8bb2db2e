//! Test support: a local HTTP or HTTPS sink (axum on hyper) that records every request body
//! and `Authorization` header and answers a settable status, or never answers.
use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU16, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode, Uri},
    Router,
};
use serde_json::Value;

/// One request the sink got.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub body: Value,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// What the sink answered.
    pub status: u16,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    status: AtomicU16,
    hang: AtomicBool,
}

pub struct Sink {
    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT`
    pub url: String,
    /// HTTPS only: the PEM file of the CA that signed the sink's certificate.
    pub ca_file: Option<PathBuf>,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn record(State(shared): State<Arc<Shared>>, uri: Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
    if shared.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let status = shared.status.load(Ordering::SeqCst);
    shared.received.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        authorization: headers
            .get("authorization")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        status,
    });
    StatusCode::from_u16(status).unwrap()
}

/// A local address nobody listens on (for a receiver that is down).
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

impl Sink {
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_on(addr: SocketAddr) -> Self {
        let shared = Arc::new(Shared {
            status: AtomicU16::new(200),
            ..Default::default()
        });
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(record).with_state(shared.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url: format!("http://{addr}"),
            ca_file: None,
            shared,
            server,
        }
    }

    /// A sink serving HTTPS on `localhost` with a certificate from a fresh CA, whose PEM is
    /// written to `dir/ca.pem`.
    pub async fn start_tls(dir: &std::path::Path) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
                )
                .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

        let shared = Arc::new(Shared {
            status: AtomicU16::new(200),
            ..Default::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = Router::new().fallback(record).with_state(shared.clone());
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing to serve.
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        let mut app = app.clone();
                        async move { tower_service::Service::call(&mut app, request).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            url: format!("https://localhost:{port}"),
            ca_file: Some(ca_file),
            shared,
            server,
        }
    }

    pub fn respond_with(&self, status: u16) {
        self.shared.status.store(status, Ordering::SeqCst);
    }

    /// Never answer (the connection stays open).
    pub fn hang(&self) {
        self.shared.hang.store(true, Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Requests answered 2xx.
    pub fn accepted(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| (200..300).contains(&r.status))
            .collect()
    }

    /// Waits until `n` requests were accepted; panics after `within`.
    pub async fn wait_accepted(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let got = self.accepted();
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sink got {} of {n} requests within {within:?}: {got:#?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
