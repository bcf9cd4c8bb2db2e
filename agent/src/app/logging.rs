//! The agent's log, on stderr: text (default) or JSON (`--log-format json`), one line per
//! event whatever the event holds.
//!
//! Process names and command lines are chosen by whoever starts a process: a name such as
//! `"a\nERROR forged"` must not write a second, forged line, and an ESC sequence must not reach
//! an operator's terminal. Rather than escaping at every log call, the writer escapes every
//! control character of a formatted line ([`escape_controls`]) except the newline that ends it,
//! so every log site is covered. (Colors are therefore off: they are ESC sequences too.) JSON
//! lines escape control characters by themselves.
use std::{borrow::Cow, io};

use clap::ValueEnum;
use tracing_subscriber::{fmt::MakeWriter, EnvFilter};

use crate::host::redact::escape_controls;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL target: message key=value...`
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `message` and the fields).
    Json,
}

/// The agent at `info`, the libraries it uses below that: their warnings are about peers
/// (rustls warns at every probe of an endpoint that does not speak TLS, every 5 s) that the
/// agent reports itself, in its own words and at its own pace. A target names a prefix
/// (`hyper` also covers `hyper_util` and `hyper_rustls`, `kube` covers `kube_client` and
/// `kube_runtime`); the kernel programs' own log lines have the target `lifeline_ebpf`.
pub const DEFAULT_FILTER: &str =
    "info,rustls=error,tokio_rustls=error,hyper=error,h2=error,tower=error,kube=error,aya=warn";

/// [`DEFAULT_FILTER`] with `user`'s directives (`RUST_LOG`) over it: a level alone replaces
/// the agent's `info`, a target's level replaces that target's (`RUST_LOG=rustls=warn` shows
/// rustls' warnings again; `RUST_LOG=debug` raises the agent, not the libraries). Invalid
/// directives are ignored, with a line on stderr.
pub fn filter(user: Option<&str>) -> EnvFilter {
    let directives = match user.map(str::trim) {
        Some(user) if !user.is_empty() => format!("{DEFAULT_FILTER},{user}"),
        _ => DEFAULT_FILTER.to_owned(),
    };
    EnvFilter::builder().parse_lossy(directives)
}

/// Installs the global subscriber: [`filter`] with `RUST_LOG`, stderr, `format`.
pub fn init(format: LogFormat) {
    let filter = filter(std::env::var(EnvFilter::DEFAULT_ENV).ok().as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(EscapeControls(io::stderr))
        .with_ansi(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// A [`MakeWriter`] whose writers escape control characters inside each formatted line.
#[derive(Clone, Copy, Debug)]
pub struct EscapeControls<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for EscapeControls<M> {
    type Writer = EscapingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingWriter(self.0.make_writer())
    }
}

/// Writes each buffer it gets (the formatter hands over one whole line per event) with its
/// control characters escaped, keeping one final newline.
pub struct EscapingWriter<W>(W);

impl<W: io::Write> io::Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (line, newline) = match text.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (&*text, ""),
        };
        let escaped = escape_controls(line);
        if matches!(escaped, Cow::Borrowed(_)) && matches!(text, Cow::Borrowed(_)) {
            self.0.write_all(buf)?;
        } else {
            self.0.write_all(escaped.as_bytes())?;
            self.0.write_all(newline.as_bytes())?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// Text lines logged through [`filter`]`(user)`.
    fn filtered(user: Option<&str>, emit: impl FnOnce()) -> Vec<String> {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(user))
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn chatter() {
        tracing::warn!(
            target: "rustls::check",
            "Received a ClientHello handshake message while expecting [ServerHello, HelloRetryRequest]"
        );
        tracing::warn!(target: "h2::proto::connection", "h2 warns");
        tracing::warn!(target: "hyper_util::client::legacy", "hyper_util warns");
        tracing::warn!(target: "kube_runtime::watcher", "kube warns");
        tracing::info!(target: "lifeline::host::prober", "endpoint 127.0.0.1:6443 does not answer TLS");
        tracing::debug!(target: "lifeline::table", "agent debug");
        tracing::warn!(target: "lifeline_ebpf", "kernel program warns");
    }

    #[test]
    fn libraries_stay_below_the_agents_default_level_unless_asked_for() {
        let shown = |lines: &[String]| -> Vec<String> {
            lines
                .iter()
                .map(|l| l.split_once(": ").map_or(l.clone(), |(_, m)| m.to_owned()))
                .collect()
        };
        assert_eq!(
            shown(&filtered(None, chatter)),
            [
                "endpoint 127.0.0.1:6443 does not answer TLS",
                "kernel program warns"
            ]
        );
        assert_eq!(
            shown(&filtered(Some(""), chatter)),
            shown(&filtered(None, chatter)),
            "an empty RUST_LOG"
        );
        // Raising the agent's level leaves the libraries where they were.
        assert_eq!(
            shown(&filtered(Some("debug"), chatter)),
            [
                "endpoint 127.0.0.1:6443 does not answer TLS",
                "agent debug",
                "kernel program warns"
            ]
        );
        // Naming a library raises it.
        let lines = filtered(Some("rustls=warn"), chatter);
        assert!(
            lines[0].contains("WARN rustls::check: Received a ClientHello"),
            "{lines:?}"
        );
        assert_eq!(lines.len(), 3, "{lines:?}");
        // Lowering the agent's level works too.
        assert_eq!(shown(&filtered(Some("warn"), chatter)), ["kernel program warns"]);
    }

    fn logged(format: LogFormat, emit: impl FnOnce()) -> String {
        let captured = Captured::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(EscapeControls(captured.clone()))
            .with_ansi(false);
        match format {
            LogFormat::Text => tracing::subscriber::with_default(builder.finish(), emit),
            LogFormat::Json => {
                tracing::subscriber::with_default(builder.json().flatten_event(true).finish(), emit)
            }
        }
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_hostile_name_stays_on_one_line_in_every_field_and_format() {
        let comm = "a\nERROR forged \u{1b}[31mred";
        for format in [LogFormat::Text, LogFormat::Json] {
            let text = logged(format, || {
                tracing::warn!(comm = %comm, "client {comm} went stale");
                tracing::info!("second");
            });
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 2, "{format:?}: {text:?}");
            assert!(!text.contains('\u{1b}'), "{format:?}: {text:?}");
            assert!(
                lines[0].contains("WARN") || lines[0].contains("\"WARN\""),
                "{text}"
            );
            assert!(
                lines[0].matches("ERROR forged").count() == 2,
                "{format:?}: {text}"
            );
            if format == LogFormat::Json {
                let event: serde_json::Value = serde_json::from_str(lines[0]).expect("JSON line");
                assert_eq!(event["comm"], comm, "JSON keeps the value exactly");
                assert_eq!(event["level"], "WARN");
            } else {
                assert!(
                    lines[0].contains("comm=a\\nERROR forged \\u{1b}[31mred"),
                    "{text}"
                );
            }
        }
    }
}
