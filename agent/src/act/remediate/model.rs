//! The vocabulary of remediation: who is acted on ([`Client`]), what is done ([`Action`]), what
//! the policy decided ([`Decision`]) and what came of it ([`Outcome`]), with the label values
//! of `lifeline_remediations_total` and the human sentences of logs and Events.
use std::{
    fmt,
    time::{Duration, Instant},
};

use crate::{health::snapshot::ClientKey, health::State, table::Tuple};

/// A pod, by namespace and name (its UID, for Events, may be empty).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The client process a decision is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Client {
    pub pid: u32,
    /// Start time in clock ticks since boot: with `pid`, the process's identity.
    pub start_time: u64,
    pub comm: String,
    pub cmdline: String,
    /// The pod the process runs in; `None` for a host process.
    pub pod: Option<PodRef>,
}

impl Client {
    pub fn key(&self) -> ClientKey {
        (self.pid, self.start_time)
    }

    /// What survives a restart of this client, for the cooldown and the escalation: a pod by
    /// namespace/name, a host process by name and command line (its supervisor starts it
    /// again with a new pid).
    pub(super) fn subject(&self) -> Subject {
        match &self.pod {
            Some(pod) => Subject::Pod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            },
            None => Subject::Process {
                comm: self.comm.clone(),
                cmdline: self.cmdline.clone(),
            },
        }
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pod {
            Some(pod) => write!(f, "pod {pod} ({} pid {})", self.comm, self.pid),
            None => write!(f, "{} (pid {})", self.comm, self.pid),
        }
    }
}

/// A client's identity across restarts (see [`Client::subject`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Subject {
    /// Not by UID: the pod that replaces an evicted one under the same name is the same client.
    Pod {
        namespace: String,
        name: String,
    },
    Process {
        comm: String,
        cmdline: String,
    },
}

/// What the policy needs to know about one judged client at one tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFacts {
    pub client: Client,
    /// The client may be remediated (pod annotation `lifeline.dev/remediate: "true"`, or a
    /// selector): decided by the caller.
    pub opted_in: bool,
    pub state: State,
    /// When the client entered `state`.
    pub since: Instant,
    /// The judge's sentence about the state.
    pub reason: String,
    /// Its established apiserver connections that are stale or blackholed: what a reset
    /// destroys.
    pub suspect: Vec<Tuple>,
    /// Its endpoint, when that endpoint is unreachable from the node right now (an apiserver
    /// outage: neither a restart nor a re-dial can help).
    pub endpoint_down: Option<String>,
}

/// The two kinds of action (the `action` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Reset,
    Restart,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Reset => "reset",
            ActionKind::Restart => "restart",
        }
    }
}

/// What a restart acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Evicted through the Eviction API (PodDisruptionBudgets honoured).
    Pod(PodRef),
    /// Signalled, if the pid still belongs to the process that started at `start_time`.
    Process { pid: u32, start_time: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Destroy these sockets (`SOCK_DESTROY`) so the client re-dials.
    Reset { tuples: Vec<Tuple> },
    /// Restart the client.
    Restart { target: Target },
}

impl Action {
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::Reset { .. } => ActionKind::Reset,
            Action::Restart { .. } => ActionKind::Restart,
        }
    }

    /// A restart of `client`: its pod if it has one, else the process itself.
    pub fn restart_of(client: &Client) -> Self {
        let target = match &client.pod {
            Some(pod) => Target::Pod(pod.clone()),
            None => Target::Process {
                pid: client.pid,
                start_time: client.start_time,
            },
        };
        Action::Restart { target }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 3;
        match self {
            Action::Reset { tuples } => {
                let plural = if tuples.len() == 1 { "" } else { "s" };
                write!(f, "reset of {} connection{plural} (", tuples.len())?;
                for (i, t) in tuples.iter().take(SHOWN).enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{} -> {}", t.local, t.remote)?;
                }
                if tuples.len() > SHOWN {
                    write!(f, ", {} more", tuples.len() - SHOWN)?;
                }
                f.write_str(")")
            }
            Action::Restart {
                target: Target::Pod(pod),
            } => write!(f, "restart (eviction) of pod {pod}"),
            Action::Restart {
                target: Target::Process { pid, .. },
            } => write!(f, "restart (signal) of pid {pid}"),
        }
    }
}

/// Why an apiserver outage holds actions back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutageCause {
    /// The client's endpoint is unreachable from the node.
    Endpoint { endpoint: String },
    /// The agent's own apiserver check fails.
    ApiserverCheck,
}

/// Why an action was not taken (the log line and Event say it; the metric says `skipped`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Neither the pod annotation nor a selector opts the client in.
    NotOptedIn,
    /// `unreachable` clients are never remediated (seed 003).
    Unreachable,
    /// The client needs a restart (it has no socket to reset) and the mode is `reset`.
    ResetOnly,
    /// The client's endpoint is unreachable, or the agent's own apiserver check fails.
    Outage(OutageCause),
    /// The client (by pod, or by name and command line) was acted on less than `cooldown` ago.
    Cooldown { remaining: Duration },
    /// The node's budget of actions per hour is spent.
    Budget { limit: u32 },
    /// The eviction was refused (PodDisruptionBudget, 429); it is retried later.
    Blocked(String),
    /// Nothing left to act on: sockets already closed, process exited, pod gone.
    Gone(String),
}

