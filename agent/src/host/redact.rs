//! Secrets out of everything the agent shows: command lines carry them (`--token=...`,
//! `--password VALUE`, `AWS_SECRET_ACCESS_KEY=...`, `Authorization: Bearer ...`, URLs with
//! `user:pass@`), and the agent shows command lines in its API, logs, alerts and Events.
//!
//! The command line is redacted once, where it is read from `/proc` (`process.rs`), so every
//! output inherits it. Values become [`REDACTED`]; names stay, so an operator still sees which
//! flag was given. The rules work on whitespace-separated words of the joined command line:
//!
//! 1. `--NAME=VALUE`, `-NAME=VALUE` and `NAME=VALUE` (environment style) where NAME looks like a
//!    secret ([`is_secret_name`]): the VALUE.
//! 2. `--NAME VALUE` (NAME a secret, the next word not a flag): the next word.
//! 3. `Bearer VALUE` (any case): the next word.
//! 4. In URLs: the password of `scheme://user:password@host` (all of a user-only
//!    `scheme://token@host`), and secret query parameters (`?token=...`).
//! 5. In a Kubernetes API path (`/api/...`, `/apis/...`, bare or in a URL: `kubectl get --raw
//!    PATH`, `curl URL`): every query value outside [`KEPT_QUERY_KEYS`], as the streams keep
//!    a request's path (a label selector's value names what a client looks for).
//!
//! Values `true` and `false` are kept (`--use-service-account-credentials=true` is a switch).

use std::{borrow::Cow, fmt::Write as _};

/// What a secret value becomes.
pub const REDACTED: &str = "<redacted>";

/// Query keys of a Kubernetes API path whose values are kept (SPEC "Streams"); every other
/// value is redacted wherever a path is shown (streams, command lines).
pub const KEPT_QUERY_KEYS: [&str; 5] = [
    "watch",
    "timeoutSeconds",
    "resourceVersion",
    "allowWatchBookmarks",
    "limit",
];

/// Words that make a name secret-looking (after lowercasing and `_`/`.` → `-`).
const SECRET_WORDS: [&str; 12] = [
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "api-key",
    "access-key",
    "private-key",
    "key-data",
    "credential",
    "bearer",
];

/// Endings that make a secret-looking name harmless: it names where a secret is, or how it
/// behaves, not the secret itself (`--token-auth-file`, `--token-ttl`,
/// `--discovery-token-ca-cert-hash`, `--secret-name`).
const HARMLESS_ENDINGS: [&str; 10] = [
    "-file",
    "-path",
    "-dir",
    "-ttl",
    "-hash",
    "-name",
    "-namespace",
    "-timeout",
    "-duration",
    "-ref",
];

/// Whether a flag, variable or parameter name looks like it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace(['_', '.'], "-");
    SECRET_WORDS.iter().any(|w| name.contains(w)) && !HARMLESS_ENDINGS.iter().any(|e| name.ends_with(e))
}

/// A name as it may appear before `=`: letters, digits, `_`, `-`, `.`.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn is_switch(value: &str) -> bool {
    value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("false")
}

/// `text` with every secret-looking value replaced by [`REDACTED`] (rules in the module doc).
/// Whitespace is kept as it was.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // The previous word asked for the next one to be redacted (`--password VALUE`, `Bearer X`).
    let mut redact_next = false;
    let mut rest = text;
    while !rest.is_empty() {
        let space = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..space]);
        rest = &rest[space..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, after) = rest.split_at(end);
        rest = after;
        if word.is_empty() {
            continue;
        }
        if std::mem::take(&mut redact_next) && !word.starts_with('-') {
            out.push_str(REDACTED);
            continue;
        }
        redact_next = word.eq_ignore_ascii_case("bearer")
            || (word.starts_with('-') && !word.contains('=') && is_secret_name(word.trim_start_matches('-')));
        out.push_str(&redact_word(word));
    }
    out
}

/// Rules 1, 4 and 5 within one word.
fn redact_word(word: &str) -> String {
    if let Some((name, value)) = word.split_once('=') {
        let bare = name.trim_start_matches('-');
        if is_name(bare) && is_secret_name(bare) && !value.is_empty() && !is_switch(value) {
            return format!("{name}={REDACTED}");
        }
    }
    let word = if word.contains("://") {
        redact_url(word)
    } else {
        word.to_owned()
    };
    redact_api_query(&word)
}

