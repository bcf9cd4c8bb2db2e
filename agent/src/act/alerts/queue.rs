//! A receiver's bounded delivery queue. Pure data structure.
//!
//! It holds at most one entry per alert identity (label set): the newest state. A state that
//! arrives for a queued identity replaces it and moves to the back, so the front is the entry
//! that has waited longest since it last changed; that is the one dropped on overflow. Since an
//! identity is queued once and a receiver sends one batch at a time, a resolve can never
//! overtake its firing: it replaces it, or it is sent after it.
use std::collections::{BTreeMap, HashMap};

use crate::act::alerts::{Alert, Labels};

/// Alert identities waiting for delivery, oldest first.
#[derive(Debug)]
pub struct Queue {
    /// At most this many identities are held.
    capacity: usize,
    /// Identity → (position, newest state).
    entries: HashMap<Labels, (i64, Alert)>,
    /// Position → identity; ascending is delivery order.
    order: BTreeMap<i64, Labels>,
    /// Next position at the back (increasing) and at the front (decreasing).
    back: i64,
    front: i64,
}

impl Queue {
    /// A queue of at most `capacity` (at least 1) identities.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            back: 0,
            front: -1,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn contains(&self, labels: &Labels) -> bool {
        self.entries.contains_key(labels)
    }

    /// Queues the newest state of an alert at the back, replacing a queued older state of
    /// the same identity. Returns the alerts dropped from the front to stay within capacity.
    pub fn push(&mut self, alert: Alert) -> Vec<Alert> {
        let position = self.back;
        self.back += 1;
        self.place(position, alert);
        self.evict()
    }

    /// Takes up to `max` alerts from the front.
    pub fn take(&mut self, max: usize) -> Vec<Alert> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some((_, labels)) = self.order.pop_first() else {
                break;
            };
            let (_, alert) = self.entries.remove(&labels).expect("ordered entries exist");
            out.push(alert);
        }
        out
    }

    /// Puts back a batch that could not be delivered, at the front and in its order, except
    /// identities that got a newer state meanwhile (the newer one wins). Returns the alerts
    /// dropped from the front to stay within capacity.
    pub fn restore(&mut self, batch: Vec<Alert>) -> Vec<Alert> {
        for alert in batch.into_iter().rev() {
            if self.entries.contains_key(&alert.labels) {
                continue;
            }
            let position = self.front;
            self.front -= 1;
            self.place(position, alert);
        }
        self.evict()
    }

    fn place(&mut self, position: i64, alert: Alert) {
        if let Some((old, _)) = self.entries.get(&alert.labels) {
            self.order.remove(old);
        }
        self.order.insert(position, alert.labels.clone());
        self.entries.insert(alert.labels.clone(), (position, alert));
    }

    fn evict(&mut self) -> Vec<Alert> {
        let over = self.entries.len().saturating_sub(self.capacity);
        self.take(over)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn alert(id: &str, resolved: bool) -> Alert {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
        Alert {
            labels: Labels::from([("alertname".into(), id.into())]),
            annotations: Default::default(),
            starts_at: t,
            ends_at: resolved.then_some(t),
        }
    }

    fn ids(alerts: &[Alert]) -> Vec<(String, bool)> {
        alerts
            .iter()
            .map(|a| (a.name().to_owned(), a.ends_at.is_some()))
            .collect()
    }

    fn id(name: &str, resolved: bool) -> (String, bool) {
        (name.to_owned(), resolved)
    }

    #[test]
    fn holds_the_newest_state_per_identity_in_order_of_last_change() {
        let mut q = Queue::new(10);
        assert!(q.push(alert("a", false)).is_empty());
        q.push(alert("b", false));
        q.push(alert("a", true));
        assert_eq!(q.len(), 2);
        assert!(q.contains(&alert("a", false).labels));
        assert_eq!(ids(&q.take(10)), [id("b", false), id("a", true)]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn overflow_drops_the_oldest() {
        let mut q = Queue::new(2);
        q.push(alert("a", false));
        q.push(alert("b", false));
        q.push(alert("a", true)); // a moves to the back; b is now oldest
        assert_eq!(ids(&q.push(alert("c", false))), [id("b", false)]);
        assert_eq!(ids(&q.take(1)), [id("a", true)]);
        assert_eq!(ids(&q.take(5)), [id("c", false)]);
    }

    #[test]
    fn a_failed_batch_goes_back_in_front_unless_superseded() {
        let mut q = Queue::new(3);
        q.push(alert("a", false));
        q.push(alert("b", false));
        let batch = q.take(2);
        q.push(alert("c", false));
        q.push(alert("b", true)); // newer state while in flight
        assert!(q.restore(batch).is_empty());
        assert_eq!(ids(&q.take(10)), [id("a", false), id("c", false), id("b", true)]);
    }

    #[test]
    fn restoring_past_capacity_drops_the_oldest_which_are_the_restored() {
        let mut q = Queue::new(2);
        q.push(alert("a", false));
        q.push(alert("b", false));
        let batch = q.take(2);
        q.push(alert("c", false));
        q.push(alert("d", false));
        assert_eq!(ids(&q.restore(batch)), [id("a", false), id("b", false)]);
        assert_eq!(ids(&q.take(10)), [id("c", false), id("d", false)]);
    }
}
