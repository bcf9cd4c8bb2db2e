//! `lifeline check`: can the agent run on this kernel with these privileges? Each check is
//! tried for real (load and attach the programs, open sock_diag in another namespace) rather
//! than inferred from version numbers. Optional techniques are probed and reported only.
//!
//! Privileges follow `privileges::REQUIREMENTS`, as `lifeline run` does: FAIL (exit 1) only for
//! what the agent cannot run without; WARN for what leaves it running blind (and not ready);
//! info for what only an optional mode needs, and for what it does not need at all.
use std::{fmt::Write as _, path::Path};

use aya::{programs::ProgramType, sys::is_program_supported};

use crate::{
    endpoint::{Endpoint, EndpointSet, Source},
    host::netns,
    host::privileges::{Blind, Capabilities, Without, REQUIREMENTS},
    host::process::Procfs,
    host::redact::escape_controls,
    host::sock_diag::DiagSocket,
    kernel::{
        offsets,
        programs::{Probes, TRACEPOINTS},
    },
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(String),
    /// The agent cannot run (`run` refuses to start).
    Fail(String),
    /// The agent runs degraded: blind to something, `/readyz` failing.
    Warn(String),
    /// Optional, or only an optional mode is limited: reported, never fatal.
    Info(String),
}

pub struct Report {
    pub items: Vec<(&'static str, Outcome)>,
}

impl Report {
    pub fn can_run(&self) -> bool {
        !self.items.iter().any(|(_, o)| matches!(o, Outcome::Fail(_)))
    }

    fn degraded(&self) -> bool {
        self.items.iter().any(|(_, o)| matches!(o, Outcome::Warn(_)))
    }

    /// What is missing, in one line: the name and reason of each FAIL.
    fn missing(&self) -> String {
        let fails: Vec<String> = self
            .items
            .iter()
            .filter_map(|(name, o)| match o {
                Outcome::Fail(why) => Some(format!("{name} ({})", escape_controls(why))),
                _ => None,
            })
            .collect();
        format!("missing {}", fails.join("; "))
    }

