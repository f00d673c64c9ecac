//! Karpenter's durations ("30s", "720h", "1h30m") and the `Never` sentinel.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration in Go notation, or `Never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NillableDuration {
    /// A finite duration.
    Duration(Duration),
    /// Disabled.
    Never,
}

impl NillableDuration {
    /// Parses `Never` or a sequence of number+unit (h, m, s, ms) groups.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "Never" {
            return Ok(NillableDuration::Never);
        }
        parse_go_duration(s).map(NillableDuration::Duration)
    }

    /// The finite duration, if any.
    pub fn duration(&self) -> Option<Duration> {
        match self {
            NillableDuration::Duration(d) => Some(*d),
            NillableDuration::Never => None,
        }
    }
}

/// Parses Go-style durations as Karpenter's CRDs accept them: one or more
/// groups of digits followed by `h`, `m`, `s` or `ms`.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?}: expected e.g. 30s, 5m, 720h or Never");
    if s.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else {
            return Err(bad());
        };
        total = total
            .checked_add(unit.checked_mul(u32::try_from(n).map_err(|_| bad())?).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        rest = &rest[len..];
    }
    Ok(total)
}

impl fmt::Display for NillableDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NillableDuration::Never => write!(f, "Never"),
            NillableDuration::Duration(d) => {
                let s = d.as_secs();
                if d.subsec_millis() != 0 {
                    return write!(f, "{}ms", d.as_millis());
                }
                let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
                let mut out = String::new();
                if h > 0 {
                    out += &format!("{h}h");
                }
                if m > 0 {
                    out += &format!("{m}m");
                }
                if s > 0 || out.is_empty() {
                    out += &format!("{s}s");
                }
                write!(f, "{out}")
            }
        }
    }
}

impl Serialize for NillableDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for NillableDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        NillableDuration::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for NillableDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NillableDuration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^(([0-9]+(s|m|h))+|Never)$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for (s, secs) in [
            ("30s", 30),
            ("5m", 300),
            ("720h", 720 * 3600),
            ("1h30m", 5400),
            ("0s", 0),
        ] {
            let d = NillableDuration::parse(s).unwrap();
            assert_eq!(d.duration(), Some(Duration::from_secs(secs)), "{s}");
            assert_eq!(NillableDuration::parse(&d.to_string()).unwrap(), d);
        }
        assert_eq!(NillableDuration::parse("Never").unwrap(), NillableDuration::Never);
        for s in ["", "5", "h", "5d", "never", "-5s", "1.5h"] {
            assert!(NillableDuration::parse(s).is_err(), "{s}");
        }
    }
}
