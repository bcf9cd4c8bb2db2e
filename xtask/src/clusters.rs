//! `cargo xtask test`'s real-cluster suites (`realcluster`, then `e2e`), in the background.
//!
//! Together they take about 25 minutes, nearly all of it waiting: a 10-minute soak with the
//! agent's default thresholds, apiserver restarts and outages sat out, a node's pods started.
//! Meanwhile the foreground runs the steps that are CPU-bound and touch nothing of the host's
//! network: lint, the unit tests, the qemu guests (`-nic none`). It runs them niced (19: a CFS
//! weight of 15 against the clusters' 1024), so a cluster's process that wants a core gets it
//! and the clusters' timing bounds hold as when they ran alone. The other root suites need the
//! host's iptables rules and routes to themselves (each is compared before and after): they
//! run once both are done.
//!
//! Each background suite writes to its log, `target/xtask/<suite>.log`, shown whole once the
//! background is done, and runs between [`hoststate::checked`]'s snapshots.
use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::{self, JoinHandle},
    time::Instant,
};

use crate::{hoststate, integration_tests, show, workspace, Failed, Result};

/// A suite for the background: its name and its command, ready to run.
pub struct Suite {
    pub name: &'static str,
    pub command: Command,
}

impl Suite {
    /// `tests/<name>.rs` built (its compiler's output shown here), to run with `args` as cargo
    /// would run it, from the package's directory: its own executable, not `cargo test`,
    /// which would wait on the build directory's lock while the foreground builds.
    pub fn build(name: &'static str, args: &[&str]) -> Result<Suite> {
        let (_, executable) = integration_tests(&[name], false)?
            .into_iter()
            .find(|(built, _)| built == name)
            .ok_or_else(|| Failed(format!("cargo named no test executable for tests/{name}.rs")))?;
        let mut command = Command::new(executable);
        command.args(args).current_dir(workspace().join("tests"));
        Ok(Suite { name, command })
    }
}

/// The suites running in the background, one after the other.
pub struct Background {
    thread: JoinHandle<Vec<(PathBuf, Result)>>,
    names: Vec<&'static str>,
}

/// Where the background suites' logs go.
fn log_dir() -> PathBuf {
    workspace().join("target/xtask")
}

/// Starts `suites`, in order, each once the one before passed; the first failure ends it.
pub fn start(suites: Vec<Suite>) -> Result<Background> {
    let dir = log_dir();
    fs::create_dir_all(&dir).map_err(|e| Failed(format!("create {}: {e}", dir.display())))?;
    let names: Vec<_> = suites.iter().map(|s| s.name).collect();
    for name in &names {
        eprintln!(
            "xtask: suite {name} runs in the background, its output in {}",
            dir.join(format!("{name}.log")).display()
        );
    }
    let thread = thread::spawn(move || {
        let mut done = Vec::new();
        for Suite { name, mut command } in suites {
            let log = dir.join(format!("{name}.log"));
            let result = hoststate::checked(&format!("suite {name}"), || run_logged(&mut command, &log));
            let failed = result.is_err();
            done.push((log, result));
            if failed {
                break;
            }
        }
        done
    });
    Ok(Background { thread, names })
}

/// Runs `command` with its output to `log` (the command line first); fails naming it and the
/// log when it exits non-zero.
fn run_logged(command: &mut Command, log: &Path) -> Result {
    let file = File::create(log).map_err(|e| Failed(format!("create {}: {e}", log.display())))?;
    let err = file
        .try_clone()
        .map_err(|e| Failed(format!("{}: {e}", log.display())))?;
    let mut header = &file;
    io::Write::write_all(&mut header, format!("+ {}\n", show(command)).as_bytes())
        .map_err(|e| Failed(format!("write {}: {e}", log.display())))?;
    let started = Instant::now();
    let status = command
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .status()
        .map_err(|e| Failed(format!("{}: {e}", show(command))))?;
    eprintln!(
        "xtask: background: {} exited with {status} after {:.0} s",
        show(command),
        started.elapsed().as_secs_f64()
    );
    if status.success() {
        Ok(())
    } else {
        Err(Failed(format!(
            "{} exited with {status} (its output: {})",
            show(command),
            log.display()
        )))
    }
}

