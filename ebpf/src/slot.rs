//! Sealed slots: an array map used as a direct-mapped table of copies, each named by a key (an
//! address in the client: a goroutine, a `*tls.Conn`) and its process. One array load where a
//! lookup in an LRU hash map costs ~0.5–0.9 µs with a cold cache (benchmarks.md); the map
//! behind each table stays the record where a slot is not.
//!
//! Two CPUs may fill one slot at once for two keys. A slot is emptied first, named last, and
//! sealed with a hash of its key, process and value, so such a mix fails its seal and reads as
//! empty: never one key's value under another's name.

/// Slots per table: the top 9 bits of a multiplicative hash. 512 slots of 56 bytes or less,
/// with the map's header, stay under the 32 KiB that the kernel allocates from its direct map
/// rather than vmalloc.
pub(crate) const SLOTS: u32 = 512;

/// A value a slot may hold: what of it enters the seal.
pub(crate) trait Sealed: Copy {
    fn mix(&self) -> u64;
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Slot<T> {
    /// 0: empty.
    pub(crate) key: u64,
    pub(crate) tgid: u32,
    seal: u32,
    pub(crate) value: T,
}

/// The slot index of `hashed` (what the table is direct-mapped by).
#[inline(always)]
pub(crate) fn index(hashed: u64) -> u32 {
    (hashed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 55) as u32
}

#[inline(always)]
fn seal<T: Sealed>(key: u64, tgid: u32, value: &T) -> u32 {
    let mixed = key ^ u64::from(tgid) << 32 ^ value.mix();
    (mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// What `slot` holds, read whole at once, if it holds anything whole.
#[inline(always)]
pub(crate) fn read<T: Sealed>(slot: *mut Slot<T>) -> Option<Slot<T>> {
    // SAFETY: an array value, which lives as long as the map.
    let held = unsafe { core::ptr::read_volatile(slot) };
    (held.key != 0 && held.seal == seal(held.key, held.tgid, &held.value)).then_some(held)
}

/// Puts `value` of `key` and `tgid` in `slot`: emptied first, named last, every store in that
/// order.
#[inline(always)]
pub(crate) fn fill<T: Sealed>(slot: *mut Slot<T>, key: u64, tgid: u32, value: T) {
    // SAFETY: an array value, which lives as long as the map.
    unsafe {
        core::ptr::write_volatile(&raw mut (*slot).key, 0);
        core::ptr::write_volatile(&raw mut (*slot).value, value);
        core::ptr::write_volatile(&raw mut (*slot).tgid, tgid);
        core::ptr::write_volatile(&raw mut (*slot).seal, seal(key, tgid, &value));
        core::ptr::write_volatile(&raw mut (*slot).key, key);
    }
}

/// Empties `slot` if `key` holds it.
#[inline(always)]
pub(crate) fn empty<T>(slot: *mut Slot<T>, key: u64) {
    // SAFETY: an array value, which lives as long as the map.
    unsafe {
        if core::ptr::read_volatile(&raw const (*slot).key) == key {
            core::ptr::write_volatile(&raw mut (*slot).key, 0);
        }
    }
}
