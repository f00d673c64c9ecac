//! Kubernetes resource quantities ("100m", "8Gi", "1.5") as exact milli-units.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a quantity string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityError {
    /// The text that was rejected.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// A Kubernetes quantity stored exactly as thousandths of its unit
/// (millicores for CPU, milli-bytes for memory), so arithmetic never rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(pub i64);

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity(0);

    /// A whole number of units ("4" CPUs, 29 pods, 1024 bytes).
    pub const fn from_units(units: i64) -> Self {
        Quantity(units.saturating_mul(1000))
    }

    /// Thousandths of a unit (millicores for CPU).
    pub const fn from_milli(milli: i64) -> Self {
        Quantity(milli)
    }

    /// Mebibytes.
    pub const fn from_mib(mib: i64) -> Self {
        Quantity(mib.saturating_mul(1024 * 1024 * 1000))
    }

    /// The value in thousandths of a unit.
    pub const fn milli(self) -> i64 {
        self.0
    }

    /// The value in whole units, rounded up (Kubernetes' `Value()`).
    pub const fn units_ceil(self) -> i64 {
        let q = self.0 / 1000;
        if self.0 % 1000 > 0 { q + 1 } else { q }
    }

    /// The value as a float in whole units, for ratios and display.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// Whole mebibytes, rounded down.
    pub const fn mib_floor(self) -> i64 {
        self.0 / (1024 * 1024 * 1000)
    }

    /// Saturating sum.
    pub const fn saturating_add(self, o: Quantity) -> Quantity {
        Quantity(self.0.saturating_add(o.0))
    }

    /// Saturating difference.
    pub const fn saturating_sub(self, o: Quantity) -> Quantity {
        Quantity(self.0.saturating_sub(o.0))
    }

    /// Parses Kubernetes notation: an optional sign, a decimal number, and a
    /// suffix from m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let err = |reason| QuantityError {
            input: input.to_string(),
            reason,
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        let (neg, s) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (num, suffix) = s.split_at(num_end);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(err("no number"));
        }
        // Scale as (multiplier, exponent of ten) applied to the milli value.
        let (mul, exp10): (i128, i32) = match suffix {
            "" => (1, 0),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            s if s.starts_with(['e', 'E']) => {
                let e: i32 = s[1..].parse().map_err(|_| err("bad exponent"))?;
                if !(-18..=18).contains(&e) {
                    return Err(err("exponent out of range"));
                }
                (1, e)
            }
            _ => return Err(err("unknown suffix")),
        };
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        let digits = format!("{int_part}{frac_part}");
        if digits.len() > 30 {
            return Err(err("too many digits"));
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| err("no number"))?
        };
        // value = mantissa * 10^(exp10 - frac_len) * mul, in milli: * 10^3
        let shift = exp10 - frac_part.len() as i32 + 3;
        let mut v = mantissa.checked_mul(mul).ok_or_else(|| err("too large"))?;
        if shift >= 0 {
            for _ in 0..shift {
                v = v.checked_mul(10).ok_or_else(|| err("too large"))?;
            }
        } else {
            // Kubernetes rounds sub-milli precision up.
            let div = 10i128.pow((-shift) as u32);
            v = (v + div - 1) / div;
        }
        if v > i64::MAX as i128 {
            return Err(err("too large"));
        }
        let v = v as i64;
        Ok(Quantity(if neg { -v } else { v }))
    }

    /// Formats like Kubernetes' canonical form for the given resource:
    /// CPU as cores or millicores, byte quantities with binary suffixes.
    pub fn to_k8s_string(self, resource: &str) -> String {
        if is_byte_resource(resource) {
            self.format_binary()
        } else {
            self.to_string()
        }
    }

    fn format_binary(self) -> String {
        if self.0 % 1000 != 0 {
            return self.to_string();
        }
        let bytes = self.0 / 1000;
        if bytes == 0 {
            return "0".into();
        }
        for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
            let unit = 1i64 << shift;
            if bytes % unit == 0 {
                return format!("{}{suffix}", bytes / unit);
            }
        }
        bytes.to_string()
    }
}

/// Resources measured in bytes, printed with binary suffixes.
pub fn is_byte_resource(resource: &str) -> bool {
    matches!(resource, "memory" | "ephemeral-storage" | "storage") || resource.starts_with("hugepages-")
}

impl fmt::Display for Quantity {
    /// Whole units when exact, otherwise millis ("1930m").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 % 1000 == 0 {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    /// Accepts strings and bare numbers, as Kubernetes' IntOrString quantities do.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i64),
            F(f64),
        }
        match Raw::deserialize(d)? {
            Raw::S(s) => Quantity::parse(&s).map_err(serde::de::Error::custom),
            Raw::I(i) => Ok(Quantity::from_units(i)),
            Raw::F(f) => Quantity::parse(&f.to_string()).map_err(serde::de::Error::custom),
        }
    }
}

impl schemars::JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": true,
            "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_notation() {
        let cases: &[(&str, i64)] = &[
            ("1", 1000),
            ("100m", 100),
            ("1.5", 1500),
            ("0.1", 100),
            ("2k", 2_000_000),
            ("1Ki", 1_024_000),
            ("8Gi", 8 * (1 << 30) * 1000),
            ("6903Mi", 6903 * (1 << 20) * 1000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("-2", -2000),
            ("+3", 3000),
            ("0.0001", 1), // rounds up like Kubernetes
            ("9000Gi", 9000 * (1i64 << 30) * 1000),
        ];
        for (s, want) in cases {
            assert_eq!(Quantity::parse(s).unwrap().milli(), *want, "{s}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "abc", "1.2.3", "1Xi", "m", "1e99", "99999999999999999999Ei"] {
            assert!(Quantity::parse(s).is_err(), "{s} should be rejected");
        }
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(Quantity::from_milli(1930).to_k8s_string("cpu"), "1930m");
        assert_eq!(Quantity::from_units(4).to_k8s_string("cpu"), "4");
        assert_eq!(Quantity::from_mib(6903).to_k8s_string("memory"), "6903Mi");
        assert_eq!(Quantity::from_mib(8192).to_k8s_string("memory"), "8Gi");
        assert_eq!(Quantity::from_units(29).to_k8s_string("pods"), "29");
        assert_eq!(Quantity::from_units(1000).to_k8s_string("memory"), "1000");
    }

    proptest::proptest! {
        #[test]
        fn display_round_trips(v in -1_000_000_000_000i64..1_000_000_000_000i64) {
            let q = Quantity(v);
            proptest::prop_assert_eq!(Quantity::parse(&q.to_string()).unwrap(), q);
            proptest::prop_assert_eq!(Quantity::parse(&q.to_k8s_string("memory")).unwrap(), q);
        }
    }
}
