//! The class → launch-template mapping, pure: what a node's user data tells
//! its kubelet, the tags of its instance and template, and the whole
//! [`TemplateSpec`] from a resolved class, a claim and the image. A new
//! EC2NodeClass field that shapes the template is read here, and only here.

use std::collections::BTreeMap;

use super::capacityreservation;
use super::error::NodeClassError;
use super::launchtemplate::{self, IMAGE_TAG, RESERVATION_TAG, TemplateSpec};
use super::resolved::{AMI_FAMILY_NOT_SET, NO_AMI_FAMILY, ResolvedClass};
use super::userdata::{self, ClusterInfo, NodeSettings};
use crate::apis::ec2nodeclass::{CapacityReservationStatus, INSTANCE_STORE_RAID0};
use crate::apis::{EC2NodeClass, Taint, TaintEffect};
use crate::labels;
use crate::nodeclaim::NodeClaim;

/// What one template of a claim is for, beyond its class: the capacity type
/// its user data labels the node with, its AMI, and for a reserved offering
/// the reservation its instances launch into (one template per reservation,
/// since EC2 reads the target from the template).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Image<'a> {
    /// `on-demand`, `spot` or `reserved`.
    pub capacity_type: &'a str,
    /// The AMI id.
    pub id: &'a str,
    /// The reservation targeted (reserved offerings only).
    pub reservation: Option<&'a CapacityReservationStatus>,
}

/// The launch template a claim of `class` launches from with `image` (pure).
/// Claims of one pool share it: nothing here names the claim.
pub fn template_spec(
    class: &EC2NodeClass,
    resolved: &ResolvedClass,
    cluster: &ClusterInfo,
    claim: &NodeClaim,
    image: &Image<'_>,
) -> Result<TemplateSpec, NodeClassError> {
    let family = class
        .ami_family()
        .ok_or_else(|| NodeClassError::unusable(format!("{AMI_FAMILY_NOT_SET}: {NO_AMI_FAMILY}")))?;
    let settings = node_settings(claim, class, image.capacity_type);
    let user_data = userdata::render(&family, cluster, &settings)?;
    let mut tags = template_tags(&cluster.name, claim, class);
    tags.insert(IMAGE_TAG.into(), image.id.to_string());
    if let Some(r) = image.reservation {
        tags.insert(RESERVATION_TAG.into(), r.id.clone());
    }
    Ok(TemplateSpec {
        cluster: cluster.name.clone(),
        image_id: image.id.to_string(),
        user_data,
        security_groups: resolved.security_groups.iter().map(|g| g.id.clone()).collect(),
        instance_profile: resolved.instance_profile.clone(),
        block_devices: launchtemplate::block_devices(&family, &class.spec.block_device_mappings),
        metadata: class.spec.metadata_options.clone(),
        monitoring: class.spec.detailed_monitoring.unwrap_or(false),
        associate_public_ip: class.spec.associate_public_ip_address,
        tags,
        capacity_reservation: image.reservation.map(capacityreservation::target),
        ip_prefix_count: class.spec.ip_prefix_count,
        connection_tracking: class.spec.connection_tracking.clone(),
        nested_virtualization: class
            .spec
            .cpu_options
            .as_ref()
            .and_then(|c| c.nested_virtualization.clone()),
        placement_group_id: resolved.placement_group.clone(),
    })
}

