//! Label and field selectors, as list and watch requests carry them, and the
//! `metav1.LabelSelector` of objects (PodDisruptionBudgets).
use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` (`a=b,c!=d,e in (f,g),h,!i`); empty selects everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

/// Splits at commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(key: &str, rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unable to parse requirement: found '{rest}', expected: '('"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if let Some(bad) = values.iter().find(|v| !valid_value(v)) {
        return Err(format!(
            "unable to parse requirement: invalid label value: \"{bad}\" for key {key}"
        ));
    }
    Ok(values)
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let req = if let Some(key) = term.strip_prefix('!') {
                Req::NotExists(key.trim().to_string())
            } else if let Some((key, rest)) = term.split_once(" notin ") {
                Req::NotIn(key.trim().to_string(), parse_set(key, rest)?)
            } else if let Some((key, rest)) = term.split_once(" in ") {
                Req::In(key.trim().to_string(), parse_set(key, rest)?)
            } else if let Some((key, value)) = term.split_once("!=") {
                Req::Ne(key.trim().to_string(), value.trim().to_string())
            } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Req::Eq(key.trim().to_string(), value.trim().to_string())
            } else if term.contains(['<', '>', '(', ')', ' ']) {
                return Err(format!("unable to parse requirement: {term:?}"));
            } else {
                Req::Exists(term.to_string())
            };
            let (key, value) = match &req {
                Req::Eq(k, v) | Req::Ne(k, v) => (k, Some(v)),
                Req::In(k, _) | Req::NotIn(k, _) | Req::Exists(k) | Req::NotExists(k) => (k, None),
            };
            if !valid_key(key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key \"{key}\""
                ));
            }
            if let Some(value) = value.filter(|v| !valid_value(v)) {
                return Err(format!(
                    "unable to parse requirement: invalid label value: \"{value}\" for key {key}"
                ));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object with `labels` (a JSON map, or null) is selected.
    pub fn matches(&self, labels: &Value) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` (`spec.nodeName=node-a,metadata.name!=x`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `s`, accepting only the field labels in `supported` (and `metadata.name`,
    /// `metadata.namespace`), as the real apiserver does per resource.
    pub fn parse(s: &str, supported: &[&str]) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: '{term}'; can't understand '{term}'"));
            };
            let field = field.trim();
            if !["metadata.name", "metadata.namespace"].contains(&field) && !supported.contains(&field) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether `object` is selected; `value` gives a field's value as a string.
    pub fn matches(&self, object: &Value, value: impl Fn(&Value, &str) -> String) -> bool {
        self.0
            .iter()
            .all(|(field, eq, want)| (value(object, field) == *want) == *eq)
    }
}

/// A field's value for field selectors: the string at the dotted `path` (booleans as
/// `true`/`false`, absent as empty).
pub fn dotted(object: &Value, path: &str) -> String {
    let v = path.split('.').fold(object, |v, key| &v[key]);
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// Whether a `metav1.LabelSelector` (`matchLabels`, `matchExpressions`) selects `labels`. An
/// empty or absent selector selects everything if `empty_selects_all`, else nothing (policy/v1
/// and policy/v1beta1 PodDisruptionBudgets differ just so).
pub fn label_selector_matches(selector: &Value, labels: &Value, empty_selects_all: bool) -> bool {
    let match_labels = selector["matchLabels"].as_object();
    let exprs = selector["matchExpressions"].as_array();
    if match_labels.is_none_or(|m| m.is_empty()) && exprs.is_none_or(|e| e.is_empty()) {
        return empty_selects_all;
    }
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    let labels_ok = match_labels
        .into_iter()
        .flatten()
        .all(|(k, v)| get(k) == v.as_str());
    let exprs_ok = exprs.into_iter().flatten().all(|e| {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"]
            .as_array()
            .map(|vs| vs.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match e["operator"].as_str().unwrap_or("") {
            "In" => get(key).is_some_and(|l| values.contains(&l)),
            "NotIn" => get(key).is_none_or(|l| !values.contains(&l)),
            "Exists" => get(key).is_some(),
            "DoesNotExist" => get(key).is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let labels = json!({"app": "web", "tier": "front"});
        let yes = [
            "",
            "app=web",
            "app==web",
            "app=web,tier",
            "tier in (front, back)",
            "app notin (db)",
            "!missing",
            "missing!=x",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&labels), "{s}");
        }
        for s in [
            "app=db",
            "app!=web",
            "missing",
            "!app",
            "tier in (back)",
            "tier notin (front)",
        ] {
            assert!(!LabelSelector::parse(s).unwrap().matches(&labels), "{s}");
        }
        assert!(!LabelSelector::parse("app=web").unwrap().matches(&Value::Null));
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("app=we b").is_err());
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "node-a"}});
        let sel = FieldSelector::parse("spec.nodeName=node-a", &["spec.nodeName"]).unwrap();
        assert!(sel.matches(&pod, dotted));
        let sel = FieldSelector::parse("spec.nodeName=node-b", &["spec.nodeName"]).unwrap();
        assert!(!sel.matches(&pod, dotted));
        let sel = FieldSelector::parse("metadata.name!=q,spec.nodeName==node-a", &["spec.nodeName"]).unwrap();
        assert!(sel.matches(&pod, dotted));
        assert_eq!(
            FieldSelector::parse("spec.foo=x", &["spec.nodeName"]).unwrap_err(),
            "field label not supported: spec.foo"
        );
    }

    #[test]
    fn object_selectors() {
        let labels = json!({"app": "web"});
        assert!(label_selector_matches(
            &json!({"matchLabels": {"app": "web"}}),
            &labels,
            false
        ));
        assert!(!label_selector_matches(
            &json!({"matchLabels": {"app": "db"}}),
            &labels,
            true
        ));
        assert!(label_selector_matches(
            &json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
            &labels,
            false
        ));
        assert!(label_selector_matches(&json!({}), &labels, true));
        assert!(!label_selector_matches(&Value::Null, &labels, false));
    }
}
