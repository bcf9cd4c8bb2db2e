//! The remediation policy (SPEC.md "Remediation"): which action, if any, each unhealthy client
//! gets at this tick. Pure: no sockets, no signals, no clock of its own (every call gets `now`).
//!
//! Per client state, in mode `reset` / `restart` (mode `none` decides nothing, not even skips):
//!
//! | state                    | `reset`                          | `restart`                                  |
//! |--------------------------|----------------------------------|--------------------------------------------|
//! | `stale`, `blackholed`    | reset its suspect sockets        | reset; restart if that did not help        |
//! | `disconnected`           | skipped (`mode`: nothing to reset) | restart                                  |
//! | `unreachable`            | skipped (`unreachable`)          | skipped (`unreachable`): never remediated  |
//!
//! Escalation: a client whose sockets were reset is restarted if, within the escalation window
//! (`cooldown`, at least 2 × [`ESCALATE_AFTER`]) after the reset, it is unhealthy *again*
//! (its state changed after the reset), or it is *still* in the same unhealthy state
//! [`ESCALATE_AFTER`] after the reset. That restart is the only action the cooldown lets
//! through; one reset and one restart per window at most.
//!
//! Guards, in order: opt-in; restarts only in mode `restart`; apiserver outage (no action on a
//! client whose endpoint is unreachable from the node, and none while the agent's own
//! apiserver check fails: neither a restart nor a re-dial brings an endpoint back); cooldown
//! per client; budget per node per sliding hour; then `dry_run` reports the action instead of taking it (and the policy
//! remembers it as taken, so a dry run shows exactly what a real run would do).
//!
//! Clients are remembered by what survives a restart: a pod by namespace/name, a host process
//! by name + command line. A restarted client that comes back unhealthy with a new pid is still
//! in cooldown, so there is never a restart storm.
//!
//! Every decision is reported once: a skip for the same client, action and reason is not
//! repeated tick after tick (it is again after the client was healthy or acted on). After an
//! action the client is left alone for [`ESCALATE_AFTER`] while its state is the one the action
//! addressed: the action needs time to show (a re-dial, a pod's termination grace).
use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

use super::model::{
    Action, ActionKind, ClientFacts, Decision, Disposition, OutageCause, Outcome, Plan, Resolution, Skip,
    Subject, Target,
};
use crate::{health::snapshot::ClientKey, health::State, host::privileges::Remedy};

/// How long an action has to show its effect: a client still in the state an action addressed
/// this long after it is judged again (a reset that did not help escalates to a restart).
pub const ESCALATE_AFTER: Duration = Duration::from_secs(60);
/// When an eviction refused by a PodDisruptionBudget (or 429) is tried again.
pub const BLOCKED_RETRY: Duration = Duration::from_secs(30);
/// The budget's sliding window.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(3600);

/// `remediation.mode`: what the agent does to an unhealthy client.
#[derive(Clone, Copy, Debug, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RemediationMode {
    #[default]
    None,
    Reset,
    Restart,
}

impl RemediationMode {
    /// What the mode does on the host, for the privilege check (none: nothing).
    pub fn remedy(self) -> Option<Remedy> {
        match self {
            Self::None => None,
            Self::Reset => Some(Remedy::Reset),
            Self::Restart => Some(Remedy::Restart),
        }
    }
}

/// The `remediation:` settings in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub mode: RemediationMode,
    /// Report actions instead of taking them.
    pub dry_run: bool,
    pub cooldown: Duration,
    pub budget_per_hour: u32,
}

impl Settings {
    /// After a reset, how long a client that is unhealthy again is restarted rather than reset.
    pub fn escalation_window(&self) -> Duration {
        self.cooldown.max(2 * ESCALATE_AFTER)
    }
}

/// The actions taken on one subject (pod, or host process by name + command line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Marks {
    /// The last action (taken or dry-run), for the cooldown.
    last: Option<(Instant, ActionKind)>,
    reset_at: Option<Instant>,
    restarted_at: Option<Instant>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Memory {
    marks: Marks,
    /// The marks before the action decided at the first instant, to undo it if it is blocked.
    undo: Option<(Instant, Marks)>,
    /// A blocked eviction is not tried again before this.
    retry_at: Option<Instant>,
}

