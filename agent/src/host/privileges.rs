//! Which privileges the agent has, and what each missing one costs. One table
//! ([`REQUIREMENTS`]) decides, per capability, whether the agent refuses to start, runs blind
//! to something (degraded: `/readyz` fails, `lifeline_agent_blind{what}` is 1, the reason is
//! logged), or only cannot use an optional mode. `lifeline run` and `lifeline check` read the
//! same table, so they never disagree.
//!
//! A missing privilege must never turn into a wrong verdict: what the agent cannot read is
//! reported as blindness, not as a client's silence.
use std::{collections::BTreeMap, fmt, sync::Mutex};

use prometheus::{Encoder, IntGaugeVec, Opts, Registry, TextEncoder};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the agent's capabilities (CapEff in /proc/self/status): {0}")]
    Status(String),
    #[error("cannot {what}: needs {needs} (run as root, or grant it)")]
    Refused { what: &'static str, needs: String },
    #[error(
        "remediation.mode {mode} needs {cap} ({why}); grant it, or set remediation.mode: none or \
         dry_run: true"
    )]
    Remediation {
        mode: &'static str,
        cap: &'static str,
        why: &'static str,
    },
    #[error("metric lifeline_agent_blind: {0}")]
    Metric(#[source] prometheus::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The capabilities lifeline cares about (bit numbers of `linux/capability.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    DacOverride = 1,
    DacReadSearch = 2,
    Kill = 5,
    NetAdmin = 12,
    SysPtrace = 19,
    SysAdmin = 21,
    SysResource = 24,
    Perfmon = 38,
    Bpf = 39,
}

impl Cap {
    pub fn name(self) -> &'static str {
        match self {
            Cap::DacOverride => "CAP_DAC_OVERRIDE",
            Cap::DacReadSearch => "CAP_DAC_READ_SEARCH",
            Cap::Kill => "CAP_KILL",
            Cap::NetAdmin => "CAP_NET_ADMIN",
            Cap::SysPtrace => "CAP_SYS_PTRACE",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::SysResource => "CAP_SYS_RESOURCE",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::Bpf => "CAP_BPF",
        }
    }
}

/// An effective capability set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// The agent's own effective set.
    pub fn current() -> Result<Self> {
        let status =
            std::fs::read_to_string("/proc/self/status").map_err(|e| Error::Status(e.to_string()))?;
        Self::from_status(&status).ok_or_else(|| Error::Status("no valid CapEff line".into()))
    }

    /// `CapEff:` of a `/proc/<pid>/status` text.
    pub fn from_status(status: &str) -> Option<Self> {
        let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
        u64::from_str_radix(hex.trim(), 16).ok().map(Self)
    }

    /// Every capability (root with nothing dropped).
    #[cfg(test)]
    pub const ALL: Capabilities = Capabilities(u64::MAX);

    pub fn has(self, cap: Cap) -> bool {
        self.0 & (1 << cap as u32) != 0
    }

    #[cfg(test)]
    pub fn without(self, caps: &[Cap]) -> Self {
        Self(caps.iter().fold(self.0, |set, cap| set & !(1 << *cap as u32)))
    }
}

/// Something the agent cannot see for want of a privilege.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Blind {
    /// Connections in other network namespaces (pods that are not on the host network) are not
    /// found by the scan nor sampled.
    OtherNetns,
    /// The owners of connections the agent did not see being opened (all connections older than
    /// the agent) are unknown: those clients are not listed.
    SocketOwners,
}

impl Blind {
    pub const ALL: [Blind; 2] = [Blind::OtherNetns, Blind::SocketOwners];

    /// The `what` label of `lifeline_agent_blind`.
    pub fn label(self) -> &'static str {
        match self {
            Blind::OtherNetns => "other_netns",
            Blind::SocketOwners => "socket_owners",
        }
    }

    /// What the agent cannot see, in a sentence.
    pub fn unseen(self) -> &'static str {
        match self {
            Blind::OtherNetns => {
                "connections in other network namespaces (pods not on the host network) are neither \
                 found nor sampled"
            }
            Blind::SocketOwners => {
                "connections older than the agent cannot be tied to their processes, so those \
                 clients are not listed"
            }
        }
    }
}

/// A remediation as the host sees it: what it does to a client (`remediation.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// Destroys the client's sockets.
    Reset,
    /// Restarts it: evicts its pod, or signals a host process.
    Restart,
}

/// What a missing requirement costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Without {
    /// The agent cannot work: `run` refuses to start, `check` fails.
    Refuse,
    /// The agent runs degraded, blind to this.
    Blind(Blind),
    /// Only this remediation mode is impossible; `run` refuses it when configured.
    Mode(Remedy),
    /// Only restarts of host processes owned by other users fail.
    SignalOthers,
    /// Nothing: listed so that `check` can say it is not needed.
    Nothing,
}

/// One thing the agent does that takes privileges.
pub struct Requirement {
    /// What it is for.
    pub purpose: &'static str,
    /// Alternatives: satisfied when every capability of at least one of them is present.
    pub any_of: &'static [&'static [Cap]],
    pub without: Without,
}

