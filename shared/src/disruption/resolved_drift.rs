//! Drift by live resolution (pure): an instance whose AMI, subnet or security
//! groups are no longer what its EC2NodeClass resolves to now is drifted, with
//! Karpenter's reason names. The sweep resolves each class and hands the
//! reasons to the core through [`super::DecideOptions::resolved_drift`].

use std::collections::BTreeSet;

/// The instance's AMI is not among the class's currently resolved AMIs.
pub const AMI_DRIFT: &str = "AMIDrift";
/// The instance's subnet is no longer selected by the class.
pub const SUBNET_DRIFT: &str = "SubnetDrift";
/// The instance's security groups differ from the class's selected ones.
pub const SECURITY_GROUP_DRIFT: &str = "SecurityGroupDrift";

/// What EC2 says an instance runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceFacts {
    /// The AMI it was launched from.
    pub image_id: Option<String>,
    /// Its subnet.
    pub subnet_id: Option<String>,
    /// Its security group ids.
    pub security_groups: BTreeSet<String>,
}

/// What the instance's class resolves to now, for the instance's AMI needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassResolution {
    /// AMI ids valid for the instance's architecture and accelerator.
    pub amis: BTreeSet<String>,
    /// Selected subnet ids.
    pub subnets: BTreeSet<String>,
    /// Selected security group ids.
    pub security_groups: BTreeSet<String>,
}

/// The drift reason of an instance, if drifted (pure). An empty resolved set
/// or an unknown instance fact says nothing: resolving to nothing is a
/// resolution problem, not a reason to replace nodes.
pub fn reason(instance: &InstanceFacts, class: &ClassResolution) -> Option<&'static str> {
    if let Some(ami) = &instance.image_id
        && !class.amis.is_empty()
        && !class.amis.contains(ami)
    {
        return Some(AMI_DRIFT);
    }
    if let Some(subnet) = &instance.subnet_id
        && !class.subnets.is_empty()
        && !class.subnets.contains(subnet)
    {
        return Some(SUBNET_DRIFT);
    }
    if !instance.security_groups.is_empty()
        && !class.security_groups.is_empty()
        && instance.security_groups != class.security_groups
    {
        return Some(SECURITY_GROUP_DRIFT);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn facts(ami: Option<&str>, subnet: Option<&str>, sgs: &[&str]) -> InstanceFacts {
        InstanceFacts {
            image_id: ami.map(str::to_string),
            subnet_id: subnet.map(str::to_string),
            security_groups: set(sgs),
        }
    }

    #[test]
    fn reasons_follow_what_no_longer_resolves() {
        let class = ClassResolution {
            amis: set(&["ami-1"]),
            subnets: set(&["subnet-a", "subnet-b"]),
            security_groups: set(&["sg-1", "sg-2"]),
        };
        let cases: [(&str, InstanceFacts, &ClassResolution, Option<&str>); 10] = [
            (
                "all match",
                facts(Some("ami-1"), Some("subnet-b"), &["sg-2", "sg-1"]),
                &class,
                None,
            ),
            (
                "new AMI",
                facts(Some("ami-0"), Some("subnet-a"), &["sg-1", "sg-2"]),
                &class,
                Some(AMI_DRIFT),
            ),
            (
                "subnet unselected",
                facts(Some("ami-1"), Some("subnet-c"), &["sg-1", "sg-2"]),
                &class,
                Some(SUBNET_DRIFT),
            ),
            (
                "a security group fewer",
                facts(Some("ami-1"), Some("subnet-a"), &["sg-1"]),
                &class,
                Some(SECURITY_GROUP_DRIFT),
            ),
            (
                "a security group more",
                facts(Some("ami-1"), Some("subnet-a"), &["sg-1", "sg-2", "sg-3"]),
                &class,
                Some(SECURITY_GROUP_DRIFT),
            ),
            (
                "AMI first when all differ",
                facts(Some("ami-0"), Some("subnet-c"), &["sg-9"]),
                &class,
                Some(AMI_DRIFT),
            ),
            (
                "subnet before security groups",
                facts(Some("ami-1"), Some("subnet-c"), &["sg-9"]),
                &class,
                Some(SUBNET_DRIFT),
            ),
            ("unknown facts say nothing", facts(None, None, &[]), &class, None),
            (
                "an empty resolution says nothing",
                facts(Some("ami-0"), Some("subnet-c"), &["sg-9"]),
                &ClassResolution::default(),
                None,
            ),
            (
                "one of several AMIs",
                facts(Some("ami-2"), Some("subnet-a"), &["sg-1", "sg-2"]),
                &ClassResolution {
                    amis: set(&["ami-1", "ami-2"]),
                    ..class.clone()
                },
                None,
            ),
        ];
        for (name, i, c, want) in cases {
            assert_eq!(reason(&i, c), want, "{name}");
        }
    }
}
