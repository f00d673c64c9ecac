//! Emptiness: a managed node whose pods are only DaemonSet, mirror and
//! finished ones, empty for `consolidateAfter` (since its last pod event), is
//! deleted without replacement, within budgets. Every consolidation policy
//! allows it; `consolidateAfter: Never` disables it; static pools
//! (`replicas`) are never emptied. It must save money: the node's price
//! must be known.

use super::candidate::Candidate;
use super::{Context, Held, Method, Reason, Verdict};

/// The emptiness method.
pub(crate) struct Emptiness;

impl Method for Emptiness {
    fn reason(&self) -> Reason {
        Reason::Empty
    }

    fn judge(&self, c: &Candidate, cx: &Context) -> Verdict {
        // A static pool keeps its replicas whatever they run (Karpenter: not a candidate).
        if !c.is_empty() || c.pool.is_static() {
            return Verdict::Skip;
        }
        if let Err(h) = c.consolidatable(cx.now) {
            return Verdict::Held(h);
        }
        match c.price {
            Some(p) if p > 0.0 => Verdict::Disrupt,
            _ => Verdict::Held(Held::NoSaving),
        }
    }

    /// Most expensive first: the biggest saving within the budget.
    fn order(&self, a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        b.price
            .unwrap_or(0.0)
            .total_cmp(&a.price.unwrap_or(0.0))
            .then_with(|| a.name.cmp(&b.name))
    }
}