    /// The report, control characters escaped (it quotes process names and kernel errors).
    pub fn render(&self) -> String {
        let mut out = String::from("lifeline check\n");
        for (name, outcome) in &self.items {
            let (tag, text) = match outcome {
                Outcome::Ok(t) => ("ok  ", t),
                Outcome::Fail(t) => ("FAIL", t),
                Outcome::Warn(t) => ("WARN", t),
                Outcome::Info(t) => ("info", t),
            };
            let _ = writeln!(out, "  [{tag}] {name:<22} {}", escape_controls(text));
        }
        let verdict = match (self.can_run(), self.degraded()) {
            (false, _) => format!("the agent cannot run here: {}", self.missing()),
            (true, true) => {
                "the agent can run here, degraded: blind to what WARN says, and /readyz fails".into()
            }
            (true, false) => "the agent can run here".into(),
        };
        let _ = writeln!(out, "{verdict}");
        out
    }
}

fn outcome<T, E: std::error::Error>(r: Result<T, E>, ok: impl FnOnce(T) -> String) -> Outcome {
    match r {
        Ok(v) => Outcome::Ok(ok(v)),
        Err(e) => Outcome::Fail(crate::error::chain(&e)),
    }
}

/// One line per privileged need ([`REQUIREMENTS`]): present, or what its absence costs.
fn privileges(caps: Capabilities) -> Vec<(&'static str, Outcome)> {
    REQUIREMENTS
        .iter()
        .map(|r| {
            let needs = r.needs();
            let outcome = match (r.satisfied(caps), r.without) {
                (_, Without::Nothing) => {
                    Outcome::Info(format!("{needs}: not needed; it would only {}", r.purpose))
                }
                (true, _) => Outcome::Ok(format!("{needs}: {}", r.purpose)),
                (false, Without::Refuse) => Outcome::Fail(format!("{needs} missing: cannot {}", r.purpose)),
                (false, Without::Blind(b)) => Outcome::Warn(format!(
                    "{needs} missing: cannot {}; the agent runs blind: {}",
                    r.purpose,
                    b.unseen()
                )),
                (false, Without::Mode(_)) => Outcome::Info(format!(
                    "{needs} missing: cannot {}; only remediation.mode reset and restart need it \
                     (refused at start-up when configured)",
                    r.purpose
                )),
                (false, Without::SignalOthers) => Outcome::Info(format!(
                    "{needs} missing: cannot {}; only remediation.mode restart of such processes needs it",
                    r.purpose
                )),
            };
            ("privileges", outcome)
        })
        .collect()
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

/// What this kernel gives the agent in its own way, and what it lacks with what that costs the
/// judgement: one info line each ([`offsets::fallbacks`], [`Probes::degradations`]), or one
/// line saying the kernel has everything. Never a refusal: what the agent cannot run without
/// fails above.
fn evidence(
    offsets: &lifeline_common::KernelOffsets,
    degradations: Vec<String>,
) -> Vec<(&'static str, Outcome)> {
    let lines: Vec<String> = offsets::fallbacks(offsets)
        .iter()
        .map(ToString::to_string)
        .chain(degradations)
        .collect();
    if lines.is_empty() {
        return vec![(
            "evidence",
            Outcome::Info("every field and program the agent reads is in this kernel".into()),
        )];
    }
    lines
        .into_iter()
        .map(|l| ("evidence", Outcome::Info(l)))
        .collect()
}

/// Runs every check. Must run inside a tokio runtime (program loading spawns a log task).
pub fn run() -> Report {
    let caps = Capabilities::current();
    let mut items = match caps {
        Ok(caps) => privileges(caps),
        Err(err) => vec![("privileges", Outcome::Fail(err.to_string()))],
    };
    items.push((
        "kernel BTF",
        match std::fs::metadata(offsets::VMLINUX_BTF) {
            Ok(_) => Outcome::Ok(offsets::VMLINUX_BTF.to_owned()),
            Err(e) => Outcome::Fail(format!(
                "{}: {e} (CONFIG_DEBUG_INFO_BTF: the structure offsets come from it)",
                offsets::VMLINUX_BTF
            )),
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
            Err(e) => Outcome::Fail(crate::error::chain(e)),
        },
    ));
    if let Ok(offsets) = &discovered {
        let start = std::time::Instant::now();
        // Attached for one endpoint on port 1, so the port filter is tried too.
        let mut probe_endpoint = EndpointSet::default();
        probe_endpoint.insert(Endpoint::exact([127, 0, 0, 1].into(), 1), Source::Flag);
        let attached =
            Probes::load(offsets, lifeline_common::STREAM_BUDGET).and_then(|(mut probes, _feed)| {
                probes.set_endpoints(&probe_endpoint)?;
                Ok((probes.attachment(), probes.degradations()))
            });
        let degradations = attached.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
        items.push((
            "load + attach",
            outcome(attached, |(how, _)| {
                format!(
                    "programs attached ({how}), ring buffer ready in {} ms (detached again)",
                    start.elapsed().as_millis()
                )
            }),
        ));
        items.extend(evidence(offsets, degradations));
    }
    items.push((
        "sock_diag",
        outcome(
            DiagSocket::open().and_then(|s| s.dump(libc::AF_INET as u16, !0)),
            |found| format!("netlink inet_diag answers ({} IPv4 sockets here)", found.len()),
        ),
    ));
    // Enter another namespace if there is one.
    let namespaces = netns::enumerate();
    let own = netns::netns_inode(Path::new("/proc/self/ns/net")).ok();
    let other = namespaces.iter().find(|(inode, _)| Some(*inode) != own);
    items.push((
        "other netns",
        match other {
            None => Outcome::Info(
                "only this network namespace on this node: nothing to enter (entering one takes \
                 CAP_SYS_ADMIN)"
                    .into(),
            ),
            Some((_, target)) => match DiagSocket::open_in(target) {
                Ok(_) => Outcome::Ok(format!(
                    "setns + sock_diag via {} ({} network namespaces on this node)",
                    target.display(),
                    namespaces.len()
                )),
                Err(err) => Outcome::Warn(format!(
                    "{}; the agent runs blind: {}",
                    crate::error::chain(&err),
                    Blind::OtherNetns.unseen()
                )),
            },
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::privileges::Cap;

    fn report(caps: Capabilities) -> Report {
        Report {
            items: privileges(caps),
        }
    }

    fn lines_tagged(r: &Report, tag: &str) -> Vec<String> {
        r.render()
            .lines()
            .filter(|l| l.contains(tag))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn only_what_the_agent_cannot_run_without_fails() {
        // This VM's root: everything but CAP_SYS_RESOURCE, which is not needed.
        let root = report(Capabilities::ALL.without(&[Cap::SysResource]));
        assert!(root.can_run());
        assert_eq!(
            lines_tagged(&root, "[FAIL]").len() + lines_tagged(&root, "[WARN]").len(),
            0
        );
        let info = lines_tagged(&root, "[info]");
        assert!(
            info.iter().any(|l| l.contains("CAP_SYS_RESOURCE: not needed")),
            "{info:?}"
        );
        assert!(root.render().ends_with("the agent can run here\n"));

        let no_net_admin = report(Capabilities::ALL.without(&[Cap::NetAdmin]));
        assert!(no_net_admin.can_run(), "{}", no_net_admin.render());
        let info = lines_tagged(&no_net_admin, "CAP_NET_ADMIN missing");
        assert!(
            info[0].contains("[info]") && info[0].contains("reset and restart"),
            "{info:?}"
        );

        let no_kill = report(Capabilities::ALL.without(&[Cap::Kill]));
        assert!(no_kill.can_run());
        assert!(lines_tagged(&no_kill, "CAP_KILL missing")[0].contains("[info]"));

        for (cap, blind) in [
            (Cap::SysAdmin, "other network namespaces"),
            (Cap::SysPtrace, "older than the agent"),
        ] {
            let r = report(Capabilities::ALL.without(&[cap]));
            assert!(r.can_run(), "{}", r.render());
            let warn = lines_tagged(&r, "[WARN]");
            assert_eq!(warn.len(), 1, "{}", r.render());
            assert!(
                warn[0].contains(cap.name()) && warn[0].contains(blind),
                "{warn:?}"
            );
            assert!(r.render().contains("degraded"), "{}", r.render());
        }

        let cannot_load = report(Capabilities::ALL.without(&[Cap::Bpf, Cap::SysAdmin]));
        assert!(!cannot_load.can_run());
        let fail = lines_tagged(&cannot_load, "[FAIL]");
        assert!(
            fail[0].contains("CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN missing"),
            "{fail:?}"
        );
        let verdict = cannot_load.render().lines().last().unwrap().to_owned();
        assert_eq!(
            verdict,
            "the agent cannot run here: missing privileges (CAP_BPF and CAP_PERFMON, or \
             CAP_SYS_ADMIN missing: cannot load and attach the eBPF programs)",
        );
    }

    #[test]
    fn a_kernel_without_what_the_agent_needs_is_named_in_the_verdict() {
        let r = Report {
            items: vec![
                ("privileges", Outcome::Ok("all".into())),
                (
                    "kernel BTF",
                    Outcome::Fail("/sys/kernel/btf/vmlinux: No such file or directory".into()),
                ),
                ("sock_diag", Outcome::Ok("answers".into())),
            ],
        };
        assert!(!r.can_run());
        assert_eq!(
            r.render().lines().last(),
            Some(
                "the agent cannot run here: missing kernel BTF (/sys/kernel/btf/vmlinux: No such file \
                 or directory)"
            )
        );
    }

    #[test]
    fn what_a_kernel_lacks_is_listed_with_its_cost_and_never_fails() {
        let offsets = lifeline_common::KernelOffsets::default();
        let lines = evidence(
            &offsets,
            vec!["inet_sk_error_report not available (ENOENT): counted as timeout".into()],
        );
        let text: Vec<String> = lines
            .iter()
            .map(|(name, o)| match o {
                Outcome::Info(t) => format!("{name}: {t}"),
                other => panic!("not info: {other:?}"),
            })
            .collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text[0].starts_with("evidence: tcp/tcp_retransmit_skb has no family field"),
            "{text:?}"
        );
        assert!(text[1].contains("counted as timeout"), "{text:?}");
        let mut full = lifeline_common::KernelOffsets::default();
        full.retransmit.family = 72;
        assert_eq!(
            evidence(&full, Vec::new()),
            [(
                "evidence",
                Outcome::Info("every field and program the agent reads is in this kernel".into())
            )]
        );
        let report = Report { items: lines };
        assert!(report.can_run() && !report.render().contains("degraded"));
    }

    #[test]
    fn the_report_escapes_what_it_quotes() {
        let r = Report {
            items: vec![("/proc", Outcome::Ok("pid 1 is a\nFAKE [ok  ]\u{1b}[2J".into()))],
        };
        let text = r.render();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(!text.contains('\u{1b}'));
    }
}
