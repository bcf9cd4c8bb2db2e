//! Time, query strings and HTTP responses of `ll-apiserver`.
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub type Body = BoxBody<Bytes, Infallible>;

// ---------------------------------------------------------------------------------------------
// Time

pub fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Days since 1970-01-01 → (year, month, day); Howard Hinnant's civil_from_days.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// (year, month, day) → days since 1970-01-01; Howard Hinnant's days_from_civil.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// RFC 3339 in UTC with second precision, like Kubernetes' metav1.Time.
pub fn rfc3339(unix_secs: u64) -> String {
    let (year, month, day) = civil_from_days((unix_secs / 86_400) as i64);
    let rem = unix_secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Seconds since the epoch of an RFC 3339 time (`2021-01-13T13:20:00Z`, fractions and offsets
/// allowed), or None.
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let days = days_from_civil(num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        rest = frac.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 => {
            let sign = match &rest[..1] {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            sign * (rest[1..3].parse::<i64>().ok()? * 3600 + rest[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    u64::try_from(secs - offset).ok()
}

/// Kubernetes' duration.HumanDuration, as kubectl's AGE column shows it.
pub fn human_duration(secs: u64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else {
        format!("{d}d")
    }
}

/// The age of an object, as kubectl shows it (`<unknown>` without a creationTimestamp).
pub fn age_of(object: &Value) -> String {
    match object["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(parse_rfc3339)
    {
        Some(t) => human_duration(unix_now().as_secs().saturating_sub(t)),
        None => "<unknown>".into(),
    }
}

/// A duration as the helper programs take it: `300ms`, `2s`, `1.5s`, `1m`, `1h`; a bare number is
/// seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

// ---------------------------------------------------------------------------------------------
// Query strings

pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', hi, lo]) => hex(*hi).zip(hex(*lo)).map(|(hi, lo)| hi << 4 | lo),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub type Query = BTreeMap<String, String>;

pub fn parse_query(query: Option<&str>) -> Query {
    query
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect()
}

/// Go's strconv.ParseBool, which the apiserver uses for query booleans (python sends `True`).
pub fn parse_bool(s: Option<&String>) -> bool {
    matches!(
        s.map(String::as_str),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True")
    )
}

// ---------------------------------------------------------------------------------------------
// Responses

pub fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Full::new(body.into()).boxed())
        .expect("valid response")
}

pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    full(status, "application/json", value.to_string())
}

pub fn ok(value: &Value) -> Response<Body> {
    json_response(StatusCode::OK, value)
}

/// A failure as the apiserver reports it: a `Status` object and its HTTP code (`details`
/// `null` leaves the field out, as the real one does for errors without details).
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Value,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>, details: Value) -> ApiError {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            details,
        }
    }

    /// 404 for a path the server does not serve at all.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
            json!({}),
        )
    }

    /// 404 `pods "web-9" not found` (`group` empty for the core group).
    pub fn not_found(group: &str, plural: &str, name: &str) -> ApiError {
        let resource = if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        let mut details = json!({"name": name, "kind": plural});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError::new(
            404,
            "NotFound",
            format!("{resource} \"{name}\" not found"),
            details,
        )
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message, Value::Null)
    }

    pub fn method_not_allowed(method: &str) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
            Value::Null,
        )
    }

    /// 422 `Kind.group "name" is invalid: [field: Required value, ...]`, with one cause per
    /// (field, causeReason, message).
    pub fn invalid(kind: &str, group: &str, name: &str, errors: &[(String, &str, String)]) -> ApiError {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let texts: Vec<String> = errors.iter().map(|(f, _, m)| format!("{f}: {m}")).collect();
        let summary = match texts.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|(f, r, m)| json!({"reason": r, "message": m, "field": f}))
            .collect();
        let mut details = json!({"name": name, "kind": kind, "causes": causes});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {summary}"),
            details,
        )
    }

    pub fn status_object(&self) -> Value {
        status_object(self.code, &self.reason, &self.message, self.details.clone())
    }

    pub fn response(&self) -> Response<Body> {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(status, &self.status_object())
    }
}

pub fn status_object(code: u16, reason: &str, message: &str, details: Value) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    });
    if status["details"].is_null() {
        if let Some(m) = status.as_object_mut() {
            m.remove("details");
        }
    }
    status
}

/// One line of a watch stream.
pub fn event_line(kind: &str, object: &Value) -> Bytes {
    // Written by hand to keep the real apiserver's key order: type, then object.
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n"))
}

/// A channel that yields the given lines, then ends.
pub fn stream_lines(lines: Vec<Bytes>) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(lines.len().max(1));
    for line in lines {
        let _ = tx.try_send(line);
    }
    rx
}

/// A 200 response whose body is every chunk received from `rx` (chunked on h1, DATA frames on
/// h2), ending when the sender is dropped.
pub fn streaming(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_610_544_000), "2021-01-13T13:20:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        for t in [0, 951_782_400, 1_610_544_000, 1_700_000_123] {
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        }
        assert_eq!(parse_rfc3339("2021-01-13T13:20:00.123456Z"), Some(1_610_544_000));
        assert_eq!(parse_rfc3339("2021-01-13T14:20:00+01:00"), Some(1_610_544_000));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("2x").is_err());
        assert_eq!(human_duration(59), "59s");
        assert_eq!(human_duration(185), "3m5s");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(5 * 86_400), "5d");
    }

    #[test]
    fn queries() {
        let q = parse_query(Some("watch=True&labelSelector=a%3Db&x&c=100%&d=%e2%9c%93"));
        assert_eq!(q["c"], "100%");
        assert_eq!(q["d"], "\u{2713}");
        assert!(parse_bool(q.get("watch")));
        assert_eq!(q["labelSelector"], "a=b");
        assert_eq!(q["x"], "");
        assert!(!parse_bool(q.get("missing")));
    }

    #[test]
    fn invalid_messages() {
        let one = ApiError::invalid(
            "Event",
            "events.k8s.io",
            "e1",
            &[("eventTime".into(), "FieldValueRequired", "Required value".into())],
        );
        assert_eq!(one.code, 422);
        assert_eq!(
            one.message,
            "Event.events.k8s.io \"e1\" is invalid: eventTime: Required value"
        );
        let two = ApiError::invalid(
            "Event",
            "",
            "e1",
            &[
                ("a".into(), "FieldValueRequired", "Required value".into()),
                ("b".into(), "FieldValueRequired", "Required value".into()),
            ],
        );
        assert_eq!(
            two.message,
            "Event \"e1\" is invalid: [a: Required value, b: Required value]"
        );
    }
}
