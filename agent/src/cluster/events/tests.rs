use super::*;

fn pod(name: &str) -> EventTarget {
    EventTarget::Pod {
        namespace: "ops".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn wall(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_746_093_600 + secs, 0).expect("time")
}

struct Clock {
    t0: Instant,
    book: Book,
}

impl Clock {
    fn new(limits: Limits) -> Self {
        let t0 = Instant::now();
        Self {
            t0,
            book: Book::new(limits, t0),
        }
    }
    fn emit(&mut self, at: u64, target: EventTarget, reason: &str, message: &str) -> Admission {
        let now = self.t0 + Duration::from_secs(at);
        self.book
            .admit(now, wall(at as i64), target, reason, message, EventType::Warning)
    }
    fn flush(&mut self, at: u64) -> Vec<Write> {
        self.book.flush(self.t0 + Duration::from_secs(at))
    }
}

fn counts(writes: &[Write]) -> Vec<(String, u32)> {
    writes
        .iter()
        .map(|w| match w {
            Write::Create(r) => (format!("create {}", r.target.name()), r.count),
            Write::Update(r) => (format!("update {}", r.target.name()), r.count),
        })
        .collect()
}

#[test]
fn repeats_are_counted_into_one_event() {
    let mut c = Clock::new(Limits::default());
    let Admission::Write(Write::Create(first)) = c.emit(0, pod("a"), "LifelineClientDisconnected", "lost it")
    else {
        panic!("first occurrence is created");
    };
    assert_eq!((first.count, first.name.starts_with("a.")), (1, true));
    // Repeats within update_every (30 s) are only counted.
    assert_eq!(
        c.emit(5, pod("a"), "LifelineClientDisconnected", "lost it"),
        Admission::Counted
    );
    assert_eq!(
        c.emit(10, pod("a"), "LifelineClientDisconnected", "lost it"),
        Admission::Counted
    );
    assert!(c.flush(20).is_empty(), "not due yet");
    // The flush writes the count once it is due.
    let w = c.flush(31);
    assert_eq!(counts(&w), [("update a".to_owned(), 3)]);
    let Write::Update(rec) = &w[0] else { unreachable!() };
    assert_eq!(
        (rec.name.as_str(), rec.first, rec.last),
        (first.name.as_str(), wall(0), wall(10))
    );
    assert!(c.flush(100).is_empty(), "nothing new");
    // A repeat after update_every is written at once.
    let Admission::Write(w) = c.emit(100, pod("a"), "LifelineClientDisconnected", "lost it") else {
        panic!("due update");
    };
    assert_eq!(counts(&[w]), [("update a".to_owned(), 4)]);
    // Another message, reason or target is another event.
    assert!(matches!(
        c.emit(101, pod("a"), "LifelineClientDisconnected", "other"),
        Admission::Write(Write::Create(_))
    ));
    assert!(matches!(
        c.emit(101, pod("a"), "LifelineReset", "lost it"),
        Admission::Write(Write::Create(_))
    ));
    assert!(matches!(
        c.emit(101, pod("b"), "LifelineClientDisconnected", "lost it"),
        Admission::Write(Write::Create(_))
    ));
    // After the window without repeats, it is a new event with a new name.
    let Admission::Write(Write::Create(again)) =
        c.emit(800, pod("a"), "LifelineClientDisconnected", "lost it")
    else {
        panic!("new event after the window");
    };
    assert_eq!(again.count, 1);
    assert_ne!(again.name, first.name);
}

#[test]
fn per_target_and_global_rate_limits() {
    let limits = Limits {
        per_target_burst: 3,
        per_target_every: Duration::from_secs(60),
        global_burst: 5,
        global_every: Duration::from_secs(10),
        ..Limits::default()
    };
    let mut c = Clock::new(limits);
    let created = |a: &Admission| matches!(a, Admission::Write(Write::Create(_)));
    for i in 0..3 {
        assert!(created(&c.emit(0, pod("a"), "R", &format!("m{i}"))), "{i}");
    }
    assert_eq!(
        c.emit(0, pod("a"), "R", "m3"),
        Admission::RateLimited,
        "pod a's burst is spent"
    );
    // A rate-limited event is not remembered: the next try is a creation again.
    assert_eq!(c.emit(1, pod("a"), "R", "m3"), Admission::RateLimited);
    assert!(created(&c.emit(1, pod("b"), "R", "m")));
    assert!(created(&c.emit(1, pod("c"), "R", "m")));
    assert_eq!(
        c.emit(1, pod("d"), "R", "m"),
        Admission::RateLimited,
        "global burst spent"
    );
    // The global bucket refills one per 10 s, pod a's one per 60 s.
    assert!(created(&c.emit(11, pod("d"), "R", "m")));
    assert_eq!(c.emit(40, pod("a"), "R", "m3"), Admission::RateLimited);
    assert!(created(&c.emit(61, pod("a"), "R", "m3")));
    // Updates take tokens too: a due count waits for one.
    assert_eq!(c.emit(61, pod("a"), "R", "m0"), Admission::Counted);
    assert!(c.flush(100).is_empty(), "pod a has no token left");
    assert_eq!(counts(&c.flush(130)), [("update a".to_owned(), 2)]);
}

#[test]
fn memory_is_bounded() {
    let mut c = Clock::new(Limits {
        max_tracked: 2,
        per_target_burst: 100,
        global_burst: 100,
        ..Limits::default()
    });
    for (i, m) in ["m0", "m1", "m2"].into_iter().enumerate() {
        assert!(matches!(
            c.emit(i as u64, pod("a"), "R", m),
            Admission::Write(Write::Create(_))
        ));
    }
    // m0 was forgotten to make room for m2: a repeat of it is created anew.
    assert!(matches!(
        c.emit(3, pod("a"), "R", "m0"),
        Admission::Write(Write::Create(_))
    ));
    assert_eq!(c.emit(4, pod("a"), "R", "m2"), Admission::Counted);
    assert_eq!(c.book.tracked.len(), 2);
}

#[test]
fn names_are_unique_and_bounded() {
    let mut book = Book::new(Limits::default(), Instant::now());
    let a = book.event_name("p", wall(0));
    let b = book.event_name("p", wall(0));
    assert_ne!(a, b);
    assert_eq!(
        a,
        format!("p.{:x}", wall(0).timestamp_nanos_opt().expect("nanos"))
    );
    let long = "x".repeat(300);
    assert_eq!(book.event_name(&long, wall(0)).len(), 253);
    assert_eq!(truncate("ééé", 3), "é");
    let msg = "m".repeat(2000);
    let Admission::Write(Write::Create(r)) =
        book.admit(Instant::now(), wall(0), pod("a"), "R", &msg, EventType::Normal)
    else {
        panic!("created")
    };
    assert_eq!(r.message.len(), MESSAGE_LIMIT);
}

fn record(target: EventTarget, count: u32) -> Record {
    Record {
        name: format!("{}.17f", target.name()),
        target,
        reason: "LifelineClientStale".into(),
        message: "no inbound payload for 95s".into(),
        type_: EventType::Warning,
        count,
        first: wall(0),
        last: DateTime::from_timestamp(1_746_093_660, 250_000_000).expect("time"),
    }
}

#[test]
fn events_v1_bodies() {
    let rec = record(pod("notifier"), 1);
    let body = create_body(EventsApi::EventsV1, &rec, "node-1", None);
    assert_eq!(
        body,
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "notifier.17f", "namespace": "ops"},
            "eventTime": "2025-05-01T10:00:00.000000Z",
            "reportingController": "lifeline.dev/agent", "reportingInstance": "node-1",
            "action": "Detect", "reason": "LifelineClientStale",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "ops", "name": "notifier", "uid": "uid-notifier"},
            "note": "no inbound payload for 95s", "type": "Warning",
        })
    );
    let rec = record(
        EventTarget::Node {
            name: "node-1".into(),
        },
        4,
    );
    let body = create_body(EventsApi::EventsV1, &rec, "node-1", Some("8f2e"));
    assert_eq!(body["metadata"]["namespace"], "default");
    assert_eq!(
        body["regarding"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "8f2e"})
    );
    assert_eq!(
        body["series"],
        json!({"count": 4, "lastObservedTime": "2025-05-01T10:01:00.250000Z"})
    );
    assert_eq!(
        update_patch(EventsApi::EventsV1, &rec),
        json!({"series": body["series"]})
    );
    assert_eq!(action_of("LifelineReset"), "ResetConnections");
    assert_eq!(action_of("LifelineRestart"), "Evict");
}

#[test]
fn core_v1_bodies() {
    let rec = record(pod("notifier"), 3);
    let body = create_body(EventsApi::CoreV1, &rec, "node-1", None);
    assert_eq!(
        body,
        json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "notifier.17f", "namespace": "ops"},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ops", "name": "notifier", "uid": "uid-notifier"},
            "reason": "LifelineClientStale", "message": "no inbound payload for 95s", "type": "Warning",
            "source": {"component": "lifeline", "host": "node-1"},
            "firstTimestamp": "2025-05-01T10:00:00Z", "lastTimestamp": "2025-05-01T10:01:00Z",
            "count": 3,
            "reportingComponent": "lifeline.dev/agent", "reportingInstance": "node-1",
        })
    );
    assert_eq!(
        update_patch(EventsApi::CoreV1, &rec),
        json!({"count": 3, "lastTimestamp": "2025-05-01T10:01:00Z"})
    );
    // A node's event lives in `default` and, without a known UID, uses the name.
    let node = create_body(
        EventsApi::CoreV1,
        &record(EventTarget::Node { name: "n".into() }, 1),
        "n",
        None,
    );
    assert_eq!(node["metadata"]["namespace"], "default");
    assert_eq!(node["involvedObject"]["uid"], "n");
}
