//! One EC2NodeClass resolved as a whole: every subnet and security group its
//! selectors match, its AMI for every key nodesmith launches for, its capacity
//! reservations and its instance profile's name. The sweep resolves each class
//! once a run, writes what it found as the class's status ([`super::conditions`])
//! and compares nodes with it for drift; launch resolves the class of a claim
//! once a run and maps it to launch templates ([`super::template`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::ami::{self, AmiKey};
use super::capacityreservation;
use super::error::NodeClassError;
use super::securitygroup::{self, SecurityGroup};
use super::subnet::{self, Subnet};
use super::{eks_cluster, placementgroup, profile};
use crate::apis::EC2NodeClass;

/// The reason of `AMIsReady=False` for a class without an AMI family.
pub const AMI_FAMILY_NOT_SET: &str = "AMIFamilyNotSet";
/// The reason of `AMIsReady=False` for an AMI selector nodesmith cannot use (an unsupported alias).
pub const AMI_SELECTOR_INVALID: &str = "AMISelectorInvalid";
/// The reason of `SubnetsReady=False`.
pub const SUBNETS_NOT_FOUND: &str = "SubnetsNotFound";
/// The reason of `SecurityGroupsReady=False`.
pub const SECURITY_GROUPS_NOT_FOUND: &str = "SecurityGroupsNotFound";
/// The reason of `AMIsReady=False` when the selectors match no image.
pub const AMI_NOT_FOUND: &str = "AMINotFound";
/// What `SubnetsNotFound` says (launch fails a claim with the same words).
pub const NO_SUBNETS: &str = "subnetSelectorTerms select no subnets";
/// What `SecurityGroupsNotFound` says.
pub const NO_SECURITY_GROUPS: &str = "securityGroupSelectorTerms select no security groups";
/// What `AMINotFound` says.
pub const NO_AMIS: &str = "amiSelectorTerms select no AMI";
/// Why launch cannot build user data for a class.
pub const NO_AMI_FAMILY: &str = "EC2NodeClass has no AMI family";

/// What a class's selectors match now: the plain value both the sweep and launch read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvedClass {
    /// Every selected subnet.
    pub subnets: Vec<Subnet>,
    /// Every selected security group.
    pub security_groups: Vec<SecurityGroup>,
    /// The AMI id per key the selectors serve.
    pub amis: BTreeMap<AmiKey, String>,
    /// Image names by id (those EC2 describes).
    pub ami_names: BTreeMap<String, String>,
    /// The instance profile's name (`instanceProfile`, or the one made for `role`).
    pub instance_profile: Option<String>,
    /// Why the class's AMIs cannot be used, beyond matching nothing: (reason, message).
    pub ami_problem: Option<(String, String)>,
    /// The active capacity reservations it selects (None: it selects none).
    pub capacity_reservations: Option<Vec<crate::apis::ec2nodeclass::CapacityReservationStatus>>,
    /// Why the class fails validation (Karpenter's CRD rules), if it does.
    pub invalid: Option<String>,
    /// The named `instanceProfile` IAM says does not exist (checked when IAM is at hand).
    pub missing_profile: Option<String>,
    /// What EC2 said to the class's latest launch, when the sweep has a
    /// record: `Ok`, or what a refusal no launch has succeeded since says
    /// ([`super::conditions::refusal_message`]).
    pub last_launch: Option<Result<(), String>>,
    /// The id of the placement group `placementGroupSelector` selects (None
    /// when it selects none or is unset; see `placement_group_problem`).
    pub placement_group: Option<String>,
    /// Why `placementGroupSelector` selects no usable group, if it does not.
    pub placement_group_problem: Option<String>,
}

impl ResolvedClass {
    /// The selected subnet ids.
    pub fn subnet_ids(&self) -> BTreeSet<String> {
        self.subnets.iter().map(|s| s.id.clone()).collect()
    }

    /// The selected security group ids.
    pub fn security_group_ids(&self) -> BTreeSet<String> {
        self.security_groups.iter().map(|g| g.id.clone()).collect()
    }

    /// Why a claim whose instance types need the AMI `keys` cannot launch from
    /// the class, if it cannot (pure): the first of no subnets, no security
    /// groups, no placement group the selector names, an AMI selector nodesmith cannot use, no AMI for those keys.
    pub fn unusable_for(&self, keys: &BTreeSet<AmiKey>) -> Option<String> {
        if self.subnets.is_empty() {
            return Some(format!("{SUBNETS_NOT_FOUND}: {NO_SUBNETS}"));
        }
        if self.security_groups.is_empty() {
            return Some(format!("{SECURITY_GROUPS_NOT_FOUND}: {NO_SECURITY_GROUPS}"));
        }
        if let Some(why) = &self.placement_group_problem {
            return Some(format!("{}: {why}", placementgroup::PLACEMENT_GROUP_NOT_FOUND));
        }
        match &self.ami_problem {
            Some((reason, what)) if reason == AMI_SELECTOR_INVALID => return Some(what.clone()),
            Some((reason, what)) => return Some(format!("{reason}: {what}")),
            None => {}
        }
        self.amis_for(keys)
            .is_empty()
            .then(|| format!("{AMI_NOT_FOUND}: {NO_AMIS} for {keys:?}"))
    }

