//! The files whose uprobes are being removed, so that a file is never probed twice at once.
//! Removing a uprobe takes the kernel 60–85 ms (a Go binary's dozen: ~1.5 s), so
//! [`uprobes::detach`](super::uprobes::detach) closes the links on a thread of its own. A file
//! probed again meanwhile (a CronJob's kubectl back just after its probes lingered out, a file
//! recycled at the bound and used again) would have each probe twice until the old ones are
//! gone: every frame seen twice, and a doubled `go_tls_write` loses its place in the frame
//! stream. So an attach first waits, bounded, for the removals of its own file.
use std::{
    os::unix::fs::MetadataExt,
    path::Path,
    sync::{Condvar, Mutex, PoisonError},
    time::{Duration, Instant},
};

/// A file as the kernel keeps its uprobes: by device and inode, whatever the path (also how
/// `probed.rs` knows its files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct File {
    dev: u64,
    ino: u64,
}

impl File {
    pub fn of(path: &Path) -> std::io::Result<File> {
        let meta = std::fs::metadata(path)?;
        Ok(File {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// The agent's removals under way (one object of probes: one set of removals).
pub static UNDER_WAY: Removals = Removals::new();

/// Removals under way, counted by file.
pub struct Removals {
    files: Mutex<Vec<(File, usize)>>,
    ended: Condvar,
}

impl Removals {
    pub const fn new() -> Removals {
        Removals {
            files: Mutex::new(Vec::new()),
            ended: Condvar::new(),
        }
    }

    /// A removal of `file`'s probes is under way until the returned guard is dropped.
    pub fn begin(&self, file: File) -> Removal<'_> {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        match files.iter_mut().find(|(f, _)| *f == file) {
            Some((_, n)) => *n += 1,
            None => files.push((file, 1)),
        }
        Removal { removals: self, file }
    }

    /// Waits until no removal of `file`'s probes is under way, for at most `bound`: Ok with how
    /// long it waited, or Err with the bound if one still is.
    pub fn wait(&self, file: File, bound: Duration) -> Result<Duration, Duration> {
        let started = Instant::now();
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let (_files, timeout) = self
            .ended
            .wait_timeout_while(files, bound, |files| files.iter().any(|(f, _)| *f == file))
            .unwrap_or_else(PoisonError::into_inner);
        if timeout.timed_out() {
            Err(bound)
        } else {
            Ok(started.elapsed())
        }
    }
}

/// One removal under way; dropped when its links are closed.
pub struct Removal<'a> {
    removals: &'a Removals,
    file: File,
}

impl Drop for Removal<'_> {
    fn drop(&mut self) {
        let mut files = self.removals.files.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = files.iter().position(|(f, _)| *f == self.file) {
            files[at].1 -= 1;
            if files[at].1 == 0 {
                files.swap_remove(at);
            }
        }
        drop(files);
        self.removals.ended.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: File = File { dev: 1, ino: 10 };
    const B: File = File { dev: 1, ino: 11 };

    #[test]
    fn an_attach_waits_for_its_own_files_removals_and_no_other() {
        static REMOVALS: Removals = Removals::new();
        let first = REMOVALS.begin(A);
        let second = REMOVALS.begin(A);
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
            std::thread::sleep(Duration::from_millis(100));
            drop(second);
        });
        // Another file's attach does not wait.
        let other = REMOVALS
            .wait(B, Duration::from_secs(5))
            .expect("B has no removal");
        assert!(other < Duration::from_millis(40), "{other:?}");
        // The same file's waits for both removals, not only the first to end.
        let waited = REMOVALS
            .wait(A, Duration::from_secs(5))
            .expect("A's removals end");
        assert!(waited >= Duration::from_millis(140), "{waited:?}");
        closer.join().expect("the closer");
        assert!(REMOVALS.files.lock().unwrap().is_empty());
    }

    #[test]
    fn a_removal_that_does_not_end_is_waited_for_only_to_the_bound() {
        let removals = Removals::new();
        let _stuck = removals.begin(A);
        let started = Instant::now();
        assert_eq!(
            removals.wait(A, Duration::from_millis(30)),
            Err(Duration::from_millis(30))
        );
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_file_is_known_by_its_inode_whatever_its_path() {
        let dir = std::env::temp_dir().join(format!("lifeline-removals-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
        std::fs::write(&a, b"x").unwrap();
        std::fs::hard_link(&a, &b).unwrap();
        std::fs::write(&c, b"x").unwrap();
        assert_eq!(File::of(&a).unwrap(), File::of(&b).unwrap());
        assert_ne!(File::of(&a).unwrap(), File::of(&c).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
