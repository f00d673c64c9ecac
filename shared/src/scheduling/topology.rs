//! Topology groups: every distinct spread constraint and pod (anti-)affinity
//! term becomes a group that counts matching pods per domain (zone, hostname,
//! any label value), so a placement can be checked in constant time.

use std::collections::HashMap;

use super::pod::{Namespaces, PodTerm, Selector, Spread, Toleration};
use crate::labels;
use crate::requirements::Requirements;

/// Index of a group.
pub type GroupId = usize;
/// An interned domain value (or a node's own hostname domain).
pub type DomainId = u32;

/// What a group constrains.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// A topology spread constraint.
    Spread {
        /// Largest allowed skew.
        max_skew: i32,
        /// minDomains.
        min_domains: Option<i32>,
    },
    /// Pod affinity: go where matching pods are.
    Affinity,
    /// Pod anti-affinity: stay away from matching pods; `required` terms are
    /// also enforced in reverse (matching pods stay away from the owner).
    AntiAffinity {
        /// Required (not preferred).
        required: bool,
    },
}

/// Which nodes a spread constraint considers (nodeAffinityPolicy / nodeTaintsPolicy Honor).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NodeFilter {
    /// The owner's node requirements (OR of terms) when nodeAffinityPolicy is Honor.
    pub terms: Option<Vec<Requirements>>,
    /// The owner's tolerations when nodeTaintsPolicy is Honor.
    pub tolerations: Option<Vec<Toleration>>,
}

/// The identity of a group: pods sharing an identical term share its counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// The constraint kind.
    pub kind: GroupKind,
    /// The (normalised) topology key.
    pub key: String,
    /// Which pods are counted.
    pub selector: Selector,
    /// In which namespaces.
    pub namespaces: Namespaces,
    /// Which nodes count (spread only).
    pub filter: NodeFilter,
}

/// A group and its static facts.
#[derive(Debug, Clone)]
pub struct Group {
    /// Identity.
    pub id: GroupKey,
    /// True when the key is the hostname (every node is its own domain).
    pub hostname: bool,
    /// The eligible domains (spread on non-hostname keys).
    pub universe: Vec<DomainId>,
    /// Its key's place among the solve's non-hostname topology keys.
    pub slot: usize,
}

/// All groups of a solve, deduplicated.
#[derive(Debug, Default, Clone)]
pub struct Groups {
    /// The groups by id.
    pub list: Vec<Group>,
    index: HashMap<GroupKey, GroupId>,
}

impl Groups {
    /// The id of a group, registering it if new.
    pub fn intern(&mut self, id: GroupKey) -> GroupId {
        if let Some(g) = self.index.get(&id) {
            return *g;
        }
        let g = self.list.len();
        let hostname = id.key == labels::HOSTNAME;
        self.index.insert(id.clone(), g);
        self.list.push(Group {
            id,
            hostname,
            universe: Vec::new(),
            slot: 0,
        });
        g
    }

    /// The group of a spread constraint owned by a pod in `namespace`.
    pub fn spread(
        &mut self,
        s: &Spread,
        namespace: &str,
        terms: &[Requirements],
        tolerations: &[Toleration],
    ) -> GroupId {
        let filter = NodeFilter {
            terms: (s.honor_affinity && terms.iter().any(|t| !t.is_empty())).then(|| terms.to_vec()),
            tolerations: s.honor_taints.then(|| tolerations.to_vec()),
        };
        self.intern(GroupKey {
            kind: GroupKind::Spread {
                max_skew: s.max_skew,
                min_domains: s.min_domains.filter(|_| s.required),
            },
            key: s.key.clone(),
            selector: s.selector.clone(),
            namespaces: Namespaces::Only([namespace.to_string()].into()),
            filter,
        })
    }

    /// The group of a pod (anti-)affinity term.
    pub fn term(&mut self, t: &PodTerm, kind: GroupKind) -> GroupId {
        self.intern(GroupKey {
            kind,
            key: t.key.clone(),
            selector: t.selector.clone(),
            namespaces: t.namespaces.clone(),
            filter: NodeFilter::default(),
        })
    }

    /// The groups whose selector counts a pod with these labels in
    /// `namespace` (whose own labels are `namespace_labels`, when known).
    pub fn matching(
        &self,
        namespace: &str,
        namespace_labels: Option<&std::collections::BTreeMap<String, String>>,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Vec<GroupId> {
        self.list
            .iter()
            .enumerate()
            .filter(|(_, g)| g.id.namespaces.contains(namespace, namespace_labels) && g.id.selector.matches(labels))
            .map(|(i, _)| i)
            .collect()
    }
}

/// Interned domain values. The first [`Domains::with_hosts`] ids are the
/// existing entries' hostnames, numbered by the compiled snapshot, so a solve
/// interns no string per node.
#[derive(Debug, Default, Clone)]
pub struct Domains {
    hosts: DomainId,
    map: HashMap<String, DomainId>,
    names: Vec<String>,
}

impl Domains {
    /// Domains whose ids below `hosts` are hostnames (named by nothing).
    pub fn with_hosts(hosts: DomainId) -> Self {
        Domains {
            hosts,
            ..Domains::default()
        }
    }

