//! Holding a starting process still while its probes go in.
//!
//! A client-go binary sends its first LIST and WATCH 15–25 ms after its exec, and putting a
//! binary's uprobes in takes the kernel one RCU grace period after a quiet spell (~17 ms beside
//! a busy cluster, `kernel/head_start.rs`): a race the agent loses now and then, and a lost
//! race leaves that start's first watches unnamed for 5–10 minutes. So once a starting
//! process is known to run client-go, each of its threads is stopped with ptrace
//! (`PTRACE_SEIZE` + `PTRACE_INTERRUPT`: a ptrace-stop, which its parent does not see, unlike
//! `SIGSTOP`, and which sends it no signal) until the attach is done, then let go
//! (`PTRACE_DETACH`). The process starts that much later, once per new binary; nothing of it
//! is read or changed.
//!
//! All calls for a process must come from the one thread that seized it (ptrace's tracer is a
//! thread), so a [`Held`] is dropped on the thread that made it (it is not `Send`). A thread
//! that took a signal while held is let go with that signal, so nothing is lost. Threads that
//! start while others are being stopped are found by listing `/proc/<pid>/task` again until it
//! holds no thread not yet stopped (a stopped thread starts none).
//!
//! A thread has one tracer. One that another tracer holds (a second agent on the node, as in
//! an upgrade's overlap or a test suite running agents side by side, each holding the same
//! start while its own probes go in) is waited for, up to [`WAIT_FOR_TRACER`], and seized as
//! soon as that tracer lets go: the start then stays held until this agent's probes are in
//! too. The leader is seized first, so two agents never each hold a part of one process.
use std::{
    collections::HashMap,
    io,
    marker::PhantomData,
    time::{Duration, Instant},
};

/// Rounds of listing a process's threads before giving up on one that keeps starting more.
const MAX_ROUNDS: usize = 16;
/// `PTRACE_EVENT_STOP`: the stop `PTRACE_INTERRUPT` asks for (`include/uapi/linux/ptrace.h`).
const EVENT_STOP: i32 = 128;
/// How long a thread held by another tracer is waited for: longer than another agent holds a
/// start (its inspection and attach, up to ~0.5 s on a loaded node), far shorter than a
/// debugger holds one (a process traced for good is then not held, as before).
pub const WAIT_FOR_TRACER: Duration = Duration::from_secs(1);
/// How often a thread held by another tracer is tried again.
const RETRY_EVERY: Duration = Duration::from_micros(250);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("/proc/{pid}/task: {source}")]
    Threads { pid: u32, source: io::Error },
    #[error("ptrace seize of thread {tid} of process {pid}: {source}")]
    Seize { pid: u32, tid: i32, source: io::Error },
    #[error(
        "thread {tid} of process {pid} is traced by {tracer}, which did not let go within {WAIT_FOR_TRACER:?}"
    )]
    Traced { pid: u32, tid: i32, tracer: u32 },
    #[error("process {pid} kept starting threads through {MAX_ROUNDS} rounds")]
    Restless { pid: u32 },
}

/// A process whose threads are stopped; dropping it lets them go.
pub struct Held {
    pid: u32,
    /// Each stopped thread, with the signal it is to be let go with (0: none).
    threads: HashMap<i32, i32>,
    /// When the first thread was seized.
    since: Instant,
    /// Only the seizing thread may let go.
    _not_send: PhantomData<*const ()>,
}

