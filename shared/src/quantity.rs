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

    /// Parses Kubernetes notation: an optional sign, a decimal number (`5`,
    /// `5.`, `.5`, `1.5`), and a suffix from n, u, m, k, M, G, T, P, E, Ki,
    /// Mi, Gi, Ti, Pi, Ei or a decimal exponent (`e3`, `E-2`, any size).
    /// Precision below a thousandth rounds away from zero, as Kubernetes'
    /// `MilliValue`; magnitudes beyond what an i64 of thousandths holds
    /// saturate to ±`i64::MAX` (a limit of `1e21` means "no limit").
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
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
            return Err(err("no number"));
        }
        // The value is digits × mul × 10^exp10 (in whole units).
        let (mul, exp10): (u64, i64) = match suffix {
            "" => (1, 0),
            "n" => (1, -9),
            "u" => (1, -6),
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
            s if s.starts_with(['e', 'E']) => (1, exponent(&s[1..]).ok_or_else(|| err("bad exponent"))?),
            _ => return Err(err("unknown suffix")),
        };
        let digits: Vec<u8> = int_part.bytes().chain(frac_part.bytes()).map(|b| b - b'0').collect();
        // In thousandths: shift the decimal point by the exponent, the
        // fraction's length and the three places of "milli".
        let shift = exp10.saturating_sub(frac_part.len() as i64).saturating_add(3);
        let magnitude = scaled(digits, mul, shift);
        Ok(Quantity(if neg { -magnitude } else { magnitude }))
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