/// The kubelet's `--node-labels`: the claim's labels a kubelet may set
/// ([`labels::kubelet_may_set`]; nodesmith applies the others at registration),
/// plus the pool and the class. A label the launched instance decides
/// ([`labels::set_from_instance`]) is left out unless the claim's requirements
/// pin it to that value, so a prediction never reaches a node. The claim's name
/// is not there: user data is shared by every claim of a pool (one launch
/// template for them all); the node gets `karpenter.sh/nodeclaim` at
/// registration, from the instance's tag of that name (pure).
pub fn node_labels(claim: &NodeClaim) -> BTreeMap<String, String> {
    let pinned = claim.requirements().single_valued_labels();
    let mut l: BTreeMap<String, String> = claim
        .labels
        .iter()
        .filter(|(k, _)| labels::kubelet_may_set(k))
        .filter(|(k, v)| !labels::set_from_instance(k) || pinned.get(*k) == Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    l.insert(labels::NODEPOOL.into(), claim.node_pool.clone());
    l.insert(labels::EC2NODECLASS.into(), claim.node_class.clone());
    l
}

/// The taints a node registers with: the claim's taints and startup taints,
/// and `karpenter.sh/unregistered:NoExecute`, which nodesmith removes when it
/// registers the node (pure).
pub fn node_taints(claim: &NodeClaim) -> Vec<Taint> {
    let mut t: Vec<Taint> = claim.taints.iter().chain(&claim.startup_taints).cloned().collect();
    if !t.iter().any(|t| t.key == labels::UNREGISTERED_TAINT_KEY) {
        t.push(Taint::new(labels::UNREGISTERED_TAINT_KEY, None, TaintEffect::NoExecute));
    }
    t
}

/// What the node's user data tells its kubelet when launched as `capacity_type`:
/// [`node_labels`] with that capacity type, [`node_taints`], and the class's
/// kubelet settings and userData (pure).
pub fn node_settings(claim: &NodeClaim, class: &EC2NodeClass, capacity_type: &str) -> NodeSettings {
    let mut l = node_labels(claim);
    l.insert(labels::CAPACITY_TYPE.into(), capacity_type.to_string());
    NodeSettings {
        labels: l,
        taints: node_taints(claim),
        kubelet: class.spec.kubelet.clone(),
        user_data: class.spec.user_data.clone(),
        instance_store_raid0: class.spec.instance_store_policy.as_deref() == Some(INSTANCE_STORE_RAID0),
    }
}

/// Instance tags: the class's, then the ones nodesmith owns (pure).
pub fn instance_tags(cluster: &str, claim: &NodeClaim, class: &EC2NodeClass) -> BTreeMap<String, String> {
    let mut t = class.spec.tags.clone();
    t.insert(crate::ec2::instances::owned_tag_key(cluster), "owned".into());
    t.insert(crate::ec2::instances::CLUSTER_NAME_TAG.into(), cluster.into());
    t.insert(crate::ec2::instances::LAUNCHED_BY_TAG.into(), cluster.into());
    t.insert(labels::NODEPOOL.into(), claim.node_pool.clone());
    t.insert(labels::NODECLAIM.into(), claim.name.clone());
    t.insert(labels::EC2NODECLASS.into(), class.name().into());
    t
}

/// Tags of a launch template (and of the volumes and network interfaces it
/// makes): the instance tags without the claim's name, so every claim of a pool
/// shares one template, plus the class's drift hash, which the sweep compares
/// to find templates no class uses any more (pure).
pub fn template_tags(cluster: &str, claim: &NodeClaim, class: &EC2NodeClass) -> BTreeMap<String, String> {
    let mut t = instance_tags(cluster, claim, class);
    t.remove(labels::NODECLAIM);
    t.insert(labels::EC2NODECLASS_HASH_ANNOTATION.into(), class.hash());
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::nodeclaim::fixtures::claim;

    #[test]
    fn labels_and_tags_carry_pool_class_and_claim() {
        let c = claim(vec![]);
        let l = node_labels(&c);
        assert_eq!(l["karpenter.sh/nodepool"], "default");
        assert!(
            !l.contains_key(labels::NODECLAIM),
            "the claim's name stays out of user data: {l:?}"
        );
        assert_eq!(l["team"], "a");
        let mut class = EC2NodeClass::new("default", Default::default());
        class.spec.tags.insert("cost-center".into(), "42".into());
        let t = instance_tags("demo", &c, &class);
        assert_eq!(t["kubernetes.io/cluster/demo"], "owned");
        assert_eq!(t["eks:eks-cluster-name"], "demo");
        assert_eq!(t["karpenter.sh/nodepool"], "default");
        assert_eq!(t["karpenter.sh/nodeclaim"], "default-x");
        assert_eq!(t["karpenter.k8s.aws/ec2nodeclass"], "default");
        assert_eq!(t["cost-center"], "42");
        let lt = template_tags("demo", &c, &class);
        assert!(!lt.contains_key(labels::NODECLAIM), "{lt:?}");
        assert_eq!(lt[labels::EC2NODECLASS_HASH_ANNOTATION], class.hash());
        let other = NodeClaim {
            name: "default-y".into(),
            ..c.clone()
        };
        assert_eq!(
            node_settings(&c, &class, "spot"),
            node_settings(&other, &class, "spot"),
            "two claims of one pool: the same user data"
        );
        assert_eq!(template_tags("demo", &other, &class), lt);
    }

    /// A claim as the solver recorded it before labels were limited to what is
    /// known before launch: every prediction among its labels.
    fn predicted_claim() -> NodeClaim {
        let mut c = claim(vec![
            (labels::REGION, &["us-east-1"]),
            (labels::INSTANCE_TYPE, &["m5.large", "m5.xlarge"]),
        ]);
        c.instance_type_options = vec!["m5.large".into(), "m5.xlarge".into()];
        for (k, v) in [
            (labels::INSTANCE_TYPE, "m5.large"),
            ("beta.kubernetes.io/instance-type", "m5.large"),
            (labels::ZONE, "us-east-1a"),
            (labels::REGION, "us-east-1"),
            (labels::HOSTNAME, "default-x"),
            (labels::ARCH, "amd64"),
            (labels::aws::FAMILY, "m5"),
            (labels::aws::CPU, "2"),
            (labels::CAPACITY_TYPE, "spot"),
            ("node-restriction.kubernetes.io/team", "a"),
            ("node.kubernetes.io/lifecycle", "normal"),
            ("kops.k8s.io/instancegroup", "nodes"),
        ] {
            c.labels.insert(k.into(), v.into());
        }
        c
    }

    #[test]
    fn kubelet_labels_are_known_and_allowed_ones_only() {
        let l = node_labels(&predicted_claim());
        let want: BTreeMap<String, String> = [
            ("team", "a"),
            (labels::REGION, "us-east-1"),
            ("node.kubernetes.io/lifecycle", "normal"),
            (labels::NODEPOOL, "default"),
            (labels::EC2NODECLASS, "default"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            l, want,
            "pinned region kept; predictions and kubelet-refused labels left out"
        );
        assert!(l.keys().all(|k| labels::kubelet_may_set(k)));
    }

    #[test]
    fn user_data_registers_unregistered_and_names_no_prediction() {
        let c = predicted_claim();
        let class = EC2NodeClass::new("default", Default::default());
        let s = node_settings(&c, &class, "spot");
        assert_eq!(s.labels[labels::CAPACITY_TYPE], "spot");
        assert_eq!(
            s.taints.last(),
            Some(&Taint::new(
                labels::UNREGISTERED_TAINT_KEY,
                None,
                TaintEffect::NoExecute
            ))
        );
        let cluster = ClusterInfo {
            name: "demo".into(),
            endpoint: "https://example".into(),
            certificate_authority: "Q0E=".into(),
            service_cidr: "10.100.0.0/16".into(),
            version: "1.33".into(),
        };
        let ud = userdata::al2023(&cluster, &s).unwrap();
        let nc: serde_json::Value =
            serde_yaml_ng::from_str(&userdata::parse_mime(&ud).unwrap().last().unwrap().body).unwrap();
        let flag = nc["spec"]["kubelet"]["flags"][0].as_str().unwrap();
        let given: Vec<&str> = flag
            .strip_prefix("--node-labels=")
            .unwrap()
            .split(',')
            .map(|kv| kv.split_once('=').unwrap().0)
            .collect();
        for k in &given {
            assert!(labels::kubelet_may_set(k), "{k} in {flag}");
            assert!(!k.starts_with("karpenter.k8s.aws/instance-"), "{flag}");
        }
        for k in [labels::INSTANCE_TYPE, labels::ZONE, labels::HOSTNAME] {
            assert!(!given.contains(&k), "{k} in {flag}");
        }
        let taints = nc["spec"]["kubelet"]["config"]["registerWithTaints"]
            .as_array()
            .unwrap();
        assert!(
            taints.contains(&serde_json::json!({"key": "karpenter.sh/unregistered", "effect": "NoExecute"})),
            "{taints:?}"
        );
        // The claim's own taints stay; the unregistered taint is never doubled.
        let mut tainted = c.clone();
        tainted.taints = vec![Taint::new("dedicated", Some("web"), TaintEffect::NoSchedule)];
        tainted.startup_taints = vec![Taint::new(labels::UNREGISTERED_TAINT_KEY, None, TaintEffect::NoExecute)];
        let keys: Vec<String> = node_taints(&tainted).into_iter().map(|t| t.key).collect();
        assert_eq!(keys, vec!["dedicated", labels::UNREGISTERED_TAINT_KEY]);
    }

    fn alias_class(alias: &str) -> EC2NodeClass {
        let mut class = EC2NodeClass::new("default", Default::default());
        class.spec.ami_selector_terms = vec![serde_json::from_value(serde_json::json!({ "alias": alias })).unwrap()];
        class.spec.role = Some("nodes".into());
        class
    }

    fn resolved_for(class: &EC2NodeClass) -> ResolvedClass {
        ResolvedClass {
            security_groups: vec![
                crate::nodeclass::securitygroup::SecurityGroup {
                    id: "sg-a".into(),
                    name: "a".into(),
                },
                crate::nodeclass::securitygroup::SecurityGroup {
                    id: "sg-b".into(),
                    name: "b".into(),
                },
            ],
            instance_profile: crate::nodeclass::profile::choose("demo", class).map(|p| p.name().to_string()),
            ..Default::default()
        }
    }

    fn cluster_info() -> ClusterInfo {
        ClusterInfo {
            name: "demo".into(),
            endpoint: "https://example".into(),
            certificate_authority: "Q0E=".into(),
            service_cidr: "10.100.0.0/16".into(),
            version: "1.33".into(),
        }
    }

    fn reservation() -> CapacityReservationStatus {
        serde_json::from_value(serde_json::json!({
            "id": "cr-1",
            "instanceType": "m5.large",
            "availabilityZone": "us-east-1a",
            "reservationType": "default",
            "availableInstanceCount": 2
        }))
        .unwrap()
    }

    /// Each row: a class edit, the image, and what the spec must show.
    #[test]
    fn the_template_is_a_function_of_class_claim_and_image() {
        type Edit = fn(&mut EC2NodeClass);
        type Check = fn(&TemplateSpec, &EC2NodeClass);
        let r = reservation();
        let cases: Vec<(&str, &str, Edit, Image<'_>, Check)> = vec![
            (
                "al2023 on-demand: the class's groups, profile, default root volume, image tag",
                "al2023@latest",
                |_| {},
                Image {
                    capacity_type: "on-demand",
                    id: "ami-1",
                    reservation: None,
                },
                |t, class| {
                    assert_eq!(t.cluster, "demo");
                    assert_eq!(t.image_id, "ami-1");
                    assert_eq!(t.security_groups, vec!["sg-a", "sg-b"]);
                    assert_eq!(
                        t.instance_profile.as_deref(),
                        crate::nodeclass::profile::choose("demo", class)
                            .as_ref()
                            .map(|p| p.name())
                    );
                    assert_eq!(t.block_devices.len(), 1);
                    assert_eq!(t.block_devices[0].size_gib, Some(20));
                    assert_eq!(t.tags[IMAGE_TAG], "ami-1");
                    assert_eq!(t.tags[labels::EC2NODECLASS_HASH_ANNOTATION], class.hash());
                    assert!(!t.tags.contains_key(RESERVATION_TAG));
                    assert!(!t.tags.contains_key(labels::NODECLAIM), "shared by the pool");
                    assert_eq!(t.capacity_reservation, None);
                    assert!(!t.monitoring);
                    assert_eq!(t.associate_public_ip, None);
                    assert!(
                        t.user_data.contains("karpenter.sh/capacity-type=on-demand"),
                        "{}",
                        t.user_data
                    );
                },
            ),
            (
                "spot: the capacity type reaches user data only",
                "al2023@latest",
                |_| {},
                Image {
                    capacity_type: "spot",
                    id: "ami-1",
                    reservation: None,
                },
                |t, _| {
                    assert!(
                        t.user_data.contains("karpenter.sh/capacity-type=spot"),
                        "{}",
                        t.user_data
                    )
                },
            ),
            (
                "reserved: the reservation is targeted and tagged",
                "al2023@latest",
                |_| {},
                Image {
                    capacity_type: "reserved",
                    id: "ami-1",
                    reservation: Some(&r),
                },
                |t, _| {
                    assert_eq!(t.tags[RESERVATION_TAG], "cr-1");
                    assert_eq!(t.capacity_reservation.as_ref().map(|c| c.id.as_str()), Some("cr-1"));
                },
            ),
            (
                "bottlerocket: its OS and data volumes, TOML user data",
                "bottlerocket@latest",
                |_| {},
                Image {
                    capacity_type: "on-demand",
                    id: "ami-br",
                    reservation: None,
                },
                |t, _| {
                    let names: Vec<&str> = t.block_devices.iter().map(|b| b.device_name.as_str()).collect();
                    assert_eq!(names, vec!["/dev/xvda", "/dev/xvdb"]);
                    assert!(t.user_data.contains("[settings.kubernetes]"), "{}", t.user_data);
                },
            ),
            (
                "the class's tags, IMDS, monitoring and public IP choice",
                "al2023@latest",
                |c| {
                    c.spec.tags.insert("cost-center".into(), "42".into());
                    c.spec.metadata_options.http_put_response_hop_limit = 2;
                    c.spec.detailed_monitoring = Some(true);
                    c.spec.associate_public_ip_address = Some(false);
                },
                Image {
                    capacity_type: "on-demand",
                    id: "ami-1",
                    reservation: None,
                },
                |t, _| {
                    assert_eq!(t.tags["cost-center"], "42");
                    assert_eq!(t.metadata.http_put_response_hop_limit, 2);
                    assert!(t.monitoring);
                    assert_eq!(t.associate_public_ip, Some(false));
                },
            ),
        ];
        for (name, alias, edit, image, check) in cases {
            let mut class = alias_class(alias);
            edit(&mut class);
            let resolved = resolved_for(&class);
            let spec = template_spec(&class, &resolved, &cluster_info(), &claim(vec![]), &image)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            check(&spec, &class);
            let other = NodeClaim {
                name: "default-y".into(),
                ..claim(vec![])
            };
            assert_eq!(
                template_spec(&class, &resolved, &cluster_info(), &other, &image).unwrap(),
                spec,
                "{name}: two claims of one pool share the template"
            );
        }
    }

    #[test]
    fn a_class_without_an_ami_family_maps_to_no_template() {
        let class = EC2NodeClass::new("default", Default::default());
        let image = Image {
            capacity_type: "on-demand",
            id: "ami-1",
            reservation: None,
        };
        let err = template_spec(&class, &resolved_for(&class), &cluster_info(), &claim(vec![]), &image).unwrap_err();
        assert!(
            matches!(&err, NodeClassError::Unusable { what } if what == "AMIFamilyNotSet: EC2NodeClass has no AMI family"),
            "{err:?}"
        );
    }
}
