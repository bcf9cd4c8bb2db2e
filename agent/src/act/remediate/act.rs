//! The actions, for real: destroy sockets through sock_diag in their network namespace, signal
//! a host process (race-free against pid reuse, through a pidfd), evict a pod through an
//! [`Evictor`]. [`Actuator::execute`] turns a [`Decision`] into its [`Outcome`].
use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::PathBuf,
    time::Duration,
};

use super::{
    evict::{EvictOutcome, Evictor},
    model::{Action, Decision, Disposition, Outcome, PodRef, Resolution, Skip, Target},
    Error, Result,
};
use crate::{error::chain, host::netns, host::process::Procfs, host::sock_diag::DiagSocket, table::Tuple};

/// The signal that restarts a host process (its supervisor starts it again).
pub const DEFAULT_SIGNAL: i32 = libc::SIGTERM;
/// How long an eviction may take before it counts as failed: a safety net over the
/// [`Evictor`]'s own timeout, so a hung request cannot stall the actions queued behind it.
pub const EVICT_TIMEOUT: Duration = Duration::from_secs(45);

/// Executes decisions. Socket and signal work runs on tokio's blocking pool; evictions are
/// awaited with [`EVICT_TIMEOUT`].
pub struct Actuator<E> {
    evictor: E,
    signal: i32,
    evict_timeout: Duration,
    procfs: Procfs,
}

impl<E: Evictor> Actuator<E> {
    pub fn new(evictor: E) -> Self {
        Self {
            evictor,
            signal: DEFAULT_SIGNAL,
            evict_timeout: EVICT_TIMEOUT,
            procfs: Procfs::default(),
        }
    }

    /// Restart host processes with `signal` instead of [`DEFAULT_SIGNAL`].
    #[cfg_attr(not(test), expect(dead_code, reason = "no config key for the signal yet"))]
    pub fn with_signal(mut self, signal: i32) -> Self {
        self.signal = signal;
        self
    }

    /// Gives up on an eviction after `timeout` instead of [`EVICT_TIMEOUT`].
    #[cfg_attr(not(test), expect(dead_code, reason = "tests shorten the timeout"))]
    pub fn with_evict_timeout(mut self, timeout: Duration) -> Self {
        self.evict_timeout = timeout;
        self
    }

    /// Takes the decision's action if it says [`Disposition::Act`]; a dry run or a skip
    /// becomes its outcome as it is.
    pub async fn execute(&self, decision: Decision) -> Outcome {
        let result = match (&decision.disposition, &decision.action) {
            (Disposition::DryRun, _) => Resolution::DryRun,
            (Disposition::Skip(skip), _) => Resolution::Skipped(skip.clone()),
            (Disposition::Act, Action::Reset { tuples }) => {
                let (tuples, owner) = (tuples.clone(), decision.client.pid);
                blocking("reset", move || reset(&tuples, Some(owner)).resolution()).await
            }
            (
                Disposition::Act,
                Action::Restart {
                    target: Target::Process { pid, start_time },
                },
            ) => {
                let (pid, start_time, signal, procfs) = (*pid, *start_time, self.signal, self.procfs.clone());
                blocking("restart", move || {
                    match signal_process(&procfs, pid, start_time, signal) {
                        Ok(Signalled::Sent) => {
                            Resolution::Done(format!("sent {} to pid {pid}", signal_name(signal)))
                        }
                        Ok(Signalled::Gone) => Resolution::Skipped(Skip::Gone(format!(
                            "pid {pid} has exited or now belongs to another process"
                        ))),
                        Err(err) => Resolution::Failed(chain(&err)),
                    }
                })
                .await
            }
            (
                Disposition::Act,
                Action::Restart {
                    target: Target::Pod(pod),
                },
            ) => self.evict(pod).await,
        };
        decision.into_outcome(result)
    }

    async fn evict(&self, pod: &PodRef) -> Resolution {
        let asked = self.evictor.evict(&pod.namespace, &pod.name);
        match tokio::time::timeout(self.evict_timeout, asked).await {
            Ok(Ok(EvictOutcome::Evicted)) => Resolution::Done(format!("pod {pod} evicted")),
            Ok(Ok(EvictOutcome::Blocked { reason })) => Resolution::Skipped(Skip::Blocked(reason)),
            Ok(Ok(EvictOutcome::NotFound)) => Resolution::Skipped(Skip::Gone(format!("pod {pod} not found"))),
            Ok(Err(source)) => Resolution::Failed(chain(&Error::Evict {
                pod: pod.clone(),
                source: Box::new(source),
            })),
            Err(_) => Resolution::Failed(chain(&Error::EvictTimeout {
                pod: pod.clone(),
                timeout: self.evict_timeout,
            })),
        }
    }
}

