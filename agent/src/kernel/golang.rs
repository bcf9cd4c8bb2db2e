//! Which Go clients' streams are followed: the Go-client uprobes (`go_probes.rs`) go on the
//! binary of every client process that is a Go program (Go 1.17 or later: arguments in
//! registers), found in it by `host::gobin`, for as long as `probed.rs` keeps a file probed.
//! Every other client keeps the connection-level judgement, with the reason in the API.
use std::{
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
};

use super::{
    go_probes::Sites,
    head_start::HeadStart,
    probed::{ProbedFiles, Runtime, Seen, Visibility},
    programs::Probes,
    uprobes::Links,
};
use crate::host::gobin::{
    self,
    http2::{self, Role},
};
use crate::host::hold::{self, Held};

/// Go clients, probed in their binary.
pub struct Go;

/// A probed Go binary.
pub struct Binary {
    links: Links,
    go_version: String,
}

/// The probed Go binaries and the clients that run them.
pub type GoTracer = ProbedFiles<Go>;

impl Runtime for Go {
    type Probed = Binary;
    type Kernel = Probes;
    const FILE: &'static str = "Go binary";

    /// Every process runs a binary (one that went away fails the table's own `stat`).
    fn file_of(pid: u32) -> std::io::Result<Option<PathBuf>> {
        Ok(Some(PathBuf::from(format!("/proc/{pid}/exe"))))
    }

    fn probe(probes: &Mutex<Probes>, exe: &Path, pid: u32) -> Option<Result<Binary, String>> {
        trace(probes, exe, pid, false).map(|r| r.and_then(|b| b.ok_or_else(|| "not probed".to_owned())))
    }

    /// A Go program, by its `.go.buildinfo` (ELF headers only: tens of microseconds).
    fn may_probe_at_start(exe: &Path) -> bool {
        gobin::is_go(exe)
    }

    /// Only a binary that links client-go: the clients this agent is for, whose first LIST
    /// and WATCH come 15–25 ms after they start. Any other Go program is probed, as before,
    /// when it first connects to an endpoint.
    fn probe_at_start(
        probes: &Mutex<Probes>,
        exe: &Path,
        pid: u32,
    ) -> Option<Result<Option<Binary>, String>> {
        trace(probes, exe, pid, true)
    }

    fn sites(binary: &Binary) -> usize {
        binary.links.len()
    }

    fn unprobe(probes: &mut Probes, binary: Binary) {
        probes.detach_uprobes(binary.links);
    }
}

/// How client `key` (pid, start time) is seen by the Go probes.
pub fn visibility(tracer: &GoTracer, key: (u32, u64)) -> Visibility {
    match tracer.seen(key) {
        Seen::Probed(binary) => Visibility::Streams {
            client: format!("Go HTTP/2 client ({})", binary.go_version),
        },
        Seen::Unprobed(why) => Visibility::Connection { why: why.to_owned() },
        Seen::Nothing => Visibility::Connection {
            why: "its binary has not been looked at yet".into(),
        },
    }
}

/// Whether function `name` is client-go's (vendored or not): its REST client's `Watch` or
/// `Do`, which every client-go program that lists or watches calls.
fn links_client_go(name: &str) -> bool {
    [
        "k8s.io/client-go/rest.(*Request).Watch",
        "k8s.io/client-go/rest.(*Request).Do",
    ]
    .iter()
    .any(|marker| {
        name.ends_with(marker)
            && (name.len() == marker.len() || name[..name.len() - marker.len()].ends_with('/'))
    })
}

