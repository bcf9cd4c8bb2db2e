//! A process began running a program: tell userspace at once, so that it can put the Go-client
//! probes on the program before the process's first request (a client-go binary connects
//! 10–25 ms after its exec). Attached only while the Go-client probes are in use; one record
//! per exec, which costs far less than the exec itself.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use lifeline_common::{EventKind, ExecEvent};

use crate::{bump, counter, EVENTS, URGENT_WAKEUP};

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let Some(mut entry) = EVENTS.reserve::<ExecEvent>(0) else {
        // No socket's evidence is lost, only the chance to probe before the first request.
        bump(counter::LOST);
        return 0;
    };
    entry.write(ExecEvent {
        // SAFETY: helper with no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        kind: EventKind::Exec as u32,
        tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
    });
    entry.submit(URGENT_WAKEUP);
    bump(counter::SENT);
    0
}