/// Rule 5: the query values of a Kubernetes API path in `word` outside [`KEPT_QUERY_KEYS`].
fn redact_api_query(word: &str) -> String {
    let Some(q) = word.find('?') else {
        return word.to_owned();
    };
    let before = &word[..q];
    let path = match before.find("://") {
        Some(s) => before[s + 3..].find('/').map_or("", |p| &before[s + 3 + p..]),
        None => before.trim_start_matches(|c| c != '/'),
    };
    if !(path.starts_with("/api/") || path.starts_with("/apis/")) {
        return word.to_owned();
    }
    let ends: &[char] = &['&', '#'];
    redact_params(word, q, ends, |name, value| {
        !KEPT_QUERY_KEYS.contains(&name) && value != REDACTED
    })
}

/// Where a URL's authority (`userinfo@host:port`) ends.
const AUTHORITY_END: &[char] = &['/', '?', '#', ',', ';', '"', '\'', '<', '>', '(', ')', '{', '}'];
/// Where a query parameter's value ends.
const PARAM_END: &[char] = &['&', ';', '#', ',', '"', '\''];

/// Rule 4: the password (or user-only token) of every `scheme://userinfo@host` in `word`, then
/// secret query parameters (`?token=...`, `&password=...`).
fn redact_url(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority = &tail[..tail.find(AUTHORITY_END).unwrap_or(tail.len())];
        match authority.rfind('@') {
            Some(at) => {
                match authority[..at].split_once(':') {
                    Some((user, _)) => out.push_str(&format!("{user}:{REDACTED}")),
                    None => out.push_str(REDACTED),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority.len()..];
    }
    out.push_str(rest);
    redact_query(&out)
}

/// Secret parameters after `?`, `&` or `;` in `text` (`?a=1&token=x` → `?a=1&token=<redacted>`).
fn redact_query(text: &str) -> String {
    match text.find('?') {
        Some(q) => redact_params(text, q, PARAM_END, |name, _| {
            is_name(name) && is_secret_name(name)
        }),
        None => text.to_owned(),
    }
}

/// `text` with the non-empty value of each parameter after its `?` at `q` (parameters end at
/// one of `ends`) that `secret(name, value)` picks replaced by [`REDACTED`].
fn redact_params(text: &str, q: usize, ends: &[char], secret: impl Fn(&str, &str) -> bool) -> String {
    let mut out = String::from(&text[..=q]);
    let mut rest = &text[q + 1..];
    while !rest.is_empty() {
        let end = rest.find(ends).unwrap_or(rest.len());
        let param = &rest[..end];
        match param.split_once('=') {
            Some((name, value)) if !value.is_empty() && secret(name, value) => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
            }
            _ => out.push_str(param),
        }
        let sep_len = rest[end..].chars().next().map_or(0, char::len_utf8);
        out.push_str(&rest[end..end + sep_len]);
        rest = &rest[end + sep_len..];
    }
    out
}

/// `text` cut to at most `max` bytes (on a character boundary), marked with
/// [`TRUNCATED`] when cut.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut cut = max.saturating_sub(TRUNCATED.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(TRUNCATED);
    text
}

