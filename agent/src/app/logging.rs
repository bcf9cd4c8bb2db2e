//! The agent's log, on stderr: text (default) or JSON (`--log-format json`), one line per
//! event whatever the event holds.
//!
//! Process names and command lines are chosen by whoever starts a process: a name such as
//! `"a\nERROR forged"` must not write a second, forged line, and an ESC sequence must not reach
//! an operator's terminal. Rather than escaping at every log call, the writer escapes every
//! control character of a formatted line ([`escape_controls`]) except the newline that ends it,
//! so every log site is covered. (Colors are therefore off: they are ESC sequences too.) JSON
//! lines escape control characters by themselves.
use std::{borrow::Cow, fmt::Write as _, io};

use clap::ValueEnum;
use tracing_subscriber::{fmt::MakeWriter, EnvFilter};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL target: message key=value...`
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `message` and the fields).
    Json,
}

/// Installs the global subscriber: `RUST_LOG` filter (default `info`), stderr, `format`.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(EscapeControls(io::stderr))
        .with_ansi(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// `text` with every control character (newline, carriage return, ESC, the C1 range, ...)
/// written as `\n`, `\r` or `\u{1b}`; tabs stay. Borrowed when there is none.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control() && c != '\t'
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

    #[test]
    fn control_characters_are_escaped_and_tabs_kept() {
        assert_eq!(escape_controls("kube-proxy"), "kube-proxy");
        assert!(matches!(escape_controls("plain\ttext"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\nERROR forged"), "a\\nERROR forged");
        assert_eq!(
            escape_controls("x\r\u{1b}[2J\u{9b}y\u{0}"),
            "x\\r\\u{1b}[2J\\u{9b}y\\u{0}"
        );
    }

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
