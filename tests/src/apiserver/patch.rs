//! PATCH bodies: JSON merge patch (RFC 7386; strategic merge patches are applied the same way,
//! which is exact for the maps and scalars the fixture's objects are patched in) and JSON patch
//! (RFC 6902).
use serde_json::Value;

/// Applies a JSON merge patch to `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let map = target.as_object_mut().expect("object");
    for (key, value) in patch {
        // Strategic merge patch directives (`$patch`, `$retainKeys`, ...) are not data.
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Splits a JSON pointer into its parent's pointer and last token.
fn split_pointer(pointer: &str) -> Result<(&str, String), String> {
    let i = pointer
        .rfind('/')
        .ok_or_else(|| format!("invalid JSON pointer {pointer:?}"))?;
    Ok((&pointer[..i], unescape(&pointer[i + 1..])))
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("doc is missing path: \"{path}\"");
    match doc.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => map.remove(&last).ok_or_else(missing),
        Value::Array(items) => {
            let i: usize = last.parse().map_err(|_| missing())?;
            (i < items.len()).then(|| items.remove(i)).ok_or_else(missing)
        }
        _ => Err(missing()),
    }
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("doc is missing path: \"{path}\"");
    match doc.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => {
            map.insert(last, value);
            Ok(())
        }
        Value::Array(items) => {
            let i = if last == "-" {
                items.len()
            } else {
                last.parse().map_err(|_| missing())?
            };
            if i > items.len() {
                return Err(missing());
            }
            items.insert(i, value);
            Ok(())
        }
        _ => Err(missing()),
    }
}

/// Applies a JSON patch (an array of operations) to `doc`.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for op in ops {
        let path = op["path"].as_str().ok_or("a JSON patch operation needs a path")?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or(format!("missing value for {path}"))
        };
        match op["op"].as_str().unwrap_or("") {
            "add" => add(doc, path, value()?)?,
            "remove" => {
                remove(doc, path)?;
            }
            "replace" => {
                remove(doc, path)?;
                add(doc, path, value()?)?;
            }
            "move" | "copy" => {
                let from = op["from"].as_str().ok_or("move/copy needs from")?;
                let v = if op["op"] == "move" {
                    remove(doc, from)?
                } else {
                    doc.pointer(from)
                        .cloned()
                        .ok_or(format!("doc is missing path: \"{from}\""))?
                };
                add(doc, path, v)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("unexpected kind: {other}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge() {
        let mut doc = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        merge_patch(
            &mut doc,
            &json!({"a": null, "b": {"c": 5}, "e": [2], "$patch": "x"}),
        );
        assert_eq!(doc, json!({"b": {"c": 5, "d": 3}, "e": [2]}));
    }

    #[test]
    fn json() {
        let mut doc = json!({"a": {"b": [1, 2]}, "c": 1});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/a/b/-", "value": 3},
                {"op": "replace", "path": "/c", "value": 2},
                {"op": "add", "path": "/d~1e", "value": true},
                {"op": "remove", "path": "/a/b/0"},
                {"op": "test", "path": "/c", "value": 2},
            ]),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": {"b": [2, 3]}, "c": 2, "d/e": true}));
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/zz"}])).is_err());
        assert!(json_patch(&mut doc, &json!([{"op": "test", "path": "/c", "value": 3}])).is_err());
    }
}
