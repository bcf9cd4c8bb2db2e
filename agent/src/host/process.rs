//! Process facts from procfs: name, command line, cgroup (hence container), network namespace,
//! start time, and which processes hold a given socket.
//!
//! Everything goes through [`Procfs`], which holds the procfs root so tests can point it at a
//! fake tree. The parsing is done by pure functions over strings ([`parse_stat`],
//! [`parse_status_tgid`], [`format_cmdline`], [`select_cgroup_path`], [`parse_socket_link`]).
//!
//! Only "no such process" (`ENOENT`, `ESRCH`), a recycled pid and a zombie mean a process is
//! gone: any other failure (out of file descriptors, memory, permission) is an unknown, never an
//! exit ([`Liveness`]).
//!
//! The command line is redacted ([`crate::host::redact`]) and bounded ([`MAX_CMDLINE`]) here, where
//! it is read, so every output (API, logs, alerts, Events) gets it that way.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use serde::Serialize;

use crate::host::container::{self, ContainerRef};
use crate::host::redact;

/// The longest command line the agent keeps, in bytes (after redaction); longer ones are cut
/// and end with [`redact::TRUNCATED`]. Bounds every answer, log line and alert that shows it.
pub const MAX_CMDLINE: usize = 4096;
/// How much of `/proc/<pid>/cmdline` is read at most (a process may have megabytes of argv).
const CMDLINE_READ: u64 = 64 * 1024;

/// Failures reading a process's procfs entries.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process (or thread) does not exist (any more), or exited while being read, or its
    /// pid now belongs to a different process.
    #[error("process {pid} is gone")]
    Gone { pid: u32 },
    /// A procfs file of an existing process could not be read.
    #[error("reading {path} (pid {pid}): {source}")]
    Read {
        pid: u32,
        path: PathBuf,
        source: io::Error,
    },
    /// A procfs file was read but did not have the expected content.
    #[error("{path}: {problem}")]
    Malformed { path: PathBuf, problem: &'static str },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the agent knows about one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    /// The process id (the thread group id, which is the main thread's id).
    pub pid: u32,
    /// The process name from `/proc/<pid>/comm` without its newline: the main thread's name
    /// (the executable's name truncated to 15 bytes unless the process renamed itself), not the
    /// name of whichever thread made a connection.
    pub comm: String,
    /// The arguments from `/proc/<pid>/cmdline` joined by single spaces, trailing NULs
    /// dropped, secret-looking values redacted ([`crate::host::redact`]), at most [`MAX_CMDLINE`]
    /// bytes; empty for kernel threads (and zombies). Not valid UTF-8 is replaced lossily.
    pub cmdline: String,
    /// The process's cgroup path as chosen by [`select_cgroup_path`] (in practice the cgroup
    /// v2 path on unified systems); empty if `/proc/<pid>/cgroup` lists none.
    pub cgroup: String,
    /// The container `cgroup` names, if any.
    pub container: Option<ContainerRef>,
    /// The inode number of the process's network namespace (`/proc/<pid>/ns/net`), which
    /// identifies the namespace; `None` if we may not look at it (not running as root) or the
    /// main thread has already exited while other threads still run.
    pub netns: Option<u64>,
    /// The process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`);
    /// with `pid` it identifies the process even after its pid is recycled.
    pub start_time_ticks: u64,
}

/// A procfs mount: the root directory under which `<pid>/…` is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Procfs {
    /// The directory procfs is mounted on (`/proc`, or a fake tree in tests).
    root: PathBuf,
}

