//! Why a pending pod got no place, as data: callers branch on it
//! (consolidation, events, status) and the edge renders it as text.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::apis::{Taint, TaintEffect};

/// Why a pod cannot be placed.
#[derive(Debug, Clone, PartialEq)]
pub enum PlacementFailure {
    /// The pod spec cannot be modelled (the message names the field).
    InvalidPod(String),
    /// Its volumes' topology cannot be read or satisfied.
    Volume(String),
    /// The cluster has no NodePool at all.
    NoNodePool,
    /// Its new node was left with no offering to launch.
    NoOffering,
    /// Every NodePool refused it, each for its own reason (in pool order).
    Pools(Vec<PoolRejection>),
}

/// One NodePool's refusal of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRejection {
    /// The NodePool.
    pub pool: String,
    /// Why it refused.
    pub why: Rejection,
}

/// Why one NodePool cannot take a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// The pool itself is unusable (e.g. invalid requirements).
    PoolInvalid(String),
    /// The pool has a taint the pod does not tolerate.
    Untolerated(Taint),
    /// The pod's node requirements conflict with the pool's.
    Requirements(String),
    /// No instance type satisfies the pod's requirements; `accelerators_only`
    /// when only accelerator types would, and the pod asks for none.
    NoInstanceType {
        /// Only accelerator types match, and those are kept for accelerator pods.
        accelerators_only: bool,
    },
    /// No instance type is large enough; `what` is the first request that
    /// exceeds the largest type (e.g. `900 cpu`).
    TooLarge {
        /// The request that does not fit, in Kubernetes notation.
        what: String,
    },
    /// The pool's limits leave no room for a node that fits.
    Limits,
    /// The solve may not open new NodeClaims (a what-if over existing capacity).
    NewClaimsForbidden,
    /// Every type that fits costs at least the price ceiling of the what-if.
    PriceCeiling,
    /// Scheduling constraints (topology, affinity, ports) cannot be met.
    Constraints(Vec<Constraint>),
    /// The pod can only run in zones an ARC zonal shift moves traffic away
    /// from: it waits until the shift ends.
    ZoneShiftedAway {
        /// Those zones, by name.
        zones: Vec<String>,
    },
}

/// A scheduling constraint that could not be met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// A DoNotSchedule topology spread on `key`.
    TopologySpread {
        /// The spread's maxSkew.
        max_skew: i32,
        /// Topology key.
        key: String,
    },
    /// Required pod affinity on `key`.
    PodAffinity {
        /// Topology key.
        key: String,
    },
    /// The pod's own required anti-affinity on `key`.
    PodAntiAffinity {
        /// Topology key.
        key: String,
    },
    /// Another pod's required anti-affinity against this one, on `key`.
    OthersAntiAffinity {
        /// Topology key.
        key: String,
    },
    /// Host ports already bound.
    HostPorts,
}

impl PlacementFailure {
    /// True when no pool could take the pod only because new claims are
    /// forbidden or priced out: it would fit with new capacity.
    pub fn needs_new_capacity(&self) -> bool {
        match self {
            PlacementFailure::Pools(list) => {
                !list.is_empty()
                    && list
                        .iter()
                        .any(|r| matches!(r.why, Rejection::NewClaimsForbidden | Rejection::PriceCeiling))
            }
            _ => false,
        }
    }
}

fn effect(e: &TaintEffect) -> String {
    format!("{e:?}")
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constraint::TopologySpread { max_skew, key } => write!(f, "topology spread (maxSkew {max_skew}) on {key}"),
            Constraint::PodAffinity { key } => write!(f, "pod affinity on {key}"),
            Constraint::PodAntiAffinity { key } => write!(f, "pod anti-affinity on {key}"),
            Constraint::OthersAntiAffinity { key } => write!(f, "another pod's anti-affinity on {key}"),
            Constraint::HostPorts => f.write_str("host ports"),
        }
    }
}

