//! Go's HTTP/2 client recognised in a binary by the shape of its function names, not by a list:
//! Go ships it in several copies, and one binary often holds more than one.
//!
//! - `net/http`'s bundle (Go 1.6 to 1.26): the package's identifiers prefixed with `http2`,
//!   `net/http.(*http2ClientConn).writeHeader`, `net/http.http2readFrameHeader`.
//! - a package whose last path element is `http2`: `net/http/internal/http2` (Go 1.27, where
//!   the bundle is gone), `golang.org/x/net/http2`, and vendored copies under any prefix
//!   (`k8s.io/kubernetes/vendor/golang.org/x/net/http2`): `P.(*ClientConn).writeHeader`,
//!   `P.readFrameHeader`.
//!
//! A copy is *probed* when it has both functions: `(*ClientConn).writeHeader(name, value
//! string)` (the request's pseudo-headers before HPACK) and `readFrameHeader(buf []byte, r
//! io.Reader) (FrameHeader, error)` (every frame header read). Their signatures and
//! `FrameHeader{valid bool; Type, Flags uint8; Length, StreamID uint32}` are the same in every
//! copy from Go 1.17 to 1.27 and x/net's (read in each `golang-1.NN-src` and
//! `golang-golang-x-net-dev`), so one set of eBPF programs reads them all. Every copy present
//! is probed: a binary links the one its transport uses (x/net's transport in a Go 1.27 build
//! wraps `net/http/internal/http2`, and x/net's `readFrameHeader` stays behind) and the
//! goroutine that reads a connection calls its own copy's functions.
//!
//! Other HTTP/2 client code (`(*ClientConn).RoundTrip`, `(*Transport).RoundTrip`) without a
//! complete copy means a client whose code has moved: named as such, never as HTTP/1.1.
use crate::host::gobin::Function;

/// The TLS functions the Go probes use.
pub const TLS_WRITE: &str = "crypto/tls.(*Conn).Write";
pub const TLS_READ: &str = "crypto/tls.(*Conn).Read";

/// What a function is to the Go probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    TlsWrite,
    TlsRead,
    /// `(*ClientConn).writeHeader` of an HTTP/2 copy.
    WriteHeader,
    /// `readFrameHeader` of an HTTP/2 copy.
    ReadFrameHeader,
    /// `(*Framer).ReadFrame` of an HTTP/2 copy: where the header its `readFrameHeader` call
    /// returned may be read from the result registers (`frame_result`).
    ReadFrame,
    /// `(*ClientConn).writeHeaders(streamID uint32, endStream bool, maxFrameSize int, hdrs
    /// []byte)`: every request's HEADERS (and trailers') of a copy.
    WriteHeaders,
    /// `(*ClientConn).writeStreamReset(streamID uint32, code ErrCode, ...)`: the client's
    /// RST_STREAM, where it is the only writer (see [`writes`]).
    StreamReset,
    /// `(*Framer).WriteRSTStream`: a copy's RST_STREAM written, by client or server.
    FramerReset,
    /// `transportResponseBody.Close`: where an older copy (x/net of 2020, in Kubernetes 1.20)
    /// writes a RST_STREAM of its own when a response body is closed early (a watch stopped).
    BodyClose,
    /// Other code of an HTTP/2 client (its round trip), evidence that the binary has one.
    Client,
}

