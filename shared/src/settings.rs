//! The one reader of settings: every function, the shell and the CLI read
//! their environment variables through [`Settings`], and a missing or bad
//! value is one [`SettingError`] that names the variable.
//!
//! A variable that is unset, empty or only blanks counts as unset: its default
//! applies, or, when it is required, it is reported missing.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A source of settings: the process environment, or any lookup (tests).
#[derive(Clone, Copy)]
pub struct Settings<F = fn(&str) -> Option<String>> {
    lookup: F,
}

impl Settings {
    /// The process environment.
    pub fn from_env() -> Self {
        Settings {
            lookup: |name| std::env::var(name).ok(),
        }
    }
}

impl<F: Fn(&str) -> Option<String>> Settings<F> {
    /// Settings read through `lookup` (pure when `lookup` is).
    pub fn new(lookup: F) -> Self {
        Settings { lookup }
    }

    /// The value as given, when set and not blank.
    pub fn optional(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.trim().is_empty())
    }

    /// The value as given; missing when unset or blank.
    pub fn required(&self, name: &str) -> Result<String, SettingError> {
        self.optional(name)
            .ok_or_else(|| SettingError::new(name, SettingProblem::Missing))
    }

    /// A duration in Go notation (`500ms`, `30s`, `5m`, `1h30m`), else `default`.
    pub fn duration(&self, name: &str, default: Duration) -> Result<Duration, SettingError> {
        let Some(value) = self.optional(name) else {
            return Ok(default);
        };
        crate::apis::duration::parse_go_duration(value.trim()).map_err(|reason| {
            SettingError::new(
                name,
                SettingProblem::Duration {
                    value: value.clone(),
                    source: DurationSyntax(reason),
                },
            )
        })
    }

    /// A whole number of seconds, else `default`.
    pub fn seconds(&self, name: &str, default: Duration) -> Result<Duration, SettingError> {
        let Some(value) = self.optional(name) else {
            return Ok(default);
        };
        value
            .trim()
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|source| SettingError::new(name, SettingProblem::Seconds { value, source }))
    }

    /// A finite, non-negative number, else `default`.
    pub fn number(&self, name: &str, default: f64) -> Result<f64, SettingError> {
        let Some(value) = self.optional(name) else {
            return Ok(default);
        };
        match value.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            Ok(_) => Err(SettingError::new(name, SettingProblem::Number { value, source: None })),
            Err(source) => Err(SettingError::new(
                name,
                SettingProblem::Number {
                    value,
                    source: Some(source),
                },
            )),
        }
    }

    /// A value of a type that parses itself (a mode, a choice), else
    /// `default`; the type's parse error is kept as the cause.
    pub fn parsed<T>(&self, name: &str, default: T) -> Result<T, SettingError>
    where
        T: FromStr,
        T::Err: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match self.optional(name) {
            Some(_) => self.parsed_required(name),
            None => Ok(default),
        }
    }

    /// Like [`Settings::parsed`] for a setting with no default: missing is an error.
    pub fn parsed_required<T>(&self, name: &str) -> Result<T, SettingError>
    where
        T: FromStr,
        T::Err: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let value = self.required(name)?;
        value.parse().map_err(|e: T::Err| {
            SettingError::new(
                name,
                SettingProblem::Invalid {
                    value: value.clone(),
                    source: e.into(),
                },
            )
        })
    }
}

/// A setting that is missing or whose value is not usable.
pub struct SettingError {
    /// The environment variable.
    pub name: String,
    /// What is wrong with it.
    pub problem: SettingProblem,
}

impl SettingError {
    /// `name` has `problem`.
    pub fn new(name: &str, problem: SettingProblem) -> Self {
        SettingError {
            name: name.to_string(),
            problem,
        }
    }
}