impl Default for Procfs {
    /// Procfs at `/proc`.
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl Procfs {
    /// Procfs mounted at `proc_root`.
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            root: proc_root.into(),
        }
    }

    /// Everything about process `pid`. A thread id is accepted too: the thread's process is
    /// described (`pid` in the result is then the thread group id).
    ///
    /// Fails with [`Error::Gone`] if the process does not exist, exits while being read, or is
    /// replaced by another process with the same pid while being read.
    pub fn process(&self, pid: u32) -> Result<ProcessInfo> {
        let tgid = self.tgid_of(pid)?;
        let gone = |e: Error| match e {
            Error::Gone { .. } => Error::Gone { pid },
            e => e,
        };
        let start_time_ticks = self.start_time(tgid).map_err(gone)?;

        let comm = self.read_string(tgid, "comm").map_err(gone)?;
        let comm = comm.strip_suffix('\n').unwrap_or(&comm).to_owned();
        let cmdline = shown_cmdline(&self.read_prefix(tgid, "cmdline", CMDLINE_READ).map_err(gone)?);
        let cgroups = self.read_string(tgid, "cgroup").map_err(gone)?;
        let cgroup = select_cgroup_path(&cgroups).unwrap_or_default().to_owned();
        let container = container::container_id_from_cgroup(&cgroup);

        let netns_path = self.pid_path(tgid, "ns/net");
        let netns = match std::fs::metadata(&netns_path) {
            Ok(meta) => Some(meta.ino()),
            // Not permitted, or the main thread has exited (its namespaces are gone even while
            // other threads run); if the whole process is gone the check below says so.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound
                ) || e.raw_os_error() == Some(libc::ESRCH) =>
            {
                None
            }
            Err(e) => return Err(io_error(tgid, netns_path, e)),
        };

        // Everything above was read from whatever process had the pid at the time: make sure
        // it is still the one whose start time we read first (and not a zombie by now).
        match self.liveness(tgid, start_time_ticks) {
            Liveness::Alive => {}
            Liveness::Exited => return Err(Error::Gone { pid }),
            Liveness::Unknown(err) => return Err(err),
        }

        Ok(ProcessInfo {
            pid: tgid,
            comm,
            cmdline,
            cgroup,
            container,
            netns,
            start_time_ticks,
        })
    }

    /// The process (thread group) id of thread `tid`: the `Tgid:` line of
    /// `/proc/<tid>/status`. For a process id it is the id itself. Thread directories are not
    /// listed in `/proc` but can be opened there by id.
    pub fn tgid_of(&self, tid: u32) -> Result<u32> {
        let status = self.read_string(tid, "status")?;
        parse_status_tgid(&status).ok_or_else(|| Error::Malformed {
            path: self.pid_path(tid, "status"),
            problem: "no valid Tgid: line",
        })
    }

    /// Whether process `pid` is known to be alive and to be the process that started at
    /// `start_time_ticks` (not a later process that was given the recycled pid). False when it
    /// exited (zombies included) *and* when that cannot be told: see [`Procfs::liveness`].
    pub fn is_alive(&self, pid: u32, start_time_ticks: u64) -> bool {
        matches!(self.liveness(pid, start_time_ticks), Liveness::Alive)
    }

    /// Whether this is the host's own procfs (`/proc`), whose pids this process can name in
    /// syscalls (`pidfd_open`), unlike a fake tree in tests.
    pub fn is_host(&self) -> bool {
        self.root == Path::new("/proc")
    }

    /// Whether process `pid`, started at `start_time_ticks`, still runs. It has
    /// [`Liveness::Exited`] only on evidence: no such process (`ENOENT`/`ESRCH`), its pid
    /// belongs to a process started at another time, or it is a zombie (state `Z`/`X` with no
    /// thread left: a process whose main thread exited while other threads run shows `Z` too,
    /// and is alive). Any other failure to read (`EMFILE`, `ENOMEM`, ...) is
    /// [`Liveness::Unknown`]: keep what is known about the process.
    pub fn liveness(&self, pid: u32, start_time_ticks: u64) -> Liveness {
        let stat = match self.read_string(pid, "stat") {
            Ok(stat) => stat,
            Err(Error::Gone { .. }) => return Liveness::Exited,
            Err(err) => return Liveness::Unknown(err),
        };
        match parse_stat(&stat) {
            None => Liveness::Unknown(Error::Malformed {
                path: self.pid_path(pid, "stat"),
                problem: "no valid state, thread count and start time",
            }),
            Some(s) if s.start_time != start_time_ticks || s.is_dead() => Liveness::Exited,
            Some(_) => Liveness::Alive,
        }
    }

    /// For each socket inode in `inodes` held open by some process, every process (tgid)
    /// holding it, in `/proc` order and without duplicates. Inodes no process holds are absent
    /// from the map.
    ///
    /// Scans the `fd` directory of every process listed in `/proc` (not `/proc/<pid>/task/*`:
    /// threads share their process's descriptors). Processes and descriptors that vanish or
    /// may not be read are skipped silently. Every process is scanned even after each inode
    /// has been found, since several processes can share a socket (after `fork`, or by
    /// descriptor passing).
    pub fn socket_owners(&self, inodes: &HashSet<u64>) -> HashMap<u64, Vec<u32>> {
        let mut owners: HashMap<u64, Vec<u32>> = HashMap::new();
        if inodes.is_empty() {
            return owners;
        }
        let root = match CString::new(self.root.as_os_str().as_bytes()) {
            Ok(root) => root,
            Err(_) => {
                tracing::warn!(root = %self.root.display(), "procfs root contains a NUL byte");
                return owners;
            }
        };
        let Some(mut proc_dir) = Dir::open(&root) else {
            tracing::warn!(
                root = %self.root.display(),
                error = %io::Error::last_os_error(),
                "cannot list procfs root"
            );
            return owners;
        };
        // "<pid>/fd\0", built in place for each process: no allocation per process or per fd.
        let mut fd_path = [0u8; 32];
        let mut link = [0u8; 64];
        while let Some(name) = proc_dir.next_name() {
            let name = name.to_bytes();
            let Some(pid) = parse_pid(name) else { continue };
            let len = name.len();
            fd_path[..len].copy_from_slice(name);
            fd_path[len..len + 4].copy_from_slice(b"/fd\0");
            let Ok(fd_path) = CStr::from_bytes_with_nul(&fd_path[..len + 4]) else {
                continue;
            };
            let Some(mut fd_dir) = Dir::open_at(&proc_dir, fd_path) else {
                continue;
            };
            let fd_dir_fd = fd_dir.fd();
            while let Some(fd_name) = fd_dir.next_name() {
                // SAFETY: `fd_dir_fd` is the open directory `fd_dir` being read, `fd_name` is a
                // NUL-terminated name in it, and `link` is writable for `link.len()` bytes.
                let n = unsafe {
                    libc::readlinkat(fd_dir_fd, fd_name.as_ptr(), link.as_mut_ptr().cast(), link.len())
                };
                // Negative: the fd was closed meanwhile (or `.`/`..`); full: longer than any
                // socket link, so possibly truncated.
                let Ok(n) = usize::try_from(n) else { continue };
                if n >= link.len() {
                    continue;
                }
                let Some(inode) = parse_socket_link(&link[..n]) else {
                    continue;
                };
                if inodes.contains(&inode) {
                    let pids = owners.entry(inode).or_default();
                    if pids.last() != Some(&pid) {
                        pids.push(pid);
                    }
                }
            }
        }
        owners
    }

    /// The start time (field 22 of `/proc/<pid>/stat`) of process `pid`.
    fn start_time(&self, pid: u32) -> Result<u64> {
        let stat = self.read_string(pid, "stat")?;
        parse_stat_start_time(&stat).ok_or_else(|| Error::Malformed {
            path: self.pid_path(pid, "stat"),
            problem: "no valid start time (field 22)",
        })
    }

    /// `<root>/<pid>/<file>`.
    fn pid_path(&self, pid: u32, file: &str) -> PathBuf {
        let mut path = self.root.join(pid.to_string());
        path.push(file);
        path
    }

    /// The bytes of `<root>/<pid>/<file>`.
    fn read(&self, pid: u32, file: &str) -> Result<Vec<u8>> {
        let path = self.pid_path(pid, file);
        std::fs::read(&path).map_err(|e| io_error(pid, path, e))
    }

    /// At most the first `limit` bytes of `<root>/<pid>/<file>`.
    fn read_prefix(&self, pid: u32, file: &str, limit: u64) -> Result<Vec<u8>> {
        let path = self.pid_path(pid, file);
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|f| f.take(limit).read_to_end(&mut bytes))
            .map_err(|e| io_error(pid, path, e))?;
        Ok(bytes)
    }

    /// The text of `<root>/<pid>/<file>`, invalid UTF-8 replaced lossily.
    fn read_string(&self, pid: u32, file: &str) -> Result<String> {
        let bytes = self.read(pid, file)?;
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }
}

