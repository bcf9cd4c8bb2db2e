//! The agent's HTTP surface (SPEC.md): `/healthz`, `/readyz`, `/metrics` for anyone who
//! reaches `--listen`, and the client API (`/api/v1/clients`, `/api/v1/endpoints`), which shows
//! command lines, only to loopback peers or to requests bearing the `--api-token-file` token.
//!
//! The server is bounded, whoever connects: at most [`Limits::max_connections`] at once, and
//! [`Limits::max_per_peer`] from one address (more are closed as they arrive, so one peer
//! cannot take every slot), a request head must arrive within [`Limits::header_timeout`]
//! (which also closes idle keep-alive connections), a connection lives at most
//! [`Limits::max_lifetime`], and a request head is at most [`MAX_HEAD`] bytes. Answers are
//! bounded by the data: command lines are cut at the source (`process::MAX_CMDLINE`).
use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::{ConnectInfo, Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use subtle::ConstantTimeEq;
use tokio::sync::{watch, Semaphore};
use tower_service::Service;

use crate::{health::snapshot::Latest, host::privileges::Blindness, serve::views};

/// The longest request head (request line and headers) the server reads.
pub const MAX_HEAD: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("--api-token-file {path}: {source}")]
    TokenFile { path: PathBuf, source: std::io::Error },
    #[error("--api-token-file {path} is empty")]
    EmptyToken { path: PathBuf },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Bounds of the HTTP server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; more are closed at once.
    pub max_connections: usize,
    /// Connections open at once from one IP address.
    pub max_per_peer: usize,
    /// Time to receive a whole request head, counted from the moment the server waits for
    /// one: a slow sender (slowloris) and an idle keep-alive connection are closed after it.
    pub header_timeout: Duration,
    /// A connection is closed (gracefully, after the request in flight) after this long.
    pub max_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_per_peer: 32,
            header_timeout: Duration::from_secs(10),
            max_lifetime: Duration::from_secs(300),
        }
    }
}

impl Limits {
    /// The defaults, with at most a quarter of the descriptors the process may open spent on
    /// HTTP connections (so that a flood of connections cannot starve `/proc` and sock_diag).
    pub fn for_fd_limit(fd_limit: u64) -> Self {
        let quarter = usize::try_from(fd_limit / 4).unwrap_or(usize::MAX);
        let d = Self::default();
        let max_connections = d.max_connections.min(quarter).max(8);
        Self {
            max_connections,
            max_per_peer: d.max_per_peer.min(max_connections / 4).max(2),
            ..d
        }
    }
}

/// Who may read the client API besides loopback peers.
#[derive(Clone, Default)]
pub struct Access {
    token: Option<Arc<[u8]>>,
}

impl Access {
    /// Loopback peers only.
    pub fn loopback_only() -> Self {
        Self::default()
    }

    /// Loopback peers, and requests bearing the token in `path` (surrounding whitespace
    /// trimmed).
    pub fn with_token_file(path: &Path) -> Result<Self> {
        let text = std::fs::read(path).map_err(|source| Error::TokenFile {
            path: path.into(),
            source,
        })?;
        let token = text.trim_ascii();
        if token.is_empty() {
            return Err(Error::EmptyToken { path: path.into() });
        }
        Ok(Self {
            token: Some(token.into()),
        })
    }

    /// Whether a request from `peer` with these headers may read the client API.
    fn allows(&self, peer: Option<SocketAddr>, authorization: Option<&[u8]>) -> Verdict {
        if peer.is_some_and(|p| crate::endpoint::canonical_ip(p.ip()).is_loopback()) {
            return Verdict::Allowed;
        }
        let Some(token) = &self.token else {
            return Verdict::LoopbackOnly;
        };
        let offered = authorization
            .and_then(|h| h.strip_prefix(b"Bearer "))
            .map(<[u8]>::trim_ascii);
        match offered {
            Some(offered) if bool::from(offered.ct_eq(token)) => Verdict::Allowed,
            _ => Verdict::NeedsToken,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    LoopbackOnly,
    NeedsToken,
}

/// What the handlers read.
#[derive(Clone)]
pub struct ApiState {
    /// The latest tick's snapshot.
    pub latest: Latest,
    /// Set once the probes are attached and the first scan is done.
    pub ready: Arc<AtomicBool>,
    /// What the agent cannot see (a missing privilege): `/readyz` fails while there is any.
    pub blindness: Arc<Blindness>,
    /// Why this kernel cannot run the agent (its programs or offsets failed to load), if so:
    /// the agent then stays up, never ready, saying why here (see `run::unsupported`).
    pub unsupported: Option<Arc<str>>,
    pub metrics: Arc<crate::act::metrics::Metrics>,
    /// The Kubernetes side, when there is one: pod names and the API versions in use.
    pub cluster: Option<crate::cluster::Cluster>,
}

pub fn router(state: ApiState, access: Access) -> Router {
    let api = Router::new()
        .route("/api/v1/clients", get(clients))
        .route("/api/v1/endpoints", get(endpoints))
        .route_layer(middleware::from_fn_with_state(access, guard));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(api)
        .with_state(state)
}

/// The client API's gate: loopback peers, or the bearer token.
async fn guard(State(access): State<Access>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(axum::http::HeaderValue::as_bytes);
    match access.allows(peer, authorization) {
        Verdict::Allowed => next.run(request).await,
        Verdict::LoopbackOnly => (
            StatusCode::FORBIDDEN,
            "the client API answers loopback peers only (the agent was started without \
             --api-token-file)\n",
        )
            .into_response(),
        Verdict::NeedsToken => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"lifeline\"")],
            "the client API needs the bearer token of --api-token-file\n",
        )
            .into_response(),
    }
}

