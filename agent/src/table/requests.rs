//! From the kernel's stream records to connections: a Go client's goroutine encodes a
//! request's `:method` and `:path` (header records), then writes the HEADERS frame that opens
//! its stream (a frame record from the same goroutine, naming the socket). The pairing is per
//! (process, goroutine); a frame finds its connection by the socket's kernel address.
//!
//! An OpenSSL client's HTTP/1.1 request comes the same way (its thread in place of the
//! goroutine), as stream 1 of its connection; a new request line on the connection replaces
//! the previous request.
use std::{collections::HashMap, time::Instant};

use super::{
    streams::{frame, request::Request, MAX_PENDING, PENDING_TTL},
    ConnectionTable,
};
use crate::kernel::events::{Frame, Header, HeaderField};

/// What one goroutine encoded last.
#[derive(Clone, Debug, Default)]
struct Encoded {
    at: Option<Instant>,
    method: Option<String>,
    path: Option<(String, bool)>,
}

/// Requests encoded, waiting for their HEADERS frame.
#[derive(Debug, Default)]
pub(super) struct Pending {
    by_goroutine: HashMap<(u32, u64), Encoded>,
}

impl Pending {
    fn note(&mut self, h: &Header) {
        if self.by_goroutine.len() >= MAX_PENDING {
            let cutoff = h.at.checked_sub(PENDING_TTL);
            self.by_goroutine
                .retain(|_, e| e.at.zip(cutoff).is_none_or(|(at, cut)| at >= cut));
            if self.by_goroutine.len() >= MAX_PENDING {
                self.by_goroutine.clear();
            }
        }
        let entry = self.by_goroutine.entry((h.tgid, h.goroutine)).or_default();
        // A `:method` starts the next request of this goroutine.
        if h.field == HeaderField::Method {
            *entry = Encoded::default();
        }
        entry.at = Some(h.at);
        match h.field {
            HeaderField::Method => entry.method = Some(h.value.clone()),
            HeaderField::Path => entry.path = Some((h.value.clone(), h.cut)),
        }
    }

    fn take(&mut self, tgid: u32, goroutine: u64, now: Instant) -> Option<Request> {
        let e = self.by_goroutine.remove(&(tgid, goroutine))?;
        if e.at
            .is_some_and(|at| now.saturating_duration_since(at) > PENDING_TTL)
        {
            return None;
        }
        let (path, cut) = e.path?;
        Some(Request::parse(e.method.as_deref().unwrap_or("GET"), &path, cut))
    }
}

impl ConnectionTable {
    /// A request header a Go client encoded.
    pub fn apply_header(&mut self, h: &Header) {
        self.pending.note(h);
    }

    /// A frame a Go client wrote or read (or a marker, see `streams::frame`). Frames of
    /// sockets the table does not know are dropped.
    pub fn apply_frame(&mut self, f: &Frame) {
        let request = (f.sent && f.frame_type == frame::HEADERS)
            .then(|| self.pending.take(f.tgid, f.goroutine, f.at))
            .flatten();
        let Some(id) = self.by_sk.get(&f.sk) else { return };
        let Some(conn) = self.conns.get_mut(id) else {
            return;
        };
        if f.http1 {
            conn.streams.http1 = true;
            // Every byte an OpenSSL client reads is seen once its libssl is probed.
            if !conn.streams.reading {
                conn.streams.apply(f.at, false, frame::READING, 0, 0, None);
            }
            // One request at a time: a request line ends the previous request's stream
            // (its response was read whole, or it is abandoned).
            if f.sent && f.frame_type == frame::HEADERS {
                conn.streams
                    .apply(f.at, true, frame::RST_STREAM, 0, f.stream_id, None);
            }
        }
        conn.streams
            .apply(f.at, f.sent, f.frame_type, f.flags, f.stream_id, request);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(goroutine: u64, field: HeaderField, value: &str, at: Instant) -> Header {
        Header {
            at,
            tgid: 7,
            goroutine,
            field,
            value: value.into(),
            cut: false,
        }
    }

    #[test]
    fn a_goroutines_method_and_path_pair_with_its_next_headers_frame_only() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.note(&header(1, HeaderField::Method, "GET", t0));
        p.note(&header(2, HeaderField::Method, "PUT", t0));
        p.note(&header(1, HeaderField::Path, "/api/v1/pods?watch=true", t0));
        p.note(&header(2, HeaderField::Path, "/api/v1/nodes/n1", t0));
        let first = p.take(7, 1, t0).expect("goroutine 1's request");
        assert_eq!(first.describe(), "watch pods (all namespaces)");
        assert!(p.take(7, 1, t0).is_none(), "taken once");
        assert!(
            p.take(8, 2, t0).is_none(),
            "another process's goroutine of the same address"
        );
        assert_eq!(p.take(7, 2, t0).unwrap().describe(), "update nodes");
        p.note(&header(3, HeaderField::Path, "/api/v1/pods", t0));
        assert!(
            p.take(7, 3, t0 + PENDING_TTL * 2).is_none(),
            "too old to be this frame's"
        );
    }

