//! Expiration: a node older than its pool's `template.spec.expireAfter`
//! (default 720h; `Never` disables) is replaced. Forceful, as Karpenter v1's
//! expiry: budgets and do-not-disrupt do not hold it (PDBs still bound what
//! one pass evicts). Replacements are planned where its pods need capacity.

use super::candidate::Candidate;
use super::{Context, Method, Reason, Verdict};

/// The expiration method.
pub(crate) struct Expiration;

impl Method for Expiration {
    fn reason(&self) -> Reason {
        Reason::Expired
    }

    fn forceful(&self) -> bool {
        true
    }

    fn judge(&self, c: &Candidate, cx: &Context) -> Verdict {
        let Some(expire_after) = c.pool.spec.template.spec.expire_after.duration() else {
            return Verdict::Skip;
        };
        let Some(created) = c.created else { return Verdict::Skip };
        let Ok(span) = jiff::SignedDuration::try_from(expire_after) else {
            return Verdict::Skip;
        };
        match created.checked_add(span) {
            Ok(expires) if expires <= cx.now => Verdict::Disrupt,
            _ => Verdict::Skip,
        }
    }

    /// Oldest first.
    fn order(&self, a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name))
    }
}