/// Reads the binary of `pid` and attaches the probes to it; None when the process went away
/// meanwhile (nothing is concluded about its binary). `at_start` (the process has only just
/// started): Ok(None) for a binary that does not link client-go, which is not probed now.
fn trace(
    probes: &Mutex<Probes>,
    exe: &Path,
    pid: u32,
    at_start: bool,
) -> Option<Result<Option<Binary>, String>> {
    let gone = || !exe.exists();
    let untraceable = |why: String| Some(Err(why));
    let lock = || probes.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(why) = lock().go_unavailable() {
        return untraceable(format!("the kernel refused the Go-client programs: {why}"));
    }
    // The kernel's wait before the first uprobe goes in is paid while the binary is read.
    let head_start = HeadStart::begin();
    let client_go = std::cell::Cell::new(false);
    // A client-go process is held still from the moment its binary is known to be one until
    // its probes are in: its first requests wait for them.
    let hold = at_start && lock().holds_starts();
    let held: std::cell::RefCell<Option<Held>> = Default::default();
    let wanted = |name: &str| {
        if at_start && !client_go.get() && links_client_go(name) {
            client_go.set(true);
            if hold {
                match Held::hold(pid) {
                    Ok(h) => *held.borrow_mut() = Some(h),
                    Err(err) => {
                        // A refusal is said once (ptrace refused is refused for every start),
                        // then per start at debug; another tracer that kept this start past
                        // the wait, for each such start.
                        static SAID: std::sync::atomic::AtomicBool =
                            std::sync::atomic::AtomicBool::new(false);
                        let per_start = matches!(err, hold::Error::Traced { .. });
                        if per_start || !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            tracing::warn!(
                                pid,
                                "a starting client-go process could not be held while its probes go in \
                                 (its first requests may go unseen): {err}"
                            );
                        }
                        if !per_start {
                            tracing::debug!(pid, "not held while probed: {err}");
                        }
                    }
                }
            }
        }
        http2::role(name).is_some()
    };
    let inspecting = std::time::Instant::now();
    let inspection = match gobin::inspect(exe, &wanted) {
        Ok(i) => i,
        Err(_) if gone() => return None,
        Err(err) => {
            let why = match &err.problem {
                gobin::Problem::NotGo(_) | gobin::Problem::NotElf => "not a Go program".to_string(),
                _ => format!("its binary could not be read: {err}"),
            };
            return untraceable(why);
        }
    };
    if at_start && !client_go.get() {
        return Some(Ok(None));
    }
    if !register_abi(&inspection.go_version) {
        return untraceable(format!(
            "built with {}: Go 1.17 or later is needed (arguments in registers)",
            inspection.go_version
        ));
    }
    let offsets_of = |role: Role| -> Vec<u64> {
        inspection
            .functions
            .iter()
            .filter(|f| http2::role(&f.name) == Some(role))
            .map(|f| f.entry_probe_offset)
            .collect()
    };
    let (tls_write, tls_read) = (offsets_of(Role::TlsWrite), offsets_of(Role::TlsRead));
    if tls_write.is_empty() || tls_read.is_empty() {
        return untraceable(format!("{} does not use crypto/tls", inspection.go_version));
    }
    let sites = match http2::client(&inspection.functions) {
        http2::Client::Recognised {
            write_header,
            read_frame_header,
        } => {
            let read_frame: Vec<&gobin::Function> = inspection
                .functions
                .iter()
                .filter(|f| http2::role(&f.name) == Some(Role::ReadFrame))
                .collect();
            let frames = frame_probes(&read_frame_header, &read_frame);
            let offsets = |functions: &[&gobin::Function]| -> Vec<u64> {
                functions.iter().map(|f| f.entry_probe_offset).collect()
            };
            // The requests and resets from the registers where every copy writes them
            // through the functions probed; else the frame headers in what TLS is given.
            let writes = http2::writes(&inspection.functions, &write_header);
            Sites {
                write_header: offsets(&write_header),
                headers_sent: writes.as_ref().map(|w| offsets(&w.headers)).unwrap_or_default(),
                resets_sent: writes.as_ref().map(|w| offsets(&w.resets)).unwrap_or_default(),
                tls_write: if writes.is_some() { Vec::new() } else { tls_write },
                // Which connection a frame came from is known from the frame probe itself, or
                // from the goroutine's last read.
                tls_read: if frames.results.is_empty() && frames.conn_reads.is_empty() {
                    tls_read
                } else {
                    Vec::new()
                },
                frame_results: frames.results,
                frame_conn_reads: frames.conn_reads,
                frame_header_reads: frames.reads,
                frame_header_returns: frames.returns,
            }
        }
        http2::Client::Unrecognised { found } => {
            return untraceable(format!(
                "{}: HTTP/2 client code not recognised: found {}",
                inspection.go_version,
                found.join(", ")
            ));
        }
        http2::Client::Absent => {
            return untraceable(format!(
                "{}: no HTTP/2 client code (an HTTP/1.1-only client)",
                inspection.go_version
            ));
        }
    };
    let attaching = std::time::Instant::now();
    let inspect_ms = (attaching - inspecting).as_secs_f64() * 1e3;
    let attached = lock().attach_go(exe, &sites);
    let attach_ms = attaching.elapsed().as_secs_f64() * 1e3;
    drop(head_start);
    let (held_threads, held_ms) = held.take().map_or((0, 0.0), |h| {
        let (threads, held_for) = h.release();
        (threads, held_for.as_secs_f64() * 1e3)
    });
    match attached {
        Ok(links) => {
            tracing::info!(
                pid,
                go = %inspection.go_version,
                sites = links.len(),
                at_start,
                inspect_ms,
                attach_ms,
                held_threads,
                held_ms,
                tls_reads_probed = !sites.tls_read.is_empty(),
                tls_writes_probed = !sites.tls_write.is_empty(),
                frame_results = sites.frame_results.len(),
                "following this Go client's HTTP/2 streams"
            );
            Some(Ok(Some(Binary {
                links,
                go_version: inspection.go_version,
            })))
        }
        Err(_) if gone() => None,
        Err(err) => untraceable(format!(
            "its probes could not be attached: {}",
            crate::error::chain(&err)
        )),
    }
}

