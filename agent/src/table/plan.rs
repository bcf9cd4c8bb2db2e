//! The sampler's plan: which connections a round reads (`sample_targets`), when a quiet
//! connection is due again (`Connection::sample_due_at`), and the quiet connections' due times
//! the table keeps, earliest first (`Upcoming`), so that a round costs no walk, and a time
//! that moved costs no read of its connection when it comes.
use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    time::{Duration, Instant},
};

use lifeline_common::tcp_state;

use super::{
    ConnId, Connection, ConnectionTable, Map, Sample, Set, Tuple, LOOKED_SAMPLE_EVERY, QUIET_AFTER,
    QUIET_EVERY,
};

/// A sample is due this much before [`QUIET_EVERY`] is over (rounds are about a second apart,
/// not exactly).
const QUIET_SLACK: Duration = Duration::from_millis(500);

/// Quiet connections' due times, earliest first (see `ConnectionTable::upcoming`).
#[derive(Debug, Default)]
pub(super) struct Upcoming {
    /// Every time planned that has not come yet, earliest first; a time that moved stays
    /// here until it comes (a heap cannot move an entry).
    times: BinaryHeap<Reverse<(Instant, ConnId)>>,
    /// Each planned connection's latest time: an entry of `times` that is not its
    /// connection's latest is dropped when it comes without reading the connection. A busy
    /// node's watches move their times with every event they receive (each a look), so most
    /// entries that come are such; the connection is cold by then (~0.5 µs a read, against a
    /// lookup in this compact map).
    latest: Map<ConnId, Instant>,
}

impl Upcoming {
    /// Connection `id` is due at `at`, no longer at any time planned for it before.
    fn plan(&mut self, id: ConnId, at: Instant) {
        self.times.push(Reverse((at, id)));
        self.latest.insert(id, at);
    }

    /// Connection `id` has no time planned any more (it is due every round).
    fn unplan(&mut self, id: ConnId) {
        self.latest.remove(&id);
    }

    /// Entries kept, the stale ones included.
    fn len(&self) -> usize {
        self.times.len()
    }

    /// The next connection whose latest planned time has come by `now`, taken out of the plan.
    fn next_due(&mut self, now: Instant) -> Option<ConnId> {
        while let Some(&Reverse((at, id))) = self.times.peek() {
            if at > now {
                return None;
            }
            self.times.pop();
            if self.latest.get(&id) == Some(&at) {
                self.latest.remove(&id);
                return Some(id);
            }
        }
        None
    }
}

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
                upcoming.plan(*id, at);
                false
            });
            while let Some(id) = upcoming.next_due(now) {
                let Some(c) = conns.get(&id).filter(|c| c.tuple.local.port() != 0) else {
                    continue; // gone
                };
                match c.sample_due_at(now) {
                    at if at <= now => {
                        if self.busy.insert(id) {
                            targets.push(c.tuple);
                        }
                    }
                    // Every change of its time is planned as it happens (`plan_sample`); one
                    // that was not is planned here rather than lost.
                    at => upcoming.plan(id, at),
                }
            }
            return (!targets.is_empty()).then_some(targets);
        }
        let mut upcoming = Upcoming::default();
        let mut targets = Vec::new();
        self.namespaces.clear();
        self.busy.clear();
        for (id, c) in self.conns.iter().filter(|(_, c)| c.tuple.local.port() != 0) {
            self.namespaces.insert(c.tuple.netns);
            let at = c.sample_due_at(now);
            if at > now {
                upcoming.plan(*id, at);
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
    /// comes, and is then dropped unread). A plan grown to many times the table (segments
    /// moving the same connections' times faster than they come) is dropped for a walk.
    pub(super) fn plan_sample(&mut self, id: ConnId, at: Instant, now: Instant) {
        if at <= now {
            self.busy.insert(id);
            if let Some(upcoming) = self.upcoming.as_mut() {
                upcoming.unplan(id);
            }
            return;
        }
        self.busy.remove(&id);
        let bound = UPCOMING_PER_CONNECTION * self.conns.len() + 1024;
        if let Some(upcoming) = self.upcoming.as_mut() {
            upcoming.plan(id, at);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_that_moved_comes_once_at_its_latest() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut plan = Upcoming::default();
        // Connection 1 is looked at twice (its time moves later), 2 once, 3 planned and then
        // due every round (unplanned).
        plan.plan(1, t0 + s(5));
        plan.plan(2, t0 + s(6));
        plan.plan(3, t0 + s(4));
        plan.plan(1, t0 + s(9));
        plan.unplan(3);
        assert_eq!(plan.next_due(t0 + s(3)), None, "nothing has come");
        assert_eq!(
            plan.next_due(t0 + s(7)),
            Some(2),
            "1's first time is stale, 3 unplanned"
        );
        assert_eq!(plan.next_due(t0 + s(7)), None);
        assert_eq!(plan.next_due(t0 + s(9)), Some(1));
        assert_eq!(plan.next_due(t0 + s(60)), None, "each came once");
        assert_eq!(plan.len(), 0);
        // A time planned again, equal to one already kept, still comes once.
        plan.plan(4, t0 + s(10));
        plan.plan(4, t0 + s(10));
        assert_eq!(plan.next_due(t0 + s(10)), Some(4));
        assert_eq!(plan.next_due(t0 + s(10)), None);
    }
}