/// The role of the function named `name` (as Go's runtime names it), if it has one.
pub fn role(name: &str) -> Option<Role> {
    match name {
        TLS_WRITE => return Some(Role::TlsWrite),
        TLS_READ => return Some(Role::TlsRead),
        _ => {}
    }
    // A binary has ~100,000 names, which a process start races through: most are settled by
    // their tails.
    if ![
        "Header",
        "Headers",
        "RoundTrip",
        "ReadFrame",
        "Reset",
        "RSTStream",
        "Close",
    ]
    .iter()
    .any(|tail| name.ends_with(tail))
    {
        return None;
    }
    let (package, rest) = split(name)?;
    let own = package.rsplit('/').next() == Some("http2");
    // In the bundle, the same identifiers prefixed with `http2`.
    let is = |plain: &str, bundled: &str| rest == if own { plain } else { bundled };
    if is("(*ClientConn).writeHeader", "(*http2ClientConn).writeHeader") {
        Some(Role::WriteHeader)
    } else if is("readFrameHeader", "http2readFrameHeader") {
        Some(Role::ReadFrameHeader)
    } else if is("(*Framer).ReadFrame", "(*http2Framer).ReadFrame") {
        Some(Role::ReadFrame)
    } else if is("(*ClientConn).writeHeaders", "(*http2ClientConn).writeHeaders") {
        Some(Role::WriteHeaders)
    } else if is(
        "(*ClientConn).writeStreamReset",
        "(*http2ClientConn).writeStreamReset",
    ) {
        Some(Role::StreamReset)
    } else if is("(*Framer).WriteRSTStream", "(*http2Framer).WriteRSTStream") {
        Some(Role::FramerReset)
    } else if is("transportResponseBody.Close", "http2transportResponseBody.Close") {
        Some(Role::BodyClose)
    } else if is("(*ClientConn).RoundTrip", "(*http2ClientConn).RoundTrip")
        || is("(*Transport).RoundTrip", "(*http2Transport).RoundTrip")
    {
        Some(Role::Client)
    } else {
        None
    }
}

/// What a binary's HTTP/2 client code is, from the functions [`role`] picked.
#[derive(Debug, PartialEq, Eq)]
pub enum Client<'a> {
    /// At least one copy has both functions: those of every copy, to probe.
    Recognised {
        write_header: Vec<&'a Function>,
        read_frame_header: Vec<&'a Function>,
    },
    /// HTTP/2 client code, but no copy with both functions: the names found, sorted.
    Unrecognised { found: Vec<&'a str> },
    /// No HTTP/2 client code at all.
    Absent,
}

/// Sorts `functions` (any mix; those without an HTTP/2 role are ignored) into a [`Client`].
pub fn client(functions: &[Function]) -> Client<'_> {
    let of = |wanted: Role| -> Vec<&Function> {
        functions
            .iter()
            .filter(|f| role(&f.name) == Some(wanted))
            .collect()
    };
    let (write_header, read_frame_header) = (of(Role::WriteHeader), of(Role::ReadFrameHeader));
    let complete = write_header
        .iter()
        .any(|w| read_frame_header.iter().any(|r| copy(&w.name) == copy(&r.name)));
    if complete {
        return Client::Recognised {
            write_header,
            read_frame_header,
        };
    }
    if write_header.is_empty() && of(Role::Client).is_empty() {
        // A `readFrameHeader` alone is a server's or a framer's.
        return Client::Absent;
    }
    let mut found: Vec<&str> = functions
        .iter()
        .filter(|f| {
            matches!(
                role(&f.name),
                Some(Role::WriteHeader | Role::ReadFrameHeader | Role::Client)
            )
        })
        .map(|f| f.name.as_str())
        .collect();
    found.sort_unstable();
    found.dedup();
    Client::Unrecognised { found }
}

/// Where a client's writes that the judgement needs are taken from the registers: each probed
/// copy's `writeHeaders` and `writeStreamReset` entries.
#[derive(Debug, PartialEq, Eq)]
pub struct Writes<'a> {
    pub headers: Vec<&'a Function>,
    pub resets: Vec<&'a Function>,
}

