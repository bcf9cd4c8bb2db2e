//! The scheduler's statistics of a process's threads (`/proc/PID/task/TID/schedstat`): how
//! long each ran and how long it waited on a run queue, in nanoseconds. The bench's CPU
//! figures are read from them, and a qemu guest's deadline (`vm.rs`).
use std::{fs, path::PathBuf};

/// One thread's statistics.
pub struct Thread {
    /// Its `/proc/PID/task/TID` directory.
    pub dir: PathBuf,
    /// Time it ran on a CPU.
    pub ran_ns: u64,
    /// Time it was runnable and waited for a CPU.
    pub waited_ns: u64,
}

/// Every thread of process `pid` whose statistics could be read (none once it is gone).
pub fn threads(pid: u32) -> Vec<Thread> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| {
            let dir = task.path();
            let stat = fs::read_to_string(dir.join("schedstat")).ok()?;
            let mut fields = stat.split_whitespace().map(str::parse::<u64>);
            let ran_ns = fields.next()?.ok()?;
            let waited_ns = fields.next()?.ok()?;
            Some(Thread {
                dir,
                ran_ns,
                waited_ns,
            })
        })
        .collect()
}