/// Runs blocking work on tokio's blocking pool; a panic in it is a failure of `action`.
async fn blocking(action: &'static str, work: impl FnOnce() -> Resolution + Send + 'static) -> Resolution {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|_| Resolution::Failed(chain(&Error::Panicked { action })))
}

/// What a reset did, socket by socket.
#[derive(Debug, Default)]
pub struct ResetReport {
    /// Sockets destroyed.
    pub destroyed: usize,
    /// Sockets that no longer existed.
    pub gone: usize,
    pub failed: Vec<Error>,
}

impl ResetReport {
    /// `done` if any socket was destroyed (failures of others are named), `failed` if none was
    /// and some failed, else `skipped` (`gone`).
    pub fn resolution(&self) -> Resolution {
        let failures = || {
            self.failed
                .iter()
                .map(|e| chain(e))
                .collect::<Vec<_>>()
                .join("; ")
        };
        if self.destroyed > 0 {
            let mut text = format!("destroyed {} socket{}", self.destroyed, plural(self.destroyed));
            if self.gone > 0 {
                text.push_str(&format!(", {} already closed", self.gone));
            }
            if !self.failed.is_empty() {
                text.push_str(&format!(", {} failed: {}", self.failed.len(), failures()));
            }
            Resolution::Done(text)
        } else if !self.failed.is_empty() {
            Resolution::Failed(failures())
        } else {
            Resolution::Skipped(Skip::Gone(format!(
                "the socket{} had already been closed",
                plural(self.gone)
            )))
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Destroys each socket (`SOCK_DESTROY`) in its network namespace: its owner gets
/// `ECONNABORTED`, the peer a RST. `owner` is the process holding them, whose namespace is
/// tried first; others are found among all namespaces ([`netns::enumerate`]).
pub fn reset(tuples: &[Tuple], owner: Option<u32>) -> ResetReport {
    let mut report = ResetReport::default();
    let mut by_netns: BTreeMap<u64, Vec<&Tuple>> = BTreeMap::new();
    for tuple in tuples {
        by_netns.entry(tuple.netns).or_default().push(tuple);
    }
    for (netns, tuples) in by_netns {
        let diag = netns_path(netns, owner)
            .ok_or(Error::NoNetns { netns })
            .and_then(|path| {
                DiagSocket::open_in(&path).map_err(|source| Error::Diag {
                    netns,
                    path,
                    source: Box::new(source),
                })
            });
        let diag = match diag {
            Ok(diag) => diag,
            Err(err) => {
                report.failed.push(err);
                continue;
            }
        };
        for t in tuples {
            match diag.destroy(t.local, t.remote) {
                Ok(true) => report.destroyed += 1,
                Ok(false) => report.gone += 1,
                Err(source) => report.failed.push(Error::Destroy {
                    netns,
                    local: t.local,
                    remote: t.remote,
                    source: Box::new(source),
                }),
            }
        }
    }
    report
}

/// A path that opens network namespace `netns`: the owner's, if it is in it, else any.
fn netns_path(netns: u64, owner: Option<u32>) -> Option<PathBuf> {
    if let Some(pid) = owner {
        let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
        if netns::netns_inode(&path).ok() == Some(netns) {
            return Some(path);
        }
    }
    netns::enumerate()
        .into_iter()
        .find(|(inode, _)| *inode == netns)
        .map(|(_, path)| path)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signalled {
    Sent,
    /// The process exited, or its pid now belongs to another process: nothing was sent.
    Gone,
}

/// Sends `signal` to process `pid` if it is still the process that started at `start_time`
/// (clock ticks since boot). A pidfd pins the process first, so a pid recycled between the
/// check and the signal cannot receive it.
pub fn signal_process(procfs: &Procfs, pid: u32, start_time: u64, signal: i32) -> Result<Signalled> {
    // SAFETY: plain syscall without pointers; the result is checked below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let source = io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::ESRCH) {
            return Ok(Signalled::Gone);
        }
        return Err(Error::Pidfd { pid, source });
    }
    // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // The pidfd names whatever process had `pid` when it was opened; if that pid has our start
    // time now, it had it then too (a process keeps its pid for life), so the pidfd is ours.
    if !procfs.is_alive(pid, start_time) {
        return Ok(Signalled::Gone);
    }
    // SAFETY: a valid pidfd, no siginfo (NULL), no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        let source = io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::ESRCH) {
            return Ok(Signalled::Gone);
        }
        return Err(Error::Signal {
            pid,
            signal: signal_name(signal),
            source,
        });
    }
    Ok(Signalled::Sent)
}

/// `SIGTERM`, ..., or `signal N`.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests;
