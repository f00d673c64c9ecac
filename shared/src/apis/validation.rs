//! Validation errors that name the object and the field path, as the
//! Kubernetes API server reports CRD validation failures.

use std::fmt;

/// A field path such as `spec.template.spec.requirements[2].operator`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    /// A top-level field.
    pub fn root(name: &str) -> Self {
        Path(name.to_string())
    }

    /// A child field.
    pub fn field(&self, name: &str) -> Self {
        Path(format!("{}.{name}", self.0))
    }

    /// An element of a list.
    pub fn index(&self, i: usize) -> Self {
        Path(format!("{}[{i}]", self.0))
    }

    /// An entry of a map.
    pub fn key(&self, k: &str) -> Self {
        Path(format!("{}[{k:?}]", self.0))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Every invalid field of one object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Errors {
    /// The object's kind.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// The invalid fields, in the order found.
    pub fields: Vec<FieldError>,
}

impl Errors {
    /// An empty error list for one object.
    pub fn new(kind: &'static str, name: &str) -> Self {
        Errors {
            kind,
            name: name.to_string(),
            fields: Vec::new(),
        }
    }

    /// Records an invalid field.
    pub fn push(&mut self, path: Path, message: impl Into<String>) {
        self.fields.push(FieldError {
            path: path.0,
            message: message.into(),
        });
    }

    /// `Ok` when nothing was recorded.
    pub fn into_result(self) -> Result<(), Errors> {
        if self.fields.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} is invalid: ", self.kind, self.name)?;
        for (i, e) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.path, e.message)?;
        }
        Ok(())
    }
}

/// Checks a five-field cron expression (or a macro such as `@daily`) the way
/// Karpenter's budget schedules are written.
pub fn validate_cron(s: &str) -> Result<(), String> {
    const MACROS: &[&str] = &[
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
    ];
    if s.starts_with('@') {
        return if MACROS.contains(&s) {
            Ok(())
        } else {
            Err(format!("unknown schedule macro {s:?}"))
        };
    }
    let fields: Vec<&str> = s.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "schedule {s:?} must have 5 fields (minute hour day-of-month month day-of-week)"
        ));
    }
    let ranges = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)];
    for (f, (lo, hi)) in fields.iter().zip(ranges) {
        for part in f.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, s)) => (r, Some(s)),
                None => (part, None),
            };
            if let Some(step) = step
                && step.parse::<u32>().map_or(true, |n| n == 0)
            {
                return Err(format!("schedule {s:?}: bad step in {part:?}"));
            }
            if range == "*" || range == "?" {
                continue;
            }
            let bounds: Vec<&str> = range.split('-').collect();
            if bounds.is_empty() || bounds.len() > 2 {
                return Err(format!("schedule {s:?}: bad range {part:?}"));
            }
            for b in bounds {
                let ok = b.parse::<u32>().is_ok_and(|n| n >= lo && n <= hi) || is_name(b);
                if !ok {
                    return Err(format!("schedule {s:?}: {b:?} is out of range {lo}-{hi}"));
                }
            }
        }
    }
    Ok(())
}

fn is_name(b: &str) -> bool {
    const NAMES: &[&str] = &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec", "sun", "mon", "tue", "wed",
        "thu", "fri", "sat",
    ];
    NAMES.contains(&b.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_table() {
        for ok in [
            "0 9 * * mon-fri",
            "*/5 * * * *",
            "@daily",
            "0 0 1 1 *",
            "15,45 8-17 * * 1-5",
        ] {
            assert!(validate_cron(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "* * * *",
            "60 * * * *",
            "* 24 * * *",
            "@sometimes",
            "*/0 * * * *",
            "a b c d e",
        ] {
            assert!(validate_cron(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_paths() {
        let mut e = Errors::new("NodePool", "default");
        e.push(Path::root("spec").field("template").index(2).key("a/b"), "bad");
        assert_eq!(
            e.to_string(),
            "NodePool \"default\" is invalid: spec.template[2][\"a/b\"]: bad"
        );
    }
}