/// Whether a process still runs, as far as procfs can tell ([`Procfs::liveness`]).
#[derive(Debug)]
pub enum Liveness {
    Alive,
    /// Gone, replaced by another process with the same pid, or a zombie.
    Exited,
    /// Its procfs entry could not be read for another reason than its absence: what is known
    /// about it stays as it is.
    Unknown(Error),
}

/// Maps an I/O error on a file of process `pid` to [`Error::Gone`] when it means the process
/// does not exist (`ENOENT`, or `ESRCH` for a process exiting while being read). Every other
/// error (`EMFILE`, `ENFILE`, `ENOMEM`, `EACCES`, ...) says nothing about the process.
fn io_error(pid: u32, path: PathBuf, source: io::Error) -> Error {
    if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
        Error::Gone { pid }
    } else {
        Error::Read { pid, path, source }
    }
}

/// The fields of a `/proc/<pid>/stat` line the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Field 20: threads in the group (a zombie main thread counts while others run).
    pub num_threads: u64,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

impl Stat {
    /// A zombie or dead process with no thread left running: it has exited, only its parent
    /// has not reaped it yet.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X') && self.num_threads <= 1
    }
}

/// Fields 3, 20 and 22 of a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may itself contain spaces and parentheses, so fields are counted from the
/// last `)`.
pub fn parse_stat(stat: &str) -> Option<Stat> {
    let (_, after_comm) = stat.rsplit_once(')')?;
    // Field 3 (state) is the first after the command name.
    let fields: Vec<&str> = after_comm.split_ascii_whitespace().take(22 - 2).collect();
    let field = |n: usize| fields.get(n - 3).copied();
    let mut state = field(3)?.chars();
    let (Some(state), None) = (state.next(), state.next()) else {
        return None;
    };
    Some(Stat {
        state,
        num_threads: field(20)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
    })
}

