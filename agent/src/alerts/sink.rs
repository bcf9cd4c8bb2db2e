//! Test support: a local HTTP sink (axum on hyper) that records every request body and
//! answers a settable status, or never answers.
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU16, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use axum::{body::Bytes, extract::State, http::StatusCode, http::Uri, Router};
use serde_json::Value;

/// One request the sink got.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub body: Value,
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
    /// `http://127.0.0.1:PORT`
    pub url: String,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn record(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> StatusCode {
    if shared.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let status = shared.status.load(Ordering::SeqCst);
    shared.received.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
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
