//! The agent's HTTP surface (SPEC.md): `/healthz`, `/readyz`, `/api/v1/clients`,
//! `/api/v1/endpoints`, and `/metrics`.
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Json, Router};

use crate::{snapshot::Latest, views};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server on {addr} failed: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the handlers read.
#[derive(Clone)]
pub struct ApiState {
    /// The latest tick's snapshot.
    pub latest: Latest,
    /// Set once the probes are attached and the first scan is done.
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The Kubernetes side, when there is one: pod names and the API versions in use.
    pub cluster: Option<crate::cluster::Cluster>,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/clients", get(clients))
        .route("/api/v1/endpoints", get(endpoints))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Binds first (so a bad address fails start-up), then serves until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = Result<()>>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let addr = listener.local_addr().unwrap_or(addr);
    tracing::info!(%addr, "serving the HTTP API");
    Ok(async move {
        axum::serve(listener, router(state))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|source| Error::Serve { addr, source })
    })
}

async fn readyz(State(state): State<ApiState>) -> impl IntoResponse {
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: probes not attached or first scan not done\n",
        )
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
    match state.metrics.render() {
        Ok(body) => (
            StatusCode::OK,
            [("content-type", "text/plain; version=0.0.4")],
            body,
        ),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            err.to_string(),
        ),
    }
}
