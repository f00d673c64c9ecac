//! The drift-hash format shared by [`super::NodePool::hash`] and
//! [`super::EC2NodeClass::hash`]: SHA-256 of canonical JSON (object keys
//! sorted, no whitespace, nulls and empty lists and maps left out), the
//! first 16 hex digits. Changing anything here changes every hash: bump both
//! hash versions with it.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Hex digits kept of the SHA-256.
const HASH_HEX_LEN: usize = 16;

/// The hash of a value's canonical form (pure).
pub(crate) fn digest(value: &Value) -> String {
    let mut text = String::new();
    write_canonical(&prune(value.clone()), &mut text);
    let mut hex = hex::encode(Sha256::digest(text.as_bytes()));
    hex.truncate(HASH_HEX_LEN);
    hex
}

/// A list whose order carries no meaning: canonical elements, sorted, repeats dropped (pure).
pub(crate) fn set(items: impl IntoIterator<Item = Value>) -> Value {
    let mut keyed: Vec<(String, Value)> = items
        .into_iter()
        .map(prune)
        .map(|v| {
            let mut k = String::new();
            write_canonical(&v, &mut k);
            (k, v)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    keyed.dedup_by(|a, b| a.0 == b.0);
    Value::Array(keyed.into_iter().map(|(_, v)| v).collect())
}

/// Drops nulls, empty lists and empty maps from objects, so an unset field and
/// an empty one hash alike (pure).
fn prune(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, prune(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(prune).collect()),
        other => other,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// JSON with object keys in byte order and no whitespace, whatever order the map kept.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hash_ignores_key_order_and_empty_fields() {
        let a = json!({"b": 1, "a": {"y": [1, 2], "x": "s"}, "gone": null, "none": [], "nothing": {}});
        let b = json!({"a": {"x": "s", "y": [1, 2]}, "b": 1});
        assert_eq!(digest(&a), digest(&b));
        assert_eq!(digest(&a).len(), 16);
        assert!(digest(&a).bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(
            digest(&b),
            digest(&json!({"a": {"x": "s", "y": [2, 1]}, "b": 1})),
            "lists keep order"
        );
        assert_ne!(digest(&json!({"a": false})), digest(&json!({})), "false is a value");
    }

    #[test]
    fn hash_of_sets_ignores_order_and_repeats() {
        let one = set([json!({"k": "a"}), json!({"k": "b"})]);
        let two = set([json!({"k": "b"}), json!({"k": "a"}), json!({"k": "b"})]);
        assert_eq!(digest(&json!({"s": one})), digest(&json!({"s": two})));
    }

    #[test]
    fn hash_format_is_stable() {
        // sha256 of `{"a":"b"}`: pins the format, so a change to it is seen here first.
        assert_eq!(digest(&json!({"a": "b"})), "db4a7ecb114bc66c");
    }
}
