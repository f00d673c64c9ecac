//! `karpenter.sh/do-not-disrupt` on pods and nodes (pure): `"true"` protects
//! for good; a Go duration (`"30m"`, `"4h"`, `"1h30m"`, Karpenter 1.12)
//! protects a pod for that long after it started and a node for that long
//! after it was created; anything else (`"false"`, `"0s"`, `"soon"`) protects
//! nothing, as Karpenter ignores an unreadable value.
//!
//! Karpenter reads durations on pods only (a node counts only `"true"`);
//! nodesmith reads them on nodes too, counting from the node's creation, so a
//! value written on a node never protects less than the user asked.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

/// The annotation.
pub const ANNOTATION: &str = "karpenter.sh/do-not-disrupt";

/// What one annotation value asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// `"true"`: protected for good.
    Always,
    /// A positive duration: protected that long from the object's start.
    For(Duration),
    /// Anything else: ignored, with why.
    Ignored(String),
}

impl Ask {
    /// Reads one annotation value.
    pub fn parse(value: &str) -> Ask {
        if value == "true" {
            return Ask::Always;
        }
        match parse_go_duration(value) {
            Ok(d) if !d.is_zero() => Ask::For(d),
            Ok(_) => Ask::Ignored(format!("duration {value:?} must be positive")),
            Err(e) => Ask::Ignored(e),
        }
    }

    /// Whether the protection holds at `now` for an object that started at
    /// `started` (unknown: it holds, failing safe).
    pub fn holds(&self, started: Option<Timestamp>, now: Timestamp) -> bool {
        match self {
            Ask::Always => true,
            Ask::Ignored(_) => false,
            Ask::For(d) => {
                let Some(started) = started else { return true };
                let Ok(span) = jiff::SignedDuration::try_from(*d) else {
                    return true;
                };
                started.checked_add(span).is_ok_and(|until| now < until)
            }
        }
    }
}

/// Whether `annotations` hold a do-not-disrupt protection in force at `now`
/// for an object that started at `started`.
pub fn protects(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    started: Option<Timestamp>,
    now: Timestamp,
) -> bool {
    annotations
        .and_then(|a| a.get(ANNOTATION))
        .is_some_and(|v| Ask::parse(v).holds(started, now))
}

/// When a pod started: `status.startTime`, else its creation.
pub fn pod_started(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
}

/// Whether the pod's do-not-disrupt protection is in force at `now`.
pub fn pod_protected(pod: &Pod, now: Timestamp) -> bool {
    protects(pod.metadata.annotations.as_ref(), pod_started(pod), now)
}

/// Parses a duration as Go's `time.ParseDuration` does: an optional sign,
/// then one or more decimal numbers (fractions allowed) each with a unit
/// `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m` or `h`; a bare `0` is zero.
/// Negative values are refused (nothing here counts backwards).
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 30m, 4h, 1h30m)");
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.find(|c: char| !c.is_ascii_digit()).unwrap_or(a.len());
                a.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(bad());
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(bad()),
        };
        let whole: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad())?
        };
        let mut part = whole.checked_mul(scale).ok_or_else(bad)?;
        // The fraction's digits beyond nanosecond precision add nothing.
        let mut place = scale;
        for d in frac.bytes() {
            place /= 10;
            if place == 0 {
                break;
            }
            part += u128::from(d - b'0') * place;
        }
        nanos = nanos.checked_add(part).ok_or_else(bad)?;
        // Go's durations are int64 nanoseconds (about 292 years).
        if nanos > i64::MAX as u128 {
            return Err(bad());
        }
        rest = after;
    }
    if negative && nanos > 0 {
        return Err(format!("{s:?} is negative"));
    }
    u64::try_from(nanos).map(Duration::from_nanos).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        let ok: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("4h", Duration::from_secs(4 * 3600)),
            ("30m", Duration::from_secs(1800)),
            ("1h30m", Duration::from_secs(5400)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("300ms", Duration::from_millis(300)),
            ("2us", Duration::from_micros(2)),
            ("2µs", Duration::from_micros(2)),
            ("7ns", Duration::from_nanos(7)),
            ("+10s", Duration::from_secs(10)),
            ("1h0m0s", Duration::from_secs(3600)),
        ];
        for (s, want) in ok {
            assert_eq!(parse_go_duration(s), Ok(*want), "{s}");
        }
        for s in ["", "true", "false", "4", "h", "4d", "1h 30m", "-1h", ".s", "3000000h"] {
            assert!(parse_go_duration(s).is_err(), "{s} parsed");
        }
    }

    #[test]
    fn asks_hold_for_their_time() {
        let now: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let hours_ago = |h: i64| Some(now - jiff::SignedDuration::from_hours(h));
        assert!(Ask::parse("true").holds(None, now));
        assert!(Ask::parse("4h").holds(hours_ago(1), now));
        assert!(!Ask::parse("4h").holds(hours_ago(4), now), "ends at exactly 4h");
        assert!(!Ask::parse("4h").holds(hours_ago(5), now));
        assert!(Ask::parse("4h").holds(None, now), "no start known: fail safe");
        for v in ["false", "0s", "-1h", "forever", "TRUE"] {
            assert!(matches!(Ask::parse(v), Ask::Ignored(_)), "{v}");
            assert!(!Ask::parse(v).holds(hours_ago(0), now), "{v}");
        }
    }

    #[test]
    fn a_pod_counts_from_its_start_else_its_creation() {
        let now: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
        let started_10m_created_5h = pod(json!({"metadata": {"name": "a",
            "creationTimestamp": "2026-03-01T07:00:00Z", "annotations": {ANNOTATION: "30m"}},
            "status": {"startTime": "2026-03-01T11:50:00Z"}}));
        assert!(pod_protected(&started_10m_created_5h, now));
        let created_5h = pod(json!({"metadata": {"name": "a",
            "creationTimestamp": "2026-03-01T07:00:00Z", "annotations": {ANNOTATION: "30m"}}}));
        assert!(!pod_protected(&created_5h, now));
        let unannotated = pod(json!({"metadata": {"name": "a"}}));
        assert!(!pod_protected(&unannotated, now));
    }
}