    /// The id of a value, interning it.
    pub fn intern(&mut self, v: &str) -> DomainId {
        if let Some(d) = self.map.get(v) {
            return *d;
        }
        let d = self.next();
        self.map.insert(v.to_string(), d);
        self.names.push(v.to_string());
        d
    }

    /// The id of a known value.
    pub fn get(&self, v: &str) -> Option<DomainId> {
        self.map.get(v).copied()
    }

    /// A fresh domain that no value shares (a new node's hostname).
    pub fn fresh(&mut self) -> DomainId {
        let d = self.next();
        self.names.push(String::new());
        d
    }

    fn next(&self) -> DomainId {
        self.hosts + self.names.len() as DomainId
    }

    /// The value of a domain (empty for a hostname).
    pub fn name(&self, d: DomainId) -> &str {
        d.checked_sub(self.hosts)
            .and_then(|i| self.names.get(i as usize))
            .map_or("", String::as_str)
    }
}

/// A group's non-zero counts by domain.
#[cfg(test)]
pub type Counted = std::collections::BTreeMap<DomainId, u32>;

/// Per-solve counts: matching pods and required anti-affinity owners per domain.
#[derive(Debug, Clone)]
pub struct Counts {
    counts: Vec<HashMap<DomainId, u32>>,
    owners: Vec<HashMap<DomainId, u32>>,
    total: Vec<u32>,
}

impl Counts {
    /// Zero counts for `n` groups.
    pub fn new(n: usize) -> Self {
        Counts {
            counts: vec![HashMap::new(); n],
            owners: vec![HashMap::new(); n],
            total: vec![0; n],
        }
    }

    /// Matching pods of group `g` in domain `d`.
    pub fn count(&self, g: GroupId, d: DomainId) -> u32 {
        self.counts[g].get(&d).copied().unwrap_or(0)
    }

    /// Records a pod counted by group `g` in domain `d`.
    pub fn record(&mut self, g: GroupId, d: DomainId) {
        self.record_n(g, d, 1);
    }

    /// Records `n` pods counted by group `g` in domain `d`.
    pub fn record_n(&mut self, g: GroupId, d: DomainId, n: u32) {
        *self.counts[g].entry(d).or_insert(0) += n;
        self.total[g] += n;
    }

    /// Takes back a pod [`Counts::record_n`] counted in group `g`'s domain `d`.
    pub fn unrecord(&mut self, g: GroupId, d: DomainId) {
        if let Some(n) = self.counts[g].get_mut(&d).filter(|n| **n > 0) {
            *n -= 1;
            self.total[g] -= 1;
        }
    }

    /// Per group, its non-zero counts and owners by domain, and its total.
    #[cfg(test)]
    pub fn nonzero(&self) -> Vec<(Counted, Counted, u32)> {
        let nonzero = |m: &HashMap<DomainId, u32>| m.iter().filter(|(_, n)| **n > 0).map(|(d, n)| (*d, *n)).collect();
        (0..self.total.len())
            .map(|g| (nonzero(&self.counts[g]), nonzero(&self.owners[g]), self.total[g]))
            .collect()
    }

    /// Records the owner of a required anti-affinity term in domain `d`.
    pub fn record_owner(&mut self, g: GroupId, d: DomainId) {
        *self.owners[g].entry(d).or_insert(0) += 1;
    }

    /// True when a pod matching group `g`'s selector may go to domain `d`
    /// (no owner of the required anti-affinity term lives there).
    pub fn inverse_allows(&self, g: GroupId, d: Option<DomainId>) -> bool {
        d.is_none_or(|d| self.owners[g].get(&d).copied().unwrap_or(0) == 0)
    }

    /// The smallest count over a spread group's eligible domains (zero for
    /// hostname, where a new node is always an empty domain, and when there are
    /// fewer eligible domains than minDomains).
    pub fn min_count(&self, group: &Group, g: GroupId) -> u32 {
        if group.hostname || group.universe.is_empty() {
            return 0;
        }
        if let GroupKind::Spread {
            min_domains: Some(m), ..
        } = group.id.kind
            && (group.universe.len() as i64) < m as i64
        {
            return 0;
        }
        group.universe.iter().map(|d| self.count(g, *d)).min().unwrap_or(0)
    }

    /// True when the owner of group `g` (which matches its own selector when
    /// `self_match`) may go to domain `d` (`None`: the node lacks the key).
    pub fn allows(&self, group: &Group, g: GroupId, self_match: bool, d: Option<DomainId>) -> bool {
        match group.id.kind {
            GroupKind::Spread { max_skew, .. } => {
                let Some(d) = d else { return false };
                let skew = self.count(g, d) as i64 + self_match as i64 - self.min_count(group, g) as i64;
                skew <= max_skew as i64
            }
            GroupKind::Affinity => match d {
                Some(d) => self.count(g, d) > 0 || (self.total[g] == 0 && self_match),
                None => false,
            },
            GroupKind::AntiAffinity { .. } => d.is_none_or(|d| self.count(g, d) == 0),
        }
    }
}
