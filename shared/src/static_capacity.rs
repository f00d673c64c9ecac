//! Static capacity (NodePool `replicas`, Karpenter 1.8): a static pool keeps
//! exactly `replicas` nodes whatever the pods want. As Karpenter's static
//! provisioning and deprovisioning controllers:
//! - claims of the pool that are not being removed (not Draining or
//!   Terminating) count; while fewer than `replicas`, the difference is
//!   launched, capped by `limits.nodes` against every claim that still holds
//!   capacity (a lost node is replaced by the next sweep once its claim is gone);
//! - while more, the surplus goes: claims with no instance yet first, then
//!   claims whose node is empty, then the rest by name;
//! - the pool is never consolidated or emptied (`disruption::emptiness`,
//!   `disruption::consolidation`) and never used for pending pods (the
//!   solver refuses it for new claims), while pods still land on its nodes.
//!
//! Each replica is launched as the pool's cheapest node (the solver's
//! choice for a pod that asks nothing but the pool), through the one door
//! for new capacity (`capacity::Door`). Pure: plain data in, decisions out.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

use crate::apis::NodePool;
use crate::capacity::name_claims;
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::scheduling::SolveOptions;
use crate::snapshot::Snapshot;

/// What one static pool needs now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replicas {
    /// The pool.
    pub pool: String,
    /// `replicas`.
    pub desired: usize,
    /// Claims of the pool that count (not being removed).
    pub running: usize,
    /// New claims to launch.
    pub launch: usize,
    /// Claims to remove, by name, in the order they go.
    pub remove: Vec<String>,
    /// `limits.nodes` kept some launches back.
    pub limited: bool,
}

/// Whether a claim counts as one of the pool's replicas: it is not on its way out.
fn counts(c: &NodeClaim) -> bool {
    !matches!(c.phase, Phase::Draining | Phase::Terminating)
}

/// The decision for `pool` given every stored claim and the names of the
/// nodes that run only DaemonSet, mirror or finished pods (pure); None for
/// a dynamic pool.
pub fn decide(pool: &NodePool, claims: &[NodeClaim], empty_nodes: &BTreeSet<String>) -> Option<Replicas> {
    let desired = usize::try_from(pool.spec.replicas?.max(0)).unwrap_or(usize::MAX);
    let mine: Vec<&NodeClaim> = claims.iter().filter(|c| c.node_pool == pool.name()).collect();
    let running: Vec<&NodeClaim> = mine.iter().copied().filter(|c| counts(c)).collect();
    let holding = mine.iter().filter(|c| c.phase.holds_capacity()).count();
    let mut out = Replicas {
        pool: pool.name().to_string(),
        desired,
        running: running.len(),
        ..Replicas::default()
    };
    if running.len() < desired {
        let want = desired - running.len();
        let room = pool
            .spec
            .limits
            .get("nodes")
            .map_or(usize::MAX, |q| {
                usize::try_from(q.units_ceil().max(0)).unwrap_or(usize::MAX)
            })
            .saturating_sub(holding);
        out.launch = want.min(room);
        out.limited = out.launch < want;
    } else if running.len() > desired {
        let mut order = running;
        // Unlaunched first, then empty nodes, then by name.
        let rank = |c: &NodeClaim| {
            let unlaunched = c.phase == Phase::Pending && c.instance_id.is_none();
            let empty = c.node_name.as_ref().is_some_and(|n| empty_nodes.contains(n));
            (!unlaunched, !empty)
        };
        order.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.name.cmp(&b.name)));
        out.remove = order
            .into_iter()
            .take(out.running - desired)
            .map(|c| c.name.clone())
            .collect();
    }
    Some(out)
}

/// A pod that asks for nothing but a node of `pool`: the solver's cheapest
/// node for it is the pool's cheapest node.
fn stand_in(pool: &str) -> Option<Pod> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{pool}-replica"), "namespace": "nodesmith-static-capacity"},
        "spec": {
            "containers": [{"name": "replica", "image": "none"}],
            "nodeSelector": {labels::NODEPOOL: pool},
            "tolerations": [{"operator": "Exists"}],
        }
    }))
    .ok()
}