/// Where the frame probes go in the copies of `readFrameHeader`.
#[derive(Debug, Default, PartialEq, Eq)]
struct FrameProbes {
    /// `go_frame_result` in the copies whose `ReadFrame` keeps the header in the result
    /// registers at its check, and
    results: Vec<u64>,
    /// `go_frame_conn` at every other copy's check (then `go_tls_read` is not needed), or
    /// neither.
    conn_reads: Vec<u64>,
    /// Else `go_frame_read` at the checks where `buf` is kept where it reads it,
    reads: Vec<u64>,
    /// and `go_frame_header` at every RET of the other copies.
    returns: Vec<u64>,
}

/// The frame probes for `read_frame_header`, the copies of `readFrameHeader`: where every
/// copy has a probe that knows the connection too, in its `ReadFrame` (of `read_frame`) where
/// the header is in the result registers at the check after its call (see
/// `host::gobin::frame_result`), else at the error check after its own read (see
/// `host::gobin::call_check`) where it keeps `buf` and its reader where `go_frame_conn` reads
/// them; else per copy, at that check if it keeps `buf` where `go_frame_read` reads it, or at
/// its RETs.
fn frame_probes(read_frame_header: &[&gobin::Function], read_frame: &[&gobin::Function]) -> FrameProbes {
    use lifeline_common::{GO_FRAME_BUF_SLOT, GO_FRAME_READER_SLOT};
    let check_with_buf = |f: &&gobin::Function| {
        f.call_check
            .filter(|check| check.first_argument == GO_FRAME_BUF_SLOT)
    };
    let result_of = |f: &&gobin::Function| {
        read_frame
            .iter()
            .filter(|r| http2::same_copy(&r.name, &f.name))
            .find_map(|r| r.frame_result)
    };
    let mut known = FrameProbes::default();
    let every_copy_knows_its_connection = read_frame_header.iter().all(|f| {
        if let Some(jump) = result_of(f) {
            known.results.push(jump);
            return true;
        }
        let conn_read = check_with_buf(f)
            .filter(|check| check.second_argument_data == Some(GO_FRAME_READER_SLOT))
            .map(|check| check.jump);
        known.conn_reads.extend(conn_read);
        conn_read.is_some()
    });
    if every_copy_knows_its_connection && !read_frame_header.is_empty() {
        return known;
    }
    let mut probes = FrameProbes::default();
    for f in read_frame_header {
        match check_with_buf(f) {
            Some(check) => probes.reads.push(check.jump),
            None => probes.returns.extend_from_slice(&f.returns),
        }
    }
    probes
}

/// Go 1.17 and later pass arguments in registers on amd64.
fn register_abi(version: &str) -> bool {
    let Some(rest) = version.strip_prefix("go1.") else {
        // "devel +abc": a development build, newer than any release.
        return version.starts_with("devel");
    };
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    minor.parse::<u32>().is_ok_and(|m| m >= 17)
}

#[cfg(test)]
mod tests {
    use super::{frame_probes, links_client_go, register_abi, FrameProbes};
    use crate::host::gobin::{call_check::CallCheck, Function};
    use lifeline_common::{GO_FRAME_BUF_SLOT, GO_FRAME_READER_SLOT};

    /// A copy of `readFrameHeader` with its check at `jump` keeping `buf` at `buf` and its
    /// reader at `reader` (no check: `jump` 0), its RETs at `jump + 1` and `jump + 2`.
    fn copy(jump: u64, buf: u64, reader: Option<u64>) -> Function {
        Function {
            name: "net/http.http2readFrameHeader".into(),
            entry: 0,
            end: 0,
            entry_offset: 0,
            entry_probe_offset: 0,
            call_check: (jump != 0).then_some(CallCheck {
                jump,
                first_argument: buf,
                second_argument_data: reader,
            }),
            frame_result: None,
            calls: vec![],
            returns: vec![jump + 1, jump + 2],
        }
    }