/// The start time in clock ticks, field 22 of a `/proc/<pid>/stat` line.
pub fn parse_stat_start_time(stat: &str) -> Option<u64> {
    parse_stat(stat).map(|s| s.start_time)
}

/// The thread group id from the `Tgid:` line of a `/proc/<tid>/status` file.
pub fn parse_status_tgid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// A `/proc/<pid>/cmdline` (arguments each followed by a NUL) as one line: arguments joined by
/// single spaces, trailing NULs dropped (processes that rewrite their title often pad with
/// them), invalid UTF-8 replaced lossily. Empty input (kernel threads) gives an empty string.
pub fn format_cmdline(raw: &[u8]) -> String {
    let end = raw.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let joined: Vec<u8> = raw[..end]
        .iter()
        .map(|&b| if b == 0 { b' ' } else { b })
        .collect();
    match String::from_utf8(joined) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// A command line as the agent shows it: [`format_cmdline`], then redacted
/// ([`redact::redact`]) and cut to [`MAX_CMDLINE`] bytes.
pub fn shown_cmdline(raw: &[u8]) -> String {
    redact::truncate(redact::redact(&format_cmdline(raw)), MAX_CMDLINE)
}

/// The cgroup path to attribute a process by, from the lines (`<hierarchy>:<controllers>:<path>`)
/// of its `/proc/<pid>/cgroup`, or `None` if there is no line.
///
/// Candidates, in order of preference: the unified (cgroup v2) line `0::<path>`, then the v1
/// lines of the `name=systemd`, `pids` and `cpu` controllers. On a pure v2 system only the
/// first exists. On hybrid and v1 systems the `0::` line exists too but may not be where
/// containers are placed (it is `/` when the v2 hierarchy is unused, and older runc left
/// cgroupfs-driver containers in the runtime's service there), so the first candidate that
/// names a container is taken; failing that, the first that is not the root `/`; failing that,
/// the first.
pub fn select_cgroup_path(cgroups: &str) -> Option<&str> {
    let mut candidates: [Option<&str>; 4] = [None; 4];
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let slot = if hierarchy == "0" && controllers.is_empty() {
            0
        } else if controllers.split(',').any(|c| c == "name=systemd") {
            1
        } else if controllers.split(',').any(|c| c == "pids") {
            2
        } else if controllers.split(',').any(|c| c == "cpu") {
            3
        } else {
            continue;
        };
        candidates[slot].get_or_insert(path);
    }
    let present = || candidates.iter().flatten().copied();
    present()
        .find(|path| container::container_id_from_cgroup(path).is_some())
        .or_else(|| present().find(|&path| path != "/"))
        .or_else(|| present().next())
}