impl Background {
    /// Waits for the suites (they clean up after themselves, so they are never cut short),
    /// shows each one's log, and fails with the first failure.
    pub fn finish(self) -> Result {
        if !self.names.is_empty() {
            eprintln!(
                "xtask: waiting for the background suites ({})",
                self.names.join(", ")
            );
        }
        let done = self
            .thread
            .join()
            .map_err(|_| Failed("the background suites' thread panicked".into()))?;
        let mut first = Ok(());
        for (log, result) in done {
            println!("==== {} ====", log.display());
            match File::open(&log) {
                Ok(mut f) => {
                    let _ = io::copy(&mut f, &mut io::stdout());
                }
                Err(e) => println!("(cannot read {}: {e})", log.display()),
            }
            println!("==== end of {} ====", log.display());
            if let Err(Failed(why)) = &result {
                eprintln!("xtask: {why}");
            }
            first = first.and(result);
        }
        first
    }
}

/// Runs `foreground` niced (19) while the background suites run; the niceness before is
/// restored after, whatever `foreground` returned (the suites after measure CPU time).
pub fn niced(foreground: impl FnOnce() -> Result) -> Result {
    let before = nice()?;
    set_nice(19)?;
    let ran = foreground();
    crate::both(ran, set_nice(before))
}

/// This thread's niceness (Linux: a thread's own, inherited by the processes it starts).
fn nice() -> Result<i32> {
    // SAFETY: getpriority has no preconditions; -1 is a valid result, told apart by errno.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(Failed(format!("getpriority: {}", io::Error::last_os_error())));
        }
        Ok(nice)
    }
}

fn set_nice(nice: i32) -> Result {
    // SAFETY: setpriority has no preconditions; lowering the niceness needs CAP_SYS_NICE,
    // which root has.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        return Err(Failed(format!(
            "setpriority to niceness {nice}: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn niced_runs_the_foreground_at_19_and_restores_the_niceness() {
        let before = nice().expect("niceness");
        let mut inside = None;
        // Lowering it again needs CAP_SYS_NICE: where that is missing, say so, not pass.
        let result = niced(|| {
            inside = Some(nice().expect("niceness inside"));
            let child = Command::new("sh")
                .args(["-c", "cut -d' ' -f19 /proc/self/stat"])
                .output();
            let child = String::from_utf8_lossy(&child.expect("sh").stdout)
                .trim()
                .to_string();
            assert_eq!(child, "19", "a process started in the foreground inherits it");
            Ok(())
        });
        assert_eq!(inside, Some(19));
        match result {
            Ok(()) => assert_eq!(nice().expect("niceness after"), before),
            Err(Failed(why)) => assert!(
                unsafe { libc::geteuid() } != 0 && why.contains("setpriority"),
                "as root the niceness must come back: {why}"
            ),
        }
    }

    #[test]
    fn a_failing_suite_fails_naming_its_log_which_holds_its_output() {
        let mut fails = Command::new("sh");
        fails.args(["-c", "echo out of the failing suite; echo to stderr >&2; exit 3"]);
        let log = std::env::temp_dir().join(format!("xtask-bg-{}.log", std::process::id()));
        let result = run_logged(&mut fails, &log);
        let text = fs::read_to_string(&log).expect("log");
        let _ = fs::remove_file(&log);
        let Err(Failed(why)) = result else {
            panic!("a suite that exits 3 must fail")
        };
        assert!(
            why.contains("exit status: 3") && why.contains("xtask-bg-"),
            "{why}"
        );
        assert!(text.starts_with("+ sh -c"), "{text}");
        assert!(text.contains("out of the failing suite\nto stderr"), "{text}");
    }
}
