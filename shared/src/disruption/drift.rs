//! Drift: a node no longer matches what its pool and class would launch now.
//! Static drift: the hashes stamped at launch (`karpenter.sh/nodepool-hash`,
//! `karpenter.k8s.aws/ec2nodeclass-hash`) differ from `NodePool::hash()` /
//! `EC2NodeClass::hash()`, compared only when the stamped `-version`
//! annotation is the current hash version (a version change is not drift).
//! Dynamic drift: the node's labels no longer satisfy the pool's
//! requirements (e.g. spot removed). Drift that needs live resolution (a new
//! AMI, subnets or security groups no longer selected) is found by the shell
//! and handed in through [`super::DecideOptions::resolved_drift`].
//! A node `nodesmith rotate` marked ([`labels::ROTATE_ANNOTATION`]) counts
//! as drifted too. Drifted nodes are replaced within budgets.

use crate::apis::EC2NodeClass;
use crate::apis::ec2nodeclass::EC2NODECLASS_HASH_VERSION;
use crate::apis::nodepool::NODEPOOL_HASH_VERSION;
use crate::labels;

use super::candidate::Candidate;
use super::{Context, Method, Reason, Verdict};

/// The drift method.
pub(crate) struct Drift;

/// Why a node is drifted, if it is.
pub(crate) fn drifted(c: &Candidate, cx: &Context) -> Option<String> {
    if let Some(at) = c.annotations.get(labels::ROTATE_ANNOTATION) {
        return Some(format!("rotation requested at {at} (nodesmith rotate)"));
    }
    let stamped = |hash: &str, version: &str, current: &str| -> Option<String> {
        let h = c.annotations.get(hash)?;
        (c.annotations.get(version).map(String::as_str) == Some(current)).then(|| h.clone())
    };
    if let Some(h) = stamped(
        labels::NODEPOOL_HASH_ANNOTATION,
        labels::NODEPOOL_HASH_VERSION_ANNOTATION,
        NODEPOOL_HASH_VERSION,
    ) && h != c.pool.hash()
    {
        return Some(format!("NodePool {} changed", c.pool.name()));
    }
    let class_name = c
        .labels
        .get(labels::EC2NODECLASS)
        .cloned()
        .unwrap_or_else(|| c.pool.spec.template.spec.node_class_ref.name.clone());
    if let Some(class) = cx.snapshot.node_class(&class_name)
        && let Some(h) = stamped(
            labels::EC2NODECLASS_HASH_ANNOTATION,
            labels::EC2NODECLASS_HASH_VERSION_ANNOTATION,
            EC2NODECLASS_HASH_VERSION,
        )
        && h != EC2NodeClass::hash(class)
    {
        return Some(format!("EC2NodeClass {class_name} changed"));
    }
    if let Ok(reqs) = c.pool.requirements() {
        for r in reqs.iter() {
            let ok = match c.labels.get(&r.key) {
                Some(v) => r.has(v),
                None => r.allows_absent() || labels::is_well_known(&r.key),
            };
            if !ok {
                return Some(format!(
                    "label {} no longer satisfies NodePool {}",
                    r.key,
                    c.pool.name()
                ));
            }
        }
    }
    cx.options.resolved_drift.get(&c.name).cloned()
}

impl Method for Drift {
    fn reason(&self) -> Reason {
        Reason::Drifted
    }

    fn judge(&self, c: &Candidate, cx: &Context) -> Verdict {
        match drifted(c, cx) {
            Some(_) => Verdict::Disrupt,
            None => Verdict::Skip,
        }
    }

    /// Oldest first, as expiry.
    fn order(&self, a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name))
    }
}
