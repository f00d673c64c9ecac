//! Label and field selectors as the API server parses them from query strings.

use std::collections::BTreeMap;

use serde_json::Value;

/// One label selector term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelTerm {
    /// `key=value` / `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the key is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the key is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

/// A parsed label selector (all terms must hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelTerm>);

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn set_values(rest: &str, term: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("invalid label selector term {term:?}: expected (values)"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for t in split_terms(s) {
            let term = if let Some(k) = t.strip_prefix('!') {
                LabelTerm::DoesNotExist(k.trim().to_string())
            } else if let Some((k, v)) = t.split_once("!=") {
                LabelTerm::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once("==") {
                LabelTerm::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once('=') {
                LabelTerm::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                LabelTerm::NotIn(k.trim().into(), set_values(rest, t)?)
            } else if let Some((k, rest)) = t.split_once(" in ") {
                LabelTerm::In(k.trim().into(), set_values(rest, t)?)
            } else if t.contains(' ') || t.contains('(') {
                return Err(format!("invalid label selector term {t:?}"));
            } else {
                LabelTerm::Exists(t.to_string())
            };
            terms.push(term);
        }
        Ok(LabelSelector(terms))
    }

    /// Whether the selector has no terms (selects everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the labels satisfy every term.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|t| match t {
            LabelTerm::Equals(k, v) => labels.get(k) == Some(v),
            LabelTerm::NotEquals(k, v) => labels.get(k) != Some(v),
            LabelTerm::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            LabelTerm::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            LabelTerm::Exists(k) => labels.contains_key(k),
            LabelTerm::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// The labels of an object.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A parsed field selector: `path=value` / `path!=value` terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `metadata.name=x,spec.nodeName=,status.phase!=Succeeded`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for t in split_terms(s) {
            let (k, eq, v) = if let Some((k, v)) = t.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = t.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = t.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid field selector term {t:?}: expected field=value or field!=value"
                ));
            };
            let k = k.trim();
            if k.is_empty()
                || !k
                    .split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_alphanumeric()))
            {
                return Err(format!("invalid field selector field {k:?}"));
            }
            terms.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the selector has no terms (selects everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the object's fields satisfy every term (absent fields read as "").
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            // Walked segment by segment: no pointer string built per object.
            let got = path.split('.').try_fold(obj, |v, seg| match v {
                Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => v.get(seg),
            });
            let same = match got {
                Some(Value::String(s)) => s == want,
                Some(Value::Bool(b)) => b.to_string() == *want,
                Some(Value::Number(n)) => n.to_string() == *want,
                _ => want.is_empty(),
            };
            same == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_selector_table() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier in (front,back),!x", true),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn bad_label_selectors_are_rejected() {
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b").is_err());
    }

    #[test]
    fn field_selector_table() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {}, "status": {"phase": "Pending"}});
        for (sel, want) in [
            ("metadata.name=p", true),
            ("metadata.name=q", false),
            ("spec.nodeName=", true),
            ("spec.nodeName!=", false),
            ("status.phase=Pending,metadata.namespace=ns", true),
            ("status.phase!=Pending", false),
        ] {
            assert_eq!(FieldSelector::parse(sel).unwrap().matches(&pod), want, "{sel}");
        }
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
