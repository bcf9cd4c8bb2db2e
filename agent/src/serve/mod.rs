//! What the agent serves: the HTTP API (health, metrics, the JSON views of the latest
//! snapshot) and `lifeline status`, its client.
pub mod api;
pub mod status;
pub mod views;
