//! The host's packet handling before and after each suite, compared: a suite leaves the
//! machine's iptables rules (both families), routes (every table, both families) and policy
//! rules as it found them (README "Tests"). Normalized as the harness's own test does it
//! (`tests/src/containment.rs`, `network_state`): no counters, no comments, no expiry times,
//! and a table holding nothing (iptables-nft creates one on first use) counts as none.
use std::process::Command;

use crate::{show, Failed, Result};

/// The sections compared.
const SECTIONS: [&[&str]; 6] = [
    &["iptables-save"],
    &["ip6tables-save"],
    &["ip", "-4", "route", "show", "table", "all"],
    &["ip", "-6", "route", "show", "table", "all"],
    &["ip", "-4", "rule", "show"],
    &["ip", "-6", "rule", "show"],
];

/// What the host's packet handling looks like now.
pub fn snapshot() -> Result<String> {
    let mut state = String::new();
    for args in SECTIONS {
        let mut cmd = Command::new(args[0]);
        cmd.args(&args[1..]);
        let out = cmd.output().map_err(|e| Failed(format!("{}: {e}", show(&cmd))))?;
        if !out.status.success() {
            return Err(Failed(format!("{} exited with {}", show(&cmd), out.status)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        state.push_str(&format!("## {}\n", args.join(" ")));
        state.push_str(&if args[0].ends_with("-save") {
            normalize_saved(&text)
        } else {
            normalize_routes(&text)
        });
    }
    Ok(state)
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

/// Every line added (`+`) or removed (`-`) since `before`.
fn changes(before: &str) -> Result<Vec<String>> {
    let after = snapshot()?;
    let mut left: Vec<&str> = after.lines().collect();
    let mut changes = Vec::new();
    for line in before.lines() {
        match left.iter().position(|l| *l == line) {
            Some(i) => {
                left.remove(i);
            }
            None => changes.push(format!("- {line}")),
        }
    }
    changes.extend(left.iter().map(|l| format!("+ {l}")));
    Ok(changes)
}

/// Removes the REJECT of all of 10.0.0.0/8 that earlier versions of the suites installed on
/// the default interface and never removed (it cuts off a resolver or mirror there); the
/// harness removes it too, but the comparison must not count that against a suite.
pub fn remove_legacy_reject() {
    let Ok(saved) = Command::new("iptables-save").args(["-t", "filter"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&saved.stdout).lines() {
        let legacy = line.starts_with("-A OUTPUT ")
            && line.contains(" -d 10.0.0.0/8 ")
            && line.contains("! --ctstate DNAT")
            && line.contains(" -j REJECT");
        if legacy {
            let rule: Vec<&str> = line["-A ".len()..].split_whitespace().collect();
            let removed = Command::new("iptables")
                .args(["-w", "-D"])
                .args(&rule)
                .status()
                .is_ok_and(|s| s.success());
            if removed {
                eprintln!("xtask: removed what an earlier version of the suites left: iptables {line}");
            }
        }
    }
}

/// `iptables-save` output without comments, counters, or tables whose chains are all built
/// in, accept by default and hold no rule.
fn normalize_saved(text: &str) -> String {
    let mut out = String::new();
    let mut table: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let line = match line.strip_prefix(':') {
            Some(chain) => format!(":{}", chain.rsplit_once(" [").map_or(chain, |(c, _)| c)),
            None => line.to_owned(),
        };
        let commit = line == "COMMIT";
        table.push(line);
        if commit {
            // Only built-in chains have a policy (a user chain's is `-`).
            let empty = table.iter().all(|l| {
                l.starts_with('*') || l == "COMMIT" || (l.starts_with(':') && l.ends_with(" ACCEPT"))
            });
            if !empty {
                for l in &table {
                    out.push_str(l);
                    out.push('\n');
                }
            }
            table.clear();
        }
    }
    out
}

/// `ip route` output without the lifetimes of expiring routes.
fn normalize_routes(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let mut kept = Vec::new();
        while let Some(w) = words.next() {
            if w == "expires" {
                words.next();
                continue;
            }
            kept.push(w);
        }
        out.push_str(&kept.join(" "));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized() {
        let empty = "# Generated\n*nat\n:PREROUTING ACCEPT [4:240]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(normalize_saved(empty), "");
        let kept = "*filter\n:OUTPUT ACCEPT [1:2]\n:X - [0:0]\n-A OUTPUT -j X\nCOMMIT\n";
        assert_eq!(
            normalize_saved(kept),
            "*filter\n:OUTPUT ACCEPT\n:X -\n-A OUTPUT -j X\nCOMMIT\n"
        );
        assert_eq!(
            normalize_routes("fd00::/64 dev eth0 proto ra metric 100 expires 86399sec pref medium"),
            "fd00::/64 dev eth0 proto ra metric 100 pref medium\n"
        );
    }
}
