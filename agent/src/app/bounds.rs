//! The agent's memory with every node-level bound of its table and metrics filled at once
//! (issue 25), measured through the pipeline as the agent runs it: kernel records into the
//! table, the judge's snapshot, the metrics and the API's listing. Heap bytes of the test's
//! own thread (`testkit::heap`), printed; `cargo xtask bench` shows the figures. The
//! `neighbours` suite measures the whole agent's RSS at the bound of open streams with real
//! clients.
use std::collections::BTreeMap;

use crate::{
    act::metrics::{Metrics, RESOURCES_PER_CLIENT, RESOURCES_PER_NODE},
    health::{judge::Judge, snapshot::no_pod, State},
    kernel::{
        events::{Frame, Header, HeaderField},
        probed::Visibility,
    },
    table::streams::{frame, MAX_OPEN_PER_NODE, MAX_PENDING, MAX_PENDING_PER_PROCESS},
    testkit::{
        heap::{self, Held},
        Lab,
    },
};

const MIB: f64 = 1024.0 * 1024.0;

/// A watch path as long as the kernel copies (`HEADER_VALUE_MAX`, 512 bytes): the most one
/// request can hold.
fn path(resource: usize, n: usize) -> String {
    let mut p = format!(
        "/apis/group-{resource}.example.com/v1/namespaces/namespace-{n}/resource-{resource}\
         ?allowWatchBookmarks=true&resourceVersion=1795833312577&timeoutSeconds=540&watch=true\
         &labelSelector="
    );
    while p.len() < lifeline_common::HEADER_VALUE_MAX {
        p.push('x');
    }
    p
}

fn header(lab: &Lab, ms: u64, tgid: u32, goroutine: u64, field: HeaderField, value: String) -> Header {
    Header {
        at: lab.at(ms),
        tgid,
        goroutine,
        field,
        value,
        cut: false,
    }
}

fn headers_frame(
    lab: &Lab,
    ms: u64,
    (sk, tgid): (u64, u32),
    goroutine: u64,
    stream_id: u32,
    sent: bool,
) -> Frame {
    Frame {
        at: lab.at(ms),
        sk,
        tgid,
        goroutine,
        stream_id,
        frame_type: frame::HEADERS,
        // A GET's HEADERS end its side; the response's do not.
        flags: if sent { frame::END_STREAM } else { 0 },
        length: 40,
        sent,
        http1: false,
    }
}

