//! Actions on each tick's snapshot: alerts (policy and delivery), remediation (reset a socket,
//! restart a pod or process, within budgets), and the Prometheus metrics.
pub mod alerts;
pub mod metrics;
pub mod remediate;