/// The policy and its memory (cooldowns, escalations, the budget, what was reported).
///
/// Many clients unhealthy at once is no reason to hold back: behind a proxy that keeps dead
/// upstreams (seed 002) a whole node goes stale at once, and resets are what helps. Only an
/// endpoint that is unreachable (SPEC.md's outage) holds actions back. The budget still bounds
/// them.
#[derive(Debug)]
pub struct Remediator {
    settings: Settings,
    memory: HashMap<Subject, Memory>,
    /// When each action in the budget window was decided, oldest first.
    spent: VecDeque<Instant>,
    /// The last skip reported per client, so it is not repeated every tick.
    reported: HashMap<ClientKey, (ActionKind, &'static str)>,
}

impl Remediator {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            memory: HashMap::new(),
            spent: VecDeque::new(),
            reported: HashMap::new(),
        }
    }

    #[cfg(test)]
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// New settings (config reload); cooldowns, escalations and the budget carry over.
    pub fn set_settings(&mut self, settings: Settings) {
        self.settings = settings;
    }

    /// The decisions of this tick: `clients` are the judged clients (healthy ones included:
    /// their recovery ends what was reported about them, and each says whether its endpoint is
    /// unreachable), `apiserver_reachable` the agent's own apiserver check (`None`: unknown or
    /// no cluster).
    ///
    /// Decisions with [`Disposition::Act`] are remembered as taken: hand their outcomes back
    /// through [`Remediator::settle`].
    pub fn plan(&mut self, now: Instant, clients: &[ClientFacts], apiserver_reachable: Option<bool>) -> Plan {
        self.forget_old(now);
        let live: HashSet<ClientKey> = clients.iter().map(|c| c.client.key()).collect();
        self.reported.retain(|key, _| live.contains(key));
        if self.settings.mode == RemediationMode::None {
            return Plan::default();
        }
        let mut ordered: Vec<&ClientFacts> = clients.iter().collect();
        ordered.sort_by_key(|c| c.client.key());
        let decisions = ordered
            .into_iter()
            .filter_map(|facts| self.decide(now, facts, apiserver_reachable))
            .collect();
        Plan { decisions }
    }

    /// Takes note of an executed decision's outcome at `now`; returns whether to report it
    /// (a repeat of the skip last reported for that client is not reported).
    ///
    /// - `done`, `failed`: kept as taken (a failed action counts against cooldown and budget:
    ///   it may have half happened, and a failing action must not be retried every tick).
    /// - `skipped` because nothing was left to act on (`gone`): the budget is refunded.
    /// - `skipped` because the eviction was refused (`blocked`): refunded and undone, so it
    ///   does not count against cooldown or budget; it is tried again after [`BLOCKED_RETRY`].
    pub fn settle(&mut self, now: Instant, outcome: &Outcome) -> bool {
        let key = outcome.client.key();
        match &outcome.result {
            Resolution::Done(_) | Resolution::Failed(_) | Resolution::DryRun => {
                self.reported.remove(&key);
                true
            }
            Resolution::Skipped(Skip::Gone(_)) => {
                self.refund(outcome.at);
                self.reported.remove(&key);
                true
            }
            Resolution::Skipped(skip @ Skip::Blocked(_)) => {
                self.refund(outcome.at);
                let memory = self.memory.entry(outcome.client.subject()).or_default();
                if let Some((_, before)) = memory.undo.filter(|(at, _)| *at == outcome.at) {
                    memory.marks = before;
                    memory.undo = None;
                }
                memory.retry_at = Some(now + BLOCKED_RETRY);
                self.note_skip(key, outcome.action.kind(), skip)
            }
            Resolution::Skipped(skip) => self.note_skip(key, outcome.action.kind(), skip),
        }
    }

    fn decide(
        &mut self,
        now: Instant,
        facts: &ClientFacts,
        apiserver_reachable: Option<bool>,
    ) -> Option<Decision> {
        let key = facts.client.key();
        if facts.state == State::Healthy {
            self.reported.remove(&key);
            return None;
        }
        let subject = facts.client.subject();
        let memory = self.memory.get(&subject).copied().unwrap_or_default();
        if let Some((at, _)) = memory.marks.last {
            if at < now && facts.since <= at && now < at + ESCALATE_AFTER {
                return None; // the last action is still taking effect
            }
        }
        if memory.retry_at.is_some_and(|at| now < at) {
            return None; // a blocked eviction, reported already, waits for its retry
        }
        let decision = |action, reason, disposition| Decision {
            at: now,
            client: facts.client.clone(),
            action,
            reason,
            disposition,
        };
        let escalation = self.escalation(&memory.marks, facts, now);
        // An escalation is always a restart, and the one action the cooldown lets through.
        let escalating = escalation.is_some();
        let (action, reason) = match facts.state {
            State::Healthy => return None,
            State::Unreachable => {
                let reason = format!("{}: {}", facts.state, facts.reason);
                let action = Action::restart_of(&facts.client);
                return self.skip(decision(action, reason, Disposition::Skip(Skip::Unreachable)));
            }
            State::Stale | State::Blackholed => match escalation {
                Some(reason) => (Action::restart_of(&facts.client), reason),
                // Its sockets are already gone: the judge keeps the old state while the
                // disconnect grace runs; it re-dials, or is `disconnected` after the grace.
                None if facts.suspect.is_empty() => return None,
                None => (
                    Action::Reset {
                        tuples: facts.suspect.clone(),
                    },
                    format!("{}: {}; a reset makes it re-dial", facts.state, facts.reason),
                ),
            },
            State::Disconnected => (
                Action::restart_of(&facts.client),
                escalation.unwrap_or_else(|| {
                    format!("disconnected: {}; a restart makes it connect again", facts.reason)
                }),
            ),
        };
        let kind = action.kind();
        let same_step = memory.marks.last == Some((now, kind));
        if same_step
            && matches!(
                action,
                Action::Restart {
                    target: Target::Pod(_)
                }
            )
        {
            return None; // another process of the pod already has the pod evicted
        }
        let cooldown_left = memory
            .marks
            .last
            .map(|(at, _)| (at + self.settings.cooldown).saturating_duration_since(now))
            .filter(|left| !left.is_zero());
        let skip = if !facts.opted_in {
            Some(Skip::NotOptedIn)
        } else if kind == ActionKind::Restart && self.settings.mode != RemediationMode::Restart {
            Some(Skip::ResetOnly)
        } else if let Some(cause) = outage_cause(facts, apiserver_reachable) {
            Some(Skip::Outage(cause))
        } else if let Some(remaining) = cooldown_left.filter(|_| !same_step && !escalating) {
            Some(Skip::Cooldown { remaining })
        } else if self.spent.len() >= self.settings.budget_per_hour as usize {
            Some(Skip::Budget {
                limit: self.settings.budget_per_hour,
            })
        } else {
            None
        };
        if let Some(skip) = skip {
            return self.skip(decision(action, reason, Disposition::Skip(skip)));
        }
        self.spent.push_back(now);
        let memory = self.memory.entry(subject).or_default();
        if !same_step {
            memory.undo = Some((now, memory.marks));
        }
        memory.marks.last = Some((now, kind));
        match kind {
            ActionKind::Reset => memory.marks.reset_at = Some(now),
            ActionKind::Restart => memory.marks.restarted_at = Some(now),
        }
        memory.retry_at = None;
        let disposition = if self.settings.dry_run {
            self.reported.remove(&key);
            Disposition::DryRun
        } else {
            Disposition::Act
        };
        Some(decision(action, reason, disposition))
    }

    /// Why a restart is due for a client whose sockets were reset, if it is.
    fn escalation(&self, marks: &Marks, facts: &ClientFacts, now: Instant) -> Option<String> {
        if self.settings.mode != RemediationMode::Restart
            || !matches!(
                facts.state,
                State::Stale | State::Blackholed | State::Disconnected
            )
        {
            return None;
        }
        let reset = marks.reset_at?;
        if marks.restarted_at.is_some_and(|at| at >= reset)
            || now >= reset + self.settings.escalation_window()
        {
            return None;
        }
        let ago = now.saturating_duration_since(reset).as_secs();
        if facts.since > reset {
            Some(format!(
                "{} again after its connections were reset {ago}s ago: {}",
                facts.state, facts.reason
            ))
        } else if now >= reset + ESCALATE_AFTER {
            Some(format!(
                "still {} {ago}s after its connections were reset: {}",
                facts.state, facts.reason
            ))
        } else {
            None
        }
    }

    /// The skip decision, unless the same skip was the last thing reported for the client.
    fn skip(&mut self, decision: Decision) -> Option<Decision> {
        let Disposition::Skip(skip) = &decision.disposition else {
            return Some(decision);
        };
        self.note_skip(decision.client.key(), decision.action.kind(), skip)
            .then_some(decision)
    }

    fn note_skip(&mut self, key: ClientKey, kind: ActionKind, skip: &Skip) -> bool {
        let entry = (kind, skip.label());
        self.reported.insert(key, entry) != Some(entry)
    }

    fn refund(&mut self, at: Instant) {
        if let Some(i) = self.spent.iter().position(|t| *t == at) {
            self.spent.remove(i);
        }
    }

    fn forget_old(&mut self, now: Instant) {
        while self
            .spent
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= BUDGET_WINDOW)
        {
            self.spent.pop_front();
        }
        // The escalation window is at least the cooldown and ESCALATE_AFTER: nothing older
        // than it matters.
        let window = self.settings.escalation_window();
        self.memory.retain(|_, m| {
            m.retry_at.is_some_and(|at| now < at)
                || m.marks
                    .last
                    .is_some_and(|(at, _)| now.saturating_duration_since(at) < window)
        });
    }
}

/// Why an outage holds an action on this client back, if it does.
fn outage_cause(facts: &ClientFacts, apiserver_reachable: Option<bool>) -> Option<OutageCause> {
    if let Some(endpoint) = &facts.endpoint_down {
        return Some(OutageCause::Endpoint {
            endpoint: endpoint.clone(),
        });
    }
    (apiserver_reachable == Some(false)).then_some(OutageCause::ApiserverCheck)
}

#[cfg(test)]
mod tests;
