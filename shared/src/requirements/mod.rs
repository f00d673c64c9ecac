//! The node requirements algebra: In, NotIn, Exists, DoesNotExist, Gt, Lt,
//! Gte, Lte and minValues over label keys, with intersection and compatibility
//! checks as Karpenter defines them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::labels;

/// A requirement's operator as written in manifests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Operator {
    /// The label has one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label is an integer greater than the value.
    Gt,
    /// The label is an integer less than the value.
    Lt,
    /// The label is an integer greater than or equal to the value.
    Gte,
    /// The label is an integer less than or equal to the value.
    Lte,
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why a requirement could not be built from its manifest form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    /// In needs at least one value.
    #[error("key {key:?}: operator In must have at least one value")]
    InWithoutValues {
        /// The label key.
        key: String,
    },
    /// Exists and DoesNotExist take no values.
    #[error("key {key:?}: operator {op} takes no values")]
    UnexpectedValues {
        /// The label key.
        key: String,
        /// The operator.
        op: Operator,
    },
    /// Gt, Lt, Gte and Lte take one integer.
    #[error("key {key:?}: operator {op} needs exactly one integer value, got {values:?}")]
    NotOneInteger {
        /// The label key.
        key: String,
        /// The operator.
        op: Operator,
        /// The values given.
        values: Vec<String>,
    },
}

/// One label key's constraint, in Karpenter's normal form: a set of values
/// that is either allowed (`complement == false`) or excluded
/// (`complement == true`, "anything but"), optionally bounded by integers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// The (normalised) label key.
    pub key: String,
    /// When true, `values` lists what is excluded rather than what is allowed.
    pub complement: bool,
    /// Allowed or excluded values.
    pub values: BTreeSet<String>,
    /// Exclusive lower bound for integer values.
    pub greater_than: Option<i64>,
    /// Exclusive upper bound for integer values.
    pub less_than: Option<i64>,
    /// The least number of distinct values a launch must keep open.
    pub min_values: Option<usize>,
}