/// The mark of a value cut by [`truncate`].
pub const TRUNCATED: &str = "…[truncated]";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_keep_only_the_stream_metadata_of_their_query() {
        assert_eq!(
            redact("kubectl get --raw /api/v1/namespaces/default/pods?watch=true&timeoutSeconds=3&labelSelector=app%3Dsecret-xyz"),
            "kubectl get --raw /api/v1/namespaces/default/pods?watch=true&timeoutSeconds=3&labelSelector=<redacted>"
        );
        assert_eq!(
            redact("curl -k https://10.0.0.1:6443/apis/apps/v1/deployments?fieldSelector=metadata.name%3Ddb&limit=5"),
            "curl -k https://10.0.0.1:6443/apis/apps/v1/deployments?fieldSelector=<redacted>&limit=5"
        );
        // Not an API path: the general rules only.
        assert_eq!(
            redact("curl https://example/search?q=cats"),
            "curl https://example/search?q=cats"
        );
        assert_eq!(redact("--path=/api/v1/pods"), "--path=/api/v1/pods");
        assert_eq!(
            redact("https://h/api/v1/pods?token=abc&watch=1"),
            "https://h/api/v1/pods?token=<redacted>&watch=1"
        );
    }

    #[test]
    fn secret_values_are_redacted_and_their_names_kept() {
        for (input, want) in [
            ("app --token=abc123", "app --token=<redacted>"),
            ("app -token=abc123", "app -token=<redacted>"),
            ("app --password hunter2 --v=2", "app --password <redacted> --v=2"),
            ("app --db-password=x --x", "app --db-password=<redacted> --x"),
            (
                "app --client-key-data=LS0tLS1CRUdJTi",
                "app --client-key-data=<redacted>",
            ),
            ("app --api_key=k", "app --api_key=<redacted>"),
            ("app --apikey k", "app --apikey <redacted>"),
            (
                "kubeadm join --token abcdef.0123456789abcdef 10.0.0.1:6443",
                "kubeadm join --token <redacted> 10.0.0.1:6443",
            ),
            (
                "env AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI run",
                "env AWS_SECRET_ACCESS_KEY=<redacted> run",
            ),
            (
                "env GITHUB_TOKEN=ghp_x DB_PASSWD=y",
                "env GITHUB_TOKEN=<redacted> DB_PASSWD=<redacted>",
            ),
            (
                "curl -H Authorization: Bearer eyJhbGciOi.x.y",
                "curl -H Authorization: Bearer <redacted>",
            ),
            (
                "curl --header=Authorization:\tbearer tok",
                "curl --header=Authorization:\tbearer <redacted>",
            ),
            (
                "app --url=https://admin:s3cret@db.example:5432/x",
                "app --url=https://admin:<redacted>@db.example:5432/x",
            ),
            (
                "git clone https://ghp_tok@github.com/o/r",
                "git clone https://<redacted>@github.com/o/r",
            ),
            (
                "app http://h/p?a=1&token=t0k&b=2#frag",
                "app http://h/p?a=1&token=<redacted>&b=2#frag",
            ),
            (
                "app --a=http://u:p@x,https://v:q@y",
                "app --a=http://u:<redacted>@x,https://v:<redacted>@y",
            ),
            ("app --secret=", "app --secret="),
        ] {
            assert_eq!(redact(input), want, "{input:?}");
        }
    }

    #[test]
    fn harmless_arguments_stay_as_they_are() {
        for input in [
            "/usr/bin/kubelet --v=2 --config=/var/lib/kubelet/config.yaml",
            "kube-apiserver --token-auth-file=/etc/tokens.csv --authorization-mode=Node,RBAC",
            "kube-apiserver --service-account-key-file=/k.pem --tls-private-key-file=/tls.key",
            "kube-controller-manager --use-service-account-credentials=true",
            "kubeadm join --discovery-token-ca-cert-hash sha256:abc --token-ttl=24h",
            "kubectl --client-key=/home/me/.kube/key.pem --kubeconfig /k",
            "app --secret-name=my-secret --enable-bootstrap-token-auth --v 2",
            "app --password-file /run/secrets/pw",
            "nginx: master process /usr/sbin/nginx -g daemon off;",
            "app http://h:8080/path?a=1 https://[::1]:6443",
            "python3 -c print('tokens') KEY=value",
            "",
        ] {
            assert_eq!(redact(input), input, "{input:?}");
        }
    }

    #[test]
    fn whitespace_is_kept() {
        assert_eq!(redact("  a \t --token x  "), "  a \t --token <redacted>  ");
    }

    #[test]
    fn secret_names() {
        for name in [
            "token",
            "PASSWORD",
            "db_passwd",
            "aws.secret.access.key",
            "X-Api-Key",
            "bearer",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "v",
            "config",
            "token-auth-file",
            "secret-name",
            "password_file",
            "client-key",
            "authorization-mode",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn truncation_marks_the_cut_on_a_character_boundary() {
        assert_eq!(truncate("short".into(), 100), "short");
        let cut = truncate("é".repeat(100), 50);
        assert!(cut.len() <= 50, "{}", cut.len());
        assert!(cut.ends_with(TRUNCATED));
        assert!(cut.starts_with("éé"));
    }

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
}