/// The inode of a socket descriptor's link target `socket:[<inode>]`, or `None` for any other
/// target (files, pipes, anonymous inodes).
pub fn parse_socket_link(target: &[u8]) -> Option<u64> {
    let digits = target.strip_prefix(b"socket:[")?.strip_suffix(b"]")?;
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits
        .iter()
        .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// The pid a `/proc` entry name denotes, if it is all digits (`self`, `sys`, … are not).
fn parse_pid(name: &[u8]) -> Option<u32> {
    if name.is_empty() || name.len() > 10 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    name.iter()
        .try_fold(0u32, |n, &d| n.checked_mul(10)?.checked_add(u32::from(d - b'0')))
}

/// An open directory stream (`opendir`), read without allocating per entry.
struct Dir(NonNull<libc::DIR>);

impl Dir {
    /// Opens the directory at `path`; `None` on failure (`errno` tells why).
    fn open(path: &CStr) -> Option<Self> {
        // SAFETY: `path` is a valid NUL-terminated string.
        let dir = unsafe { libc::opendir(path.as_ptr()) };
        NonNull::new(dir).map(Self)
    }

    /// Opens the directory at `path` relative to the directory `parent`; `None` on failure.
    fn open_at(parent: &Dir, path: &CStr) -> Option<Self> {
        // SAFETY: `parent.fd()` is an open directory, `path` a valid NUL-terminated string.
        let fd = unsafe {
            libc::openat(
                parent.fd(),
                path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is an open directory descriptor we own; on success the stream takes
        // ownership of it.
        let dir = unsafe { libc::fdopendir(fd) };
        match NonNull::new(dir) {
            Some(dir) => Some(Self(dir)),
            None => {
                // SAFETY: `fdopendir` failed, so `fd` is still ours to close.
                unsafe { libc::close(fd) };
                None
            }
        }
    }

    /// The file descriptor of the open directory, valid as long as `self`.
    fn fd(&self) -> libc::c_int {
        // SAFETY: `self.0` is an open directory stream.
        unsafe { libc::dirfd(self.0.as_ptr()) }
    }

    /// The name of the next entry (`.` and `..` skipped), or `None` at the end or on a read
    /// error. The name is valid until the next call.
    fn next_name(&mut self) -> Option<&CStr> {
        loop {
            // SAFETY: `self.0` is an open directory stream, read by this thread only (we hold
            // `&mut self`).
            let entry = unsafe { libc::readdir(self.0.as_ptr()) };
            if entry.is_null() {
                return None;
            }
            // SAFETY: a non-null entry from `readdir` holds a NUL-terminated `d_name` that stays
            // valid until the next `readdir`/`closedir` on this stream, which the `&mut self`
            // borrow of the returned name rules out.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                return Some(name);
            }
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: `self.0` is an open directory stream, closed only here.
        unsafe { libc::closedir(self.0.as_ptr()) };
    }
}

#[cfg(test)]
mod tests;
