//! The sampler's plan: which connections a round reads (`sample_targets`), when a quiet
//! connection is due again (`Connection::sample_due_at`), and the quiet connections' due times
//! the table keeps, earliest first (`Upcoming`), so that a round costs no walk.
use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    time::{Duration, Instant},
};

use lifeline_common::tcp_state;

use super::{
    ConnId, Connection, ConnectionTable, Sample, Set, Tuple, LOOKED_SAMPLE_EVERY, QUIET_AFTER, QUIET_EVERY,
};

/// A sample is due this much before [`QUIET_EVERY`] is over (rounds are about a second apart,
/// not exactly).
const QUIET_SLACK: Duration = Duration::from_millis(500);

/// Quiet connections' due times, earliest first (see `ConnectionTable::upcoming`).
pub(super) type Upcoming = BinaryHeap<Reverse<(Instant, ConnId)>>;

/// Entries of [`Upcoming`] per tracked connection beyond which the plan is walked again (each
/// look adds one; they leave as their times come, within [`QUIET_EVERY`] as a rule).
const UPCOMING_PER_CONNECTION: usize = 4;

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
    /// or, while it is quiet, [`QUIET_EVERY`] after the last look at it: the last sample, or a
    /// segment since that showed nothing outstanding, but no later than
    /// [`LOOKED_SAMPLE_EVERY`] after the sample. Only a change of the connection (an event, a
    /// sample) makes a quiet connection due sooner.
    pub fn sample_due_at(&self, now: Instant) -> Instant {
        match self.sampled_at {
            Some(at) if self.quiet(now) => match self.looked_at.filter(|look| *look > at) {
                // A look comes at any moment, not at a round: no slack for rounds' jitter (the
                // round that reads it comes within a second, well within SAMPLE_MAX_AGE).
                Some(look) => (look + QUIET_EVERY).min(at + LOOKED_SAMPLE_EVERY),
                None => at + QUIET_EVERY - QUIET_SLACK,
            },
            _ => now,
        }
    }
}

impl ConnectionTable {
    /// The tracked connections (with a complete tuple) whose sample is due at `now`, for the
    /// sampler (a dump it makes for them samples the others it finds too, at no extra cost);
    /// `None` when none is due and none changed since the last call said when one would be.
    /// Only the due ones are listed: most rounds read a few busy connections of thousands,
    /// and between walks only the busy ones (due every round) and the quiet ones whose time
    /// came are looked at, not the whole table (a node's watches receive events at any
    /// moment, each a look that moves its connection's time: the earliest is always near).
    pub fn sample_targets(&mut self, now: Instant) -> Option<Vec<Tuple>> {
        if let Some(upcoming) = self.upcoming.as_mut() {
            let mut targets = Vec::new();
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
                upcoming.push(Reverse((at, *id)));
                false
            });
            while let Some(&Reverse((at, id))) = upcoming.peek() {
                if at > now {
                    break;
                }
                upcoming.pop();
                // Gone, or due later by now: its new time is in the heap (see `plan_sample`).
                let Some(c) = conns.get(&id).filter(|c| c.tuple.local.port() != 0) else {
                    continue;
                };
                if c.sample_due_at(now) <= now && self.busy.insert(id) {
                    targets.push(c.tuple);
                }
            }
            return (!targets.is_empty()).then_some(targets);
        }
        let mut upcoming = Upcoming::new();
        let mut targets = Vec::new();
        self.namespaces.clear();
        self.busy.clear();
        for (id, c) in self.conns.iter().filter(|(_, c)| c.tuple.local.port() != 0) {
            self.namespaces.insert(c.tuple.netns);
            let at = c.sample_due_at(now);
            if at > now {
                upcoming.push(Reverse((at, *id)));
            } else {
                targets.push(c.tuple);
                self.busy.insert(*id);
            }
        }
        // The due ones' next samples are added as they are applied (`apply_sample`).
        self.upcoming = Some(upcoming);
        Some(targets)
    }

    /// Folds connection `id`'s next sample, due at `at` as seen at `now`, into the plan: due at
    /// once (it is not quiet), it is one of the busy connections every round reads; later, its
    /// time is added to the upcoming ones (a time it had before stays there, stale, until it
    /// comes). A plan grown to many times the table (segments moving the same connections'
    /// times faster than they come) is dropped for a walk.
    pub(super) fn plan_sample(&mut self, id: ConnId, at: Instant, now: Instant) {
        if at <= now {
            self.busy.insert(id);
            return;
        }
        self.busy.remove(&id);
        let bound = UPCOMING_PER_CONNECTION * self.conns.len() + 1024;
        if let Some(upcoming) = self.upcoming.as_mut() {
            upcoming.push(Reverse((at, id)));
            if upcoming.len() > bound {
                self.upcoming = None;
            }
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
        self.upcoming = None;
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
