//! What the API server does to a custom resource against its CRD's
//! `openAPIV3Schema` (a structural schema) before storing it: fields the
//! schema does not declare are pruned (kept where
//! `x-kubernetes-preserve-unknown-fields` says so), and a value of the wrong
//! type, or outside an enum, is a 422 naming the field. apiVersion, kind and
//! metadata are the server's own and kept. Not modelled: defaults, formats,
//! patterns, bounds and CEL rules (`x-kubernetes-validations`).

use serde_json::{Map, Value};

/// The `openAPIV3Schema` of `crd` for `version`, if the CRD serves it.
pub fn version_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
        .pointer("/schema/openAPIV3Schema")
}

/// Prunes `obj` to `schema` and checks its types and enums; the errors are
/// the API server's field messages (`spec.x: Invalid value: ...`).
pub fn fit(obj: &mut Value, schema: &Value) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    if let Some(o) = obj.as_object_mut() {
        // The root's apiVersion, kind and metadata are never pruned or checked here.
        let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| o.remove(*k).map(|v| (k.to_string(), v)))
            .collect();
        fit_object(o, schema, "", &mut errors);
        for (k, v) in kept {
            o.insert(k, v);
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn fit_value(v: &mut Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    let flag = |k: &str| schema.get(k).and_then(Value::as_bool) == Some(true);
    if v.is_null() {
        if !flag("nullable")
            && let Some(t) = schema.get("type").and_then(Value::as_str)
        {
            errors.push(format!(
                "{path}: Invalid value: \"null\": {path} in body must be of type {t}: \"null\""
            ));
        }
        return;
    }
    let got = type_name(v);
    if flag("x-kubernetes-int-or-string") {
        if !matches!(got, "integer" | "string") {
            errors.push(format!(
                "{path}: Invalid value: \"{got}\": {path} in body must be of type integer or string: \"{got}\""
            ));
        }
    } else if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let ok = want == got || (want == "number" && got == "integer");
        if !ok {
            errors.push(format!(
                "{path}: Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let listed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        errors.push(format!(
            "{path}: Unsupported value: {v}: supported values: {}",
            listed.join(", ")
        ));
    }
    match v {
        Value::Object(o) => fit_object(o, schema, path, errors),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    fit_value(item, item_schema, &format!("{path}[{i}]"), errors);
                }
            }
        }
        _ => {}
    }
}

fn fit_object(o: &mut Map<String, Value>, schema: &Value, path: &str, errors: &mut Vec<String>) {
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    let props = schema.get("properties").and_then(Value::as_object);
    let extra = schema.get("additionalProperties").filter(|a| a.is_object());
    let keys: Vec<String> = o.keys().cloned().collect();
    for k in keys {
        let sub = props.and_then(|p| p.get(&k)).or(extra);
        match sub {
            Some(s) => {
                if let Some(v) = o.get_mut(&k) {
                    fit_value(v, s, &child(path, &k), errors);
                }
            }
            None if preserve => {}
            None => {
                o.remove(&k);
            }
        }
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            if !o.contains_key(r) {
                errors.push(format!("{}: Required value", child(path, r)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "n": {"type": "integer"},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "size": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                         "properties": {"known": {"type": "boolean"}}},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                "list": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}}
            }}
        }})
    }

    #[test]
    fn unknown_fields_are_pruned_where_not_preserved() {
        let mut obj = json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "n"}, "extra": 1,
            "spec": {"n": 1, "gone": true, "free": {"kept": 1, "known": true}, "tags": {"a": "b"},
                     "list": [{"x": "y", "z": 1}], "size": "1Gi"}});
        fit(&mut obj, &schema()).unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "n"},
                "spec": {"n": 1, "free": {"kept": 1, "known": true}, "tags": {"a": "b"}, "list": [{"x": "y"}], "size": "1Gi"}})
        );
    }

    #[test]
    fn wrong_types_and_values_outside_an_enum_name_the_field() {
        let mut obj = json!({"spec": {"n": "one", "mode": "c", "free": {"known": 1}, "size": true, "tags": {"a": 2}}});
        let errs = fit(&mut obj, &schema()).unwrap_err();
        for path in [
            "spec.n:",
            "spec.mode:",
            "spec.free.known:",
            "spec.size:",
            "spec.tags.a:",
        ] {
            assert!(errs.iter().any(|e| e.starts_with(path)), "{path} in {errs:?}");
        }
    }
}
