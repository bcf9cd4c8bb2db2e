//! A gateway that holds chosen watches (issue 16) and lists (issue 23): haproxy in its own
//! network namespace forwards everything a client sends to the apiserver, except the watches
//! and lists of the resources it is told to hold, which go to an upstream that never finishes
//! them: one that sends the response headers and then nothing (a watch open past its own
//! deadline), one that sends nothing at all (a request without response headers), one that
//! sends the headers of a chunked list and its first chunk, then nothing (an upstream that
//! died mid-answer: seed 003's cache sync that waits forever). The client's other streams on
//! the same HTTP/2 connection flow as usual.
use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Stdio},
};

use super::{pki::Profile, ControlPlane};
use crate::scenario::{Gateway, Host};

/// The held upstream, in python: for a request line naming one of argument 2, the response
/// headers of a chunked answer, then nothing; for a list (no `watch=`) naming one of argument
/// 3, those headers and the first chunk of a list; for any other, nothing at all. Connections
/// are kept open for ever.
const HELD_UPSTREAM: &str = r#"
import socket, sys, threading
answer = [r for r in sys.argv[2].encode().split(b",") if r]
midway = [r for r in sys.argv[3].encode().split(b",") if r]
first = b'{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":['
held = []
def serve(c):
    data = b""
    while b"\r\n\r\n" not in data:
        d = c.recv(65536)
        if not d:
            return
        data += d
    line = data.split(b"\r\n")[0]
    print("held:", line.decode(errors="replace"), flush=True)
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    if b"watch=" not in line and any(r in line for r in midway):
        c.sendall(headers + b"%x\r\n" % len(first) + first + b"\r\n")
    elif any(r in line for r in answer):
        c.sendall(headers)
    held.append(c)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

const HELD_PORT: u16 = 18081;

/// What to hold: watches and lists whose path is exactly one of these (regexes of haproxy's
/// `path_reg`).
pub struct Held<'a> {
    /// Watches answered with headers, then nothing.
    pub headers_only: &'a [&'a str],
    /// Watches never answered.
    pub unanswered: &'a [&'a str],
    /// Lists (requests without `watch=true`) answered with headers and a first chunk, then
    /// nothing.
    pub lists_midway: &'a [&'a str],
}

/// The running gateway and its held upstream (both stopped on drop).
pub struct HoldingGateway {
    _gateway: Gateway,
    upstream: Child,
    pub endpoint: SocketAddr,
}

impl HoldingGateway {
    /// haproxy on `host`:6443 with a certificate of the cluster's CA for its address, to the
    /// apiserver at `apiserver` (reachable from `host`), holding `held`.
    pub fn start(
        cp: &ControlPlane,
        host: &Host,
        apiserver: SocketAddr,
        held: &Held<'_>,
        dir: &Path,
    ) -> HoldingGateway {
        let endpoint = host.addr(6443);
        let cert = cp.pki().issue(
            "holding-gateway",
            Profile::Server {
                sans: &[host.ip.to_string()],
            },
        );
        let log = std::fs::File::create(dir.join("held-upstream.log")).expect("held upstream log");
        let upstream = host
            .ns
            .command(crate::SYSTEM_PYTHON)
            .args(["-c", HELD_UPSTREAM, &HELD_PORT.to_string()])
            .args([held.headers_only, held.lists_midway].map(|paths| {
                paths
                    .iter()
                    .map(|p| p.rsplit('/').next().unwrap_or(p))
                    .collect::<Vec<_>>()
                    .join(",")
            }))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start the held upstream (python3)");
        let regexes = |paths: &mut dyn Iterator<Item = &&str>| {
            paths.map(|p| format!("^{p}$")).collect::<Vec<_>>().join("|")
        };
        let watches = regexes(&mut held.headers_only.iter().chain(held.unanswered));
        // haproxy refuses an empty regex list: a path no request has stands in.
        let lists = match regexes(&mut held.lists_midway.iter()) {
            none if none.is_empty() => "^/none$".to_owned(),
            some => some,
        };
        let config = format!(
            "global\n    log stderr format raw local0 info\n\
defaults\n    mode http\n    log global\n    option httplog\n    retries 0\n\
    timeout connect 10s\n    timeout client 2h\n    timeout server 2h\n    timeout tunnel 2h\n\
frontend api\n    bind {endpoint} ssl crt {pem} alpn h2,http/1.1\n\
    acl watch url_param(watch) -m str true\n\
    acl held path_reg {watches}\n\
    acl list_held path_reg {lists}\n\
    use_backend held if watch held\n\
    use_backend held if !watch list_held\n\
    default_backend apiserver\n\
backend apiserver\n    http-reuse always\n    server api {apiserver} ssl verify required ca-file {ca} alpn h2\n\
backend held\n    server held 127.0.0.1:{HELD_PORT}\n",
            pem = cert.combined().display(),
            ca = cp.ca_pem().display(),
        );
        let gateway = Gateway::start_with_config(host, 6443, &config, dir);
        HoldingGateway {
            _gateway: gateway,
            upstream,
            endpoint,
        }
    }
}

impl Drop for HoldingGateway {
    fn drop(&mut self) {
        let _ = self.upstream.kill();
        let _ = self.upstream.wait();
    }
}
