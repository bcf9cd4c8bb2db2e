//! The agent's own probe of each apiserver endpoint, for [`crate::health::reachability`]: every
//! [`PROBE_EVERY`], a TCP connect, a TLS handshake (any certificate: the question is whether
//! something answers, not whom to trust — nothing is sent but the probe) and
//! `GET /readyz`, each bounded by [`STEP_TIMEOUT`]. A handshake that gets no answer in that
//! time is a failure (the kernel accepts for an apiserver that is stopped or deadlocked); one
//! that gets an answer that is not TLS is a plain TCP service, which is there. It runs in the agent's network namespace
//! (the host's, in the DaemonSet), where host clients and the ClusterIP path are.
//!
//! The agent's own sockets are not clients: the connection table ignores the agent's pid.
//! What the probe finds is logged in the agent's own words, once per change
//! ([`conditions`]): rustls' own warnings stay below the default log level.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime},
    DigitallySignedStruct, SignatureScheme,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf},
    net::TcpStream,
    sync::watch,
};

use crate::endpoint::Endpoint;

mod conditions;

pub const PROBE_EVERY: Duration = Duration::from_secs(5);
pub const STEP_TIMEOUT: Duration = Duration::from_secs(3);

/// How one probe of an endpoint ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Connection refused.
    Refused,
    /// No answer to the SYN in time.
    Timeout,
    /// No route (EHOSTUNREACH, ENETUNREACH).
    NoRoute,
    /// Connected, but the TLS handshake got no answer in time: the kernel accepts, the
    /// apiserver does not answer (stopped, deadlocked, overloaded).
    TlsTimeout,
    /// Connected, and the endpoint answered something that is not TLS, or closed (a plain
    /// TCP service): it is there.
    NoTls,
    /// TLS up, but no HTTP answer in time: no evidence either way (a gateway holding the
    /// request for a dead upstream, or a slow apiserver).
    NoAnswer,
    /// An HTTP answer with this status to `GET /readyz`.
    Answered(u16),
}

impl ProbeOutcome {
    /// `Some(true)`: success evidence, `Some(false)`: failure, `None`: neither.
    pub fn reachable(self) -> Option<bool> {
        match self {
            ProbeOutcome::Refused
            | ProbeOutcome::Timeout
            | ProbeOutcome::NoRoute
            | ProbeOutcome::TlsTimeout => Some(false),
            ProbeOutcome::NoTls => Some(true),
            ProbeOutcome::NoAnswer => None,
            ProbeOutcome::Answered(code) => Some(code < 500),
        }
    }

    /// Whether the probe got through to something at the endpoint (its TCP connection was
    /// accepted): its failures are then about the endpoint, not about the agent's own path.
    pub fn connected(self) -> bool {
        !matches!(
            self,
            ProbeOutcome::Refused | ProbeOutcome::Timeout | ProbeOutcome::NoRoute
        )
    }

    pub fn describe(self) -> String {
        match self {
            ProbeOutcome::Refused => "the agent's probe was refused".into(),
            ProbeOutcome::Timeout => "the agent's probe got no answer to its SYN".into(),
            ProbeOutcome::NoRoute => "the agent's probe found no route".into(),
            ProbeOutcome::TlsTimeout => format!(
                "the agent's probe connected but the TLS handshake got no answer in {}s",
                STEP_TIMEOUT.as_secs()
            ),
            ProbeOutcome::NoTls => "the agent's probe connected".into(),
            ProbeOutcome::NoAnswer => "the agent's probe got no HTTP answer".into(),
            ProbeOutcome::Answered(code) => format!("the agent's probe of /readyz got HTTP {code}"),
        }
    }
}

/// The latest probe of one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub at: Instant,
    pub outcome: ProbeOutcome,
}

/// What to probe: per endpoint, the addresses to try (an exact endpoint's own address; for a
/// CIDR endpoint, the addresses clients used).
pub type Targets = BTreeMap<Endpoint, BTreeSet<SocketAddr>>;

/// The latest probe per endpoint, shared between the probe task and the tick.
#[derive(Clone, Default)]
pub struct Probes(Arc<Mutex<BTreeMap<Endpoint, Probe>>>);

impl Probes {
    pub fn snapshot(&self) -> BTreeMap<Endpoint, Probe> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn record(&self, endpoint: Endpoint, probe: Probe) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.insert(endpoint, probe);
    }

    fn retain(&self, targets: &Targets) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|e, _| targets.contains_key(e));
    }
}

/// Starts the probe loop; it follows `targets` and stops when the sender is dropped.
pub fn start(targets: watch::Receiver<Targets>) -> Probes {
    let probes = Probes::default();
    tokio::spawn(run(targets, probes.clone()));
    probes
}