#[test]
fn memory_at_the_nodes_bounds_of_streams_requests_and_labels() {
    // Clients enough to fill the node's resource labels at the per-client bound, their open
    // watches together the node's bound of streams, each on a resource of its own.
    let clients = RESOURCES_PER_NODE / RESOURCES_PER_CLIENT;
    let per_client = MAX_OPEN_PER_NODE / clients;
    let start = Held::now();
    let mut lab = Lab::new();
    for c in 0..clients {
        let (tgid, sk) = (1000 + c as u32, 0x10_0000 + c as u64);
        lab.connect(0, sk, 30000 + c as u16, tgid);
        for i in 0..per_client {
            let goroutine = 1 + i as u64;
            let resource = c * RESOURCES_PER_CLIENT + i % RESOURCES_PER_CLIENT;
            lab.table.apply_header(&header(
                &lab,
                10,
                tgid,
                goroutine,
                HeaderField::Method,
                "GET".into(),
            ));
            lab.table.apply_header(&header(
                &lab,
                10,
                tgid,
                goroutine,
                HeaderField::Path,
                path(resource, i),
            ));
            let stream = 1 + 2 * i as u32;
            lab.table
                .apply_frame(&headers_frame(&lab, 10, (sk, tgid), goroutine, stream, true));
            lab.table
                .apply_frame(&headers_frame(&lab, 20, (sk, tgid), goroutine, stream, false));
        }
    }
    let streams = Held::now();
    let table_streams = start.grown();
    // Requests encoded and never sent on a watched connection: the node's bound of them.
    for p in 0..MAX_PENDING / MAX_PENDING_PER_PROCESS {
        let tgid = 5000 + p as u32;
        for g in 0..MAX_PENDING_PER_PROCESS as u64 {
            lab.table
                .apply_header(&header(&lab, 30, tgid, g, HeaderField::Method, "GET".into()));
            lab.table.apply_header(&header(
                &lab,
                30,
                tgid,
                g,
                HeaderField::Path,
                path(9999, g as usize),
            ));
        }
    }
    let table_pending = streams.grown();
    let open: usize = lab.table.connections().map(|c| c.streams.open_count()).sum();
    assert_eq!(open, MAX_OPEN_PER_NODE, "the node's bound of streams filled");
    assert_eq!(
        lab.table.pending_len(),
        MAX_PENDING,
        "the node's bound of requests filled"
    );

    let mut judge = Judge::new(Default::default(), Default::default());
    let followed = |_| Visibility::Streams {
        client: "Go HTTP/2 client (go1.24.4)".into(),
    };
    let before = Held::now();
    let snap = judge.tick(&lab.table, &BTreeMap::new(), &no_pod, &followed, lab.at(1_000));
    let snapshot = before.grown();
    assert!(snap
        .clients
        .iter()
        .filter(|c| c.key.0 < 5000)
        .all(|c| c.verdict.state == State::Healthy));

    let metrics = Metrics::new("test", "test").expect("registry");
    let before = Held::now();
    metrics.update(&snap);
    let series = before.grown();
    heap::reset_peak();
    let before = Held::now();
    let text = metrics.render().expect("render");
    let rendering = heap::peak_above(before);
    let labels: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("lifeline_client_watches{"))
        .filter_map(|l| l.split("resource=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        labels.len(),
        RESOURCES_PER_NODE,
        "the node's bound of resource labels filled"
    );
    let exposition = text.len();
    drop(text);

    heap::reset_peak();
    let before = Held::now();
    let listing = serde_json::to_string(&crate::serve::views::clients(&snap)).expect("json");
    let api = heap::peak_above(before);
    let listing_len = listing.len();
    drop(listing);

    let kept = table_streams + table_pending + snapshot + series;
    // `cargo xtask bench` reads these lines.
    eprintln!(
        "memory at the node's bounds: {MAX_OPEN_PER_NODE} open streams {:.1} MiB in the table \
         ({:.0} B a stream, with its request and {clients} connections)",
        table_streams / MIB,
        table_streams / MAX_OPEN_PER_NODE as f64
    );
    eprintln!(
        "memory at the node's bounds: {MAX_PENDING} requests waiting {:.1} MiB ({:.0} B each)",
        table_pending / MIB,
        table_pending / MAX_PENDING as f64
    );
    eprintln!(
        "memory at the node's bounds: the judge's snapshot {:.1} MiB, {RESOURCES_PER_NODE} resource \
         labels' series {:.1} MiB",
        snapshot / MIB,
        series / MIB
    );
    eprintln!(
        "memory at the node's bounds: held {:.1} MiB; while serving, /metrics {:.1} MiB more \
         ({:.1} MiB of text), /api/v1/clients {:.1} MiB more ({:.1} MiB of JSON)",
        kept / MIB,
        rendering / MIB,
        exposition as f64 / MIB,
        api / MIB,
        listing_len as f64 / MIB
    );
    // Ceilings some 1.5 times what was measured when they were set (6.0, 3.0, 3.9, 2.4 and
    // 8.2 MiB): a structure that grows per entry (a path copied twice, a map that never
    // shrinks) crosses them.
    for (what, bytes, ceiling) in [
        ("open streams", table_streams, 9.0),
        ("requests waiting", table_pending, 4.5),
        ("snapshot", snapshot, 6.0),
        ("label series", series, 3.6),
        ("/api/v1/clients", api, 12.0),
    ] {
        assert!(
            bytes / MIB <= ceiling,
            "{what}: {:.1} MiB, over {ceiling} MiB",
            bytes / MIB
        );
    }
}