impl fmt::Display for PoolRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.pool;
        match &self.why {
            Rejection::PoolInvalid(e) => write!(f, "NodePool {name}: {e}"),
            Rejection::Untolerated(t) => write!(
                f,
                "NodePool {name} has taint {}={}:{} that the pod does not tolerate",
                t.key,
                t.value.as_deref().unwrap_or(""),
                effect(&t.effect)
            ),
            Rejection::Requirements(e) => write!(f, "incompatible with NodePool {name} requirements: {e}"),
            Rejection::NoInstanceType { accelerators_only } => {
                let why = if *accelerators_only {
                    " (accelerator types are used only for pods that request accelerators)"
                } else {
                    ""
                };
                write!(
                    f,
                    "no instance type in NodePool {name} satisfies the pod's requirements{why}"
                )
            }
            Rejection::TooLarge { what } => write!(f, "no instance type in NodePool {name} fits {what}"),
            Rejection::Limits => write!(f, "NodePool {name} limits exceeded"),
            Rejection::NewClaimsForbidden => write!(f, "NodePool {name}: no new NodeClaims in this solve"),
            Rejection::PriceCeiling => write!(f, "NodePool {name}: no instance type under the price ceiling"),
            Rejection::ZoneShiftedAway { zones } => write!(
                f,
                "NodePool {name}: zone {} is shifted away (ARC zonal shift); no new capacity there until the shift ends",
                zones.join(", ")
            ),
            Rejection::Constraints(list) if list.is_empty() => {
                write!(f, "NodePool {name}: constraints cannot be satisfied")
            }
            Rejection::Constraints(list) => {
                let what: Vec<String> = list.iter().map(Constraint::to_string).collect();
                write!(f, "NodePool {name}: {} cannot be satisfied", what.join(", "))
            }
        }
    }
}

impl fmt::Display for PlacementFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementFailure::InvalidPod(e) => write!(f, "invalid pod: {e}"),
            PlacementFailure::Volume(e) => f.write_str(e),
            PlacementFailure::NoNodePool => f.write_str("no NodePool"),
            PlacementFailure::NoOffering => f.write_str("no offering left for its node"),
            PlacementFailure::Pools(list) => {
                for (i, r) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{r}")?;
                }
                Ok(())
            }
        }
    }
}

impl Serialize for PlacementFailure {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Sorts and dedupes constraints by their text, as they are reported.
pub(crate) fn normalise(mut list: Vec<Constraint>) -> Vec<Constraint> {
    list.sort_by_cached_key(Constraint::to_string);
    list.dedup();
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_as_the_simulate_contract_text() {
        let r = PlacementFailure::Pools(vec![
            PoolRejection {
                pool: "gpu".into(),
                why: Rejection::Untolerated(Taint {
                    key: "nvidia.com/gpu".into(),
                    value: Some("true".into()),
                    effect: TaintEffect::NoSchedule,
                    time_added: None,
                }),
            },
            PoolRejection {
                pool: "default".into(),
                why: Rejection::TooLarge { what: "900 cpu".into() },
            },
            PoolRejection {
                pool: "zonal".into(),
                why: Rejection::Constraints(normalise(vec![
                    Constraint::TopologySpread {
                        max_skew: 1,
                        key: "topology.kubernetes.io/zone".into(),
                    },
                    Constraint::HostPorts,
                    Constraint::HostPorts,
                ])),
            },
        ]);
        assert_eq!(
            r.to_string(),
            "NodePool gpu has taint nvidia.com/gpu=true:NoSchedule that the pod does not tolerate; \
             no instance type in NodePool default fits 900 cpu; \
             NodePool zonal: host ports, topology spread (maxSkew 1) on topology.kubernetes.io/zone cannot be satisfied"
        );
        assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::json!(r.to_string()));
    }

    #[test]
    fn what_if_refusals_say_new_capacity_would_help() {
        let forbidden = PlacementFailure::Pools(vec![PoolRejection {
            pool: "default".into(),
            why: Rejection::NewClaimsForbidden,
        }]);
        assert!(forbidden.needs_new_capacity());
        assert!(!PlacementFailure::NoNodePool.needs_new_capacity());
        assert!(
            !PlacementFailure::Pools(vec![PoolRejection {
                pool: "default".into(),
                why: Rejection::Limits
            }])
            .needs_new_capacity()
        );
    }
}