    /// The AMI id for each of `keys` the class serves.
    pub fn amis_for(&self, keys: &BTreeSet<AmiKey>) -> BTreeMap<AmiKey, String> {
        self.amis
            .iter()
            .filter(|(k, _)| keys.contains(*k))
            .map(|(k, id)| (k.clone(), id.clone()))
            .collect()
    }
}

/// The cluster's Kubernetes version (aliases name the AMI per version).
pub async fn k8s_version(eks: &aws_sdk_eks::Client, cluster_name: &str) -> Result<String, NodeClassError> {
    Ok(eks_cluster::describe(eks, cluster_name).await?.version)
}

/// Resolves one class (no IAM call: a managed profile's name is known before it exists).
/// A selector nodesmith cannot use is a fact in the value, not an error; an error is a failed call.
pub async fn resolve(
    ec2: &aws_sdk_ec2::Client,
    ssm: &aws_sdk_ssm::Client,
    cluster_name: &str,
    k8s_version: &str,
    class: &EC2NodeClass,
) -> Result<ResolvedClass, NodeClassError> {
    let subnets = subnet::resolve(ec2, &class.spec.subnet_selector_terms).await?;
    let security_groups = securitygroup::resolve_groups(ec2, &class.spec.security_group_selector_terms).await?;
    let resolved = ami::resolve(ec2, ssm, &class.spec.ami_selector_terms, k8s_version, &ami::all_keys()).await;
    // A selector launch refuses (an unsupported alias) is a fact about the class, not a failed call.
    let (amis, mut ami_problem) = match resolved {
        Ok(a) => (a, None),
        Err(NodeClassError::Unusable { what }) => (BTreeMap::new(), Some((AMI_SELECTOR_INVALID.to_string(), what))),
        Err(e) => return Err(e),
    };
    if ami_problem.is_none() && class.ami_family().is_none() {
        ami_problem = Some((AMI_FAMILY_NOT_SET.into(), NO_AMI_FAMILY.into()));
    }
    let ids: BTreeSet<String> = amis.values().cloned().collect();
    // Names only explain; an image EC2 cannot describe keeps its id alone.
    let ami_names = match ami::names(ec2, &ids).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(class = class.name(), error = %crate::telemetry::causes(&e), "AMI names not described");
            BTreeMap::new()
        }
    };
    let terms = &class.spec.capacity_reservation_selector_terms;
    let capacity_reservations = if terms.is_empty() {
        None
    } else {
        Some(capacityreservation::resolve(ec2, terms).await?)
    };
    let (placement_group, placement_group_problem) = match &class.spec.placement_group_selector {
        None => (None, None),
        Some(sel) => match placementgroup::resolve(ec2, sel).await? {
            Ok(id) => (Some(id), None),
            Err(why) => (None, Some(why)),
        },
    };
    Ok(ResolvedClass {
        placement_group,
        placement_group_problem,
        invalid: class.validate().err().map(|e| e.to_string()),
        missing_profile: None,
        last_launch: None,
        capacity_reservations,
        subnets,
        security_groups,
        amis,
        ami_names,
        instance_profile: profile::choose(cluster_name, class).map(|p| p.name().to_string()),
        ami_problem,
    })
}

/// The classes one run (one sweep, one launch batch) resolved, by name: a class
/// met twice in a run is resolved once. Dropped with the run, so nothing read
/// here outlives it; a class whose spec changed meanwhile (a new generation) is
/// resolved again.
#[derive(Debug, Default)]
pub struct RunClasses {
    seen: Mutex<BTreeMap<String, Seen>>,
}

/// A class resolved in the run, with the generation it was resolved at.
type Seen = (Option<i64>, Arc<ResolvedClass>);

impl RunClasses {
    /// What this run resolved for the class at its current generation.
    pub fn get(&self, class: &EC2NodeClass) -> Option<Arc<ResolvedClass>> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(class.name())
            .filter(|(generation, _)| *generation == class.metadata.generation)
            .map(|(_, r)| r.clone())
    }

    /// Keeps what was resolved for the class, for the rest of the run.
    pub fn put(&self, class: &EC2NodeClass, resolved: ResolvedClass) -> Arc<ResolvedClass> {
        let resolved = Arc::new(resolved);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(class.name().to_string(), (class.metadata.generation, resolved.clone()));
        resolved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reuses_a_class_until_its_generation_changes() {
        let run = RunClasses::default();
        let mut class = EC2NodeClass::new("default", Default::default());
        class.metadata.generation = Some(1);
        assert!(run.get(&class).is_none());
        let resolved = ResolvedClass {
            instance_profile: Some("p".into()),
            ..Default::default()
        };
        run.put(&class, resolved.clone());
        assert_eq!(run.get(&class).as_deref(), Some(&resolved));
        class.metadata.generation = Some(2);
        assert!(run.get(&class).is_none(), "a changed spec is resolved again");
    }
}
