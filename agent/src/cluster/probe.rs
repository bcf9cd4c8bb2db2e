//! Can the agent itself reach the apiserver? For the remediation guards: no restarts while
//! the apiserver is out.
//!
//! A probe (`GET /readyz`, every [`PROBE_EVERY`], [`PROBE_TIMEOUT`] each) succeeds when the
//! apiserver answers anything but a 5xx: a 4xx (no permission for `/readyz`, or a server
//! without it) still proves it is there, while a 5xx is an apiserver that is not ready, or a
//! proxy in front of it that cannot reach one. No answer in time, refused, reset: a failure.
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kube::Client;

pub const PROBE_EVERY: Duration = Duration::from_secs(5);
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// A verdict older than this is no verdict (the probe itself is stuck or was stopped).
pub const STALE_AFTER: Duration = Duration::from_secs(20);

/// How one probe ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// An HTTP answer with this status code.
    Answered(u16),
    /// No answer: timeout, connection refused or reset, TLS failure.
    NoAnswer,
}

impl ProbeResult {
    pub fn reachable(self) -> bool {
        matches!(self, ProbeResult::Answered(code) if code < 500)
    }
}

/// The latest verdict.
#[derive(Debug, Default)]
pub struct Reachability {
    last: Option<(Instant, bool)>,
}

impl Reachability {
    /// Records a probe that ended at `now`; returns `Some(new verdict)` when it changed.
    pub fn record(&mut self, now: Instant, result: ProbeResult) -> Option<bool> {
        let ok = result.reachable();
        let changed = self.last.is_none_or(|(_, prev)| prev != ok);
        self.last = Some((now, ok));
        changed.then_some(ok)
    }

    /// `None` before the first probe ended or when the last one is older than [`STALE_AFTER`].
    pub fn get(&self, now: Instant) -> Option<bool> {
        self.last
            .filter(|(at, _)| now.saturating_duration_since(*at) <= STALE_AFTER)
            .map(|(_, ok)| ok)
    }
}

// ---------------------------------------------------------------------------------------------
// The task

/// `GET /readyz` every [`PROBE_EVERY`].
pub(super) async fn probe_loop(client: Client, reach: Arc<Mutex<Reachability>>, server: String) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("a valid request");
        let (result, detail) = match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request)).await {
            Ok(Ok(_)) => (ProbeResult::Answered(200), "ok".to_owned()),
            Ok(Err(kube::Error::Api(status))) => (
                ProbeResult::Answered(status.code),
                format!("{} {}", status.code, status.message.lines().next().unwrap_or("")),
            ),
            Ok(Err(err)) => (ProbeResult::NoAnswer, crate::error::chain(&err)),
            Err(_) => (
                ProbeResult::NoAnswer,
                format!("no answer within {:?}", PROBE_TIMEOUT),
            ),
        };
        let changed = reach
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(Instant::now(), result);
        match changed {
            Some(true) => tracing::info!("apiserver {server} reachable (GET /readyz: {detail})"),
            Some(false) => tracing::warn!("apiserver {server} unreachable (GET /readyz: {detail})"),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        assert!(ProbeResult::Answered(200).reachable());
        assert!(ProbeResult::Answered(403).reachable());
        assert!(ProbeResult::Answered(404).reachable());
        assert!(!ProbeResult::Answered(500).reachable());
        assert!(!ProbeResult::Answered(503).reachable());
        assert!(!ProbeResult::NoAnswer.reachable());
    }

    #[test]
    fn latest_fresh_verdict_wins() {
        let t0 = Instant::now();
        let mut r = Reachability::default();
        assert_eq!(r.get(t0), None);
        assert_eq!(r.record(t0, ProbeResult::Answered(200)), Some(true));
        assert_eq!(r.record(t0 + PROBE_EVERY, ProbeResult::Answered(200)), None);
        assert_eq!(r.get(t0 + PROBE_EVERY), Some(true));
        let t1 = t0 + PROBE_EVERY * 2;
        assert_eq!(r.record(t1, ProbeResult::NoAnswer), Some(false));
        assert_eq!(r.get(t1 + STALE_AFTER), Some(false));
        assert_eq!(r.get(t1 + STALE_AFTER + Duration::from_millis(1)), None);
    }
}