impl Requirement {
    pub fn satisfied(&self, caps: Capabilities) -> bool {
        self.any_of.iter().any(|set| set.iter().all(|c| caps.has(*c)))
    }

    /// `CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN`.
    pub fn needs(&self) -> String {
        self.any_of
            .iter()
            .map(|set| set.iter().map(|c| c.name()).collect::<Vec<_>>().join(" and "))
            .collect::<Vec<_>>()
            .join(", or ")
    }
}

/// Everything the agent needs privileges for, and what it costs to lack each.
pub const REQUIREMENTS: [Requirement; 7] = [
    Requirement {
        purpose: "load and attach the eBPF programs",
        any_of: &[&[Cap::Bpf, Cap::Perfmon], &[Cap::SysAdmin]],
        without: Without::Refuse,
    },
    Requirement {
        purpose: "enter other network namespaces (setns) to scan and sample their sockets",
        any_of: &[&[Cap::SysAdmin]],
        without: Without::Blind(Blind::OtherNetns),
    },
    Requirement {
        purpose: "read /proc/<pid>/fd of other processes to find who holds a socket (and hold a \
                  starting client-go process still while its probes go in)",
        any_of: &[&[Cap::SysPtrace]],
        without: Without::Blind(Blind::SocketOwners),
    },
    Requirement {
        purpose: "list /proc/<pid>/fd of processes of other users",
        any_of: &[&[Cap::DacReadSearch], &[Cap::DacOverride]],
        without: Without::Blind(Blind::SocketOwners),
    },
    Requirement {
        purpose: "destroy sockets (netlink SOCK_DESTROY) for remediation.mode reset and restart",
        any_of: &[&[Cap::NetAdmin]],
        without: Without::Mode(Remedy::Reset),
    },
    Requirement {
        purpose: "signal host processes of other users for remediation.mode restart",
        any_of: &[&[Cap::Kill]],
        without: Without::SignalOthers,
    },
    Requirement {
        purpose: "raise RLIMIT_MEMLOCK (kernels >= 5.11 charge eBPF memory to the cgroup instead)",
        any_of: &[&[Cap::SysResource]],
        without: Without::Nothing,
    },
];

/// What the agent can do with `caps`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assessment {
    /// Requirements without which the agent cannot run: (purpose, needs).
    pub refused: Vec<(&'static str, String)>,
    /// What it is blind to, with the reason.
    pub blind: BTreeMap<Blind, String>,
    /// Remediation is limited: `reset` (and so `restart`) impossible.
    pub no_socket_destroy: bool,
    /// Host processes of other users cannot be signalled.
    pub no_signal_others: bool,
}

impl Assessment {
    pub fn of(caps: Capabilities) -> Self {
        let mut a = Assessment::default();
        for r in REQUIREMENTS.iter().filter(|r| !r.satisfied(caps)) {
            match r.without {
                Without::Refuse => a.refused.push((r.purpose, r.needs())),
                Without::Blind(b) => {
                    a.blind.entry(b).or_insert_with(|| {
                        format!("{} ({} missing: cannot {})", b.unseen(), r.needs(), r.purpose)
                    });
                }
                Without::Mode(_) => a.no_socket_destroy = true,
                Without::SignalOthers => a.no_signal_others = true,
                Without::Nothing => {}
            }
        }
        a
    }

