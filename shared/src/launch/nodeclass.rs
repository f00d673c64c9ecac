//! One EC2NodeClass resolved as a whole, through the launch resolvers: every
//! subnet and security group its selectors match, its AMI for every key
//! nodesmith launches for, and its instance profile. The sweep resolves each
//! class once a run, writes what it found as the class's status
//! ([`super::status`]) and compares nodes with it for drift.

use std::collections::{BTreeMap, BTreeSet};

use super::ami::{self, AmiKey};
use super::capacityreservation;
use super::errors::LaunchError;
use super::securitygroup::{self, SecurityGroup};
use super::subnet::{self, Subnet};
use super::{cluster, profile};
use crate::apis::EC2NodeClass;

/// The reason of `AMIsReady=False` for a class without an AMI family.
pub const AMI_FAMILY_NOT_SET: &str = "AMIFamilyNotSet";
/// Why launch cannot build user data for a class.
pub const NO_AMI_FAMILY: &str = "EC2NodeClass has no AMI family";

/// What a class's selectors match now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassFacts {
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
}

impl ClassFacts {
    /// The selected subnet ids.
    pub fn subnet_ids(&self) -> BTreeSet<String> {
        self.subnets.iter().map(|s| s.id.clone()).collect()
    }

    /// The selected security group ids.
    pub fn security_group_ids(&self) -> BTreeSet<String> {
        self.security_groups.iter().map(|g| g.id.clone()).collect()
    }
}

/// The cluster's Kubernetes version (aliases name the AMI per version).
pub async fn k8s_version(eks: &aws_sdk_eks::Client, cluster_name: &str) -> Result<String, LaunchError> {
    Ok(cluster::describe(eks, cluster_name).await?.version)
}

/// Resolves one class (no IAM call: a managed profile's name is known before it exists).
pub async fn resolve(
    ec2: &aws_sdk_ec2::Client,
    ssm: &aws_sdk_ssm::Client,
    cluster_name: &str,
    k8s_version: &str,
    class: &EC2NodeClass,
) -> Result<ClassFacts, LaunchError> {
    let subnets = subnet::resolve(ec2, &class.spec.subnet_selector_terms).await?;
    let security_groups = securitygroup::resolve_groups(ec2, &class.spec.security_group_selector_terms).await?;
    let resolved = ami::resolve(ec2, ssm, &class.spec.ami_selector_terms, k8s_version, &ami::all_keys()).await;
    // A selector launch refuses (an unsupported alias) is a fact about the class, not a failed call.
    let (amis, mut ami_problem) = match resolved {
        Ok(a) => (a, None),
        Err(LaunchError::Resolve { what, .. }) => (BTreeMap::new(), Some(("AMISelectorInvalid".to_string(), what))),
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
            tracing::warn!(class = class.name(), error = %e, "AMI names not described");
            BTreeMap::new()
        }
    };
    let terms = &class.spec.capacity_reservation_selector_terms;
    let capacity_reservations = if terms.is_empty() {
        None
    } else {
        Some(capacityreservation::resolve(ec2, terms).await?)
    };
    Ok(ClassFacts {
        invalid: class.validate().err().map(|e| e.to_string()),
        missing_profile: None,
        capacity_reservations,
        subnets,
        security_groups,
        amis,
        ami_names,
        instance_profile: profile::choose(cluster_name, class).map(|p| p.name().to_string()),
        ami_problem,
    })
}
