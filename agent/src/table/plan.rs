//! The sampler's plan: which connections a round reads (`sample_targets`), when a quiet
//! connection is due again (`Connection::sample_due_at`), and the earliest next due time the
//! table keeps (`next_sample_due`) so that a round of quiet connections costs no walk.
use std::time::{Duration, Instant};

use lifeline_common::tcp_state;

use super::{ConnId, Connection, ConnectionTable, Sample, Set, Tuple, QUIET_AFTER, QUIET_EVERY};

/// A sample is due this much before [`QUIET_EVERY`] is over (rounds are about a second apart,
/// not exactly).
const QUIET_SLACK: Duration = Duration::from_millis(500);

impl Connection {
    /// Whether it is quiet at `now` (see [`QUIET_AFTER`]): established, sampled, unchanged for
    /// a while, nothing pending.
    pub fn quiet(&self, now: Instant) -> bool {
        self.sampled_at.is_some()
            && self.tcp_state == tcp_state::ESTABLISHED
            && self.vanished_at.is_none()
            && !self.outstanding
            && self.stalled_since.is_none()
            && self.ordered.settled()
            && self
                .last_change
                .is_some_and(|c| now.saturating_duration_since(c) >= QUIET_AFTER)
    }

    /// When a sample of it is due, seen at `now`: at once (every round, about a second apart),
    /// or [`QUIET_EVERY`] after the last one while it is quiet. Only a change of the connection
    /// (an event, a sample) makes a quiet connection due sooner.
    pub fn sample_due_at(&self, now: Instant) -> Instant {
        match self.sampled_at {
            Some(at) if self.quiet(now) => at + QUIET_EVERY - QUIET_SLACK,
            _ => now,
        }
    }
}

impl ConnectionTable {
    /// The tracked connections (with a complete tuple) whose sample is due at `now`, for the
    /// sampler (a dump it makes for them samples the others it finds too, at no extra cost);
    /// `None` when none is due and none changed since the last call said when one would be.
    /// Only the due ones are listed: most rounds read a few busy connections of thousands,
    /// and until a quiet one is due only the busy ones (due every round) are looked at, not
    /// the whole table.
    pub fn sample_targets(&mut self, now: Instant) -> Option<Vec<Tuple>> {
        if self.next_sample_due.is_some_and(|at| now < at) {
            let mut targets = Vec::new();
            let mut next = self.next_sample_due;
            let conns = &self.conns;
            self.busy.retain(|id| {
                let Some(c) = conns.get(id).filter(|c| c.tuple.local.port() != 0) else {
                    return false;
                };
                let at = c.sample_due_at(now);
                if at <= now {
                    targets.push(c.tuple);
                    return true;
                }
                next = next.map(|n| n.min(at));
                false
            });
            self.next_sample_due = next;
            return (!targets.is_empty()).then_some(targets);
        }
        let mut next = None::<Instant>;
        let mut targets = Vec::new();
        self.namespaces.clear();
        self.busy.clear();
        for (id, c) in self.conns.iter().filter(|(_, c)| c.tuple.local.port() != 0) {
            self.namespaces.insert(c.tuple.netns);
            let at = c.sample_due_at(now);
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
            } else {
                targets.push(c.tuple);
                self.busy.insert(*id);
            }
        }
        // The due ones' next samples are folded in as they are applied (`apply_sample`).
        self.next_sample_due = Some(next.unwrap_or(now + QUIET_EVERY));
        Some(targets)
    }

    /// Folds connection `id`'s next sample, due at `at` as seen at `now`, into the plan: due at
    /// once (it is not quiet), it is one of the busy connections every round reads; later, the
    /// next walk comes no later than that.
    pub(super) fn plan_sample(&mut self, id: ConnId, at: Instant, now: Instant) {
        if at <= now {
            self.busy.insert(id);
        } else {
            self.busy.remove(&id);
            self.next_sample_due = self.next_sample_due.map(|n| n.min(at));
        }
    }

    /// The network namespaces of the tracked connections, as the last walk for the sampler
    /// ([`Self::sample_targets`]) found them.
    pub fn namespaces(&self) -> &Set<u64> {
        &self.namespaces
    }

    /// Some due connections could not be read (their namespace could not be entered, the
    /// kernel refused): the next round walks the table again instead of trusting the plan.
    pub fn unread_due(&mut self) {
        self.next_sample_due = None;
    }

    /// Applies one sampler result taken at `now`.
    pub fn apply_sample(&mut self, tuple: &Tuple, sample: Sample, now: Instant) {
        self.apply_sample_to(tuple, sample, now);
        // The sampled connection's next sample (gone: none), folded into the plan of the
        // walk that asked for it: no walk is needed to know it.
        let Some(&id) = self.by_tuple.get(tuple) else {
            return;
        };
        if let Some(at) = self.conns.get(&id).map(|c| c.sample_due_at(now)) {
            self.plan_sample(id, at, now);
        }
    }
}
