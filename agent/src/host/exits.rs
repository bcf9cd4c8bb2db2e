//! Which owners exited, each sampling round: one `poll` over a pidfd per process instead of
//! reading every owner's `/proc/<pid>/stat` every second (an open and a walk of the process's
//! threads each, the largest fixed cost of a round).
//!
//! A pidfd names one process for good (a recycled pid is another process) and becomes
//! readable when the process has exited, as a zombie too, which is exactly
//! [`Liveness::Exited`]. It is opened once per process, after `/proc` confirmed that the pid
//! still belongs to the process the table knows (same start time). Where a pidfd cannot be
//! opened (a fake procfs in tests, `EMFILE`, a kernel older than 5.3), the process is checked
//! through `/proc` as before, and whatever that cannot tell stays [`Liveness::Unknown`].
use std::{
    collections::HashMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use super::process::{Liveness, Procfs};

/// Open pidfds of the owners the table knows, by (pid, start time).
#[derive(Default)]
pub struct ExitWatch {
    fds: HashMap<(u32, u64), OwnedFd>,
}

impl ExitWatch {
    /// The liveness of each of `owners` (pid, start time), in that order. Pidfds of processes
    /// no longer among `owners`, or found exited, are closed.
    pub fn check(&mut self, procfs: &Procfs, owners: &[(u32, u64)]) -> Vec<Liveness> {
        self.fds.retain(|key, _| owners.contains(key));
        let mut verdicts: Vec<Option<Liveness>> = owners
            .iter()
            .map(|&(pid, start)| self.open(procfs, pid, start))
            .collect();
        let polled: Vec<usize> = (0..owners.len()).filter(|&i| verdicts[i].is_none()).collect();
        let mut fds: Vec<libc::pollfd> = polled
            .iter()
            .map(|&i| libc::pollfd {
                fd: self.fds[&owners[i]].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd for its length; a zero timeout never blocks.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        for (k, &i) in polled.iter().enumerate() {
            let (pid, start) = owners[i];
            verdicts[i] = Some(if ready < 0 {
                // The poll itself failed (EINTR, ENOMEM): ask /proc this time.
                procfs.liveness(pid, start)
            } else if fds[k].revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                self.fds.remove(&(pid, start));
                Liveness::Exited
            } else if fds[k].revents != 0 {
                // POLLNVAL or POLLERR: not a usable pidfd any more; open another next time.
                self.fds.remove(&(pid, start));
                procfs.liveness(pid, start)
            } else {
                Liveness::Alive
            });
        }
        verdicts
            .into_iter()
            .map(|v| v.expect("every owner judged"))
            .collect()
    }

    /// Opens the pidfd of (`pid`, `start`) if it is not open yet. `None`: open, to be polled;
    /// otherwise the liveness `/proc` says, when no pidfd could be (or needs to be) opened.
    fn open(&mut self, procfs: &Procfs, pid: u32, start: u64) -> Option<Liveness> {
        if self.fds.contains_key(&(pid, start)) {
            return None;
        }
        if !procfs.is_host() {
            return Some(procfs.liveness(pid, start));
        }
        // SAFETY: plain syscall; the returned descriptor, if any, is owned below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Some(match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ESRCH) => Liveness::Exited,
                _ => procfs.liveness(pid, start),
            });
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // The pid may have been recycled before the pidfd was opened: the start time says.
        match procfs.liveness(pid, start) {
            Liveness::Alive => {
                self.fds.insert((pid, start), fd);
                None
            }
            other => Some(other),
        }
    }

    /// How many pidfds are open.
    #[cfg(test)]
    pub fn open_count(&self) -> usize {
        self.fds.len()
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    fn start_time(procfs: &Procfs, pid: u32) -> u64 {
        procfs.process(pid).expect("a live process").start_time_ticks
    }

    #[test]
    fn a_live_process_is_polled_and_its_exit_seen_zombie_or_reaped() {
        let procfs = Procfs::default();
        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let start = start_time(&procfs, pid);
        let mut watch = ExitWatch::default();
        assert!(matches!(
            watch.check(&procfs, &[(pid, start)])[..],
            [Liveness::Alive]
        ));
        assert_eq!(watch.open_count(), 1, "a pidfd, opened once");
        assert!(matches!(
            watch.check(&procfs, &[(pid, start)])[..],
            [Liveness::Alive]
        ));
        assert_eq!(watch.open_count(), 1);
        // Killed and not reaped: a zombie has exited.
        child.kill().expect("kill");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match watch.check(&procfs, &[(pid, start)])[..] {
                [Liveness::Exited] => break,
                [Liveness::Alive] if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                ref other => panic!("a killed process: {other:?}"),
            }
        }
        assert_eq!(watch.open_count(), 0, "its pidfd closed");
        child.wait().expect("reap");
        assert!(matches!(
            watch.check(&procfs, &[(pid, start)])[..],
            [Liveness::Exited]
        ));
    }

    #[test]
    fn another_process_with_the_pid_or_none_at_all_has_exited() {
        let procfs = Procfs::default();
        let me = std::process::id();
        let start = start_time(&procfs, me);
        let mut watch = ExitWatch::default();
        // The same pid with another start time: the pid was recycled.
        assert!(matches!(
            watch.check(&procfs, &[(me, start + 1)])[..],
            [Liveness::Exited]
        ));
        assert_eq!(watch.open_count(), 0);
        // A pid nobody has (beyond pid_max).
        assert!(matches!(
            watch.check(&procfs, &[(u32::MAX >> 1, 1)])[..],
            [Liveness::Exited]
        ));
        // Forgotten owners lose their pidfd.
        assert!(matches!(
            watch.check(&procfs, &[(me, start)])[..],
            [Liveness::Alive]
        ));
        assert_eq!(watch.open_count(), 1);
        assert!(watch.check(&procfs, &[]).is_empty());
        assert_eq!(watch.open_count(), 0);
    }
}
