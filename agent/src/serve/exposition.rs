//! Reading samples back from the Prometheus text exposition format (what `/metrics` serves):
//! `name{label="value",...} value [timestamp]`, label values with `\\`, `\"` and `\n` escaped.
//! Only what `kubectl lifeline` needs: the samples of one metric, with their labels.
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    #[error("line {line}: {why}: {text:?}")]
    Malformed {
        line: usize,
        why: &'static str,
        text: String,
    },
}

/// One sample: its labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The samples of metric `name` in `text` (comments and other metrics skipped).
pub fn samples(text: &str, name: &str) -> Result<Vec<Sample>, Error> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue; // another metric whose name starts with `name`
        }
        let malformed = |why| Error::Malformed {
            line: i + 1,
            why,
            text: line.to_owned(),
        };
        let (labels, rest) = if let Some(body) = rest.strip_prefix('{') {
            parse_labels(body).ok_or_else(|| malformed("bad labels"))?
        } else {
            (BTreeMap::new(), rest)
        };
        let value = rest
            .split_whitespace()
            .next()
            .ok_or_else(|| malformed("no value"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| malformed("bad value"))?,
        };
        out.push(Sample { labels, value });
    }
    Ok(out)
}

/// `a="x",b="y"} rest` → the labels and `rest`.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (name, rest) = s.split_once('=')?;
        let mut chars = rest.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (at, '"') => break at,
                (_, c) => value.push(c),
            }
        };
        labels.insert(name.trim().to_owned(), value);
        s = &rest[end + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_of_one_metric_with_escaped_labels() {
        let text = "# HELP lifeline_client_state x\n\
            # TYPE lifeline_client_state gauge\n\
            lifeline_client_state{comm=\"a \\\"b\\\"\\\\c\",namespace=\"ns\",pod=\"p\",state=\"disconnected\"} 1\n\
            lifeline_client_state{comm=\"k\",namespace=\"\",state=\"healthy\"} 0\n\
            lifeline_client_state_other{x=\"y\"} 3\n\
            lifeline_build_info{version=\"1\"} 1\n";
        let got = samples(text, "lifeline_client_state").unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].labels["comm"], "a \"b\"\\c");
        assert_eq!(got[0].labels["state"], "disconnected");
        assert_eq!(got[0].value, 1.0);
        assert_eq!(got[1].labels["namespace"], "");
        assert_eq!(got[1].value, 0.0);
        assert_eq!(samples("up 1 1700000000\n", "up").unwrap()[0].value, 1.0);
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        let err = samples("m 1\nm{a=\"unterminated} 1\n", "m").unwrap_err();
        assert!(matches!(err, Error::Malformed { line: 2, .. }), "{err}");
        assert!(samples("m{a=\"x\"} nope\n", "m").is_err());
    }
}
