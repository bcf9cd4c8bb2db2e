//! What the agent serves: the HTTP API (health, metrics, the JSON views of the latest
//! snapshot), `lifeline status`, its client, and `kubectl lifeline`, every node's unhealthy
//! clients through the Kubernetes API.
pub mod api;
pub mod exposition;
pub mod plugin;
pub mod status;
pub mod views;