    /// The `ReadFrame` of the copy in package `package` (the bundle: `net/http`), with the
    /// header in its result registers at the check `jump` (0: not).
    fn read_frame(package: &str, jump: u64) -> Function {
        let name = if package == "net/http" {
            "net/http.(*http2Framer).ReadFrame".to_string()
        } else {
            format!("{package}.(*Framer).ReadFrame")
        };
        Function {
            name,
            frame_result: (jump != 0).then_some(jump),
            call_check: None,
            ..copy(0, 0, None)
        }
    }

    #[test]
    fn frames_read_from_the_result_registers_where_a_copys_read_frame_keeps_them() {
        let both = |jump| copy(jump, GO_FRAME_BUF_SLOT, Some(GO_FRAME_READER_SLOT));
        let xnet_header = Function {
            name: "golang.org/x/net/http2.readFrameHeader".into(),
            ..both(0x20)
        };
        // The bundle's ReadFrame keeps it, x/net's does not: one probe each, no go_tls_read.
        let frames = [
            &read_frame("net/http", 0x100),
            &read_frame("golang.org/x/net/http2", 0),
        ];
        assert_eq!(
            frame_probes(&[&both(0x10), &xnet_header], &frames),
            FrameProbes {
                results: vec![0x100],
                conn_reads: vec![0x20],
                ..FrameProbes::default()
            }
        );
        // A ReadFrame of another copy is not this copy's.
        assert_eq!(
            frame_probes(&[&both(0x10)], &[&read_frame("golang.org/x/net/http2", 0x200)]),
            FrameProbes {
                conn_reads: vec![0x10],
                ..FrameProbes::default()
            }
        );
        // A copy with neither: every copy as before, the ReadFrame site unused.
        let neither = Function {
            name: "golang.org/x/net/http2.readFrameHeader".into(),
            ..copy(0x20, GO_FRAME_BUF_SLOT, None)
        };
        assert_eq!(
            frame_probes(&[&both(0x10), &neither], &frames),
            FrameProbes {
                reads: vec![0x10, 0x20],
                ..FrameProbes::default()
            }
        );
    }

    #[test]
    fn frames_and_their_connection_in_one_probe_only_where_every_copy_allows_it() {
        let both = |jump| copy(jump, GO_FRAME_BUF_SLOT, Some(GO_FRAME_READER_SLOT));
        assert_eq!(
            frame_probes(&[&both(0x10), &both(0x20)], &[]),
            FrameProbes {
                conn_reads: vec![0x10, 0x20],
                ..FrameProbes::default()
            }
        );
        // One copy keeps its reader elsewhere: the buffer reads, and go_tls_read beside them.
        let elsewhere = copy(0x20, GO_FRAME_BUF_SLOT, Some(GO_FRAME_READER_SLOT + 8));
        assert_eq!(
            frame_probes(&[&both(0x10), &elsewhere], &[]),
            FrameProbes {
                reads: vec![0x10, 0x20],
                ..FrameProbes::default()
            }
        );
        // One copy without the check, one without its reader kept, one with buf elsewhere.
        let buf_elsewhere = copy(0x30, GO_FRAME_BUF_SLOT + 8, Some(GO_FRAME_READER_SLOT));
        assert_eq!(
            frame_probes(
                &[
                    &copy(0, 0, None),
                    &copy(0x20, GO_FRAME_BUF_SLOT, None),
                    &buf_elsewhere
                ],
                &[]
            ),
            FrameProbes {
                reads: vec![0x20],
                returns: vec![1, 2, 0x31, 0x32],
                ..FrameProbes::default()
            }
        );
        assert_eq!(frame_probes(&[], &[]), FrameProbes::default());
    }

    #[test]
    fn client_go_is_known_by_its_rest_client_vendored_or_not() {
        assert!(links_client_go("k8s.io/client-go/rest.(*Request).Watch"));
        assert!(links_client_go(
            "k8s.io/kubernetes/vendor/k8s.io/client-go/rest.(*Request).Do"
        ));
        assert!(!links_client_go("k8s.io/client-go/rest.(*Request).DoRaw"));
        assert!(!links_client_go(
            "example.com/notk8s.io/client-go/rest.(*Request).Watch"
        ));
        assert!(!links_client_go("net/http.(*Client).Do"));
    }

    #[test]
    fn go_versions_with_arguments_in_registers() {
        assert!(register_abi("go1.19.8"));
        assert!(register_abi("go1.17"));
        assert!(register_abi("go1.22rc1"));
        assert!(register_abi("devel go1.23-abc"));
        assert!(!register_abi("go1.16.15"));
        assert!(!register_abi("go1.9"));
        assert!(!register_abi("gccgo"));
    }
}
