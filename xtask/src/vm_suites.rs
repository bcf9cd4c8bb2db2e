//! The kernel-facing root suites (`foundation`, `judgement`) in the vm-test guest.
//!
//! The suites' test binaries and what they run are dynamically linked; the guest has no disk
//! (and Debian's cloud kernel no 9p), so the initramfs carries them with their shared
//! libraries (as `ldd` names them, at the same paths): the test binaries (debug information
//! stripped), iproute2's `ip` (`ip netns`, veth pairs) and iptables (nft) with its extensions
//! (the harness contains test traffic with a REJECT rule). The agent they start is the static
//! `lifeline` (`LIFELINE_BIN`), their `ll-client` / `ll-server` the static ones, put where the
//! test binaries look for them; the stream test's fixture apiserver (`ll-apiserver`, beside the
//! agent) and its client, kubectl 1.20 (static). Only the tests in [`CHOSEN`] run, each must
//! pass, by name.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{
    image::output, integration_tests, run, setup::KUBECTL_1_20, test_threads, workspace, Failed, Result,
};

/// The tests run in the guest, by suite. Left out: `foundation`'s
/// `suites_leave_the_host_as_they_found_it` and `containment_child` (the harness's own
/// hygiene on the host, nothing of the kernel's); of `judgement`, the stream tests but one (the
/// same uprobes with other clients, whose binaries or interpreters the guest does not carry).
pub const CHOSEN: [(&str, &[&str]); 2] = [
    (
        "foundation",
        &[
            "endpoint_connection_is_listed_with_its_process",
            "connection_from_another_netns_is_attributed",
            "ipv6_endpoint",
            "cidr_endpoint",
            "ipv6_cidr_endpoint_across_netns",
            "localhost_endpoint",
            "connection_opened_before_start_is_listed_when_ready",
            "closed_connections_and_exited_processes_disappear",
            "two_processes_three_connections_each",
            "containerd_cgroup_gives_container_id",
            "bytes_received_and_last_receive_age",
            "endpoints_follow_config_reload",
            "command_line",
            "exactly_the_endpoint_clients_across_namespaces",
            "metrics_carry_spec_names_without_pid",
        ],
    ),
    (
        "judgement",
        &[
            "a_dual_stack_socket_is_listed_sampled_judged_and_reset",
            "an_idle_close_of_its_own_is_not_a_loss_a_peer_close_is",
            "the_clients_own_close_is_no_loss_whatever_the_peer_sends_after_it",
            "retrying_into_a_blackhole_is_unreachable_not_disconnected",
            "drops_on_the_clients_own_path_are_a_blackhole",
            "an_agent_restart_does_not_forgive_a_connection_the_peer_closed",
            "a_request_left_unanswered_is_stale_and_quiet_is_healthy",
            "an_answer_and_the_clients_reply_to_it_are_no_wait",
            "a_peers_pings_the_client_acks_are_no_answer",
            "silence_beyond_the_learned_rhythm_is_stale",
            "a_forked_child_keeps_the_socket_its_parent_leaves",
            "removing_an_endpoint_does_not_disconnect_its_clients",
            "failed_connects_carry_refused_unreachable_and_reset",
            // The Go uprobes end to end: kubectl 1.20's hung watch stuck and named.
            "a_go_clients_hung_watch_is_stuck_and_named_and_no_secret_leaves",
        ],
    ),
];

/// The fixture apiserver the stream test starts, beside the agent (`sibling_bin`).
const APISERVER: &str = "ll-apiserver";

/// Tests a kernel cannot pass because it lacks what they prove, left out on that preset:
/// (preset, suite, test, why).
pub const LACKING: [(&str, &str, &str, &str); 1] = [(
    "debian-5.10",
    "judgement",
    "failed_connects_carry_refused_unreachable_and_reset",
    "5.10 has no sock/inet_sk_error_report, so an ICMP-refused connect that the process read \
     first counts as \"timeout\", not \"unreachable\" (`lifeline check` says so)",
)];

/// The tests to run on `kernel` (a preset's name, `host` or a path), by suite: [`CHOSEN`]
/// without what [`LACKING`] leaves out there.
pub fn chosen(kernel: &str) -> Vec<(&'static str, Vec<&'static str>)> {
    CHOSEN
        .iter()
        .map(|(suite, tests)| {
            let kept = tests
                .iter()
                .copied()
                .filter(|t| {
                    !LACKING
                        .iter()
                        .any(|(k, s, l, _)| *k == kernel && s == suite && l == t)
                })
                .collect();
            (*suite, kept)
        })
        .collect()
}