/// What is wrong with a setting.
#[derive(Debug)]
pub enum SettingProblem {
    /// Required, and unset or blank.
    Missing,
    /// Required unless another variable is set.
    MissingEither {
        /// What the variable is for.
        meaning: &'static str,
        /// The variable that can stand in for it, and what that one is.
        instead: &'static str,
    },
    /// Not a duration in Go notation.
    Duration {
        /// The value given.
        value: String,
        /// Why it does not parse.
        source: DurationSyntax,
    },
    /// Not a whole number of seconds.
    Seconds {
        /// The value given.
        value: String,
        /// Why it does not parse.
        source: std::num::ParseIntError,
    },
    /// Not a finite, non-negative number.
    Number {
        /// The value given.
        value: String,
        /// Why it does not parse (none when it parses but is out of range).
        source: Option<std::num::ParseFloatError>,
    },
    /// Not one of the values the setting takes.
    Invalid {
        /// The value given.
        value: String,
        /// The type's own parse error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why a duration does not parse, in the parser's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DurationSyntax(pub String);

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.name;
        match &self.problem {
            SettingProblem::Missing => write!(f, "environment variable {name} is not set"),
            SettingProblem::MissingEither { meaning, instead } => {
                write!(
                    f,
                    "environment variable {name} is not set: set it ({meaning}) or {instead}"
                )
            }
            SettingProblem::Duration { value, .. } => {
                write!(f, "environment variable {name}={value:?} is an invalid duration")
            }
            SettingProblem::Seconds { value, .. } => {
                write!(
                    f,
                    "environment variable {name}={value:?} is not a whole number of seconds"
                )
            }
            SettingProblem::Number { value, .. } => {
                write!(f, "environment variable {name}={value:?} is not a non-negative number")
            }
            SettingProblem::Invalid { value, .. } => write!(f, "environment variable {name}={value:?} is not valid"),
        }
    }
}

impl std::error::Error for SettingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.problem {
            SettingProblem::Missing | SettingProblem::MissingEither { .. } => None,
            SettingProblem::Duration { source, .. } => Some(source),
            SettingProblem::Seconds { source, .. } => Some(source),
            SettingProblem::Number { source, .. } => source.as_ref().map(|s| s as _),
            SettingProblem::Invalid { source, .. } => Some(source.as_ref()),
        }
    }
}

// A binary's `main` that fails prints its error with `Debug`: say it in
// words, with its causes.
impl fmt::Debug for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &'static [(&'static str, &'static str)]) -> Settings<impl Fn(&str) -> Option<String>> {
        Settings::new(move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn blanks_are_unset_and_defaults_apply() {
        let s = lookup(&[("A", "  "), ("B", " x ")]);
        assert_eq!(s.optional("A"), None);
        assert_eq!(s.optional("B").as_deref(), Some(" x "));
        assert_eq!(
            s.required("A").unwrap_err().to_string(),
            "environment variable A is not set"
        );
        assert_eq!(s.duration("A", Duration::from_secs(7)).unwrap(), Duration::from_secs(7));
        assert_eq!(s.seconds("C", Duration::ZERO).unwrap(), Duration::ZERO);
        assert_eq!(s.number("C", 0.5).unwrap(), 0.5);
    }

    #[test]
    fn values_parse_trimmed() {
        let s = lookup(&[("D", " 1m30s "), ("S", " 90 "), ("N", "0.25")]);
        assert_eq!(s.duration("D", Duration::ZERO).unwrap(), Duration::from_secs(90));
        assert_eq!(s.seconds("S", Duration::ZERO).unwrap(), Duration::from_secs(90));
        assert_eq!(s.number("N", 0.0).unwrap(), 0.25);
    }

    #[test]
    fn bad_values_name_the_variable_and_keep_the_cause() {
        let s = lookup(&[("D", "soon"), ("S", "1m"), ("N", "-1"), ("M", "cheap"), ("B", "maybe")]);
        let e = s.duration("D", Duration::ZERO).unwrap_err();
        assert_eq!(e.name, "D");
        assert_eq!(e.to_string(), r#"environment variable D="soon" is an invalid duration"#);
        assert!(
            std::error::Error::source(&e)
                .unwrap()
                .to_string()
                .contains("expected e.g. 30s")
        );
        let e = s.seconds("S", Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("whole number of seconds"), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        let e = s.number("N", 0.0).unwrap_err();
        assert!(e.to_string().contains("non-negative number"), "{e}");
        assert!(std::error::Error::source(&e).is_none(), "-1 parses; it is out of range");
        assert!(std::error::Error::source(&s.number("M", 0.0).unwrap_err()).is_some());
        let e = s.parsed::<bool>("B", false).unwrap_err();
        assert_eq!(
            format!("{e:?}"),
            r#"environment variable B="maybe" is not valid: provided string was not `true` or `false`"#
        );
    }
}