impl Requirement {
    /// Builds a requirement from its manifest form, normalising the key.
    pub fn new<S: AsRef<str>>(key: &str, op: Operator, values: &[S]) -> Result<Self, RequirementError> {
        let key = labels::normalize(key).to_string();
        let vals: BTreeSet<String> = values.iter().map(|v| v.as_ref().to_string()).collect();
        let int = |op| -> Result<i64, RequirementError> {
            match values {
                [v] => v
                    .as_ref()
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| RequirementError::NotOneInteger {
                        key: key.clone(),
                        op,
                        values: values.iter().map(|v| v.as_ref().to_string()).collect(),
                    }),
                _ => Err(RequirementError::NotOneInteger {
                    key: key.clone(),
                    op,
                    values: values.iter().map(|v| v.as_ref().to_string()).collect(),
                }),
            }
        };
        let mut r = Requirement {
            key: key.clone(),
            complement: true,
            values: BTreeSet::new(),
            greater_than: None,
            less_than: None,
            min_values: None,
        };
        match op {
            Operator::In => {
                if vals.is_empty() {
                    return Err(RequirementError::InWithoutValues { key });
                }
                r.complement = false;
                r.values = vals;
            }
            Operator::NotIn => r.values = vals,
            Operator::Exists => {
                if !vals.is_empty() {
                    return Err(RequirementError::UnexpectedValues { key, op });
                }
            }
            Operator::DoesNotExist => {
                if !vals.is_empty() {
                    return Err(RequirementError::UnexpectedValues { key, op });
                }
                r.complement = false;
            }
            Operator::Gt => r.greater_than = Some(int(op)?),
            Operator::Gte => r.greater_than = Some(int(op)?.saturating_sub(1)),
            Operator::Lt => r.less_than = Some(int(op)?),
            Operator::Lte => r.less_than = Some(int(op)?.saturating_add(1)),
        }
        Ok(r)
    }

    /// `key In values`.
    pub fn in_values<S: AsRef<str>>(key: &str, values: &[S]) -> Self {
        Requirement {
            key: labels::normalize(key).to_string(),
            complement: false,
            values: values.iter().map(|v| v.as_ref().to_string()).collect(),
            greater_than: None,
            less_than: None,
            min_values: None,
        }
    }

    /// `key Exists`.
    pub fn exists(key: &str) -> Self {
        Requirement {
            key: labels::normalize(key).to_string(),
            complement: true,
            values: BTreeSet::new(),
            greater_than: None,
            less_than: None,
            min_values: None,
        }
    }

    /// `key DoesNotExist`.
    pub fn does_not_exist(key: &str) -> Self {
        Requirement {
            complement: false,
            ..Requirement::exists(key)
        }
    }

    /// Sets minValues.
    pub fn with_min_values(mut self, min_values: Option<usize>) -> Self {
        self.min_values = min_values;
        self
    }

    /// The operator that best describes this requirement.
    pub fn operator(&self) -> Operator {
        if self.complement {
            if !self.values.is_empty() {
                Operator::NotIn
            } else if self.greater_than.is_some() && self.less_than.is_none() {
                Operator::Gt
            } else if self.less_than.is_some() && self.greater_than.is_none() {
                Operator::Lt
            } else {
                Operator::Exists
            }
        } else if self.values.is_empty() {
            Operator::DoesNotExist
        } else {
            Operator::In
        }
    }

    fn within_bounds(&self, value: &str) -> bool {
        if self.greater_than.is_none() && self.less_than.is_none() {
            return true;
        }
        match value.parse::<i64>() {
            Ok(n) => self.greater_than.is_none_or(|g| n > g) && self.less_than.is_none_or(|l| n < l),
            Err(_) => false,
        }
    }

    fn bounds_empty(&self) -> bool {
        matches!((self.greater_than, self.less_than), (Some(g), Some(l)) if g.saturating_add(1) >= l)
    }

    /// True when a node with label value `value` satisfies this requirement.
    pub fn has(&self, value: &str) -> bool {
        if self.complement {
            !self.values.contains(value) && self.within_bounds(value)
        } else {
            self.values.contains(value) && self.within_bounds(value)
        }
    }

    /// True when a node without this label satisfies the requirement
    /// (NotIn and DoesNotExist).
    pub fn allows_absent(&self) -> bool {
        matches!(self.operator(), Operator::NotIn | Operator::DoesNotExist)
    }

    /// How many values satisfy it; `usize::MAX` minus the exclusions for
    /// complements (an unbounded set).
    pub fn len(&self) -> usize {
        if self.complement {
            if self.bounds_empty() {
                return 0;
            }
            if let (Some(g), Some(l)) = (self.greater_than, self.less_than) {
                let span = (l - g - 1) as usize;
                let excluded = self.values.iter().filter(|v| self.within_bounds(v)).count();
                return span.saturating_sub(excluded);
            }
            usize::MAX - self.values.len()
        } else {
            self.values.iter().filter(|v| self.within_bounds(v)).count()
        }
    }

    /// True when no value satisfies it.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The requirement both `self` and `other` impose on the same key.
    pub fn intersection(&self, other: &Requirement) -> Requirement {
        let greater_than = max_opt(self.greater_than, other.greater_than);
        let less_than = min_opt(self.less_than, other.less_than);
        let min_values = max_opt(self.min_values, other.min_values);
        let (complement, values) = match (self.complement, other.complement) {
            (true, true) => (true, self.values.union(&other.values).cloned().collect()),
            (true, false) => (false, other.values.difference(&self.values).cloned().collect()),
            (false, true) => (false, self.values.difference(&other.values).cloned().collect()),
            (false, false) => (false, self.values.intersection(&other.values).cloned().collect()),
        };
        let mut r = Requirement {
            key: self.key.clone(),
            complement,
            values,
            greater_than,
            less_than,
            min_values,
        };
        if !r.complement {
            // A finite set absorbs its bounds.
            let values = r.values.iter().filter(|v| r.within_bounds(v)).cloned().collect();
            r.values = values;
            r.greater_than = None;
            r.less_than = None;
        } else if r.bounds_empty() {
            r = Requirement {
                complement: false,
                values: BTreeSet::new(),
                greater_than: None,
                less_than: None,
                ..r
            };
        }
        r
    }

    /// A deterministic value that satisfies it, if there is one: the smallest
    /// allowed value, or for bounded complements the smallest integer in range.
    pub fn any(&self) -> Option<String> {
        if !self.complement {
            return self.values.iter().find(|v| self.within_bounds(v)).cloned();
        }
        if self.greater_than.is_some() || self.less_than.is_some() {
            let start = self.greater_than.map_or(0, |g| g.saturating_add(1));
            let end = self.less_than.unwrap_or(i64::MAX);
            return (start..end)
                .take(10_000)
                .map(|n| n.to_string())
                .find(|v| !self.values.contains(v));
        }
        None
    }

    /// The manifest form (key, operator, values) of this requirement.
    pub fn to_manifest(&self) -> (String, Operator, Vec<String>) {
        let op = self.operator();
        let values = match op {
            Operator::Gt => vec![self.greater_than.unwrap_or_default().to_string()],
            Operator::Lt => vec![self.less_than.unwrap_or_default().to_string()],
            _ => self.values.iter().cloned().collect(),
        };
        (self.key.clone(), op, values)
    }
}

fn max_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (key, op, values) = self.to_manifest();
        match op {
            Operator::Exists | Operator::DoesNotExist => write!(f, "{key} {op}"),
            _ => write!(f, "{key} {op} [{}]", values.join(", ")),
        }
    }
}