/// Where the test binaries go in the guest.
const GUEST_DIR: &str = "suites";
/// The host's tools the harness runs, copied with their libraries.
const TOOLS: [&str; 3] = ["/usr/sbin/ip", "/usr/sbin/iptables", "/usr/sbin/iptables-save"];
/// iptables' extensions (`-m conntrack`, `-j REJECT`, ...), loaded at run time.
const XTABLES: &str = "/usr/lib/x86_64-linux-gnu/xtables";
/// The system's python3, which two `judgement` tests run (a server that resets, a forked
/// child), with the part of its library that `import socket, struct, os, sys, time` and its
/// start-up load: the top level and these packages.
const PYTHON: &str = "/usr/bin/python3";
const PYTHON_PACKAGES: [&str; 4] = ["encodings", "collections", "importlib", "re"];

/// What the guest needs for the suites: files (guest path, host path) and the shell script
/// that runs them.
pub struct Suites {
    pub files: Vec<(String, PathBuf)>,
    pub script: String,
}

/// Builds the suites' test binaries (unless `no_build`) and gathers what they need to run
/// `chosen` (see [`chosen`]). `client` and `server` are the static `ll-client` and `ll-server`.
pub fn prepare(
    no_build: bool,
    dir: &Path,
    client: &Path,
    server: &Path,
    chosen: &[(&str, Vec<&str>)],
) -> Result<Suites> {
    let names: Vec<&str> = CHOSEN.iter().map(|(suite, _)| *suite).collect();
    let executables = integration_tests(&names, no_build)?;
    let stripped = dir.join(GUEST_DIR);
    fs::create_dir_all(&stripped).map_err(|e| Failed(format!("{}: {e}", stripped.display())))?;
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    let mut dynamic: Vec<PathBuf> = Vec::new();
    for (suite, _) in chosen {
        let built = executables
            .iter()
            .find(|(name, _)| name == suite)
            .map(|(_, path)| path)
            .ok_or_else(|| Failed(format!("cargo built no test binary for suite {suite}")))?;
        let small = stripped.join(suite);
        run(Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&small)
            .arg(built))?;
        files.push((format!("{GUEST_DIR}/{suite}"), small));
        dynamic.push(built.clone());
    }
    // Where the test binaries look for their helpers (CARGO_BIN_EXE_*, fixed at build time).
    let debug = workspace().join("target/debug");
    for (name, binary) in [("ll-client", client), ("ll-server", server)] {
        files.push((guest_path(&debug.join(name)), binary.to_path_buf()));
    }
    // The stream test's fixture apiserver, next to the guest's agent, and its kubectl.
    let apiserver = stripped.join(APISERVER);
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&apiserver)
        .arg(debug.join(APISERVER)))?;
    files.push((format!("usr/local/bin/{APISERVER}"), apiserver));
    dynamic.push(debug.join(APISERVER));
    if !Path::new(KUBECTL_1_20).is_file() {
        return Err(Failed(format!(
            "{KUBECTL_1_20} is missing: run `cargo xtask setup`"
        )));
    }
    files.push((guest_path(Path::new(KUBECTL_1_20)), PathBuf::from(KUBECTL_1_20)));
    for tool in TOOLS {
        // iptables is a link to xtables-nft-multi, which acts by the name it is called by.
        let real = fs::canonicalize(tool)
            .map_err(|e| Failed(format!("{tool}: {e} (install iproute2 and iptables)")))?;
        files.push((guest_path(Path::new(tool)), real.clone()));
        dynamic.push(real);
    }
    for entry in fs::read_dir(XTABLES).map_err(|e| Failed(format!("{XTABLES}: {e}")))? {
        let path = entry.map_err(|e| Failed(format!("{XTABLES}: {e}")))?.path();
        if path.extension().is_some_and(|x| x == "so") {
            files.push((guest_path(&path), path.clone()));
            dynamic.push(path);
        }
    }
    let python = fs::canonicalize(PYTHON).map_err(|e| Failed(format!("{PYTHON}: {e} (install python3)")))?;
    files.push((guest_path(Path::new(PYTHON)), python.clone()));
    dynamic.push(python.clone());
    let version = python
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let lib = Path::new("/usr/lib").join(&version);
    files.extend(tree(&lib, 1)?);
    files.extend(tree(&lib.join("__pycache__"), 1)?);
    for package in PYTHON_PACKAGES {
        files.extend(tree(&lib.join(package), usize::MAX)?);
    }
    let mut libraries = BTreeSet::new();
    for binary in &dynamic {
        libraries.extend(shared_libraries(binary)?);
    }
    for library in libraries {
        files.push((guest_path(&library), library));
    }
    Ok(Suites {
        files,
        script: script(chosen),
    })
}

/// The regular files under `dir`, `depth` levels down at most (1: its own files), as
/// (guest path, host path); links are followed, dangling ones left out.
fn tree(dir: &Path, depth: usize) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))? {
        let path = entry
            .map_err(|e| Failed(format!("{}: {e}", dir.display())))?
            .path();
        match fs::metadata(&path) {
            Ok(m) if m.is_file() => out.push((guest_path(&path), path)),
            Ok(m) if m.is_dir() && depth > 1 => out.extend(tree(&path, depth - 1)?),
            _ => {}
        }
    }
    Ok(out)
}