    /// An OpenSSL client's HTTP/1.1 messages as the kernel sends them (`ebpf/src/openssl.rs`).
    fn http1(lab: &crate::testkit::Lab, ms: u64, sk: u64, sent: bool, frame_type: u8, flags: u8) -> Frame {
        Frame {
            at: lab.at(ms),
            sk,
            tgid: 7,
            goroutine: 70,
            stream_id: 1,
            frame_type,
            flags,
            length: 100,
            sent,
            http1: true,
        }
    }

    #[test]
    fn an_http1_request_replaces_the_previous_one_and_its_terminator_ends_it() {
        let mut lab = crate::testkit::Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        let request = |lab: &mut crate::testkit::Lab, ms: u64, method: &str, path: &str| {
            let at = lab.at(ms);
            lab.table.apply_header(&Header {
                at,
                tgid: 7,
                goroutine: 70,
                field: HeaderField::Method,
                value: method.into(),
                cut: false,
            });
            lab.table.apply_header(&Header {
                at,
                tgid: 7,
                goroutine: 70,
                field: HeaderField::Path,
                value: path.into(),
                cut: false,
            });
            let f = http1(lab, ms, 0xa, true, frame::HEADERS, 0);
            lab.table.apply_frame(&f);
        };
        let open = |lab: &crate::testkit::Lab| -> Vec<(String, bool, bool)> {
            let conn = lab.table.connections().next().expect("the connection");
            conn.streams
                .open()
                .map(|s| {
                    (
                        s.request.as_ref().map(Request::describe).unwrap_or_default(),
                        s.response_at.is_some(),
                        s.whole,
                    )
                })
                .collect()
        };
        request(&mut lab, 10, "GET", "/api/v1/namespaces/default/pods");
        let f = http1(&lab, 12, 0xa, false, frame::HEADERS, 0);
        lab.table.apply_frame(&f);
        assert_eq!(open(&lab), vec![("list pods in default".to_string(), true, true)]);
        // A plain response has no terminator: the next request line replaces it.
        request(&mut lab, 20, "GET", "/api/v1/pods?timeoutSeconds=5&watch=True");
        assert_eq!(
            open(&lab),
            vec![("watch pods (all namespaces)".to_string(), false, true)]
        );
        let f = http1(&lab, 22, 0xa, false, frame::HEADERS, 0);
        lab.table.apply_frame(&f);
        // The chunked body's terminator ends the watch.
        let f = http1(&lab, 5000, 0xa, false, 0, frame::END_STREAM);
        lab.table.apply_frame(&f);
        assert!(open(&lab).is_empty());
        let conn = lab.table.connections().next().expect("the connection");
        assert_eq!(conn.streams.ended, 2);
    }

    #[test]
    fn pending_requests_are_bounded() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        for g in 0..(MAX_PENDING as u64 * 3) {
            p.note(&header(g, HeaderField::Path, "/api/v1/pods", t0));
        }
        assert!(p.by_goroutine.len() <= MAX_PENDING);
    }
}
