//! `lifeline check`: can the agent run on this kernel with these privileges? Each check is
//! tried for real (load and attach the programs, open sock_diag in another namespace) rather
//! than inferred from version numbers. Optional techniques are probed and reported only.
use std::{fmt::Write as _, path::Path};

use aya::{programs::ProgramType, sys::is_program_supported};

use crate::{
    endpoint::{Endpoint, EndpointSet, Source},
    kernel::{
        offsets,
        programs::{Probes, TRACEPOINTS},
    },
    netns,
    process::Procfs,
    sock_diag::DiagSocket,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(String),
    Fail(String),
    /// Optional: reported, never fatal.
    Info(String),
}

pub struct Report {
    pub items: Vec<(&'static str, Outcome)>,
}

impl Report {
    pub fn can_run(&self) -> bool {
        !self.items.iter().any(|(_, o)| matches!(o, Outcome::Fail(_)))
    }

    pub fn render(&self) -> String {
        let mut out = String::from("lifeline check\n");
        for (name, outcome) in &self.items {
            let (tag, text) = match outcome {
                Outcome::Ok(t) => ("ok  ", t),
                Outcome::Fail(t) => ("FAIL", t),
                Outcome::Info(t) => ("info", t),
            };
            let _ = writeln!(out, "  [{tag}] {name:<22} {text}");
        }
        let verdict = if self.can_run() {
            "the agent can run here"
        } else {
            "the agent cannot run here"
        };
        let _ = writeln!(out, "{verdict}");
        out
    }
}

fn outcome<T, E: std::error::Error>(r: Result<T, E>, ok: impl FnOnce(T) -> String) -> Outcome {
    match r {
        Ok(v) => Outcome::Ok(ok(v)),
        Err(e) => Outcome::Fail(crate::chain(&e)),
    }
}

/// Capabilities the agent uses, from `CapEff` in /proc/self/status.
fn capabilities() -> Outcome {
    const NEEDED: [(u32, &str); 4] = [
        (21, "CAP_SYS_ADMIN"),
        (12, "CAP_NET_ADMIN"),
        (19, "CAP_SYS_PTRACE"),
        (39, "CAP_BPF"),
    ];
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(eff) = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
    else {
        return Outcome::Fail("cannot read CapEff from /proc/self/status".into());
    };
    let missing: Vec<&str> = NEEDED
        .iter()
        .filter(|(bit, _)| eff & (1 << bit) == 0)
        .map(|(_, n)| *n)
        .collect();
    if missing.is_empty() {
        Outcome::Ok("CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_PTRACE, CAP_BPF".into())
    } else {
        Outcome::Fail(format!(
            "missing {} (run as root, or grant them)",
            missing.join(", ")
        ))
    }
}

fn optional_program(kind: ProgramType, what: &str) -> Outcome {
    match is_program_supported(kind) {
        Ok(true) => Outcome::Info(format!("{what}: available (optional; lifeline uses tracepoints)")),
        Ok(false) => Outcome::Info(format!(
            "{what}: not available (optional; lifeline uses tracepoints)"
        )),
        Err(err) => Outcome::Info(format!(
            "{what}: refused ({err}) (optional; lifeline uses tracepoints)"
        )),
    }
}

/// Runs every check. Must run inside a tokio runtime (program loading spawns a log task).
pub fn run() -> Report {
    let mut items = vec![("privileges", capabilities())];
    items.push((
        "kernel BTF",
        match std::fs::metadata(offsets::VMLINUX_BTF) {
            Ok(_) => Outcome::Ok(offsets::VMLINUX_BTF.to_owned()),
            Err(e) => Outcome::Fail(format!("{}: {e}", offsets::VMLINUX_BTF)),
        },
    ));
    let discovered = offsets::discover();
    items.push((
        "tracepoints + offsets",
        match &discovered {
            Ok(o) => Outcome::Ok(format!(
                "{} (sock_common.skc_net at {}, net.ns.inum at {})",
                TRACEPOINTS.map(|(_, c, n)| format!("{c}/{n}")).join(", "),
                o.sock_common_skc_net,
                o.net_ns_inum
            )),
            Err(e) => Outcome::Fail(crate::chain(e)),
        },
    ));
    if let Ok(offsets) = &discovered {
        let start = std::time::Instant::now();
        // Attached for one endpoint on port 1, so the port filter is tried too.
        let mut probe_endpoint = EndpointSet::default();
        probe_endpoint.insert(Endpoint::exact([127, 0, 0, 1].into(), 1), Source::Flag);
        let attached = Probes::load(offsets).and_then(|(mut probes, _feed)| {
            probes.set_endpoints(&probe_endpoint)?;
            Ok(probes.attachment())
        });
        items.push((
            "load + attach",
            outcome(attached, |how| {
                format!(
                    "programs attached ({how}), ring buffer ready in {} ms (detached again)",
                    start.elapsed().as_millis()
                )
            }),
        ));
    }
    items.push((
        "sock_diag",
        outcome(
            DiagSocket::open().and_then(|s| s.dump(libc::AF_INET as u16, !0)),
            |found| format!("netlink inet_diag answers ({} IPv4 sockets here)", found.len()),
        ),
    ));
    // Enter another namespace if there is one (else our own: the same code path).
    let namespaces = netns::enumerate();
    let own = netns::netns_inode(Path::new("/proc/self/ns/net")).ok();
    let target = namespaces
        .iter()
        .find(|(inode, _)| Some(*inode) != own)
        .map_or_else(
            || Path::new("/proc/self/ns/net").to_path_buf(),
            |(_, path)| path.clone(),
        );
    items.push((
        "other netns",
        outcome(DiagSocket::open_in(&target), |_| {
            format!(
                "setns + sock_diag via {} ({} network namespaces on this node)",
                target.display(),
                namespaces.len()
            )
        }),
    ));
    items.push((
        "/proc",
        outcome(Procfs::default().process(1), |p| {
            format!("process details readable (pid 1 is {})", p.comm)
        }),
    ));
    items.push(("fentry", optional_program(ProgramType::Tracing, "fentry/fexit")));
    let kprobe_pmu = Path::new("/sys/bus/event_source/devices/kprobe").exists();
    items.push((
        "kprobe",
        Outcome::Info(format!(
            "kprobes: {} (optional; lifeline uses tracepoints)",
            if kprobe_pmu {
                "available"
            } else {
                "not available (no kprobe PMU)"
            }
        )),
    ));
    Report { items }
}
