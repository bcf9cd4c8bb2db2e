//! Remediation (SPEC.md "Remediation"): reset a stale or blackholed client's apiserver sockets
//! so it re-dials, restart a client that does not recover (a pod through the Eviction API, a
//! host process by signal), behind the guards: opt-in, dry run, cooldown per client, budget per
//! node per hour, escalation reset → restart, no restarts during an apiserver outage.
//!
//! - [`policy`]: which action each client gets ([`policy::Remediator::plan`]), pure, fed `now`.
//! - [`act`]: the actions for real ([`Actuator`]): sock_diag `SOCK_DESTROY`, pidfd signals,
//!   evictions through an [`evict::Evictor`] (`app::workers::ClusterEvictor` implements it over
//!   the cluster, falling back to [`NoCluster`] without one).
//! - [`runner`]: [`Remediation`], the two joined for the run loop:
//!
//! ```text
//! // start-up, inside the runtime (app/run.rs):
//! let remediation = remediate::Remediation::start(
//!     settings.file.remediation.settings(args.dry_run), // config::Remediation::settings
//!     remediate::Actuator::new(ClusterEvictor(cluster.clone())),
//!     &metrics,
//! );
//! // each tick, from the judge's snapshot (app/workers.rs, SampleLoop::act), with the agent's
//! // own apiserver check (None: unknown, or no cluster):
//! let apiserver_reachable = cluster.as_ref().and_then(Cluster::apiserver_reachable);
//! let outcomes = remediation.tick(&snapshot, apiserver_reachable,
//!                                 |client| remediate::Workload { pod, opted_in });
//! // config reload (app/run.rs, Reload::apply):
//! remediation.reconfigure(new.file.remediation.settings(dry_run));
//! // shutdown (app/run.rs):
//! remediation.shutdown(GRACE).await;
//! ```
//!
//! Every decision (skips and dry runs included) gives one log line, one increment of
//! `lifeline_remediations_total{action,result}`, and one [`model::Outcome`] returned by
//! [`Remediation::tick`] for the caller's Kubernetes Events.

pub mod act;
pub mod evict;
pub mod model;
pub mod policy;
pub mod runner;

use std::{io, net::SocketAddr, path::PathBuf, time::Duration};

pub use act::Actuator;
pub use evict::{EvictOutcome, Evictor, NoCluster};
pub use policy::{RemediationMode, Settings};
pub use runner::{Remediation, Workload};

use crate::host::sock_diag;
use model::PodRef;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no network namespace with inode {netns} is left")]
    NoNetns { netns: u64 },
    #[error("opening sock_diag in network namespace {netns} ({path})", path = .path.display())]
    Diag {
        netns: u64,
        path: PathBuf,
        source: Box<sock_diag::Error>,
    },
    #[error("destroying socket {local} -> {remote} in network namespace {netns}")]
    Destroy {
        netns: u64,
        local: SocketAddr,
        remote: SocketAddr,
        source: Box<sock_diag::Error>,
    },
    #[error("pidfd_open of pid {pid}")]
    Pidfd { pid: u32, source: io::Error },
    #[error("sending {signal} to pid {pid}")]
    Signal {
        pid: u32,
        signal: String,
        source: io::Error,
    },
    #[error("no Kubernetes API configured")]
    NoCluster,
    #[error("evicting pod {pod}")]
    Evict {
        pod: PodRef,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("evicting pod {pod}: no answer within {timeout:?}")]
    EvictTimeout { pod: PodRef, timeout: Duration },
    #[error("the {action} action panicked")]
    Panicked { action: &'static str },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
