//! A head start on the kernel's wait before a binary's uprobes go in.
//!
//! Registering a uprobe write-locks the per-CPU rwsem that every fork reads (`dup_mmap_sem`,
//! `kernel/events/uprobes.c`). After a quiet spell its first writer waits a whole RCU grace
//! period for the readers to switch to the slow path (`rcu_sync_enter`); writers that come
//! within the next grace period or so pass at once. Measured here (6.18, 2 CPUs): a uprobe's
//! `perf_event_open` on a file not probed before takes 5–15 ms cold, 0.03 ms 5 ms after another
//! registration. That wait was the larger part of probing a client-go binary as it starts
//! (`probed.rs`, "at start"), whose first request comes 15–25 ms after its exec.
//!
//! So the wait is paid while the binary is inspected: [`HeadStart::begin`] registers a
//! placeholder uprobe on a thread of its own, on a function of the agent that is never called
//! (disabled, with no program: nothing would run even if it were), and again every
//! [`KEEP_EVERY`] (each one cheap) until the [`HeadStart`] is dropped after the attach, or
//! [`AT_MOST`] has passed.
//!
//! Removing a uprobe is slow (60–85 ms, measured: the kernel waits for its uprobe readers under
//! the trace-event lock), and a uprobe registered meanwhile waits for it (see `uprobes::detach`).
//! So the placeholders are held until no head start has begun for [`QUIET`] (a burst of starts,
//! as at a node's boot, attaches without waiting behind them), or for at most
//! [`HOLD_AT_MOST`] (starts that never pause keep none for long), then closed on that thread
//! one at a time, each only while starts still pause: a start that begins while they are
//! being closed waits for one removal, not for all of them.
use std::{
    ffi::CStr,
    io,
    os::fd::{FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock, PoisonError,
    },
    thread,
    time::{Duration, Instant},
};

/// How often a placeholder is registered again while the attach is to come: well within a
/// grace period, so the kernel never goes back to waiting for one.
const KEEP_EVERY: Duration = Duration::from_millis(4);
/// The longest a head start is held: an inspection and attach that take longer pay the wait.
const AT_MOST: Duration = Duration::from_millis(100);
/// Placeholders are closed once no head start has begun for this long...
const QUIET: Duration = Duration::from_secs(1);
/// ...or when they have been held this long.
const HOLD_AT_MOST: Duration = Duration::from_secs(5);
/// The file of the placeholder: the agent's own binary, whatever its path (or if replaced).
const OWN_BINARY: &CStr = c"/proc/self/exe";
/// perf_event_open's flag for a close-on-exec descriptor (`include/uapi/linux/perf_event.h`).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the uprobe event type is unknown (/sys/bus/event_source/devices/uprobe/type): {0}")]
    NoUprobeType(io::Error),
    #[error("/proc/self/maps: {0}")]
    Maps(io::Error),
    #[error("the placeholder function is in no mapping of /proc/self/maps")]
    NotMapped,
    #[error("perf_event_open of a placeholder uprobe: {0}")]
    Open(io::Error),
}

/// Held while a binary is inspected and attached; dropping it ends the head start.
pub struct HeadStart {
    done: Arc<AtomicBool>,
}

impl HeadStart {
    /// Starts registering placeholders on a thread of its own; None when no thread could be
    /// started (the attach then pays the wait itself).
    pub fn begin() -> Option<Self> {
        LAST_BEGIN.store(since_base(), Ordering::Release);
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        thread::Builder::new()
            .name("uprobe-head".into())
            .spawn(move || hold(&flag))
            .ok()?;
        Some(Self { done })
    }
}

impl Drop for HeadStart {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}

/// When the last head start began, in [`since_base`] nanoseconds.
static LAST_BEGIN: AtomicU64 = AtomicU64::new(0);

