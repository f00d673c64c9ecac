//! Preferences: preferred node affinity, preferred pod (anti-)affinity,
//! ScheduleAnyway spreads and PreferNoSchedule taints are first treated as
//! required, then relaxed one step at a time when the pod cannot be placed,
//! in Karpenter's order.

use std::borrow::Cow;

use super::model::PendingPod;
use super::topology::GroupId;
use crate::requirements::Requirements;

/// How far a pod's preferences have been relaxed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Relaxation {
    /// Preferred pod affinity terms dropped (heaviest first).
    pub affinity_dropped: usize,
    /// Preferred pod anti-affinity terms dropped (heaviest first).
    pub anti_dropped: usize,
    /// Preferred node affinity terms dropped (heaviest first).
    pub node_dropped: usize,
    /// ScheduleAnyway spreads dropped.
    pub spread_dropped: bool,
    /// PreferNoSchedule taints tolerated.
    pub tolerate_prefer: bool,
}

/// The constraints a placement must honour at a relaxation level.
#[derive(Debug, Clone)]
pub struct Active<'p> {
    /// Node terms (OR); the heaviest preferred node term still active is folded in.
    pub terms: Cow<'p, [Requirements]>,
    /// Groups the pod must satisfy as owner.
    pub groups: Vec<GroupId>,
    /// True when PreferNoSchedule taints are tolerated.
    pub tolerate_prefer: bool,
}

impl Relaxation {
    /// True when nothing has been relaxed.
    pub fn is_strict(&self) -> bool {
        *self == Relaxation::default()
    }

    /// Relaxes one more step; false when nothing is left to relax.
    pub fn relax(&mut self, p: &PendingPod) -> bool {
        if self.affinity_dropped < p.pref_affinity.len() {
            self.affinity_dropped += 1;
        } else if self.anti_dropped < p.pref_anti.len() {
            self.anti_dropped += 1;
        } else if self.node_dropped < p.preferred_node.len() {
            self.node_dropped += 1;
        } else if !self.spread_dropped && !p.soft_spread.is_empty() {
            self.spread_dropped = true;
        } else if !self.tolerate_prefer {
            self.tolerate_prefer = true;
        } else {
            return false;
        }
        true
    }

    /// The constraints in force.
    pub fn active<'p>(&self, p: &'p PendingPod) -> Active<'p> {
        let terms = match p.preferred_node.get(self.node_dropped) {
            Some(pref) => Cow::Owned(
                p.terms
                    .iter()
                    .map(|t| {
                        let mut t = t.clone();
                        t.add_all(pref);
                        t
                    })
                    .collect(),
            ),
            None => Cow::Borrowed(p.terms.as_slice()),
        };
        let mut groups = p.required.clone();
        groups.extend(&p.pref_affinity[self.affinity_dropped.min(p.pref_affinity.len())..]);
        groups.extend(&p.pref_anti[self.anti_dropped.min(p.pref_anti.len())..]);
        if !self.spread_dropped {
            groups.extend(&p.soft_spread);
        }
        Active {
            terms,
            groups,
            tolerate_prefer: self.tolerate_prefer,
        }
    }
}