async fn run(mut targets: watch::Receiver<Targets>, probes: Probes) {
    let tls = tls_connector();
    let mut every = tokio::time::interval(PROBE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conditions = conditions::Conditions::default();
    loop {
        tokio::select! {
            _ = every.tick() => {}
            changed = targets.changed() => if changed.is_err() { return },
        }
        let current = targets.borrow_and_update().clone();
        probes.retain(&current);
        conditions.retain(|e| current.contains_key(e));
        let rounds = current.into_iter().map(|(endpoint, addrs)| {
            let tls = tls.clone();
            async move {
                // An endpoint is reachable when any of its addresses is; try them in turn.
                let mut best = None;
                for addr in addrs {
                    let outcome = probe(addr, &tls).await;
                    let done = outcome.reachable() == Some(true);
                    best = Some(match best {
                        None => outcome,
                        Some(prev) if better(outcome, prev) => outcome,
                        Some(prev) => prev,
                    });
                    if done {
                        break;
                    }
                }
                best.map(|outcome| (endpoint, outcome))
            }
        });
        for (endpoint, outcome) in futures::future::join_all(rounds).await.into_iter().flatten() {
            if let Some(line) = conditions.observe(endpoint, outcome, Instant::now()) {
                line.emit();
            }
            probes.record(
                endpoint,
                Probe {
                    at: Instant::now(),
                    outcome,
                },
            );
        }
    }
}

/// Success beats no evidence beats failure.
fn better(a: ProbeOutcome, b: ProbeOutcome) -> bool {
    let rank = |o: ProbeOutcome| match o.reachable() {
        Some(true) => 2,
        None => 1,
        Some(false) => 0,
    };
    rank(a) > rank(b)
}

/// One probe of one address.
pub async fn probe(addr: SocketAddr, tls: &tokio_rustls::TlsConnector) -> ProbeOutcome {
    let tcp = match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await {
        Err(_) => return ProbeOutcome::Timeout,
        Ok(Err(err)) => {
            return match err.raw_os_error() {
                Some(libc::ECONNREFUSED) => ProbeOutcome::Refused,
                Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => ProbeOutcome::NoRoute,
                _ => ProbeOutcome::Timeout,
            }
        }
        Ok(Ok(tcp)) => tcp,
    };
    let name = ServerName::IpAddress(addr.ip().into());
    let first = Arc::new(OnceLock::new());
    let tcp = FirstByte {
        inner: tcp,
        first: first.clone(),
    };
    let mut stream = match tokio::time::timeout(STEP_TIMEOUT, tls.connect(name, tcp)).await {
        Ok(Ok(stream)) => stream,
        // It answered something that is not TLS, or closed: something listens there.
        Ok(Err(_)) => return ProbeOutcome::NoTls,
        Err(_) => return handshake_timed_out(first.get().copied()),
    };
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: lifeline-probe\r\nConnection: close\r\n\r\n"
    );
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        let mut buf = [0u8; 64];
        let mut len = 0;
        while len < buf.len() {
            let n = stream.read(&mut buf[len..]).await?;
            if n == 0 {
                break;
            }
            len += n;
            if buf[..len].windows(2).any(|w| w == b"\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(status_code(&buf[..len]))
    };
    match tokio::time::timeout(STEP_TIMEOUT, exchange).await {
        Ok(Ok(Some(code))) => ProbeOutcome::Answered(code),
        _ => ProbeOutcome::NoAnswer,
    }
}

/// A TLS handshake that did not finish in time, by the first byte the peer sent: none (the
/// kernel accepted, nothing answers: a stopped, deadlocked or overloaded apiserver) or the
/// start of a TLS handshake record that never completed is a failure; anything else came from
/// a peer that speaks another protocol (a few bytes, fewer than a TLS record header, leave
/// rustls waiting for more).
fn handshake_timed_out(first: Option<u8>) -> ProbeOutcome {
    const TLS_HANDSHAKE_RECORD: u8 = 0x16;
    match first {
        None | Some(TLS_HANDSHAKE_RECORD) => ProbeOutcome::TlsTimeout,
        Some(_) => ProbeOutcome::NoTls,
    }
}

/// The probe's TCP stream, noting the first byte the peer sends: once a handshake has timed
/// out (and the stream is gone with it), that tells a silent peer from a talkative one.
struct FirstByte {
    inner: TcpStream,
    first: Arc<OnceLock<u8>>,
}

impl AsyncRead for FirstByte {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Some(&byte) = buf.filled().get(before) {
            let _ = self.first.set(byte);
        }
        polled
    }
}

impl AsyncWrite for FirstByte {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The status code of an HTTP/1.x status line.
fn status_code(line: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/1."))?;
    words.next()?.parse().ok()
}

/// A TLS client that accepts any certificate: the probe asks whether an apiserver answers,
/// and sends nothing that needs protecting.
pub fn tls_connector() -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn parses_status_lines() {
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_code(b"HTTP/1.0 503 Service Unavailable\r\n"), Some(503));
        assert_eq!(status_code(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code(b""), None);
    }

    #[tokio::test]
    async fn refused_and_plain_tcp_endpoints() {
        let tls = tls_connector();
        // A port nobody listens on.
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        assert_eq!(probe(addr, &tls).await, ProbeOutcome::Refused);
        // A plain TCP service that closes at once: it is there.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                drop(s);
            }
        });
        assert_eq!(probe(addr, &tls).await, ProbeOutcome::NoTls);
    }

    /// A server that accepts and then writes `reply` (nothing if empty) and holds the
    /// connection open.
    async fn server(reply: &'static [u8]) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut s, _)) = listener.accept().await {
                s.write_all(reply).await.unwrap();
                held.push(s);
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_silent_handshake_fails_an_answer_that_is_not_tls_does_not() {
        let tls = tls_connector();
        let (stuck, half_tls, garbage, short) = (
            // A stopped apiserver: its kernel accepts, nothing answers the ClientHello.
            server(b"").await,
            // A TLS record header, and then nothing: an overloaded TLS server.
            server(&[0x16, 0x03, 0x03]).await,
            // Something else, answering in its own protocol.
            server(b"SSH-2.0-OpenSSH_9.6\r\n").await,
            // Fewer bytes than a TLS record header: rustls waits for more, in vain.
            server(b"?\n").await,
        );
        let outcomes = tokio::join!(
            probe(stuck, &tls),
            probe(half_tls, &tls),
            probe(garbage, &tls),
            probe(short, &tls),
        );
        assert_eq!(
            outcomes,
            (
                ProbeOutcome::TlsTimeout,
                ProbeOutcome::TlsTimeout,
                ProbeOutcome::NoTls,
                ProbeOutcome::NoTls
            )
        );
    }
}