/// A decimal exponent (`3`, `+3`, `-12`, any number of digits), clamped to a
/// range past which every value saturates or rounds to one thousandth anyway.
fn exponent(s: &str) -> Option<i64> {
    let (neg, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    const CLAMP: i64 = 1_000_000;
    let e = digits
        .bytes()
        .try_fold(0i64, |acc, b| {
            let next = acc * 10 + i64::from(b - b'0');
            (next <= CLAMP).then_some(next)
        })
        .unwrap_or(CLAMP);
    Some(if neg { -e } else { e })
}

/// `digits × mul × 10^shift` (decimal digits, most significant first), rounded
/// up to a whole number and saturated at `i64::MAX`. Works on the digit string
/// so that no length of input or size of exponent can overflow.
fn scaled(mut digits: Vec<u8>, mul: u64, shift: i64) -> i64 {
    // Multiply by `mul` (at most 2^60) from the least significant digit.
    if mul != 1 {
        let mut carry: u128 = 0;
        for d in digits.iter_mut().rev() {
            let v = u128::from(*d) * u128::from(mul) + carry;
            *d = (v % 10) as u8;
            carry = v / 10;
        }
        let mut head = Vec::new();
        while carry > 0 {
            head.push((carry % 10) as u8);
            carry /= 10;
        }
        head.reverse();
        head.extend(digits);
        digits = head;
    }
    let first = digits.iter().position(|d| *d != 0);
    let Some(first) = first else { return 0 };
    let digits = &digits[first..];
    let len = digits.len() as i64;
    // Whole part: the digits left of the shifted decimal point.
    let whole_len = len.saturating_add(shift);
    if whole_len > 19 {
        return i64::MAX;
    }
    let (whole, fraction): (&[u8], &[u8]) = if whole_len <= 0 {
        (&[], digits)
    } else if shift >= 0 {
        (digits, &[])
    } else {
        digits.split_at(whole_len as usize)
    };
    let mut v: u128 = whole.iter().fold(0, |acc, d| acc * 10 + u128::from(*d));
    if shift > 0 {
        v *= 10u128.pow(shift as u32);
    }
    if fraction.iter().any(|d| *d != 0) {
        v += 1;
    }
    i64::try_from(v).unwrap_or(i64::MAX)
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
    fn accepts_the_whole_kubernetes_grammar() {
        let cases: &[(&str, i64)] = &[
            ("500u", 1),  // 0.0005 rounds up to one milli
            ("1500u", 2), // 0.0015 -> 2m
            ("1000000u", 1000),
            ("1000000000n", 1000),
            ("999999n", 1),
            ("0n", 0),
            ("0u", 0),
            ("1n", 1),
            (".5", 500),
            ("5.", 5000),
            ("+.5Ki", 512_000),
            ("-1.5Gi", -1_610_612_736_000),
            ("1e+3", 1_000_000),
            ("1e-2", 10),
            ("1E0", 1000),
            ("12e-4", 2),
            ("0.5e1", 5000),
            ("1e-30", 1),
            ("0e99", 0),
            ("0000000000000000000000000000000000000012", 12_000),
            ("12.000000000000000000000000000000000000000", 12_000),
            ("1e15", 1_000_000_000_000_000_000),
            ("2P", 2_000_000_000_000_000_000),
            ("9.223372036854775807P", i64::MAX),
        ];
        for (s, want) in cases {
            assert_eq!(Quantity::parse(s).map(Quantity::milli), Ok(*want), "{s}");
        }
        // Beyond what thousandths in an i64 can hold: saturated, never an error or a panic.
        for s in [
            "1e21",
            "1e400",
            "99999999999999999999Ei",
            "8Ei",
            "1e99999999999999999999",
            "10E",
            "9.2233720368547758075P",
        ] {
            assert_eq!(Quantity::parse(s), Ok(Quantity(i64::MAX)), "{s}");
        }
        for s in ["-1e21", "-8Ei"] {
            assert_eq!(Quantity::parse(s), Ok(Quantity(-i64::MAX)), "{s}");
        }
        assert_eq!(Quantity::parse("1e-99999999999999999999"), Ok(Quantity(1)));
        let pool: crate::apis::NodePool = serde_yaml_ng::from_str(
            "metadata: {name: p}\nspec:\n  limits: {cpu: 1e21, memory: 500u}\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n      requirements: []",
        )
        .unwrap();
        assert!(!pool.spec.limits.is_empty());
    }

    #[test]
    fn refuses_what_kubernetes_refuses_and_says_why() {
        for s in [
            "1e", "1e+", "1e2.5", "1i", "1Ki2", "--1", "1 k", "e3", "1.2.3", ".", "+", "1ee3", "1Ki.5",
        ] {
            let e = Quantity::parse(s).unwrap_err();
            assert!(!e.reason.is_empty(), "{s}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_any_text(s in "\\PC{0,40}") {
            let _ = Quantity::parse(&s);
        }

        #[test]
        fn never_panics_on_grammar_shaped_text(
            sign in "[+-]?",
            int in "[0-9]{0,45}",
            frac in "(\\.[0-9]{0,45})?",
            suffix in "(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]{1,25})?",
        ) {
            let s = format!("{sign}{int}{frac}{suffix}");
            let r = Quantity::parse(&s);
            let has_digit = int.chars().chain(frac.chars()).any(|c| c.is_ascii_digit());
            proptest::prop_assert_eq!(r.is_ok(), has_digit, "{:?} -> {:?}", s, r);
        }

        #[test]
        fn exponents_scale_and_saturate(m in 0i64..1_000_000, e in -40i32..40) {
            let got = Quantity::parse(&format!("{m}e{e}")).unwrap().milli();
            // The exact value in thousandths, rounded up, saturated.
            let shift = e + 3;
            let want: i128 = if m == 0 {
                0
            } else if shift >= 0 {
                let mut v = m as i128;
                for _ in 0..shift {
                    v = v.saturating_mul(10).min(i64::MAX as i128 + 1);
                }
                v.min(i64::MAX as i128)
            } else if -shift > 30 {
                1
            } else {
                let d = 10i128.pow((-shift) as u32);
                (m as i128 + d - 1) / d
            };
            proptest::prop_assert_eq!(got as i128, want);
        }

        #[test]
        fn suffixes_agree_with_their_multipliers(m in 0i64..1_000_000) {
            let q = |s: String| Quantity::parse(&s).unwrap().milli();
            proptest::prop_assert_eq!(q(format!("{m}k")), q(format!("{m}e3")));
            proptest::prop_assert_eq!(q(format!("{m}n")), q(format!("{m}e-9")));
            proptest::prop_assert_eq!(q(format!("{m}u")), q(format!("{m}e-6")));
            proptest::prop_assert_eq!(q(format!("{m}Mi")), m * 1_048_576_000);
            proptest::prop_assert_eq!(q(format!("-{m}u")), -q(format!("{m}u")));
        }
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "abc", "1.2.3", "1Xi", "m"] {
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