/// `count` new claims of the static pool `pool` of `snapshot`, named from
/// `seed` (pure); empty when the pool cannot launch (its requirements allow
/// no offering, its class is not ready), with why.
pub fn plan_launches(snapshot: &Snapshot, pool: &str, count: usize, seed: &str) -> Result<Vec<NodeClaim>, String> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let Some(np) = snapshot.node_pool(pool) else {
        return Err(format!("NodePool {pool} is not usable"));
    };
    // The pool alone, as a dynamic pool, with nothing existing to land on.
    let mut s = snapshot.clone();
    let mut dynamic = np.clone();
    dynamic.spec.replicas = None;
    s.node_pools = vec![dynamic];
    s.nodes.clear();
    s.node_claims.clear();
    s.pods = stand_in(pool).into_iter().collect();
    let plan = s.compile().solve(&SolveOptions {
        improve: false,
        ..SolveOptions::default()
    });
    if let Some(u) = plan.unschedulable.first() {
        return Err(u.reason.to_string());
    }
    let Some(mut one) = plan.node_claims.into_iter().next() else {
        return Err(format!("NodePool {pool}: the solver planned no node"));
    };
    one.pods.clear();
    let planned = vec![one; count];
    Ok(name_claims(snapshot, &planned, seed))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::scheduling::fixtures::{catalog, pool};

    fn static_pool(extra: &str) -> NodePool {
        pool(
            "fixed",
            &format!(
                "template:\n  spec:\n    nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n{extra}\n"
            ),
        )
    }

    fn claim(name: &str, pool: &str, phase: Phase, node: Option<&str>) -> NodeClaim {
        let mut c = NodeClaim::pending(name, pool, "default");
        c.phase = phase;
        if phase != Phase::Pending {
            c.instance_id = Some(format!("i-{name}"));
        }
        c.node_name = node.map(String::from);
        c
    }

    #[test]
    fn replicas_table() {
        use Phase::*;
        let up = |n: &str| claim(n, "fixed", Initialized, Some(n));
        // (what, pool extra, claims, empty nodes, launch, remove, limited)
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, &str, Vec<NodeClaim>, &[&str], usize, &[&str], bool)> = vec![
            ("a new pool launches all", "replicas: 3\n", vec![], &[], 3, &[], false),
            (
                "at size: nothing",
                "replicas: 2\n",
                vec![up("a"), up("b")],
                &[],
                0,
                &[],
                false,
            ),
            (
                "in-flight claims count",
                "replicas: 2\n",
                vec![up("a"), claim("b", "fixed", Pending, None)],
                &[],
                0,
                &[],
                false,
            ),
            (
                "a node on its way out is replaced",
                "replicas: 2\n",
                vec![up("a"), claim("b", "fixed", Draining, Some("b"))],
                &[],
                1,
                &[],
                false,
            ),
            (
                "other pools' claims do not count",
                "replicas: 1\n",
                vec![claim("x", "other", Initialized, Some("x"))],
                &[],
                1,
                &[],
                false,
            ),
            (
                "limits.nodes caps launches, counting claims still holding capacity",
                "replicas: 3\nlimits: {nodes: '2'}\n",
                vec![claim("b", "fixed", Draining, Some("b"))],
                &[],
                1,
                &[],
                true,
            ),
            (
                "scale down: unlaunched, then empty, then by name",
                "replicas: 1\n",
                vec![up("a"), up("b"), up("c"), claim("d", "fixed", Pending, None)],
                &["c"],
                0,
                &["d", "c", "a"],
                false,
            ),
            (
                "scale to zero",
                "replicas: 0\n",
                vec![up("b"), up("a")],
                &[],
                0,
                &["a", "b"],
                false,
            ),
        ];
        for (what, extra, claims, empty, launch, remove, limited) in cases {
            let empty: BTreeSet<String> = empty.iter().map(|s| s.to_string()).collect();
            let got = decide(&static_pool(extra), &claims, &empty).unwrap();
            assert_eq!(got.launch, launch, "{what}");
            assert_eq!(got.remove, remove, "{what}");
            assert_eq!(got.limited, limited, "{what}");
        }
        assert_eq!(decide(&static_pool(""), &[], &BTreeSet::new()), None, "a dynamic pool");
    }

    #[test]
    fn each_replica_is_the_pools_cheapest_node_with_a_name_of_its_own() {
        let mut s = Snapshot::new(Arc::new(catalog()), "2026-03-01T12:00:00Z".parse().unwrap());
        s.node_pools = vec![static_pool("replicas: 2")];
        let claims = plan_launches(&s, "fixed", 2, "seed").unwrap();
        assert_eq!(claims.len(), 2);
        assert_ne!(claims[0].name, claims[1].name);
        for c in &claims {
            assert_eq!(c.node_pool, "fixed");
            assert_eq!(c.phase, Phase::Pending);
            assert_eq!(
                c.instance_type_options.first().map(String::as_str),
                Some("c.large"),
                "{c:?}"
            );
        }
        assert!(plan_launches(&s, "fixed", 0, "seed").unwrap().is_empty());
        assert!(plan_launches(&s, "missing", 1, "seed").is_err());
    }
}
