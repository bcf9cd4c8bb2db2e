use std::time::{Duration, Instant};

use super::{frame::*, request::Request, Loss, Streams};

const DATA: u8 = 0;

/// A connection whose reads are followed.
fn followed(t0: Instant) -> Streams {
    let mut s = Streams::default();
    s.apply(t0, false, READING, 0, 0, None);
    s
}

const STALE: Duration = Duration::from_secs(90);
const GRACE: Duration = Duration::from_secs(120);
const MAX_WATCH: Duration = Duration::from_secs(3600);

fn watch(timeout: u64, resource: &str) -> Request {
    Request::parse(
        "GET",
        &format!("/api/v1/{resource}?timeoutSeconds={timeout}&watch=true"),
        false,
    )
}

fn secs(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

#[test]
fn a_watch_that_ends_on_time_is_never_stuck() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    s.apply(t0, true, HEADERS, 0x4, 3, Some(watch(300, "pods")));
    s.apply(secs(t0, 0), false, HEADERS, 0x4, 3, None);
    s.apply(secs(t0, 100), false, DATA, 0, 3, None);
    assert!(s.visible());
    assert!(s.stuck(secs(t0, 300), STALE, GRACE, MAX_WATCH).is_empty());
    s.apply(secs(t0, 300), false, DATA, END_STREAM, 3, None);
    assert_eq!(s.open().count(), 0);
    assert_eq!(s.ended, 1);
    assert!(s.stuck(secs(t0, 3000), STALE, GRACE, MAX_WATCH).is_empty());
}

#[test]
fn a_watch_open_past_its_deadline_and_grace_with_nothing_since_is_stuck_and_named() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    s.apply(t0, true, HEADERS, 0x4, 5, Some(watch(494, "endpoints")));
    s.apply(t0, false, HEADERS, 0x4, 5, None);
    s.apply(secs(t0, 4), false, DATA, 0, 5, None);
    // Another stream of the same connection keeps flowing.
    s.apply(secs(t0, 1), true, HEADERS, 0x4, 7, Some(watch(500, "services")));
    s.apply(secs(t0, 1), false, HEADERS, 0x4, 7, None);
    assert!(
        s.stuck(secs(t0, 494 + 119), STALE, GRACE, MAX_WATCH).is_empty(),
        "within the grace"
    );
    let stuck = s.stuck(secs(t0, 494 + 120), STALE, GRACE, MAX_WATCH);
    assert_eq!(
        stuck.len(),
        1,
        "stream 7 is still within its own deadline + grace"
    );
    assert_eq!(stuck[0].stream, 5);
    assert_eq!(stuck[0].resource, "endpoints");
    assert_eq!(
        stuck[0].description,
        "watch endpoints (all namespaces): open 10m14s, due to end after 8m14s, nothing since 10m10s"
    );
    // Past its own deadline + grace, stream 7 (nothing since its headers) is stuck too.
    let both = s.stuck(secs(t0, 1 + 500 + 120), STALE, GRACE, MAX_WATCH);
    assert_eq!(both.iter().map(|s| s.stream).collect::<Vec<_>>(), [5, 7]);
}

#[test]
fn a_stream_that_still_receives_after_its_deadline_is_not_stuck() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    s.apply(t0, true, HEADERS, 0x4, 1, Some(watch(60, "pods")));
    s.apply(t0, false, HEADERS, 0x4, 1, None);
    s.apply(secs(t0, 70), false, DATA, 0, 1, None);
    assert!(s.stuck(secs(t0, 1000), STALE, GRACE, MAX_WATCH).is_empty());
}

#[test]
fn a_request_without_response_headers_is_stuck_after_stale_after() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    let lease = Request::parse(
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kcm?timeout=10s",
        false,
    );
    s.apply(t0, true, HEADERS, 0x4, 9, Some(lease));
    s.apply(t0, true, DATA, END_STREAM, 9, None);
    assert!(s.stuck(secs(t0, 89), STALE, GRACE, MAX_WATCH).is_empty());
    let stuck = s.stuck(secs(t0, 90), STALE, GRACE, MAX_WATCH);
    assert_eq!(stuck.len(), 1);
    assert!(stuck[0]
        .description
        .starts_with("update coordination.k8s.io/leases in kube-system: open 1m30s, no response headers"));
    s.apply(secs(t0, 91), false, HEADERS, 0x5, 9, None);
    assert_eq!(
        s.open().count(),
        0,
        "response headers with END_STREAM end the stream"
    );
}

