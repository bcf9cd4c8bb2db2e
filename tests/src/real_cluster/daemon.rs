//! Long-running cluster processes (etcd, the Kubernetes components, containerd): each in its
//! own process group, its output appended to a log file, stopped on drop.
use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

/// How long a daemon gets to exit after SIGTERM on drop before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running daemon. Dropping it sends SIGTERM to its process group (SIGKILL after
/// [`STOP_GRACE`]); if the test panicked, the end of its log is printed.
pub struct Daemon {
    name: String,
    child: Child,
    status: Option<ExitStatus>,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `cmd` (stdin from /dev/null) with stdout and stderr appended to `log_dir/NAME.log`.
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> Daemon {
        let log = log_dir.join(format!("{name}.log"));
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let shown = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("dup log fd"))
            .stderr(file)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name} ({shown}): {e}"));
        Daemon {
            name: name.to_owned(),
            child,
            status: None,
            log,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status, if it exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Panics (with the end of its log) if it exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.exited() {
            panic!(
                "{} exited with {status}; its last errors (from {}):\n{}",
                self.name,
                self.log.display(),
                self.log_errors(15)
            );
        }
    }

    /// Sends `signal` to the process itself.
    pub fn signal(&self, signal: i32) {
        if self.status.is_none() {
            // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
            unsafe { libc::kill(self.child.id() as i32, signal) };
        }
    }

    /// Sends `signal` and waits up to `timeout` for the exit; then SIGKILLs the group. Returns
    /// how long the exit took, or `None` if it had to be killed.
    pub fn stop(&mut self, signal: i32, timeout: Duration) -> Option<Duration> {
        if self.exited().is_some() {
            return Some(Duration::ZERO);
        }
        let start = Instant::now();
        self.signal(signal);
        while start.elapsed() < timeout {
            if self.exited().is_some() {
                self.kill_group();
                return Some(start.elapsed());
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.kill_group();
        self.status = Some(self.child.wait().expect("wait"));
        None
    }

    /// Waits up to `timeout` for it to exit by itself (no signal: a second SIGTERM makes a
    /// Kubernetes component exit at once). Returns how long it took, `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        loop {
            if self.exited().is_some() {
                self.kill_group();
                return Some(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL to whatever is left in the process group (children of a script, for example).
    fn kill_group(&self) {
        // SAFETY: as in `signal`; the group id is the child's pid (process_group(0)).
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
    }

    /// The last `lines` klog error and fatal lines of its log (`E1123 ...`, `F1123 ...`; a Go
    /// program's fatal exit ends in goroutine dumps, useless as a tail), or its last lines if
    /// it logged none.
    pub fn log_errors(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let errors: Vec<&str> = text
            .lines()
            .filter(|l| {
                let b = l.as_bytes();
                b.len() > 5 && matches!(b[0], b'E' | b'F') && b[1..5].iter().all(u8::is_ascii_digit)
            })
            .collect();
        if errors.is_empty() {
            return self.log_tail(lines);
        }
        errors[errors.len().saturating_sub(lines)..].join("\n")
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(libc::SIGTERM, STOP_GRACE);
        if thread::panicking() {
            eprintln!(
                "----- {} ({}), last errors -----\n{}\n----- end of {} -----",
                self.name,
                self.log.display(),
                self.log_errors(15),
                self.name
            );
        }
    }
}
