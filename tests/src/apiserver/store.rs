//! The object store: every object of every kind in its internal form, one global
//! resourceVersion sequence (as etcd's), a bounded history of changes for watches that resume
//! from a resourceVersion, and a broadcast of live changes.
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::kinds::{self, Kind};
use super::util::{rfc3339, unix_now};

/// How many changes the watch history keeps.
const HISTORY: usize = 4096;

/// One change of one object.
#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    pub kind: Kind,
    /// ADDED, MODIFIED or DELETED.
    pub verb: &'static str,
    /// The object after the change (for DELETED: as it was, with the deletion's
    /// resourceVersion).
    pub object: Arc<Value>,
    /// The object before the change (MODIFIED and DELETED).
    pub prev: Option<Arc<Value>>,
}

fn key(object: &Value) -> (String, String) {
    let m = &object["metadata"];
    (
        m["namespace"].as_str().unwrap_or("").to_string(),
        m["name"].as_str().unwrap_or("").to_string(),
    )
}

pub struct Store {
    /// The newest resourceVersion.
    pub rv: u64,
    /// Watches may start from any resourceVersion >= this.
    pub oldest: u64,
    /// Every object, per kind, sorted by (namespace, name) as etcd lists them.
    objects: BTreeMap<Kind, Vec<Value>>,
    history: VecDeque<Change>,
    /// How many `web-*` pod modifications were made.
    pub tick: u64,
    /// Start time of this process (seconds since the epoch), for the generated objects.
    pub start_secs: u64,
    /// How many uids were handed out.
    uids: u64,
    changes: broadcast::Sender<Change>,
}

impl Store {
    pub fn new() -> Store {
        let now = unix_now();
        let base = now.as_millis() as u64;
        let (changes, _) = broadcast::channel(1024);
        Store {
            rv: base,
            oldest: base,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            tick: 0,
            start_secs: now.as_secs(),
            uids: 1000,
            changes,
        }
    }

