//! Everything that touches the kernel's eBPF side: finding this kernel's structure offsets,
//! loading and attaching the programs, the endpoint maps, and decoding ring-buffer events
//! (the pump that applies them to the connection table is `app::pump`).
use std::os::fd::AsRawFd;

use tokio::io::{unix::AsyncFd, Interest};

pub mod events;
pub mod filter;
pub mod go_probes;
pub mod golang;
pub mod head_start;
pub mod object;
pub mod offsets;
pub mod openssl;
pub mod probed;
pub mod programs;
pub mod removals;
pub mod ssl_probes;
pub mod uprobes;

/// Held by the tests that register or remove uprobes: removing one holds up every
/// registration on the node for 60–85 ms, which would land in the head start's timings.
#[cfg(test)]
pub static UPROBE_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Registers an fd-owning object (ring buffer, log buffer) with tokio for readability.
pub fn readable_fd<T: AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its fd; moving it into the AsyncFd keeps the fd open and unchanged
    // for the AsyncFd's whole lifetime.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}
