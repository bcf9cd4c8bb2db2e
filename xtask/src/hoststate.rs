//! The host's packet handling before and after each suite, compared: a suite leaves the
//! machine's iptables rules (both families), routes (every table, both families) and policy
//! rules as it found them (docs/testing.md "What the suites do to the host"). Normalized as the
//! harness's own tests do it: the same file, `tests/src/network_state.rs`.
use std::process::Command;

use crate::{show, Failed, Result};

#[path = "../../tests/src/network_state.rs"]
mod network_state;

// The harness uses the rest of it (installing, registering).
#[allow(dead_code)]
#[path = "../../tests/src/containment_state.rs"]
mod containment_state;

/// What the host's packet handling looks like now.
pub fn snapshot() -> Result<String> {
    network_state::state(|args| {
        let mut cmd = Command::new(args[0]);
        cmd.args(&args[1..]);
        let out = cmd.output().map_err(|e| Failed(format!("{}: {e}", show(&cmd))))?;
        if !out.status.success() {
            return Err(Failed(format!("{} exited with {}", show(&cmd), out.status)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    })
}

/// How long a difference may take to go away: the kernel destroys a deleted network
/// namespace, and with it the host end of its veth pairs (their routes), asynchronously, once
/// the last process in it is gone; on a loaded machine that takes seconds after a suite exits.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(20);

/// Fails naming every line that `what` added (`+`) or removed (`-`) since `before`, once the
/// difference has outlasted [`SETTLE`].
pub fn unchanged(before: &str, what: &str) -> Result {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let changes = changes(before)?;
        if changes.is_empty() {
            eprintln!("xtask: {what} left the host's iptables rules and routes as it found them");
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Failed(format!(
                "{what} changed the host's iptables rules or routes (or something else on this \
                 machine did meanwhile):\n{}",
                changes.join("\n")
            )));
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Runs `suite` between two snapshots (what earlier runs left cleared first): fails if it
/// failed, or if `what` left the host's packet handling changed; both said when both.
pub fn checked(what: &str, suite: impl FnOnce() -> Result) -> Result {
    clear_leftovers();
    let before = snapshot()?;
    let ran = suite();
    crate::both(ran, unchanged(&before, what))
}

/// Every line added (`+`) or removed (`-`) since `before`.
fn changes(before: &str) -> Result<Vec<String>> {
    Ok(network_state::changes(before, &snapshot()?))
}

/// Before the first snapshot: removes what earlier runs left, which the harness would remove
/// too and the comparison must then not count against a suite: the suites' containment where no
/// suite process holds it any more (a suite killed outright, by SIGKILL or the end of the
/// session that ran it), and the REJECT of all of 10.0.0.0/8 of earlier versions.
pub fn clear_leftovers() {
    match containment_state::clear_abandoned() {
        Ok(removed) if removed.is_empty() => {}
        Ok(removed) => eprintln!(
            "xtask: removed what a suite killed outright left (no suite process holds it): {}",
            removed.join("; ")
        ),
        Err(e) => eprintln!(
            "xtask: could not tell whether a killed suite left its containment ({}: {e}); the \
             comparisons below count it if one did",
            containment_state::STATE_DIR
        ),
    }
    for line in containment_state::remove_legacy_reject() {
        eprintln!("xtask: removed what an earlier version of the suites left: iptables {line}");
    }
}
