//! The kernel's count of each program's runs, as a test reads it: enabled for as long as the
//! test holds a [`Stats`] (`BPF_ENABLE_STATS`: the count stops when the descriptor closes,
//! and nothing of the machine's settings changes), read from a process's program descriptors.
use std::{
    fs,
    os::fd::{FromRawFd, OwnedFd},
};

/// `BPF_ENABLE_STATS` (`enum bpf_cmd`) and `BPF_STATS_RUN_TIME`.
const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_STATS_RUN_TIME: u32 = 0;
/// `BPF_PROG_TYPE_KPROBE`: the type of uprobe programs.
const PROG_TYPE_KPROBE: u64 = 2;

/// Run counts kept by the kernel while this is held.
pub struct Stats(#[allow(dead_code)] OwnedFd);

impl Stats {
    pub fn enable() -> Stats {
        let mut attr = [0u8; 16];
        attr[..4].copy_from_slice(&BPF_STATS_RUN_TIME.to_ne_bytes());
        // SAFETY: bpf(2) reads `attr`, which outlives the call; it returns a new descriptor.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_mut_ptr(),
                attr.len() as libc::c_uint,
            )
        };
        assert!(fd >= 0, "BPF_ENABLE_STATS: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor the kernel has just given us, owned by nobody else.
        Stats(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
}

/// Runs so far of the uprobe (kprobe-type) programs process `pid` holds, summed.
pub fn uprobe_runs(pid: u32) -> u64 {
    let dir =
        fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap_or_else(|e| panic!("/proc/{pid}/fdinfo: {e}"));
    dir.flatten()
        .filter_map(|entry| fs::read_to_string(entry.path()).ok())
        .filter_map(|text| {
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
            };
            (field("prog_type:")? == PROG_TYPE_KPROBE).then(|| field("run_cnt:"))?
        })
        .sum()
}