impl Held {
    /// Stops every thread of process `pid`. Err (having let go what it stopped) when the
    /// kernel refuses (no `CAP_SYS_PTRACE`, Yama's `ptrace_scope` 3, a process another tracer
    /// held through [`WAIT_FOR_TRACER`]) or the process will not be still; the caller then
    /// goes on without holding it.
    pub fn hold(pid: u32) -> Result<Self, Error> {
        let mut held = Self {
            pid,
            threads: HashMap::new(),
            since: Instant::now(),
            _not_send: PhantomData,
        };
        for _ in 0..MAX_ROUNDS {
            let tids = threads(pid).map_err(|source| Error::Threads { pid, source })?;
            let mut new: Vec<i32> = tids
                .into_iter()
                .filter(|t| !held.threads.contains_key(t))
                .collect();
            if new.is_empty() {
                return Ok(held);
            }
            // The leader first: whoever holds it holds the rest, the other waits holding none.
            new.sort_unstable_by_key(|&tid| (tid != pid as i32, tid));
            let mut seized = Vec::with_capacity(new.len());
            for tid in new {
                match seize_when_free(pid, tid) {
                    Ok(()) => seized.push(tid),
                    // It exited between the listing and the seize.
                    Err(Error::Seize { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(err) => {
                        // Those seized are let go (by the drop) once stopped.
                        held.settle(seized);
                        return Err(err);
                    }
                }
            }
            held.settle(seized);
        }
        Err(Error::Restless { pid })
    }

    /// Records each seized thread once it has stopped (a running tracee cannot be let go).
    fn settle(&mut self, seized: Vec<i32>) {
        for tid in seized {
            if let Some(signal) = wait_stopped(tid) {
                self.threads.insert(tid, signal);
            }
        }
    }

    /// How many threads are held.
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Lets the process go: how many threads were held, and for how long (the first seize to
    /// the last detach).
    pub fn release(self) -> (usize, Duration) {
        let (threads, since) = (self.threads.len(), self.since);
        drop(self);
        (threads, since.elapsed())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut dying = Vec::new();
        for (&tid, &signal) in &self.threads {
            // SAFETY: PTRACE_DETACH of a tracee of this thread, in a ptrace-stop.
            let r = unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, signal as libc::c_long) };
            if r != 0 {
                tracing::debug!(
                    pid = self.pid,
                    tid,
                    "letting go of a held thread: {}",
                    io::Error::last_os_error()
                );
                dying.push(tid);
            }
        }
        // Only SIGKILL takes a thread out of its stop: it is dying, and once dead it waits for
        // its tracer (its parent hears of it only after), so it is reaped here: the other
        // threads first, for the leader is reaped only once they are.
        dying.sort_by_key(|&tid| tid == self.pid as i32);
        for tid in dying {
            let mut status = 0;
            // SAFETY: as in wait_stopped.
            unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        }
    }
}

/// The thread ids of process `pid`.
fn threads(pid: u32) -> io::Result<Vec<i32>> {
    let mut tids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            tids.push(tid);
        }
    }
    Ok(tids)
}

/// Seizes thread `tid` of process `pid`, waiting up to [`WAIT_FOR_TRACER`] while another
/// tracer holds it; the kernel's other refusals (no privilege, Yama) are returned at once.
fn seize_when_free(pid: u32, tid: i32) -> Result<(), Error> {
    retry_while_traced(pid, tid, || seize(tid), || tracer(pid, tid))
}

/// The waiting of [`seize_when_free`] over its two reads of the kernel: `seize` the thread,
/// and read its `tracer` when refused. A refusal whose tracer then reads none is tried once
/// more before it is taken for the kernel's own (no privilege, Yama): the tracer may have let
/// go between the refusal and the read, and the next seize then succeeds.
fn retry_while_traced(
    pid: u32,
    tid: i32,
    mut seize: impl FnMut() -> io::Result<()>,
    mut tracer: impl FnMut() -> Option<u32>,
) -> Result<(), Error> {
    let since = Instant::now();
    let mut refused_untraced = false;
    loop {
        let source = match seize() {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let refused = source.raw_os_error() == Some(libc::EPERM);
        let traced_by = if refused {
            tracer().filter(|&t| t != 0)
        } else {
            None
        };
        match traced_by {
            Some(tracer) if since.elapsed() >= WAIT_FOR_TRACER => {
                return Err(Error::Traced { pid, tid, tracer })
            }
            Some(_) => std::thread::sleep(RETRY_EVERY),
            None if refused && !refused_untraced => refused_untraced = true,
            None => return Err(Error::Seize { pid, tid, source }),
        }
    }
}

/// The thread that traces thread `tid` of process `pid` (0: none), from its status; None when
/// it cannot be read (the thread is gone).
fn tracer(pid: u32, tid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Seizes thread `tid` and asks it to stop.
fn seize(tid: i32) -> io::Result<()> {
    // SAFETY: ptrace requests with no pointers.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until seized thread `tid` stops: Some(the signal to let it go with), or None when it
/// exited instead. The stop comes as the thread next leaves the kernel, or at once if it
/// sleeps interruptibly.
fn wait_stopped(tid: i32) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status it was given.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        if r == -1 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return None;
        }
        if !libc::WIFSTOPPED(status) {
            return None;
        }
        // A signal-delivery stop (no event): the signal is passed on when the thread is let go.
        // The interrupt's own stop, or a group stop, passes nothing on.
        let signal = if status >> 16 == 0 {
            libc::WSTOPSIG(status)
        } else {
            debug_assert!(status >> 16 == EVENT_STOP);
            0
        };
        return Some(signal);
    }
}

#[cfg(test)]
mod tests;
