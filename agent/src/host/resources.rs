//! Process resource limits. The open-file soft limit is often 1024 while the hard limit is far
//! higher, and Rust's runtime does not raise it: the agent raises its soft limit to the hard
//! limit at start (no privilege needed), because every tracked network namespace, `/proc` read
//! and HTTP connection costs a descriptor. RLIMIT_MEMLOCK is left alone: kernels since 5.11
//! charge eBPF memory to the cgroup, and raising it needs `CAP_SYS_RESOURCE`, which the agent
//! does without.

/// The open-file limits after [`raise_nofile`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NofileLimit {
    pub before: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft RLIMIT_NOFILE to the hard limit. Failing is not fatal: the limit stays as
/// it was and the caller logs it.
pub fn raise_nofile() -> std::io::Result<NofileLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; raising the soft limit up to the hard one needs
        // no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(NofileLimit {
        before,
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        // Changes this test process's own limit upwards only, which no other test minds.
        let limit = raise_nofile().expect("raise");
        assert_eq!(limit.soft, limit.hard);
        assert!(limit.before <= limit.soft);
        assert_eq!(raise_nofile().expect("again").before, limit.soft);
    }
}
