//! Pod restarts through the Kubernetes Eviction API, behind a trait so the policy and the
//! actions are tested without a cluster. The Kubernetes module implements [`Evictor`]; until it
//! exists, and on hosts without a cluster, [`NoCluster`] fails every eviction.
use std::future::Future;

use super::Error;

/// What the apiserver answered to an eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictOutcome {
    /// The eviction was accepted (201); the pod terminates with its grace period.
    Evicted,
    /// Refused for now (429 Too Many Requests: a PodDisruptionBudget allows no disruption, or
    /// the apiserver throttles): the reason as the apiserver gave it. Retried later.
    Blocked { reason: String },
    /// No such pod (404): it is gone already.
    NotFound,
}

/// Evicts pods (`POST /api/v1/namespaces/{namespace}/pods/{name}/eviction`).
pub trait Evictor: Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Asks the apiserver to evict the pod. Errors are for everything but the three answers
    /// of [`EvictOutcome`] (network, TLS, authorization, 5xx).
    fn evict(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<EvictOutcome, Self::Error>> + Send;
}

/// No Kubernetes API: every eviction fails with [`Error::NoCluster`] (the caller names the pod).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCluster;

impl Evictor for NoCluster {
    type Error = Error;

    async fn evict(&self, _namespace: &str, _name: &str) -> Result<EvictOutcome, Error> {
        Err(Error::NoCluster)
    }
}
