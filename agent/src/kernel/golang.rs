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
use crate::host::hold::Held;

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
                        // Said once (ptrace refused is refused for every start), then per start.
                        static SAID: std::sync::Once = std::sync::Once::new();
                        SAID.call_once(|| {
                            tracing::warn!(
                                pid,
                                "a starting client-go process could not be held while its probes go in \
                                 (its first requests may go unseen): {err}"
                            );
                        });
                        tracing::debug!(pid, "not held while probed: {err}");
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
    let entries = |role: Role| -> Vec<u64> {
        inspection
            .functions
            .iter()
            .filter(|f| http2::role(&f.name) == Some(role))
            .map(|f| f.entry_probe_offset)
            .collect()
    };
    let (tls_write, tls_read) = (entries(Role::TlsWrite), entries(Role::TlsRead));
    if tls_write.is_empty() || tls_read.is_empty() {
        return untraceable(format!("{} does not use crypto/tls", inspection.go_version));
    }
    let sites = match http2::client(&inspection.functions) {
        http2::Client::Recognised {
            write_header,
            read_frame_header,
        } => {
            // Each copy of readFrameHeader is probed at its read's check, or else at its RETs.
            let (mut frame_header_reads, mut frame_header_returns) = (Vec::new(), Vec::new());
            for f in &read_frame_header {
                match frame_read_site(f) {
                    Some(site) => frame_header_reads.push(site),
                    None => frame_header_returns.extend_from_slice(&f.returns),
                }
            }
            Sites {
                write_header: write_header.iter().map(|f| f.entry_probe_offset).collect(),
                tls_write,
                tls_read,
                frame_header_reads,
                frame_header_returns,
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

/// Where `go_frame_read` goes in a copy of `readFrameHeader`: the error check after its read,
/// if `buf` is kept where the program reads it (see `host::gobin::call_check`).
fn frame_read_site(read_frame_header: &gobin::Function) -> Option<u64> {
    read_frame_header
        .call_check
        .filter(|check| check.first_argument == lifeline_common::GO_FRAME_BUF_SLOT)
        .map(|check| check.jump)
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
    use super::{links_client_go, register_abi};

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