#[test]
fn streams_older_than_lifeline_are_listed_never_judged() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    s.apply(t0, false, DATA, 0, 11, None);
    assert_eq!(s.open().count(), 1);
    assert!(s.open().next().unwrap().request.is_none());
    assert!(!s.visible(), "nothing sent seen yet");
    // A stream whose reads were not followed from its start is never judged either.
    let mut blind = Streams::default();
    blind.apply(t0, true, HEADERS, 0x4, 1, Some(watch(60, "pods")));
    assert!(blind.stuck(secs(t0, 100_000), STALE, GRACE, MAX_WATCH).is_empty());
    // Nor one open when the kernel lost its place.
    let mut lost = followed(t0);
    lost.apply(t0, true, HEADERS, 0x4, 1, Some(watch(60, "pods")));
    assert_eq!(
        lost.apply(t0, true, LOST_PLACE, 0, 0, None),
        Some(Loss::LostPlace)
    );
    assert!(lost.stuck(secs(t0, 100_000), STALE, GRACE, MAX_WATCH).is_empty());
    assert!(s.stuck(secs(t0, 100_000), STALE, GRACE, MAX_WATCH).is_empty());
}

#[test]
fn a_reader_said_again_is_a_reader_the_kernel_forgot_and_its_streams_are_not_judged() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    s.apply(t0, true, HEADERS, 0x4, 1, Some(watch(60, "pods")));
    // The kernel's entry for the reader was evicted: frames read meanwhile may be unseen.
    assert_eq!(
        s.apply(secs(t0, 1), false, READING, 0, 0, None),
        Some(Loss::ReaderForgotten)
    );
    assert!(s.stuck(secs(t0, 100_000), STALE, GRACE, MAX_WATCH).is_empty());
    // A stream begun after it is followed whole again.
    s.apply(secs(t0, 2), true, HEADERS, 0x4, 3, Some(watch(60, "pods")));
    let stuck = s.stuck(secs(t0, 2 + 60 + 121), STALE, GRACE, MAX_WATCH);
    assert_eq!(stuck.iter().map(|st| st.stream).collect::<Vec<_>>(), [3]);
    // The first reader after the preface marker is no loss.
    let mut fresh = Streams::default();
    fresh.apply(t0, true, FRESH, 0, 0, None);
    fresh.apply(t0, true, HEADERS, 0x4, 1, Some(watch(60, "pods")));
    assert_eq!(fresh.apply(t0, false, READING, 0, 0, None), None);
    assert_eq!(fresh.stuck(secs(t0, 60 + 121), STALE, GRACE, MAX_WATCH).len(), 1);
}

/// A connection with no frame seen had nothing to lose: a Go HTTP/1.1 connection (whose
/// writes are no frames: each loses the kernel's place), read by the goroutine of each body
/// in turn (a reader said again and again), is no loss; once frames were followed, it is.
#[test]
fn a_loss_is_said_only_on_a_connection_whose_frames_were_followed() {
    let t0 = Instant::now();
    let mut http1 = Streams::default();
    for at in 0..3 {
        assert_eq!(http1.apply(secs(t0, at), false, READING, 0, 0, None), None);
        assert_eq!(http1.apply(secs(t0, at), true, LOST_PLACE, 0, 0, None), None);
    }
    let mut s = followed(t0);
    assert_eq!(
        s.apply(t0, true, LOST_PLACE, 0, 0, None),
        None,
        "nothing followed yet"
    );
    s.apply(t0, true, HEADERS, 0x4, 1, Some(watch(60, "pods")));
    assert_eq!(s.apply(t0, true, LOST_PLACE, 0, 0, None), Some(Loss::LostPlace));
    assert_eq!(
        s.apply(t0, false, READING, 0, 0, None),
        Some(Loss::ReaderForgotten)
    );
}

#[test]
fn a_reset_either_way_ends_the_stream_and_memory_is_bounded() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    s.apply(t0, true, HEADERS, 0x4, 1, Some(watch(300, "pods")));
    s.apply(t0, true, RST_STREAM, 0, 1, None);
    assert_eq!(s.open().count(), 0);
    for id in 0..(super::MAX_OPEN as u32 + 100) {
        s.apply(t0, true, HEADERS, 0x4, 2 * id + 3, Some(watch(300, "pods")));
    }
    assert_eq!(s.open().count(), super::MAX_OPEN);
    assert_eq!(s.dropped, 100);
}