    /// Refuses to start without the privileges the agent cannot work without.
    pub fn check_can_run(&self) -> Result<()> {
        match self.refused.first() {
            Some((what, needs)) => Err(Error::Refused {
                what,
                needs: needs.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses a remediation mode the agent could not carry out (a dry run needs nothing).
    pub fn check_remediation(&self, remedy: Option<Remedy>, dry_run: bool) -> Result<()> {
        let name = match remedy {
            None => return Ok(()),
            _ if dry_run => return Ok(()),
            Some(Remedy::Reset) => "reset",
            Some(Remedy::Restart) => "restart",
        };
        if self.no_socket_destroy {
            return Err(Error::Remediation {
                mode: name,
                cap: Cap::NetAdmin.name(),
                why: "it destroys the client's sockets with netlink SOCK_DESTROY",
            });
        }
        Ok(())
    }
}

/// What the running agent is blind to: read by `/readyz` and exported as
/// `lifeline_agent_blind{what}` (1 blind, 0 not; every `what` always present).
pub struct Blindness {
    reasons: Mutex<BTreeMap<Blind, String>>,
    registry: Registry,
    gauge: IntGaugeVec,
}

impl Blindness {
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        let gauge = IntGaugeVec::new(
            Opts::new(
                "lifeline_agent_blind",
                "1 while the agent cannot see what `what` names (other_netns, socket_owners) for \
                 want of a privilege; /readyz fails meanwhile",
            ),
            &["what"],
        )
        .map_err(Error::Metric)?;
        registry
            .register(Box::new(gauge.clone()))
            .map_err(Error::Metric)?;
        for b in Blind::ALL {
            gauge.with_label_values(&[b.label()]).set(0);
        }
        Ok(Self {
            reasons: Mutex::new(BTreeMap::new()),
            registry,
            gauge,
        })
    }

    /// Records that the agent is blind to `what`, and why (logged as an error once).
    pub fn set(&self, what: Blind, reason: String) {
        let mut reasons = self
            .reasons
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if reasons.get(&what) != Some(&reason) {
            tracing::error!(what = what.label(), "running blind: {reason}");
        }
        reasons.insert(what, reason);
        self.gauge.with_label_values(&[what.label()]).set(1);
    }

    /// Every current blindness with its reason.
    pub fn reasons(&self) -> Vec<(Blind, String)> {
        let reasons = self
            .reasons
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        reasons.iter().map(|(b, r)| (*b, r.clone())).collect()
    }

    /// The metric in Prometheus' text format.
    pub fn render(&self) -> Result<String> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(Error::Metric)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

impl fmt::Debug for Blindness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blindness")
            .field("reasons", &self.reasons())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_come_from_cap_eff() {
        let caps = Capabilities::from_status(
            "Name:\tx\nCapInh:\t0\nCapPrm:\t000001ffffffffff\nCapEff:\t0000000000200000\n",
        )
        .unwrap();
        assert!(caps.has(Cap::SysAdmin));
        assert!(!caps.has(Cap::SysPtrace));
        assert_eq!(Capabilities::from_status("Name:\tx\n"), None);
        assert!(Capabilities::current().is_ok());
    }

    #[test]
    fn root_with_everything_is_neither_refused_nor_blind() {
        assert_eq!(Assessment::of(Capabilities::ALL), Assessment::default());
        // This VM's root: no CAP_SYS_RESOURCE, and nothing is lost.
        assert_eq!(
            Assessment::of(Capabilities::ALL.without(&[Cap::SysResource])),
            Assessment::default()
        );
    }

    #[test]
    fn each_capability_has_its_own_consequence() {
        let all = Capabilities::ALL;
        // Loading: CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN.
        assert!(Assessment::of(all.without(&[Cap::Bpf])).refused.is_empty());
        let none = Assessment::of(all.without(&[Cap::Bpf, Cap::SysAdmin]));
        assert_eq!(none.refused.len(), 1);
        let err = none.check_can_run().unwrap_err().to_string();
        assert!(err.contains("CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN"), "{err}");

        let no_admin = Assessment::of(all.without(&[Cap::SysAdmin]));
        assert!(no_admin.check_can_run().is_ok());
        assert_eq!(no_admin.blind.keys().collect::<Vec<_>>(), [&Blind::OtherNetns]);
        assert!(no_admin.blind[&Blind::OtherNetns].contains("CAP_SYS_ADMIN missing"));

        let no_ptrace = Assessment::of(all.without(&[Cap::SysPtrace]));
        assert_eq!(no_ptrace.blind.keys().collect::<Vec<_>>(), [&Blind::SocketOwners]);
        assert!(no_ptrace.blind[&Blind::SocketOwners].contains("CAP_SYS_PTRACE missing"));
        let no_dac = Assessment::of(all.without(&[Cap::DacReadSearch, Cap::DacOverride]));
        assert_eq!(no_dac.blind.keys().collect::<Vec<_>>(), [&Blind::SocketOwners]);
        assert!(Assessment::of(all.without(&[Cap::DacReadSearch]))
            .blind
            .is_empty());

        let no_net_admin = Assessment::of(all.without(&[Cap::NetAdmin]));
        assert!(no_net_admin.check_can_run().is_ok() && no_net_admin.blind.is_empty());
        assert!(no_net_admin.check_remediation(None, false).is_ok());
        assert!(
            no_net_admin.check_remediation(Some(Remedy::Reset), true).is_ok(),
            "dry run"
        );
        for mode in [Remedy::Reset, Remedy::Restart] {
            let err = no_net_admin
                .check_remediation(Some(mode), false)
                .unwrap_err()
                .to_string();
            assert!(err.contains("needs CAP_NET_ADMIN"), "{err}");
        }

        let no_kill = Assessment::of(all.without(&[Cap::Kill]));
        assert!(no_kill.no_signal_others && no_kill.check_remediation(Some(Remedy::Restart), false).is_ok());
    }

    #[test]
    fn blindness_is_a_metric_per_what_and_a_reason() {
        let b = Blindness::new().unwrap();
        let text = b.render().unwrap();
        assert!(
            text.contains("lifeline_agent_blind{what=\"other_netns\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("lifeline_agent_blind{what=\"socket_owners\"} 0"),
            "{text}"
        );
        b.set(Blind::OtherNetns, "why".into());
        assert!(b
            .render()
            .unwrap()
            .contains("lifeline_agent_blind{what=\"other_netns\"} 1"));
        assert!(b
            .render()
            .unwrap()
            .contains("lifeline_agent_blind{what=\"socket_owners\"} 0"));
        assert_eq!(b.reasons(), vec![(Blind::OtherNetns, "why".to_owned())]);
    }
}
