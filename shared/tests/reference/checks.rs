//! Checks that a plan keeps the rules the generated clusters use: every
//! pending pod placed once or reported, no node over the allocatable of any
//! type it may launch as, node requirements and taints, topology spread,
//! pod affinity and anti-affinity. Written from the rules, not from either
//! scheduler, so that it checks the reference as strictly as the solver.

use std::collections::{BTreeMap, BTreeSet};

use nodesmith::labels;
use nodesmith::resources::Resources;
use nodesmith::scheduling::SolveInput;

use super::karpenter::{Outcome, PodData, TermKind, pod_data, pool_capacity, reachable_zones, tolerates};

/// Where a pod ended up: its node's index in the outcome.
fn locations(input: &SolveInput, o: &Outcome) -> Result<BTreeMap<String, usize>, String> {
    let mut at = BTreeMap::new();
    for (i, n) in o.nodes.iter().enumerate() {
        for p in &n.pods {
            if at.insert(p.clone(), i).is_some() {
                return Err(format!("{p} placed twice"));
            }
        }
    }
    let mut seen: BTreeSet<&String> = at.keys().collect();
    for p in &o.unschedulable {
        if !seen.insert(p) {
            return Err(format!("{p} both placed and unschedulable"));
        }
    }
    let pending: BTreeSet<String> = input.pods.iter().map(|p| pod_data(p).key).collect();
    let reported: BTreeSet<String> = seen.into_iter().cloned().collect();
    if pending != reported {
        return Err(format!("pods placed or reported {reported:?} != pending {pending:?}"));
    }
    Ok(at)
}

/// Checks every rule; the error names the first broken one.
pub fn validate(input: &SolveInput, o: &Outcome) -> Result<(), String> {
    let at = locations(input, o)?;
    let pending: BTreeMap<String, PodData> = input.pods.iter().map(pod_data).map(|p| (p.key.clone(), p)).collect();
    let capacity = pool_capacity(input);

    // Resources, requirements, taints.
    for n in &o.nodes {
        let pods: Vec<&PodData> = n.pods.iter().map(|k| &pending[k]).collect();
        for p in &pods {
            if n.requirements.compatible(&p.requirements, n.pool.is_some()).is_err() {
                return Err(format!("{} cannot run on {} ({:?})", p.key, n.name, n.requirements));
            }
            if p.requirements.get(labels::ZONE).is_some_and(|z| !z.has(&n.zone)) {
                return Err(format!("{} launched in {} against its zone requirement", p.key, n.zone));
            }
            if !tolerates(&p.tolerations, &n.taints) {
                return Err(format!("{} does not tolerate {}'s taints", p.key, n.name));
            }
        }
        if let Some(pool) = &n.pool {
            let (daemon, alloc) = &capacity[pool];
            let mut total: Resources = daemon.clone();
            for p in &pods {
                total.add(&p.requests);
            }
            for t in &n.options {
                let a = alloc
                    .get(t)
                    .ok_or_else(|| format!("{} offers {t}, not a type of pool {pool}", n.name))?;
                if let Some((r, need, have)) = total.first_exceeding(a) {
                    return Err(format!("{} over {r} as {t}: {need:?} > {have:?}", n.name));
                }
            }
        } else {
            let ex = input
                .nodes
                .iter()
                .find(|e| e.node.metadata.name.as_deref() == Some(n.name.as_str()))
                .ok_or("existing node vanished")?;
            let mut total = Resources::new();
            for p in ex.pods.iter().map(pod_data) {
                total.add(&p.requests);
            }
            for p in &pods {
                total.add(&p.requests);
            }
            let mut alloc = Resources::new();
            let status = ex.node.status.as_ref().and_then(|s| s.allocatable.as_ref());
            for (k, q) in status.into_iter().flatten() {
                alloc.set(
                    k,
                    nodesmith::quantity::Quantity::parse(&q.0).map_err(|e| e.to_string())?,
                );
            }
            if let Some((r, need, have)) = total.first_exceeding(&alloc) {
                return Err(format!("existing {} over {r}: {need:?} > {have:?}", n.name));
            }
        }
    }

    // Topology over every pod: the running ones and the placed ones.
    let mut all: Vec<(PodData, usize)> = at.iter().map(|(k, i)| (pending[k].clone(), *i)).collect();
    for ex in input.nodes {
        let i = o
            .nodes
            .iter()
            .position(|n| n.pool.is_none() && n.name == ex.node.metadata.name.clone().unwrap_or_default())
            .ok_or("existing node missing")?;
        all.extend(ex.pods.iter().map(|p| (pod_data(p), i)));
    }
    let domain = |i: usize, key: &str| -> String {
        let n = &o.nodes[i];
        match key {
            labels::HOSTNAME => n.name.clone(),
            labels::ZONE => n.zone.clone(),
            k => n.requirements.get(k).and_then(|r| r.any()).unwrap_or_default(),
        }
    };
    for (p, i) in all.iter().filter(|(p, _)| pending.contains_key(&p.key)) {
        for t in &p.terms {
            let here = domain(*i, &t.key);
            let selected = |d: &str| {
                all.iter()
                    .filter(|(q, j)| t.selects(q) && domain(*j, &t.key) == d)
                    .count() as i32
            };
            match t.kind {
                TermKind::Spread(max_skew) => {
                    let count = selected(&here);
                    let min = if t.key == labels::HOSTNAME {
                        0
                    } else {
                        reachable_zones(input, &p.requirements, &p.tolerations)
                            .iter()
                            .map(|z| selected(z))
                            .min()
                            .unwrap_or(0)
                    };
                    if count - min > max_skew {
                        return Err(format!(
                            "{} breaks its {} spread: {count} in {here}, min {min}",
                            p.key, t.key
                        ));
                    }
                }
                TermKind::AntiAffinity => {
                    let others = selected(&here) - i32::from(t.selects(p));
                    if others > 0 {
                        return Err(format!(
                            "{} shares {here} with {others} pods it is anti-affine to",
                            p.key
                        ));
                    }
                }
                TermKind::Affinity => {
                    let others = selected(&here) - i32::from(t.selects(p));
                    let alone = !all.iter().any(|(q, _)| t.selects(q) && q.key != p.key);
                    if others == 0 && !(t.selects(p) && alone) {
                        return Err(format!("{} has no affine pod in {here}", p.key));
                    }
                    let running = input
                        .nodes
                        .iter()
                        .flat_map(|e| e.pods.iter())
                        .any(|q| t.selects(&pod_data(q)));
                    let split = all
                        .iter()
                        .filter(|(q, _)| t.selects(q))
                        .any(|(_, j)| domain(*j, &t.key) != here);
                    if t.selects(p) && !running && split {
                        return Err(format!("{}'s self-affine group is split across {}", p.key, t.key));
                    }
                }
            }
        }
    }
    Ok(())
}