/// Binds first (so a bad address fails start-up), then serves until `shutdown` completes;
/// open connections then get [`crate::app::run::GRACE`]-like time from the caller to finish.
pub async fn serve(
    addr: SocketAddr,
    app: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = ()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let addr = listener.local_addr().unwrap_or(addr);
    tracing::info!(%addr, max_connections = limits.max_connections, "serving the HTTP API");
    Ok(accept_loop(listener, app, limits, shutdown))
}

/// Connections open per peer address.
#[derive(Default)]
struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

/// One connection's place in [`PeerCounts`], given back on drop.
struct PeerSlot {
    counts: Arc<PeerCounts>,
    ip: IpAddr,
}

impl PeerSlot {
    fn take(counts: &Arc<PeerCounts>, ip: IpAddr, max: usize) -> Option<Self> {
        let mut map = counts.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Self {
            counts: counts.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self
            .counts
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Refused connections are logged at most this often.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(PeerCounts::default());
    let (closing, closing_rx) = watch::channel(false);
    let refused = AtomicU64::new(0);
    let mut last_refusal_log: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                // Out of descriptors or memory: give the process a moment, never spin.
                if last_refusal_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL) {
                    tracing::warn!("HTTP accept failed: {err}");
                    last_refusal_log = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer_slot = PeerSlot::take(&peers, peer.ip(), limits.max_per_peer);
        let slot = slots.clone().try_acquire_owned().ok();
        let (Some(peer_slot), Some(slot)) = (peer_slot, slot) else {
            drop(stream);
            let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
            if last_refusal_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    max_per_peer = limits.max_per_peer,
                    %peer,
                    refused_so_far = n,
                    "HTTP connection limit reached: closing new connections"
                );
                last_refusal_log = Some(Instant::now());
            }
            continue;
        };
        let app = app.clone();
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    let mut app = app.clone();
                    async move { Ok::<_, Infallible>(app.call(request).await.unwrap_or_else(|e| match e {})) }
                });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let deadline = tokio::time::sleep(limits.max_lifetime);
            tokio::pin!(deadline);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = &mut deadline => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), connection.as_mut()).await;
                }
                _ = async { closing.wait_for(|c| *c).await.map(|_| ()) } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.as_mut().await;
                }
            }
            drop((slot, peer_slot));
        });
    }
    // Stop accepting; let open connections finish what they serve.
    drop(listener);
    let _ = closing.send(true);
    let _ = slots.acquire_many(limits.max_connections as u32).await;
}

async fn readyz(State(state): State<ApiState>) -> impl IntoResponse {
    let mut not_ready = Vec::new();
    if let Some(why) = &state.unsupported {
        not_ready.push(format!("this kernel cannot run the agent: {why}"));
    } else if !state.ready.load(Ordering::Acquire) {
        not_ready.push("starting: probes not attached or first scan not done".to_owned());
    }
    for (what, reason) in state.blindness.reasons() {
        not_ready.push(format!("blind ({}): {reason}", what.label()));
    }
    if not_ready.is_empty() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        let body: String = not_ready
            .iter()
            .map(|line| format!("not ready: {line}\n"))
            .collect();
        (StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

async fn clients(State(state): State<ApiState>) -> Json<Vec<views::ClientView>> {
    Json(views::clients(&state.latest.get()))
}

async fn endpoints(State(state): State<ApiState>) -> Json<views::EndpointsView> {
    let snap = state.latest.get();
    Json(views::EndpointsView {
        endpoints: views::endpoints(&snap.endpoint_set, &snap),
        api_versions: state
            .cluster
            .as_ref()
            .and_then(crate::cluster::Cluster::api_versions),
    })
}

async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    match (state.metrics.render(), state.blindness.render()) {
        (Ok(body), Ok(blind)) => (
            StatusCode::OK,
            [("content-type", "text/plain; version=0.0.4")],
            body + &blind,
        ),
        (Err(err), _) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            err.to_string(),
        ),
        (_, Err(err)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            err.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests;