impl Skip {
    /// A short stable word for logs and filters.
    pub fn label(&self) -> &'static str {
        match self {
            Skip::NotOptedIn => "not_opted_in",
            Skip::Unreachable => "unreachable",
            Skip::ResetOnly => "mode",
            Skip::Outage(_) => "outage",
            Skip::Cooldown { .. } => "cooldown",
            Skip::Budget { .. } => "budget",
            Skip::Blocked(_) => "blocked",
            Skip::Gone(_) => "gone",
        }
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::NotOptedIn => f.write_str(
                "not opted in (pod annotation lifeline.dev/remediate: \"true\" or a remediation selector)",
            ),
            Skip::Unreachable => f.write_str(
                "unreachable clients are never remediated: a restart does not help while the endpoint is down",
            ),
            Skip::ResetOnly => f.write_str(
                "it has no connection to reset, and restarts need remediation mode restart",
            ),
            Skip::Outage(OutageCause::Endpoint { endpoint }) => write!(
                f,
                "apiserver outage: {endpoint} is unreachable from this node"
            ),
            Skip::Outage(OutageCause::ApiserverCheck) => {
                f.write_str("apiserver outage: the agent's own apiserver check fails")
            }
            Skip::Cooldown { remaining } => write!(
                f,
                "cooldown: acted on this client recently; next action possible in {}s",
                remaining.as_secs().max(1)
            ),
            Skip::Budget { limit } => {
                write!(f, "budget: the node's {limit} actions per hour are spent")
            }
            Skip::Blocked(why) => write!(f, "eviction blocked: {why}; retried later"),
            Skip::Gone(what) => write!(f, "nothing to act on: {what}"),
        }
    }
}

/// What the policy says about an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Take it.
    Act,
    /// Report it as if taken, do nothing (`dry_run` / `--dry-run`).
    DryRun,
    /// Do not take it.
    Skip(Skip),
}

/// One decision of the policy about one client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The tick that decided (identifies the decision when its outcome comes back).
    pub at: Instant,
    pub client: Client,
    pub action: Action,
    /// Why this action is the remedy: the client's state and the judge's sentence.
    pub reason: String,
    pub disposition: Disposition,
}

impl Decision {
    pub fn into_outcome(self, result: Resolution) -> Outcome {
        Outcome {
            at: self.at,
            client: self.client,
            action: self.action,
            reason: self.reason,
            result,
        }
    }
}

/// The decisions of one tick, in client order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
}

/// What came of a decision (the `result` label).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Taken; what exactly was done.
    Done(String),
    DryRun,
    Skipped(Skip),
    /// Tried and failed; the error with its causes.
    Failed(String),
}

impl Resolution {
    pub fn label(&self) -> &'static str {
        match self {
            Resolution::Done(_) => "done",
            Resolution::DryRun => "dry_run",
            Resolution::Skipped(_) => "skipped",
            Resolution::Failed(_) => "failed",
        }
    }
}

impl fmt::Display for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resolution::Done(what) => write!(f, "done ({what})"),
            Resolution::DryRun => f.write_str("dry run: not done"),
            Resolution::Skipped(why) => write!(f, "skipped: {why}"),
            Resolution::Failed(error) => write!(f, "failed: {error}"),
        }
    }
}

/// A decision and its result: one log line, one metric increment, one Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The tick that decided.
    pub at: Instant,
    pub client: Client,
    pub action: Action,
    pub reason: String,
    pub result: Resolution,
}

impl Outcome {
    /// The `reason` of the Kubernetes Event: `Lifeline{Reset,Restart}[DryRun|Skipped|Failed]`.
    pub fn event_reason(&self) -> &'static str {
        match (self.action.kind(), &self.result) {
            (ActionKind::Reset, Resolution::Done(_)) => "LifelineReset",
            (ActionKind::Reset, Resolution::DryRun) => "LifelineResetDryRun",
            (ActionKind::Reset, Resolution::Skipped(_)) => "LifelineResetSkipped",
            (ActionKind::Reset, Resolution::Failed(_)) => "LifelineResetFailed",
            (ActionKind::Restart, Resolution::Done(_)) => "LifelineRestart",
            (ActionKind::Restart, Resolution::DryRun) => "LifelineRestartDryRun",
            (ActionKind::Restart, Resolution::Skipped(_)) => "LifelineRestartSkipped",
            (ActionKind::Restart, Resolution::Failed(_)) => "LifelineRestartFailed",
        }
    }

    /// A failure is a `Warning` Event; everything else is `Normal`.
    pub fn is_failure(&self) -> bool {
        matches!(self.result, Resolution::Failed(_))
    }

    /// One line: `kcm (pid 7): reset of 1 connection (a -> b): done (…); reason: stale: …`.
    pub fn summary(&self) -> String {
        format!(
            "{}: {}: {}; reason: {}",
            self.client, self.action, self.result, self.reason
        )
    }
}
