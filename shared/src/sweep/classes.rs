//! Each EC2NodeClass resolved once a run ([`crate::nodeclass::resolve`], as
//! launch resolves it) and its status written back through the
//! status subresource when it changed, as Karpenter's EC2NodeClass
//! controller does; the same resolution feeds drift ([`super::disrupt`]).

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::Sweeper;
use crate::apis::EC2NodeClass;
use crate::kubernetes::Cluster;
use crate::nodeclass::{self, ResolvedClass, conditions};

/// What the class part of one run did.
#[derive(Debug, Default)]
pub struct ClassReport {
    /// Classes whose status was written (it changed).
    pub written: Vec<String>,
    /// Classes not resolved (an AWS call failed), with why: their status is left as it was.
    pub unresolved: Vec<(String, String)>,
    /// Classes whose status write failed, with why.
    pub failed: Vec<(String, String)>,
}

/// The class with `status` in place of its own, or None when that is no change (pure).
pub fn with_status(
    class: &EC2NodeClass,
    status: crate::apis::ec2nodeclass::EC2NodeClassStatus,
) -> Option<EC2NodeClass> {
    if class.status.as_ref() == Some(&status) {
        return None;
    }
    let mut updated = class.clone();
    updated.status = Some(status);
    Some(updated)
}

impl<C: Cluster> Sweeper<C> {
    /// Resolves every class and writes the statuses that changed; returns what
    /// each resolved class's selectors match (empty when resolution is not wired).
    pub(super) async fn classes(
        &self,
        now: Timestamp,
        claims: &[crate::nodeclaim::NodeClaim],
        report: &mut ClassReport,
    ) -> BTreeMap<String, ResolvedClass> {
        let mut out = BTreeMap::new();
        let Some(r) = &self.resolution else {
            return out;
        };
        let classes = match self.cluster.usable_node_classes().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "EC2NodeClasses not listed; no status nor drift by resolution this run");
                report.unresolved.push((String::new(), e.to_string()));
                return out;
            }
        };
        if classes.is_empty() {
            return out;
        }
        let cluster = self.instances.cluster();
        let version = match nodeclass::k8s_version(&r.eks, cluster).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "cluster not described; no status nor drift by resolution this run");
                report.unresolved.push((String::new(), e.to_string()));
                return out;
            }
        };
        for class in &classes {
            let name = class.name().to_string();
            let mut facts = match nodeclass::resolve(self.instances.ec2(), &r.ssm, cluster, &version, class).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(class = %name, error = %crate::telemetry::causes(&e), "EC2NodeClass not resolved; its status stays and its nodes are not checked for drift this run");
                    report.unresolved.push((name, e.to_string()));
                    continue;
                }
            };
            // A named profile is used as is: say so when IAM does not have it.
            if let (Some(iam), Some(name)) = (&self.iam, &class.spec.instance_profile) {
                match nodeclass::profile::exists(iam, name).await {
                    Ok(true) => {}
                    Ok(false) => facts.missing_profile = Some(name.clone()),
                    Err(e) => {
                        tracing::warn!(class = class.name(), profile = %name, error = %crate::telemetry::causes(&e), "instance profile not checked this run")
                    }
                }
            }
            // A refusal stands until a claim of the class launched after it.
            let latest_launch = claims
                .iter()
                .filter(|c| c.node_class == name)
                .filter_map(|c| c.timestamps.launched)
                .map(|t| t.as_millisecond())
                .max();
            match self.store.launch_refusal(&name).await {
                Ok(refusal) => {
                    facts.last_launch = refusal.map(|r| match r.stands(latest_launch) {
                        true => Err(conditions::refusal_message(&r.code, &r.message)),
                        false => Ok(()),
                    })
                }
                // The condition stays as it is this run.
                Err(e) => {
                    tracing::warn!(class = %name, error = %crate::telemetry::causes(&e), "launch refusal not read this run");
                    facts.last_launch = class
                        .condition(crate::apis::ec2nodeclass::condition_types::LAUNCH_SUCCEEDED)
                        .map(|c| match c.status.as_str() {
                            "False" => Err(c.message.clone()),
                            _ => Ok(()),
                        });
                }
            }
            let computed = conditions::compute(&facts, class.status.as_ref(), class.metadata.generation, now);
            if let Some(updated) = with_status(class, computed) {
                match self.cluster.replace_node_class_status(&updated).await {
                    Ok(true) => {
                        let ready = updated.may_launch();
                        tracing::info!(class = %name, ready, "EC2NodeClass status written");
                        report.written.push(name.clone());
                    }
                    Ok(false) => {}
                    // A conflict: the class changed since it was listed; the next run writes.
                    Err(e) => {
                        tracing::warn!(class = %name, error = %crate::telemetry::causes(&e), "EC2NodeClass status not written; the next sweep tries again");
                        report.failed.push((name.clone(), e.to_string()));
                    }
                }
            }
            out.insert(name, facts);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_status_is_not_written() {
        let mut class = EC2NodeClass::new("default", Default::default());
        let status = crate::apis::ec2nodeclass::EC2NodeClassStatus {
            instance_profile: Some("p".into()),
            ..Default::default()
        };
        let updated = with_status(&class, status.clone()).expect("a first status is a change");
        assert_eq!(updated.status.as_ref(), Some(&status));
        assert_eq!(updated.spec, class.spec);
        class.status = Some(status.clone());
        assert!(with_status(&class, status).is_none());
    }
}