    /// Live changes from now on. Subscribe under the same lock as a snapshot is taken, to get
    /// exactly the changes after it.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    pub fn list(&self, kind: Kind) -> &[Value] {
        self.objects.get(&kind).map_or(&[], Vec::as_slice)
    }

    fn position(&self, kind: Kind, ns: &str, name: &str) -> Result<usize, usize> {
        let wanted = (ns, name);
        self.list(kind).binary_search_by(|o| {
            let (ons, oname) = key(o);
            (ons.as_str(), oname.as_str()).cmp(&wanted)
        })
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<&Value> {
        let i = self.position(kind, ns, name).ok()?;
        self.list(kind).get(i)
    }

    /// Changes of `kind` after `rv` from the history; None if `rv` is older than the history.
    pub fn since(&self, rv: u64, kind: Kind) -> Option<Vec<Change>> {
        if rv < self.oldest {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|c| c.rv > rv && c.kind == kind)
                .cloned()
                .collect(),
        )
    }

    fn record(&mut self, kind: Kind, verb: &'static str, object: Value, prev: Option<Value>) {
        let change = Change {
            rv: self.rv,
            kind,
            verb,
            object: Arc::new(object),
            prev: prev.map(Arc::new),
        };
        if self.history.len() == HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.oldest = old.rv;
            }
        }
        self.history.push_back(change.clone());
        // Sent under the lock: a watch that subscribes under the same lock sees exactly the
        // changes after its snapshot.
        let _ = self.changes.send(change);
    }

    /// A fresh uid.
    pub fn new_uid(&mut self) -> String {
        self.uids += 1;
        kinds::uid(self.start_secs, self.uids)
    }

    /// Adds a new object (the caller checked it does not exist): fills in uid,
    /// creationTimestamp and resourceVersion, records ADDED, and returns the stored object.
    pub fn insert(&mut self, kind: Kind, mut object: Value) -> Value {
        self.rv += 1;
        let meta = &mut object["metadata"];
        if !meta["uid"].is_string() {
            self.uids += 1;
            meta["uid"] = json!(kinds::uid(self.start_secs, self.uids));
        }
        if !meta["creationTimestamp"].is_string() {
            meta["creationTimestamp"] = json!(rfc3339(unix_now().as_secs()));
        }
        meta["resourceVersion"] = json!(self.rv.to_string());
        let (ns, name) = key(&object);
        let at = match self.position(kind, &ns, &name) {
            Ok(i) | Err(i) => i,
        };
        self.objects.entry(kind).or_default().insert(at, object.clone());
        self.record(kind, "ADDED", object.clone(), None);
        object
    }

    /// Replaces an existing object (same namespace and name): a new resourceVersion, MODIFIED.
    /// Returns the stored object, or None if there is no such object.
    pub fn replace(&mut self, kind: Kind, mut object: Value) -> Option<Value> {
        let (ns, name) = key(&object);
        let i = self.position(kind, &ns, &name).ok()?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let slot = &mut self.objects.get_mut(&kind)?[i];
        let prev = std::mem::replace(slot, object.clone());
        self.record(kind, "MODIFIED", object.clone(), Some(prev));
        Some(object)
    }

    /// Deletes an object: DELETED with the deletion's resourceVersion. Returns it as it was.
    pub fn remove(&mut self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let i = self.position(kind, ns, name).ok()?;
        let prev = self.objects.get_mut(&kind)?.remove(i);
        self.rv += 1;
        let mut object = prev.clone();
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(kind, "DELETED", object, Some(prev.clone()));
        Some(prev)
    }

    /// Modifies the next `web-*` pod that still exists (round robin): a new counter label and
    /// annotation. Nothing if every one is gone.
    pub fn modify_next_web_pod(&mut self) {
        for _ in 0..kinds::PODS {
            self.tick += 1;
            let i = (self.tick as usize - 1) % kinds::PODS;
            let Some(pod) = self.get(Kind::Pod, kinds::NAMESPACE, &format!("web-{i}")) else {
                continue;
            };
            let mut pod = pod.clone();
            let tick = self.tick.to_string();
            pod["metadata"]["labels"]["lifeline.test/counter"] = json!(tick);
            pod["metadata"]["annotations"]["lifeline.test/modified-at"] =
                json!(rfc3339(unix_now().as_secs()));
            self.replace(Kind::Pod, pod);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(ns: &str, name: &str) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}})
    }

    #[test]
    fn keeps_order_versions_and_history() {
        let mut store = Store::new();
        let mut rx = store.subscribe();
        let first = store.rv;
        store.insert(Kind::Pod, obj("default", "b"));
        store.insert(Kind::Pod, obj("default", "a"));
        store.insert(Kind::Pod, obj("abc", "z"));
        store.insert(Kind::Event, obj("default", "e"));
        let names: Vec<String> = store.list(Kind::Pod).iter().map(|o| key(o).1).collect();
        assert_eq!(names, ["z", "a", "b"]);
        let mut modified = store.get(Kind::Pod, "default", "a").unwrap().clone();
        modified["spec"] = json!({"x": 1});
        let stored = store.replace(Kind::Pod, modified).unwrap();
        assert_eq!(stored["metadata"]["resourceVersion"], (first + 5).to_string());
        assert!(store.replace(Kind::Pod, obj("default", "nope")).is_none());
        let gone = store.remove(Kind::Pod, "default", "b").unwrap();
        assert_eq!(gone["metadata"]["resourceVersion"], (first + 1).to_string());
        assert!(store.get(Kind::Pod, "default", "b").is_none());
        let verbs: Vec<&str> = store
            .since(first, Kind::Pod)
            .unwrap()
            .iter()
            .map(|c| c.verb)
            .collect();
        assert_eq!(verbs, ["ADDED", "ADDED", "ADDED", "MODIFIED", "DELETED"]);
        assert_eq!(store.since(first + 4, Kind::Event).unwrap().len(), 0);
        assert!(store.since(first - 1, Kind::Pod).is_none());
        let mut rvs = Vec::new();
        while let Ok(c) = rx.try_recv() {
            rvs.push(c.rv - first);
        }
        assert_eq!(rvs, [1, 2, 3, 4, 5, 6]);
    }
}