fn since_base() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn hold(done: &AtomicBool) {
    let site = match placeholder() {
        Ok(site) => site,
        Err(err) => {
            tracing::debug!("no head start for uprobes: {err}");
            return;
        }
    };
    let started = Instant::now();
    let mut held = Vec::new();
    loop {
        match site.register() {
            Ok(fd) => {
                HELD.fetch_add(1, Ordering::AcqRel);
                held.push(fd);
            }
            Err(err) => {
                tracing::debug!("no head start for uprobes: {err}");
                break;
            }
        }
        thread::sleep(KEEP_EVERY);
        if done.load(Ordering::Acquire) || started.elapsed() >= AT_MOST {
            break;
        }
    }
    // Closed one at a time, each when starts pause, or HOLD_AT_MOST after this one began, and
    // under one lock for every head start's thread: a removal holds the kernel's trace-event
    // lock for 60-85 ms, so a slow inspection's dozen closed at once kept a start that came
    // meanwhile waiting for several (135-161 ms here; likely the 332 ms of a CI start 2 s
    // after a cold one). Now it waits for the one removal under way at most.
    while let Some(placeholder) = held.pop() {
        let _one = CLOSING.lock().unwrap_or_else(PoisonError::into_inner);
        wait_for_quiet(HOLD_AT_MOST.saturating_sub(started.elapsed()));
        drop(placeholder);
        HELD.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Taken to close a placeholder (see `hold`).
static CLOSING: Mutex<()> = Mutex::new(());
/// Placeholders registered and not closed yet (a test waits for none).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Waits until no head start has begun for [`QUIET`], at most `at_most`.
fn wait_for_quiet(at_most: Duration) {
    let until = Instant::now() + at_most;
    loop {
        let quiet_for = Duration::from_nanos(since_base().saturating_sub(LAST_BEGIN.load(Ordering::Acquire)));
        let left = QUIET
            .saturating_sub(quiet_for)
            .min(until.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            return;
        }
        thread::sleep(left);
    }
}

/// The placeholder's site, found once.
fn placeholder() -> Result<Site, String> {
    static SITE: OnceLock<Result<Site, String>> = OnceLock::new();
    SITE.get_or_init(|| Site::of(never_called as *const () as usize).map_err(|e| e.to_string()))
        .clone()
}

/// Never called: only its first instruction is a place for placeholder uprobes. Its body is
/// its own (no other function's code folded into it would be probed).
#[inline(never)]
fn never_called() -> u64 {
    std::hint::black_box(0x6865_6164_7374_6172)
}

/// A place in the agent's own binary where a uprobe can be registered.
#[derive(Clone, Copy, Debug)]
struct Site {
    /// The kernel's event type for uprobes.
    kind: u32,
    /// File offset in [`OWN_BINARY`].
    offset: u64,
}

impl Site {
    /// The site of the agent's function at `address`.
    fn of(address: usize) -> Result<Site, Error> {
        let kind = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
            .and_then(|t| {
                t.trim()
                    .parse()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            })
            .map_err(Error::NoUprobeType)?;
        let maps = std::fs::read_to_string("/proc/self/maps").map_err(Error::Maps)?;
        let offset = file_offset(&maps, address as u64).ok_or(Error::NotMapped)?;
        Ok(Site { kind, offset })
    }

    /// Registers a disabled uprobe here, with no program: held until the descriptor closes.
    fn register(&self) -> Result<OwnedFd, Error> {
        // struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1): type, size, then
        // config1 (the path) at 56 and config2 (the offset) at 64; bit 0 at 40 is `disabled`.
        const SIZE: usize = 72;
        let mut attr = [0u8; SIZE];
        attr[0..4].copy_from_slice(&self.kind.to_ne_bytes());
        attr[4..8].copy_from_slice(&(SIZE as u32).to_ne_bytes());
        attr[40..48].copy_from_slice(&1u64.to_ne_bytes());
        attr[56..64].copy_from_slice(&(OWN_BINARY.as_ptr() as u64).to_ne_bytes());
        attr[64..72].copy_from_slice(&self.offset.to_ne_bytes());
        // SAFETY: `attr` is a valid perf_event_attr of the size it says, and the path it points
        // to is a static C string; on success the kernel returns a new descriptor we own.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                -1 as libc::pid_t,
                0 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(Error::Open(io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
}

/// The offset in the file of the agent's own binary of `address`, from `/proc/self/maps`.
fn file_offset(maps: &str, address: u64) -> Option<u64> {
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (range, _perms, offset) = (fields.next()?, fields.next()?, fields.next()?);
        let (start, end) = range.split_once('-')?;
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        let offset = u64::from_str_radix(offset, 16).ok()?;
        (start..end).contains(&address).then(|| address - start + offset)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_placed_in_its_file_by_its_mapping() {
        let maps = "\
55d0c0000000-55d0c0100000 r--p 00000000 08:01 42 /usr/bin/lifeline
55d0c0100000-55d0c0900000 r-xp 00100000 08:01 42 /usr/bin/lifeline
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";
        assert_eq!(file_offset(maps, 0x55d0_c010_0040), Some(0x10_0040));
        assert_eq!(file_offset(maps, 0x55d0_c000_0010), Some(0x10));
        assert_eq!(file_offset(maps, 0x1000), None);
    }

    /// Another function of the agent's, for a registration the test times.
    #[inline(never)]
    fn also_never_called() -> u64 {
        std::hint::black_box(0x7465_7374_7369_7465)
    }

    /// As root: the uprobe tests' lock and a site of the test binary (None: not root).
    fn uprobe_test() -> Option<(std::sync::MutexGuard<'static, ()>, Site)> {
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let alone = crate::kernel::UPROBE_TESTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let site = Site::of(also_never_called as *const () as usize).expect("the test function's site");
        Some((alone, site))
    }

    /// Root: with a head start begun while "the binary is inspected", registering a uprobe
    /// after that does not wait for a grace period. Cold, it may (another test's uprobes can
    /// have warmed the kernel: only the head start's side is asserted).
    #[test]
    fn a_head_start_takes_the_grace_period_off_the_attach() {
        let Some((_alone, site)) = uprobe_test() else {
            eprintln!("skipped: needs root");
            return;
        };
        // Closing the descriptor removes the uprobe (itself a registration, slow: after it).
        let time = |site: &Site| {
            let t = Instant::now();
            let fd = site.register().expect("a uprobe on the test binary");
            let took = t.elapsed();
            drop(fd);
            took
        };
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        for _ in 0..5 {
            thread::sleep(Duration::from_millis(150));
            cold.push(time(&site));
            thread::sleep(Duration::from_millis(150));
            let head = HeadStart::begin().expect("a thread");
            // The inspection's time, longer than a grace period here.
            thread::sleep(Duration::from_millis(25));
            warm.push(time(&site));
            drop(head);
        }
        warm.sort();
        eprintln!("uprobe registration: cold {cold:?}, after a head start {warm:?}");
        assert!(
            warm[2] < Duration::from_millis(3),
            "after a head start a registration still took {warm:?} (cold: {cold:?})"
        );
    }

    /// Root: a start that comes while a slow inspection's placeholders are being closed waits
    /// for one removal (60-85 ms here), not for the dozen.
    #[test]
    fn a_start_while_placeholders_close_waits_for_one_removal_at_most() {
        let Some((_alone, site)) = uprobe_test() else {
            eprintln!("skipped: needs root");
            return;
        };
        // Other tests' placeholders closed first (theirs would be timed too).
        let quiet = Instant::now() + Duration::from_secs(20);
        while HELD.load(Ordering::Acquire) > 0 && Instant::now() < quiet {
            thread::sleep(Duration::from_millis(50));
        }
        // What one removal takes on this machine now.
        let fd = site.register().expect("a uprobe on the test binary");
        thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        drop(fd);
        let removal = t.elapsed();
        thread::sleep(Duration::from_millis(150));
        // A cold inspection: ~15 placeholders.
        let head = HeadStart::begin().expect("a thread");
        thread::sleep(Duration::from_millis(60));
        drop(head);
        // Their closing has begun (QUIET after the head start began).
        thread::sleep(QUIET + Duration::from_millis(150));
        let next = HeadStart::begin().expect("a thread");
        let t = Instant::now();
        let fd = site.register().expect("a uprobe on the test binary");
        let took = t.elapsed();
        drop(next);
        eprintln!("a registration while placeholders close: {took:?} (one removal: {removal:?})");
        drop(fd);
        // Leave the kernel without removals under way for the next uprobe test.
        thread::sleep(QUIET + Duration::from_millis(1500));
        // Closed all at once, it waited for two removals and more (137-161 ms against ~60).
        assert!(
            took < removal * 3 / 2 + Duration::from_millis(10),
            "a start while placeholders closed waited {took:?}, one removal taking {removal:?}"
        );
    }
}
