//! A kernel that cannot run the agent: stay up, not ready, saying why.
//!
//! When the kernel lacks what the agent needs (no BTF, no ring buffer before 5.8, a verifier
//! that rejects a program, a tracepoint missing), exiting would make the DaemonSet crash-loop:
//! the pod restarts with back-off forever and the reason scrolls out of its log. So the agent
//! says it once in its log, keeps serving `/healthz` (alive: restarting cannot help) and
//! `/readyz` (not ready, with the reason), and `/metrics`, until it is stopped.
use std::{
    net::SocketAddr,
    sync::{atomic::AtomicBool, Arc},
};

use tokio::signal::unix::{signal, SignalKind};

use crate::{
    act::metrics::Metrics,
    app::run::{Error, Result, GRACE},
    cluster::Cluster,
    health::snapshot::{Latest, Snapshot},
    host::privileges::Blindness,
    serve::api::{self, Access, ApiState},
};

/// What the API serves while the kernel cannot run the agent.
pub struct Unsupported {
    pub listen: SocketAddr,
    pub access: Access,
    pub fd_limit: u64,
    pub metrics: Arc<Metrics>,
    pub blindness: Arc<Blindness>,
    pub cluster: Option<Cluster>,
}

impl Unsupported {
    /// Logs `why` once, then serves the API, never ready, until SIGTERM or SIGINT.
    pub async fn serve(self, why: &Error) -> Result<()> {
        let reason = crate::error::chain(why);
        tracing::error!(
            "this kernel cannot run the agent: {reason}; staying up and not ready (/readyz says \
             why; `lifeline check` lists what is missing)"
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = state(reason, self.metrics, self.blindness, self.cluster.clone());
        let server = tokio::spawn(
            api::serve(
                self.listen,
                api::router(state, self.access),
                api::Limits::for_fd_limit(self.fd_limit),
                async move {
                    let _ = stop_rx.await;
                },
            )
            .await?,
        );
        let mut term = signal(SignalKind::terminate()).map_err(|e| Error::Signal("SIGTERM", e))?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::Signal("SIGINT", e))?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(GRACE, server).await;
        if let Some(c) = &self.cluster {
            c.shutdown(GRACE).await;
        }
        Ok(())
    }
}

/// The API's state for an agent that will never be ready: nothing to list, the reason kept.
fn state(
    reason: String,
    metrics: Arc<Metrics>,
    blindness: Arc<Blindness>,
    cluster: Option<Cluster>,
) -> ApiState {
    ApiState {
        latest: Latest::new(Snapshot::empty()),
        ready: Arc::new(AtomicBool::new(false)),
        blindness,
        unsupported: Some(reason.into()),
        metrics,
        cluster,
    }
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use tower_service::Service as _;

    use super::*;

    /// GET `path` from the router over `state`: status and body.
    async fn get(state: ApiState, path: &str) -> (u16, String) {
        let response = api::router(state, Access::loopback_only())
            .call(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_kernel_that_cannot_run_the_agent_leaves_it_alive_and_not_ready_saying_why() {
        let why = Error::Offsets(crate::kernel::offsets::Error::BtfRead {
            path: "/sys/kernel/btf/vmlinux".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
        let metrics = Arc::new(Metrics::new("test", "test").unwrap());
        let blindness = Arc::new(Blindness::new().unwrap());
        let state = state(crate::error::chain(&why), metrics, blindness, None);

        let (status, body) = get(state.clone(), "/readyz").await;
        assert_eq!(status, 503, "{body}");
        assert!(
            body.starts_with("not ready: this kernel cannot run the agent: ")
                && body.contains("/sys/kernel/btf/vmlinux"),
            "{body}"
        );
        // Not the reason of an agent merely starting: this one will not become ready.
        assert!(!body.contains("starting"), "{body}");
        assert_eq!(get(state.clone(), "/healthz").await, (200, "ok\n".into()));
        let (status, _) = get(state, "/metrics").await;
        assert_eq!(status, 200);
    }
}