#[test]
fn a_connection_begun_under_the_probes_has_its_first_stream_judged() {
    let t0 = Instant::now();
    let mut s = Streams::default();
    s.apply(t0, true, FRESH, 0, 0, None);
    s.apply(t0, true, HEADERS, 0x4, 1, Some(watch(3, "pods")));
    // The reader's own marker may come after the first request: no matter.
    s.apply(t0, false, READING, 0, 0, None);
    s.apply(t0, false, HEADERS, 0x4, 1, None);
    assert!(s.visible());
    assert_eq!(s.stuck(secs(t0, 3 + 120), STALE, GRACE, MAX_WATCH).len(), 1);
}

fn list(resource: &str) -> Request {
    Request::parse("GET", &format!("/api/v1/{resource}?limit=500"), false)
}

#[test]
fn a_response_begun_and_never_finished_is_stuck_after_stale_after_of_nothing() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    s.apply(t0, true, HEADERS, 0x5, 3, Some(list("configmaps")));
    s.apply(secs(t0, 1), false, HEADERS, 0x4, 3, None);
    // A large answer streams: alive as long as frames come, however long it takes.
    for t in 2..200 {
        s.apply(secs(t0, t), false, DATA, 0, 3, None);
    }
    assert!(s.stuck(secs(t0, 199 + 89), STALE, GRACE, MAX_WATCH).is_empty());
    // The client's own frames (WINDOW_UPDATE) are not an answer.
    s.apply(secs(t0, 250), true, 8, 0, 3, None);
    let stuck = s.stuck(secs(t0, 199 + 90), STALE, GRACE, MAX_WATCH);
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].resource, "configmaps");
    assert_eq!(stuck[0].evidence, secs(t0, 199 + 90));
    assert_eq!(
        stuck[0].description,
        "list configmaps (all namespaces): open 4m49s, its response begun and unfinished, nothing since 39s"
    );
    // Its end ends it.
    s.apply(secs(t0, 300), false, DATA, END_STREAM, 3, None);
    assert!(s.stuck(secs(t0, 1000), STALE, GRACE, MAX_WATCH).is_empty());
}

#[test]
fn responses_endless_by_design_and_http1_bodies_are_not_judged_by_their_pauses() {
    let t0 = Instant::now();
    let mut s = followed(t0);
    let follow = Request::parse("GET", "/api/v1/namespaces/a/pods/p/log?follow=true", false);
    s.apply(t0, true, HEADERS, 0x5, 1, Some(follow));
    s.apply(t0, false, HEADERS, 0x4, 1, None);
    assert!(s.stuck(secs(t0, 10_000), STALE, GRACE, MAX_WATCH).is_empty());
    // HTTP/1.1: a Content-Length body's end is never seen; the next request replaces it.
    let mut h1 = followed(t0);
    h1.http1 = true;
    h1.apply(t0, true, HEADERS, 0, 1, Some(list("pods")));
    h1.apply(t0, false, HEADERS, 0, 1, None);
    assert!(h1.stuck(secs(t0, 10_000), STALE, GRACE, MAX_WATCH).is_empty());
    // Without response headers, both are still stuck after stale_after.
    let mut waiting = followed(t0);
    waiting.http1 = true;
    waiting.apply(t0, true, HEADERS, 0, 1, Some(list("pods")));
    assert_eq!(waiting.stuck(secs(t0, 90), STALE, GRACE, MAX_WATCH).len(), 1);
}

/// Issue 23: an HTTP/1.1 response the kernel said is chunked has a visible end (its
/// terminator): begun, unfinished and silent for stale_after, it is stuck; while bytes come
/// it is not, and once its terminator came it is gone.
#[test]
fn a_chunked_http1_response_begun_and_unfinished_is_stuck() {
    use lifeline_common::protocol::HTTP1_CHUNKED;
    let t0 = Instant::now();
    let mut h1 = followed(t0);
    h1.http1 = true;
    h1.apply(t0, true, HEADERS, 0, 1, Some(list("pods")));
    h1.apply(t0, false, HEADERS, HTTP1_CHUNKED, 1, None);
    h1.apply(secs(t0, 60), false, DATA, 0, 1, None);
    assert!(
        h1.stuck(secs(t0, 60 + 89), STALE, GRACE, MAX_WATCH).is_empty(),
        "bytes came at 60 s"
    );
    let stuck = h1.stuck(secs(t0, 60 + 90), STALE, GRACE, MAX_WATCH);
    assert_eq!(stuck.len(), 1);
    assert!(
        stuck[0]
            .description
            .starts_with("list pods (all namespaces): open 2m30s, its response begun and unfinished"),
        "{}",
        stuck[0].description
    );
    h1.apply(secs(t0, 61), false, DATA, END_STREAM, 1, None);
    assert!(h1.stuck(secs(t0, 10_000), STALE, GRACE, MAX_WATCH).is_empty());
}