/// The [`Writes`] of the probed copies `write_header` (one function of each) among
/// `functions`, if every one of them sends each request's HEADERS through its `writeHeaders`
/// and each RST_STREAM through its `writeStreamReset` (read in Go 1.19–1.27's and x/net
/// 0.7–0.62's transports: `writeStreamReset` is the only client caller of `WriteRSTStream`
/// there). A copy whose `transportResponseBody.Close` calls its `WriteRSTStream` itself (x/net
/// of 2020), or one where any of the four functions is missing, would have resets go unseen:
/// None, and the written frames are read from `crypto/tls.(*Conn).Write` as before.
pub fn writes<'a>(functions: &'a [Function], write_header: &[&Function]) -> Option<Writes<'a>> {
    let in_copy = |of: &Function, wanted: Role| {
        functions
            .iter()
            .find(|f| role(&f.name) == Some(wanted) && same_copy(&f.name, &of.name))
    };
    let mut writes = Writes {
        headers: Vec::new(),
        resets: Vec::new(),
    };
    for copy in write_header {
        let framer_reset = in_copy(copy, Role::FramerReset)?;
        let close = in_copy(copy, Role::BodyClose)?;
        if close.calls.contains(&framer_reset.entry) {
            return None;
        }
        writes.headers.push(in_copy(copy, Role::WriteHeaders)?);
        writes.resets.push(in_copy(copy, Role::StreamReset)?);
    }
    (!writes.headers.is_empty()).then_some(writes)
}

/// Whether the functions named `a` and `b` belong to one copy of the client.
pub fn same_copy(a: &str, b: &str) -> bool {
    copy(a).is_some() && copy(a) == copy(b)
}

/// The copy `name` belongs to: its package, and whether it is the `http2`-prefixed bundle in it.
fn copy(name: &str) -> Option<(&str, bool)> {
    let (package, _) = split(name)?;
    Some((package, package.rsplit('/').next() != Some("http2")))
}