/// Why two sets of requirements cannot hold together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    /// Both constrain the key and no value satisfies both.
    #[error("{key}: {incoming} conflicts with {existing}")]
    NoCommonValue {
        /// The label key.
        key: String,
        /// The requirement asked for.
        incoming: String,
        /// The requirement in force.
        existing: String,
    },
    /// The key must be present but nothing will define it.
    #[error("label {key:?} does not have known values")]
    Undefined {
        /// The label key.
        key: String,
    },
}

/// A conjunction of requirements, one per key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Requirements(BTreeMap<String, Requirement>);

impl Requirements {
    /// No requirements.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds from requirements, intersecting repeats of a key.
    pub fn from_iter_reqs(reqs: impl IntoIterator<Item = Requirement>) -> Self {
        let mut r = Requirements::new();
        for q in reqs {
            r.add(q);
        }
        r
    }

    /// `key In [value]` for each label: what a node with these labels offers.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        Requirements::from_iter_reqs(labels.into_iter().map(|(k, v)| Requirement::in_values(k, &[v])))
    }

    /// Adds a requirement, intersecting with any on the same key.
    pub fn add(&mut self, r: Requirement) {
        match self.0.get_mut(&r.key) {
            Some(existing) => *existing = existing.intersection(&r),
            None => {
                self.0.insert(r.key.clone(), r);
            }
        }
    }

    /// Adds every requirement of `other`.
    pub fn add_all(&mut self, other: &Requirements) {
        for r in other.0.values() {
            self.add(r.clone());
        }
    }

    /// The requirement on a key, if any.
    pub fn get(&self, key: &str) -> Option<&Requirement> {
        self.0.get(labels::normalize(key))
    }

    /// True when the key is constrained.
    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(labels::normalize(key))
    }

    /// Removes a key's requirement.
    pub fn remove(&mut self, key: &str) -> Option<Requirement> {
        self.0.remove(labels::normalize(key))
    }

    /// The constrained keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    /// All requirements, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = &Requirement> {
        self.0.values()
    }

    /// The number of constrained keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when nothing is constrained.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// For keys both sides constrain, some value must satisfy both, except
    /// where both only exclude (NotIn / DoesNotExist): an absent label
    /// satisfies them together.
    pub fn intersects(&self, incoming: &Requirements) -> Result<(), Incompatible> {
        for (key, inc) in &incoming.0 {
            let Some(existing) = self.0.get(key) else { continue };
            if existing.intersection(inc).is_empty() {
                if inc.allows_absent() && existing.allows_absent() {
                    continue;
                }
                return Err(Incompatible::NoCommonValue {
                    key: key.clone(),
                    incoming: inc.to_string(),
                    existing: existing.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Whether `incoming` (a pod's needs) can hold on a node described by
    /// `self`. Keys `self` does not constrain must be well known (an instance
    /// type will define them) or merely exclude values.
    pub fn compatible(&self, incoming: &Requirements, allow_undefined_well_known: bool) -> Result<(), Incompatible> {
        for (key, inc) in &incoming.0 {
            if self.0.contains_key(key) {
                continue;
            }
            if inc.allows_absent() || (allow_undefined_well_known && labels::is_well_known(key)) {
                continue;
            }
            return Err(Incompatible::Undefined { key: key.clone() });
        }
        self.intersects(incoming)
    }

    /// True when a node with exactly these labels satisfies every requirement.
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.values().all(|r| match labels.get(&r.key) {
            Some(v) => r.has(v),
            None => r.allows_absent(),
        })
    }

    /// The labels these requirements pin to a single value (`In [v]`, or the
    /// only value left), as a node launched for them will carry.
    pub fn single_valued_labels(&self) -> BTreeMap<String, String> {
        self.0
            .values()
            .filter(|r| !r.complement && r.values.len() == 1)
            .filter_map(|r| r.any().map(|v| (r.key.clone(), v)))
            .collect()
    }

    /// The minValues constraints that are not met by the given counts of
    /// distinct values per key.
    pub fn unmet_min_values(&self, distinct: impl Fn(&str) -> usize) -> Vec<(String, usize, usize)> {
        self.0
            .values()
            .filter_map(|r| r.min_values.map(|m| (r, m)))
            .filter_map(|(r, m)| {
                let have = distinct(&r.key);
                (have < m).then(|| (r.key.clone(), m, have))
            })
            .collect()
    }
}

impl fmt::Display for Requirements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.values().map(|r| r.to_string()).collect();
        write!(f, "{}", parts.join(", "))
    }
}

impl FromIterator<Requirement> for Requirements {
    fn from_iter<I: IntoIterator<Item = Requirement>>(iter: I) -> Self {
        Requirements::from_iter_reqs(iter)
    }
}

#[cfg(test)]
mod tests;
