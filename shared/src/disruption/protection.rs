//! PodDisruptionBudgets for one pass: how many of each budget's pods may be
//! evicted, and what the pass has evicted so far.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::kubernetes::pods;
use crate::scheduling::pod::Selector;
use crate::scheduling::{ExistingNode, PodRef};

/// One PDB: which pods it covers and how many more may go.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    namespace: String,
    selector: Option<Selector>,
    allowed: usize,
}

impl Entry {
    fn covers(&self, pod: &Pod) -> bool {
        let Some(sel) = &self.selector else { return false };
        pod.metadata.namespace.as_deref().unwrap_or("default") == self.namespace
            && sel.matches(pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
    }
}

/// The evictions each PDB still allows in this pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct PdbLedger {
    entries: Vec<Entry>,
}

/// A PDB that allows no more evictions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PdbRefusal {
    /// `namespace/name` of the PDB.
    pub pdb: String,
    /// The pod it would not let go.
    pub pod: PodRef,
}

/// `value` as a count of `total` (percentages round up).
fn scaled(value: &IntOrString, total: usize) -> usize {
    match value {
        IntOrString::Int(i) => usize::try_from(*i).unwrap_or(0),
        IntOrString::String(s) => match s.strip_suffix('%').and_then(|p| p.trim().parse::<usize>().ok()) {
            Some(p) => (total * p).div_ceil(100),
            // An unreadable value protects everything.
            None => total,
        },
    }
}

impl PdbLedger {
    /// Reads the PDBs against the running pods of `nodes` (all counted healthy).
    pub fn new(pdbs: &[PodDisruptionBudget], nodes: &[ExistingNode]) -> Self {
        let running: Vec<&Pod> = nodes
            .iter()
            .flat_map(|n| n.pods.iter())
            .filter(|p| !pods::is_terminal(p))
            .collect();
        let entries = pdbs
            .iter()
            .map(|b| {
                let spec = b.spec.clone().unwrap_or_default();
                // policy/v1: no selector matches nothing; an empty one matches everything.
                let selector = spec
                    .selector
                    .as_ref()
                    .map(|s| Selector::from_k8s(Some(s), "spec.selector"))
                    .and_then(Result::ok);
                let mut entry = Entry {
                    name: b.metadata.name.clone().unwrap_or_default(),
                    namespace: b.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
                    selector,
                    allowed: 0,
                };
                let healthy = running.iter().filter(|p| entry.covers(p)).count();
                entry.allowed = match (&spec.min_available, &spec.max_unavailable) {
                    (_, Some(max)) => scaled(max, healthy),
                    (Some(min), None) => healthy.saturating_sub(scaled(min, healthy)),
                    (None, None) => healthy,
                };
                entry
            })
            .collect();
        PdbLedger { entries }
    }

    /// Evicts `pods` if every PDB covering them allows it; otherwise takes nothing.
    pub fn take<'a>(&mut self, evicted: impl IntoIterator<Item = &'a Pod>) -> Result<(), PdbRefusal> {
        let mut need = vec![0usize; self.entries.len()];
        for p in evicted {
            for (i, e) in self.entries.iter().enumerate() {
                if e.covers(p) {
                    need[i] += 1;
                    if need[i] > e.allowed {
                        return Err(PdbRefusal {
                            pdb: format!("{}/{}", e.namespace, e.name),
                            pod: PodRef::of(p),
                        });
                    }
                }
            }
        }
        for (e, n) in self.entries.iter_mut().zip(need) {
            e.allowed -= n;
        }
        Ok(())
    }

    /// Gives back what [`PdbLedger::take`] took for `pods`.
    pub fn give_back<'a>(&mut self, evicted: impl IntoIterator<Item = &'a Pod>) {
        for p in evicted {
            for e in &mut self.entries {
                if e.covers(p) {
                    e.allowed += 1;
                }
            }
        }
    }
}
