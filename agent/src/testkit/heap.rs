//! Heap held by the current thread, for tests that measure what a structure costs: the test
//! binary's allocator counts each thread's allocations (requested sizes; the allocator's own
//! overhead, some 16 bytes an allocation, is not in them) and the most it held at once.
//! Memory freed by another thread than the one that allocated it is charged to the freer, so a
//! measurement builds and drops what it measures on its own thread.
use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

/// The system allocator, counting.
pub struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static ALLOCATIONS: Cell<isize> = const { Cell::new(0) };
}

fn add(bytes: isize, allocations: isize) {
    // During a thread's teardown its counters may be gone: that memory goes uncounted.
    let _ = HELD.try_with(|held| {
        let now = held.get() + bytes;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + allocations));
}

// SAFETY: every call is passed to the system allocator unchanged; only counted around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as isize, 1);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as isize, 1);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as isize), -1);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size as isize - layout.size() as isize, 0);
        }
        p
    }
}

/// What this thread holds now: bytes and live allocations.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub bytes: isize,
    pub allocations: isize,
}

impl Held {
    /// Now.
    pub fn now() -> Self {
        Self {
            bytes: HELD.with(Cell::get),
            allocations: ALLOCATIONS.with(Cell::get),
        }
    }

    /// Bytes held since `self`, with 16 bytes of the allocator's for each allocation.
    pub fn grown(self) -> f64 {
        let now = Self::now();
        ((now.bytes - self.bytes) + 16 * (now.allocations - self.allocations)) as f64
    }
}

/// Starts a new peak from what is held now.
pub fn reset_peak() {
    PEAK.with(|peak| peak.set(HELD.with(Cell::get)));
}

/// The most this thread held since [`reset_peak`], in bytes above `from`.
pub fn peak_above(from: Held) -> f64 {
    (PEAK.with(Cell::get) - from.bytes) as f64
}
