//! Drift by live resolution (pure): an instance whose AMI, subnet, security
//! groups or capacity reservation are no longer what its EC2NodeClass
//! resolves to now is drifted, with Karpenter's reason names. The sweep resolves each class and hands the
//! reasons to the core through [`super::DecideOptions::resolved_drift`].

use std::collections::BTreeSet;

/// The instance's AMI is not among the class's currently resolved AMIs.
pub const AMI_DRIFT: &str = "AMIDrift";
/// The instance's subnet is no longer selected by the class.
pub const SUBNET_DRIFT: &str = "SubnetDrift";
/// The instance's security groups differ from the class's selected ones.
pub const SECURITY_GROUP_DRIFT: &str = "SecurityGroupDrift";
/// The instance runs in a capacity reservation the class no longer selects.
pub const CAPACITY_RESERVATION_DRIFT: &str = "CapacityReservationDrift";

/// What EC2 says an instance runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceFacts {
    /// The AMI it was launched from.
    pub image_id: Option<String>,
    /// Its subnet.
    pub subnet_id: Option<String>,
    /// Its security group ids.
    pub security_groups: BTreeSet<String>,
    /// The capacity reservation it runs in now (EC2's `CapacityReservationId`;
    /// none once the reservation expired or was cancelled).
    pub capacity_reservation: Option<String>,
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
    /// Ids of the active reservations the class selects (empty: it selects
    /// none, so every reserved instance of it drifts, as in Karpenter).
    pub capacity_reservations: BTreeSet<String>,
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
    // Only the instance's reservation now counts: one that left it (expired,
    // cancelled) is relabelled on-demand instead (`crate::reservation_end`).
    if let Some(id) = &instance.capacity_reservation
        && !class.capacity_reservations.contains(id)
    {
        return Some(CAPACITY_RESERVATION_DRIFT);
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
            capacity_reservation: None,
        }
    }

    #[test]
    fn reasons_follow_what_no_longer_resolves() {
        let class = ClassResolution {
            amis: set(&["ami-1"]),
            subnets: set(&["subnet-a", "subnet-b"]),
            security_groups: set(&["sg-1", "sg-2"]),
            capacity_reservations: BTreeSet::new(),
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

    #[test]
    fn a_reservation_the_class_no_longer_selects_drifts_its_instances() {
        let in_reservation = |id: Option<&str>| InstanceFacts {
            capacity_reservation: id.map(str::to_string),
            ..facts(Some("ami-1"), Some("subnet-a"), &["sg-1"])
        };
        let selecting = |ids: &[&str]| ClassResolution {
            amis: set(&["ami-1"]),
            subnets: set(&["subnet-a"]),
            security_groups: set(&["sg-1"]),
            capacity_reservations: set(ids),
        };
        let cases: [(&str, InstanceFacts, ClassResolution, Option<&str>); 6] = [
            (
                "still selected",
                in_reservation(Some("cr-1")),
                selecting(&["cr-2", "cr-1"]),
                None,
            ),
            (
                "no longer selected",
                in_reservation(Some("cr-1")),
                selecting(&["cr-2"]),
                Some(CAPACITY_RESERVATION_DRIFT),
            ),
            (
                "the class selects no reservation at all",
                in_reservation(Some("cr-1")),
                selecting(&[]),
                Some(CAPACITY_RESERVATION_DRIFT),
            ),
            (
                "out of its reservation (expired): relabelled, not drifted",
                in_reservation(None),
                selecting(&[]),
                None,
            ),
            ("never reserved", in_reservation(None), selecting(&["cr-1"]), None),
            (
                "security groups before the reservation",
                InstanceFacts {
                    security_groups: set(&["sg-9"]),
                    ..in_reservation(Some("cr-1"))
                },
                selecting(&[]),
                Some(SECURITY_GROUP_DRIFT),
            ),
        ];
        for (name, i, c, want) in cases {
            assert_eq!(reason(&i, &c), want, "{name}");
        }
    }
}