/// `path` without its leading `/`, as the initramfs names it.
fn guest_path(path: &Path) -> String {
    path.to_string_lossy().trim_start_matches('/').to_owned()
}

/// `cargo test --no-run` of the [`CHOSEN`] suites: (suite, executable).
/// The shared libraries `binary` loads, the program interpreter included (`ldd`).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let text = output(Command::new("ldd").arg(binary))?;
    Ok(parse_ldd(&text))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The guest's script: each suite's chosen tests, by exact name; every suite runs, the exit
/// code is 1 if any failed.
fn script(chosen: &[(&str, Vec<&str>)]) -> String {
    let mut s = String::from(
        "# The root suites' chosen tests (xtask/src/vm_suites.rs), after the test above.\n\
         export LIFELINE_BIN=/usr/local/bin/lifeline PATH=/usr/sbin:$PATH RUST_BACKTRACE=1\n\
         # Waits for a condition may last three times as long under TCG (tests/src/wait.rs).\n\
         export LIFELINE_WAIT_SCALE=3\n\
         suites_rc=0\n",
    );
    for (suite, tests) in chosen {
        // As many at once as on the host: the guest's 2 vCPUs idle while its tests wait.
        let threads = test_threads(suite);
        s.push_str(&format!(
            "echo \"== suite {suite} ({} tests)\"\n\
             t0=$(cut -d' ' -f1 /proc/uptime)\n\
             RUSTC_BOOTSTRAP=1 /{GUEST_DIR}/{suite} --exact --test-threads={threads} -Zunstable-options --report-time {} || suites_rc=1\n\
             echo \"suite {suite}: $(awk -v a=$t0 -v b=$(cut -d' ' -f1 /proc/uptime) 'BEGIN {{ printf \"%.1f\", b - a }}') s\"\n",
            tests.len(),
            tests.join(" ")
        ));
    }
    s.push_str("exit $suites_rc\n");
    s
}

/// Fails unless every test of `chosen` is reported passed in `output` (a test the binary does
/// not have, renamed, would otherwise not run at all with `--exact`).
pub fn verify(output: &str, chosen: &[(&str, Vec<&str>)]) -> Result {
    let mut missing = Vec::new();
    for (suite, tests) in chosen {
        for test in tests.iter() {
            let passed = output.lines().any(|l| {
                l.strip_prefix(&format!("test {test} ... ok"))
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
            });
            if !passed {
                missing.push(format!("{suite}::{test}"));
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Failed(format!(
            "in the guest, not passed (failed, or not run): {}",
            missing.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_libraries_and_the_interpreter() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn every_chosen_test_must_be_reported_passed() {
        let mut all = String::new();
        for (_, tests) in CHOSEN {
            for t in tests.iter() {
                all.push_str(&format!("test {t} ... ok <1.234s>\n"));
            }
        }
        let every = chosen("debian-6.1");
        assert!(verify(&all, &every).is_ok());
        let failed = all.replacen("ipv6_endpoint ... ok", "ipv6_endpoint ... FAILED", 1);
        let err = verify(&failed, &every).unwrap_err().0;
        assert!(err.contains("foundation::ipv6_endpoint"), "{err}");
        // A prefix of another test's name is not that test.
        let renamed = all.replacen("test cidr_endpoint ... ok", "test cidr_endpoint_v2 ... ok", 1);
        assert!(verify(&renamed, &every)
            .unwrap_err()
            .0
            .contains("foundation::cidr_endpoint"));
    }

    #[test]
    fn a_kernel_leaves_out_only_what_it_lacks() {
        let count = |c: &[(&str, Vec<&str>)]| c.iter().map(|(_, t)| t.len()).sum::<usize>();
        let every = chosen("debian-6.1");
        assert_eq!(count(&every), CHOSEN.iter().map(|(_, t)| t.len()).sum::<usize>());
        assert_eq!(chosen("host"), every);
        let old = chosen("debian-5.10");
        assert_eq!(count(&old), count(&every) - 1);
        assert!(!old[1]
            .1
            .contains(&"failed_connects_carry_refused_unreachable_and_reset"));
        // What is left out is not asked for: its absence does not fail the run.
        let all: String = old
            .iter()
            .flat_map(|(_, t)| t.iter().map(|t| format!("test {t} ... ok\n")))
            .collect();
        assert!(verify(&all, &old).is_ok());
        assert!(verify(&all, &every).is_err());
        for (kernel, suite, test, _) in LACKING {
            let listed = CHOSEN.iter().any(|(s, t)| *s == suite && t.contains(&test));
            assert!(
                listed,
                "LACKING names {suite}::{test} ({kernel}), which CHOSEN does not run"
            );
        }
    }
}
