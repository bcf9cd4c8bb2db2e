//! What the table records about a client for the health rules: how its connections were
//! lost, and how its requests have been spaced. The table fills them in; `health` judges
//! them.
use std::time::{Duration, Instant};

/// How the client's requests have been spaced so far (rule B).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rhythm {
    pub last_request: Option<Instant>,
    /// The longest interval between two consecutive requests seen.
    pub longest_gap: Duration,
    /// How many intervals were seen.
    pub gaps: u32,
}

/// Who or what ended a connection that was not ended by the client's own choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// The peer closed it (FIN: the socket went to CLOSE_WAIT).
    PeerClosed,
    /// Reset by the peer or the path (RST, ECONNRESET).
    Reset,
    /// Timed out (ETIMEDOUT: unacknowledged retransmits, keepalive).
    TimedOut,
    /// The client closed it right after data arrived: an HTTP/2 GOAWAY or a server's close.
    Prompted,
    /// Destroyed on the host (ECONNABORTED: `ss -K`, lifeline's own reset).
    Aborted,
    /// The start-up scan found it closed by the peer and still held (CLOSE_WAIT): the loss
    /// happened before the agent started.
    FoundClosed,
}

impl LossCause {
    pub fn describe(self) -> &'static str {
        match self {
            LossCause::PeerClosed => "closed by the apiserver side",
            LossCause::Reset => "reset",
            LossCause::TimedOut => "timed out",
            LossCause::Prompted => "closed after the apiserver asked it to (GOAWAY)",
            LossCause::Aborted => "destroyed on this host",
            LossCause::FoundClosed => "found closed by the apiserver side when the agent started",
        }
    }
}
