//! The shipped Grafana dashboard (`deploy/components/monitoring/dashboard.json`) as Grafana
//! would query it: each panel's targets with the dashboard's own template variables
//! substituted (`$node`, `${node}`, `[[node]]`, `${node:regex}`, ... with the values chosen, as
//! a regex alternation for multi-value variables, which is Grafana's Prometheus formatting).
use std::collections::BTreeMap;

use serde_json::Value;

/// One query of one panel.
#[derive(Clone, Debug, PartialEq)]
pub struct PanelQuery {
    pub title: String,
    /// `table` panels and targets marked `instant` are instant queries.
    pub instant: bool,
    pub expr: String,
}

/// Grafana's regex escaping of one value (what `${var:regex}` and multi-value variables use).
fn regex_escape(v: &str) -> String {
    v.chars()
        .flat_map(|c| {
            let special = "\\^$.|?*+()[]{}/".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// `expr` with each variable of `values` substituted; the values of one variable joined as
/// `(a|b)` when there are several, escaped as regexes (the dashboard uses `=~` for every
/// variable). Unknown variables are left as they are (the caller fails on them).
pub fn substitute(expr: &str, values: &BTreeMap<String, Vec<String>>) -> String {
    let mut out = expr.to_owned();
    // Longest names first: `$node` must not eat `$nodes`.
    let mut names: Vec<&String> = values.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        let vals = &values[name];
        let text = match vals.as_slice() {
            [one] => regex_escape(one),
            many => format!(
                "({})",
                many.iter().map(|v| regex_escape(v)).collect::<Vec<_>>().join("|")
            ),
        };
        for form in [
            format!("${{{name}:regex}}"),
            format!("${{{name}:pipe}}"),
            format!("${{{name}}}"),
            format!("[[{name}]]"),
            format!("${name}"),
        ] {
            out = out.replace(&form, &text);
        }
    }
    out
}

/// The panels, nested rows included, in order.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every query of every panel (rows have none), variables substituted; a panel without a
/// query, or a query left with a `$`, is an error naming the panel.
pub fn queries(dashboard: &Value, values: &BTreeMap<String, Vec<String>>) -> Result<Vec<PanelQuery>, String> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap_or("(untitled)").to_owned();
        // The panel's data source is the dashboard's `datasource` variable (the Prometheus
        // chosen), or its targets' would say otherwise.
        let source = &p["datasource"];
        if source["type"] != "prometheus"
            || !matches!(source["uid"].as_str(), Some("${datasource}" | "$datasource"))
        {
            return Err(format!(
                "panel {title:?} does not query the $datasource Prometheus: {source}"
            ));
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            return Err(format!("panel {title:?} has no query"));
        }
        for t in targets {
            if !t["datasource"].is_null() && t["datasource"] != *source {
                return Err(format!("panel {title:?}: a target with its own data source: {t}"));
            }
            let expr = t["expr"]
                .as_str()
                .ok_or(format!("panel {title:?}: a target without expr: {t}"))?;
            let expr = substitute(expr, values);
            if expr.contains('$') || expr.contains("[[") {
                return Err(format!("panel {title:?}: a variable is left in {expr:?}"));
            }
            out.push(PanelQuery {
                title: title.clone(),
                instant: p["type"] == "table" || t["instant"] == true,
                expr,
            });
        }
    }
    Ok(out)
}

/// The template variables of type `query`: name → the PromQL of its `label_values(MATCH,
/// LABEL)`, as (LABEL, MATCH) with the variables it uses substituted by the caller.
pub fn query_variables(dashboard: &Value) -> Vec<(String, String)> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .filter_map(|v| {
            let q = v["query"]["query"].as_str().or(v["query"].as_str())?;
            Some((v["name"].as_str()?.to_owned(), q.to_owned()))
        })
        .collect()
}

/// `label_values(MATCH, LABEL)` → (MATCH, LABEL).
pub fn label_values(query: &str) -> Option<(String, String)> {
    let inner = query.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (matcher, label) = inner.rsplit_once(',')?;
    Some((matcher.trim().to_owned(), label.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_substituted_as_grafana_does_for_prometheus() {
        let mut v = BTreeMap::new();
        v.insert("node".to_owned(), vec!["n1.example".to_owned()]);
        v.insert("namespace".to_owned(), vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(
            substitute("x{node=~\"$node\", namespace=~\"${namespace}\"}", &v),
            "x{node=~\"n1\\.example\", namespace=~\"(a|b)\"}"
        );
        assert_eq!(
            label_values("label_values(lifeline_client_state{node=~\"$node\"}, namespace)"),
            Some((
                "lifeline_client_state{node=~\"$node\"}".into(),
                "namespace".into()
            ))
        );
    }

    #[test]
    fn every_shipped_panel_has_queries_and_no_variable_is_left() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/components/monitoring/dashboard.json"
        );
        let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut v = BTreeMap::new();
        for (name, _) in query_variables(&d) {
            v.insert(name, vec![".*".to_owned()]);
        }
        assert!(v.contains_key("node") && v.contains_key("namespace"), "{v:?}");
        let q = queries(&d, &v).unwrap();
        assert!(q.iter().any(|p| p.instant) && q.iter().any(|p| !p.instant));
        let mut partial = v.clone();
        partial.remove("namespace");
        assert!(queries(&d, &partial).unwrap_err().contains("variable is left"));
    }
}
