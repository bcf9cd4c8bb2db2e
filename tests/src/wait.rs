//! Waiting: polling until a condition holds, or asserting it keeps holding, and the values shown
//! in the panic messages when it does not.
use std::fmt;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Interval of every polling loop.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// `timeout` as this machine needs it: times `LIFELINE_WAIT_SCALE` in a guest under emulation
/// (the guests' script sets it, `xtask/src/vm_suites.rs`: under TCG beside a busy host a
/// config reload took over 2 s to be in force), unchanged on the host. Only waits for a
/// condition to come are scaled, never how long one must hold.
pub(crate) fn scaled(timeout: Duration) -> Duration {
    timeout.mul_f64(wait_scale())
}

/// `LIFELINE_WAIT_SCALE` (at least 1; 1 when unset, as on the host): how much later than on
/// the host a condition may come here. Detection bounds scale their upper end by it, never
/// their lower end (judging too early is no matter of a slow machine).
pub fn wait_scale() -> f64 {
    static SCALE: OnceLock<f64> = OnceLock::new();
    *SCALE.get_or_init(|| {
        std::env::var("LIFELINE_WAIT_SCALE")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| *s >= 1.0)
            .unwrap_or(1.0)
    })
}

/// Calls `poll` every 50 ms until it returns `Ok`, for at most `timeout` (see [`scaled`]). On
/// timeout, panics naming `what` and showing the last value `poll` observed (its `Err`).
pub fn wait_until<T, S: fmt::Debug>(
    timeout: Duration,
    what: &str,
    mut poll: impl FnMut() -> Result<T, S>,
) -> T {
    let timeout = scaled(timeout);
    let start = Instant::now();
    loop {
        match poll() {
            Ok(v) => return v,
            Err(last) if start.elapsed() >= timeout => {
                panic!("timed out after {timeout:?} waiting for {what}; last observed:\n{last:?}")
            }
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// Calls `poll` every 50 ms for `duration`, panicking at the first `Err` (showing it).
pub fn hold<S: fmt::Debug>(duration: Duration, what: &str, mut poll: impl FnMut() -> Result<(), S>) {
    let start = Instant::now();
    while start.elapsed() < duration {
        if let Err(seen) = poll() {
            panic!(
                "{what} stopped holding after {:?}; observed:\n{seen:?}",
                start.elapsed()
            );
        }
        thread::sleep(POLL);
    }
}

/// JSON shown pretty-printed in panic messages.
pub struct Pretty<'a>(pub &'a [Value]);

impl fmt::Debug for Pretty<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_string_pretty(self.0).map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

/// A string shown as is (not quoted) in panic messages.
pub struct Shown(pub String);

impl fmt::Debug for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