/// `name` split into its package path and the rest (`net/http/internal/http2`,
/// `(*ClientConn).writeHeader`): the package ends at the first dot after the last slash (Go
/// escapes dots in a path's last element), looking only before any type arguments.
fn split(name: &str) -> Option<(&str, &str)> {
    let head = name.split('[').next()?;
    let from = head.rfind('/').map_or(0, |slash| slash + 1);
    let dot = from + head[from..].find('.')?;
    Some((&name[..dot], &name[dot + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str) -> Function {
        Function {
            name: name.into(),
            entry: 0x1000,
            end: 0x1100,
            entry_offset: 0x1000,
            entry_probe_offset: 0x1004,
            call_check: None,
            frame_result: None,
            calls: vec![],
            returns: vec![0x10f0],
        }
    }

    fn names(functions: &[&Function]) -> Vec<String> {
        functions.iter().map(|f| f.name.clone()).collect()
    }

    #[test]
    fn every_copy_of_the_client_is_recognised_by_its_shape() {
        use Role::*;
        for (name, expected) in [
            ("net/http.(*http2ClientConn).writeHeader", WriteHeader),
            ("net/http.http2readFrameHeader", ReadFrameHeader),
            ("net/http/internal/http2.(*ClientConn).writeHeader", WriteHeader),
            ("net/http/internal/http2.readFrameHeader", ReadFrameHeader),
            ("golang.org/x/net/http2.(*ClientConn).writeHeader", WriteHeader),
            ("golang.org/x/net/http2.readFrameHeader", ReadFrameHeader),
            (
                "k8s.io/kubernetes/vendor/golang.org/x/net/http2.(*ClientConn).writeHeader",
                WriteHeader,
            ),
            (
                "example.com/app/vendor/golang.org/x/net/http2.readFrameHeader",
                ReadFrameHeader,
            ),
            ("net/http.(*http2Framer).ReadFrame", ReadFrame),
            ("golang.org/x/net/http2.(*Framer).ReadFrame", ReadFrame),
            ("net/http/internal/http2.(*Framer).ReadFrame", ReadFrame),
            ("net/http.(*http2ClientConn).writeHeaders", WriteHeaders),
            ("golang.org/x/net/http2.(*ClientConn).writeHeaders", WriteHeaders),
            (
                "net/http/internal/http2.(*ClientConn).writeStreamReset",
                StreamReset,
            ),
            ("net/http.(*http2ClientConn).writeStreamReset", StreamReset),
            ("net/http.(*http2Framer).WriteRSTStream", FramerReset),
            (
                "k8s.io/kubernetes/vendor/golang.org/x/net/http2.(*Framer).WriteRSTStream",
                FramerReset,
            ),
            ("net/http.http2transportResponseBody.Close", BodyClose),
            ("golang.org/x/net/http2.transportResponseBody.Close", BodyClose),
            ("net/http/internal/http2.(*ClientConn).RoundTrip", Client),
            ("net/http.(*http2Transport).RoundTrip", Client),
            ("crypto/tls.(*Conn).Write", TlsWrite),
            ("crypto/tls.(*Conn).Read", TlsRead),
        ] {
            assert_eq!(role(name), Some(expected), "{name}");
        }
        for name in [
            "net/http.(*http2serverConn).writeHeaders",
            "golang.org/x/net/http2.(*transportResponseBody).Close",
            "net/http.(*http2ClientConn).Close",
            "net/http/internal/http2.(*responseWriterState).writeHeader",
            "net/http.(*ClientConn).writeHeader",
            "golang.org/x/net/http2/hpack.(*Encoder).WriteField",
            "example.com/nothttp2.readFrameHeader",
            "example.com/http2x.readFrameHeader",
            "net/http/internal/http2.readFrameHeader.func1",
            "main.main",
            "readFrameHeader",
            "net/http/internal/http2.F[go.shape.*net/http2.readFrameHeader]",
            "crypto/tls.(*Conn).Writer",
            "net/http/internal/http2.(*Framer).ReadFrameHeader",
            "net/http.(*http2Framer).readFrame",
            "example.com/app.(*Framer).ReadFrame",
        ] {
            assert_eq!(role(name), None, "{name}");
        }
    }

    #[test]
    fn every_copy_present_is_probed() {
        // kubectl 1.36.4 built with go1.27.1: the client in net/http/internal/http2, x/net's
        // transport a wrapper of it that keeps its own readFrameHeader.
        let kubectl_1_36 = [
            function("crypto/tls.(*Conn).Write"),
            function("golang.org/x/net/http2.readFrameHeader"),
            function("golang.org/x/net/http2.(*ClientConn).RoundTrip"),
            function("net/http.(*http2ClientConn).RoundTrip"),
            function("net/http/internal/http2.(*ClientConn).writeHeader"),
            function("net/http/internal/http2.(*ClientConn).RoundTrip"),
            function("net/http/internal/http2.readFrameHeader"),
        ];
        let Client::Recognised {
            write_header,
            read_frame_header,
        } = client(&kubectl_1_36)
        else {
            panic!("{:?}", client(&kubectl_1_36));
        };
        assert_eq!(
            names(&write_header),
            ["net/http/internal/http2.(*ClientConn).writeHeader"]
        );
        assert_eq!(
            names(&read_frame_header),
            [
                "golang.org/x/net/http2.readFrameHeader",
                "net/http/internal/http2.readFrameHeader"
            ]
        );
        // Kubernetes 1.20's components: the bundle and the vendored x/net.
        let k8s = [
            function("net/http.(*http2ClientConn).writeHeader"),
            function("net/http.http2readFrameHeader"),
            function("k8s.io/kubernetes/vendor/golang.org/x/net/http2.(*ClientConn).writeHeader"),
            function("k8s.io/kubernetes/vendor/golang.org/x/net/http2.readFrameHeader"),
        ];
        let Client::Recognised {
            write_header,
            read_frame_header,
        } = client(&k8s)
        else {
            panic!("{:?}", client(&k8s));
        };
        assert_eq!((write_header.len(), read_frame_header.len()), (2, 2));
    }

    /// A copy with the four functions, its `transportResponseBody.Close` calling `close_calls`.
    fn copy_with_writes(package: &str, entry: u64, close_calls: Vec<u64>) -> Vec<Function> {
        let at = |name: &str, entry: u64| Function {
            entry,
            ..function(&format!("{package}.{name}"))
        };
        vec![
            at("(*ClientConn).writeHeader", entry),
            at("(*ClientConn).writeHeaders", entry + 0x100),
            at("(*ClientConn).writeStreamReset", entry + 0x200),
            at("(*Framer).WriteRSTStream", entry + 0x300),
            Function {
                calls: close_calls,
                ..at("transportResponseBody.Close", entry + 0x400)
            },
        ]
    }

    #[test]
    fn the_writes_come_from_registers_only_where_every_copy_resets_through_one_function() {
        let modern = copy_with_writes("golang.org/x/net/http2", 0x10000, vec![0x10200]);
        let bundle: Vec<Function> = copy_with_writes("net/http", 0x20000, vec![0x20200])
            .into_iter()
            .map(|f| Function {
                name: f.name.replace("net/http.(*", "net/http.(*http2").replace(
                    "net/http.transportResponseBody",
                    "net/http.http2transportResponseBody",
                ),
                ..f
            })
            .collect();
        let both: Vec<Function> = modern.iter().chain(&bundle).cloned().collect();
        let write_header: Vec<&Function> = both
            .iter()
            .filter(|f| role(&f.name) == Some(Role::WriteHeader))
            .collect();
        assert_eq!(write_header.len(), 2);
        let writes = writes(&both, &write_header).expect("both copies write through the two");
        assert_eq!(
            (names(&writes.headers), names(&writes.resets)),
            (
                vec![
                    "golang.org/x/net/http2.(*ClientConn).writeHeaders".to_string(),
                    "net/http.(*http2ClientConn).writeHeaders".to_string()
                ],
                vec![
                    "golang.org/x/net/http2.(*ClientConn).writeStreamReset".to_string(),
                    "net/http.(*http2ClientConn).writeStreamReset".to_string()
                ]
            )
        );
        // x/net of 2020: a closed body resets its stream itself, in one of the two copies.
        let mut old = both.clone();
        old[4].calls.push(0x10300);
        assert_eq!(writes_of(&old), None);
        // The other copy's WriteRSTStream called is not this copy's own.
        let mut crossed = both.clone();
        crossed[4].calls.push(0x20300);
        assert!(writes_of(&crossed).is_some());
        // Any of the four missing in a copy: not known to be complete.
        for missing in 1..5 {
            let mut short = both.clone();
            short.remove(missing);
            assert_eq!(writes_of(&short), None, "without {}", both[missing].name);
        }
    }

    fn writes_of(functions: &[Function]) -> Option<(usize, usize)> {
        let write_header: Vec<&Function> = functions
            .iter()
            .filter(|f| role(&f.name) == Some(Role::WriteHeader))
            .collect();
        writes(functions, &write_header).map(|w| (w.headers.len(), w.resets.len()))
    }

    #[test]
    fn a_client_whose_code_moved_is_named_not_called_http1() {
        // Only one half of each copy: not one copy complete.
        let moved = [
            function("net/http/internal/http2.(*ClientConn).RoundTrip"),
            function("golang.org/x/net/http2.readFrameHeader"),
            function("net/http/internal/http2.(*ClientConn).writeHeader"),
            function("crypto/tls.(*Conn).Read"),
        ];
        assert_eq!(
            client(&moved),
            Client::Unrecognised {
                found: vec![
                    "golang.org/x/net/http2.readFrameHeader",
                    "net/http/internal/http2.(*ClientConn).RoundTrip",
                    "net/http/internal/http2.(*ClientConn).writeHeader",
                ]
            }
        );
        // A server's framer, or nothing of HTTP/2: no client.
        assert_eq!(
            client(&[function("net/http.http2readFrameHeader")]),
            Client::Absent
        );
        assert_eq!(client(&[function("crypto/tls.(*Conn).Read")]), Client::Absent);
        assert_eq!(client(&[]), Client::Absent);
    }
}
