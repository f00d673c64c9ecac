//! Launch templates: one per distinct content, named by a hash of it, so
//! concurrent launches converge on the same template and `AlreadyExists` is success.

use std::collections::BTreeMap;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    CapacityReservationTarget, ConnectionTrackingSpecificationRequest, LaunchTemplateBlockDeviceMappingRequest,
    LaunchTemplateCapacityReservationSpecificationRequest, LaunchTemplateCpuOptionsRequest,
    LaunchTemplateEbsBlockDeviceRequest, LaunchTemplateHttpTokensState,
    LaunchTemplateIamInstanceProfileSpecificationRequest, LaunchTemplateInstanceMarketOptionsRequest,
    LaunchTemplateInstanceMetadataEndpointState, LaunchTemplateInstanceMetadataOptionsRequest,
    LaunchTemplateInstanceMetadataProtocolIpv6, LaunchTemplateInstanceNetworkInterfaceSpecificationRequest,
    LaunchTemplatePlacementRequest, LaunchTemplateTagSpecificationRequest, LaunchTemplatesMonitoringRequest,
    MarketType, NestedVirtualizationSpecification, RequestLaunchTemplateData, ResourceType, Tag, TagSpecification,
    VolumeType,
};
use base64::Engine;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::NodeClassError;
use crate::apis::ec2nodeclass::{BlockDeviceMapping, ConnectionTracking, MetadataOptions};
use crate::nodeclaim::ReservationRef;

/// The tag naming a template's AMI.
pub const IMAGE_TAG: &str = "nodesmith/image-id";
/// The tag naming the capacity reservation a template targets.
pub const RESERVATION_TAG: &str = "nodesmith/capacity-reservation-id";

/// Everything a launch template holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSpec {
    /// The cluster (part of the name's hash so clusters never share templates).
    pub cluster: String,
    /// AMI id.
    pub image_id: String,
    /// User data, plain text (base64-encoded when sent).
    pub user_data: String,
    /// Security group ids.
    pub security_groups: Vec<String>,
    /// Instance profile name.
    pub instance_profile: Option<String>,
    /// Block devices.
    pub block_devices: Vec<LaunchVolume>,
    /// IMDS options.
    pub metadata: MetadataOptions,
    /// Detailed monitoring.
    pub monitoring: bool,
    /// `associatePublicIPAddress`: set, the primary interface is described in
    /// the template (EC2 takes the choice only there), with the security groups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub associate_public_ip: Option<bool>,
    /// Tags for the template, and for volumes and network interfaces it creates.
    pub tags: BTreeMap<String, String>,
    /// The capacity reservation its instances launch into (reserved offerings:
    /// one template per reservation, since EC2 reads the target from the template).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_reservation: Option<ReservationRef>,
    /// IPv4 prefixes of the primary interface (`ipPrefixCount`; set, the
    /// primary interface is described in the template, with the security groups).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_prefix_count: Option<i32>,
    /// Connection tracking timeouts of the primary interface (set, as `ip_prefix_count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_tracking: Option<ConnectionTracking>,
    /// `cpuOptions.nestedVirtualization`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nested_virtualization: Option<String>,
    /// The placement group's id (`placementGroupSelector`, resolved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement_group_id: Option<String>,
}

/// One EBS volume.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchVolume {
    /// Device name.
    pub device_name: String,
    /// Size in GiB.
    pub size_gib: Option<i32>,
    /// Volume type.
    pub volume_type: String,
    /// Encrypted.
    pub encrypted: bool,
    /// Delete on termination.
    pub delete_on_termination: bool,
    /// IOPS.
    pub iops: Option<i32>,
    /// Throughput MiB/s.
    pub throughput: Option<i32>,
    /// KMS key.
    pub kms_key_id: Option<String>,
    /// Snapshot.
    pub snapshot_id: Option<String>,
    /// MiB/s the snapshot is read into the volume at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_initialization_rate: Option<i32>,
}

/// Block devices from the EC2NodeClass, or the family's defaults (pure):
/// AL2023 a 20 GiB gp3 root; Bottlerocket a 4 GiB OS volume and a 20 GiB data volume.
pub fn block_devices(family: &str, mappings: &[BlockDeviceMapping]) -> Vec<LaunchVolume> {
    let dev = |name: &str, gib: i32| LaunchVolume {
        device_name: name.into(),
        size_gib: Some(gib),
        volume_type: "gp3".into(),
        encrypted: true,
        delete_on_termination: true,
        iops: None,
        throughput: None,
        kms_key_id: None,
        snapshot_id: None,
        volume_initialization_rate: None,
    };
    if mappings.is_empty() {
        return match family {
            "Bottlerocket" => vec![dev("/dev/xvda", 4), dev("/dev/xvdb", 20)],
            _ => vec![dev("/dev/xvda", 20)],
        };
    }
    mappings
        .iter()
        .filter_map(|m| {
            let ebs = m.ebs.as_ref()?;
            let gib = ebs
                .volume_size
                .map(|q| (q.as_f64() / (1u64 << 30) as f64).ceil() as i32);
            Some(LaunchVolume {
                device_name: m.device_name.clone().unwrap_or_else(|| "/dev/xvda".into()),
                size_gib: gib,
                volume_type: ebs.volume_type.clone().unwrap_or_else(|| "gp3".into()),
                encrypted: ebs.encrypted.unwrap_or(true),
                delete_on_termination: ebs.delete_on_termination.unwrap_or(true),
                iops: ebs.iops.map(|v| v as i32),
                throughput: ebs.throughput.map(|v| v as i32),
                kms_key_id: ebs.kms_key_id.clone(),
                snapshot_id: ebs.snapshot_id.clone(),
                volume_initialization_rate: ebs.volume_initialization_rate,
            })
        })
        .collect()
}

/// The template's name: `nodesmith/<sha256 of its content, 32 hex>` (pure).
pub fn name(spec: &TemplateSpec) -> String {
    // TemplateSpec has only strings, numbers, bools and maps: serialisation cannot fail.
    let json = serde_json::to_vec(spec).unwrap_or_default();
    format!("nodesmith/{}", &hex::encode(Sha256::digest(&json))[..32])
}

fn tags(m: &BTreeMap<String, String>) -> Vec<Tag> {
    m.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect()
}

/// The SDK request data for a template (pure).
pub fn request_data(spec: &TemplateSpec) -> RequestLaunchTemplateData {
    let md = &spec.metadata;
    let mut data = RequestLaunchTemplateData::builder()
        .image_id(&spec.image_id)
        .user_data(base64::engine::general_purpose::STANDARD.encode(&spec.user_data))
        .monitoring(
            LaunchTemplatesMonitoringRequest::builder()
                .enabled(spec.monitoring)
                .build(),
        )
        .metadata_options(
            LaunchTemplateInstanceMetadataOptionsRequest::builder()
                .http_endpoint(LaunchTemplateInstanceMetadataEndpointState::from(
                    md.http_endpoint.as_str(),
                ))
                .http_protocol_ipv6(LaunchTemplateInstanceMetadataProtocolIpv6::from(
                    md.http_protocol_ipv6.as_str(),
                ))
                .http_put_response_hop_limit(md.http_put_response_hop_limit as i32)
                .http_tokens(LaunchTemplateHttpTokensState::from(md.http_tokens.as_str()))
                .build(),
        );
    // EC2 takes these only on an interface, and refuses security groups both
    // on the template and on an interface: set, the primary interface carries the groups.
    let primary_interface =
        spec.associate_public_ip.is_some() || spec.ip_prefix_count.is_some() || spec.connection_tracking.is_some();
    data = if primary_interface {
        let tracking = spec.connection_tracking.as_ref().map(|c| {
            ConnectionTrackingSpecificationRequest::builder()
                .set_tcp_established_timeout(c.tcp_established_timeout)
                .set_udp_stream_timeout(c.udp_stream_timeout)
                .set_udp_timeout(c.udp_timeout)
                .build()
        });
        data.network_interfaces(
            LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
                .device_index(0)
                .set_associate_public_ip_address(spec.associate_public_ip)
                .set_ipv4_prefix_count(spec.ip_prefix_count)
                .set_connection_tracking_specification(tracking)
                .set_groups(Some(spec.security_groups.clone()))
                .delete_on_termination(true)
                .build(),
        )
    } else {
        data.set_security_group_ids(Some(spec.security_groups.clone()))
    };
    if let Some(nv) = &spec.nested_virtualization {
        data = data.cpu_options(
            LaunchTemplateCpuOptionsRequest::builder()
                .nested_virtualization(NestedVirtualizationSpecification::from(nv.as_str()))
                .build(),
        );
    }
    if let Some(pg) = &spec.placement_group_id {
        data = data.placement(LaunchTemplatePlacementRequest::builder().group_id(pg).build());
    }
    if let Some(r) = &spec.capacity_reservation {
        data = data.capacity_reservation_specification(
            LaunchTemplateCapacityReservationSpecificationRequest::builder()
                .capacity_reservation_target(
                    CapacityReservationTarget::builder()
                        .capacity_reservation_id(&r.id)
                        .build(),
                )
                .build(),
        );
        if r.capacity_block() {
            data = data.instance_market_options(
                LaunchTemplateInstanceMarketOptionsRequest::builder()
                    .market_type(MarketType::CapacityBlock)
                    .build(),
            );
        }
    }
    if let Some(p) = &spec.instance_profile {
        data = data.iam_instance_profile(
            LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                .name(p)
                .build(),
        );
    }
    for b in &spec.block_devices {
        let ebs = LaunchTemplateEbsBlockDeviceRequest::builder()
            .set_volume_size(b.size_gib)
            .volume_type(VolumeType::from(b.volume_type.as_str()))
            .encrypted(b.encrypted)
            .delete_on_termination(b.delete_on_termination)
            .set_iops(b.iops)
            .set_throughput(b.throughput)
            .set_kms_key_id(b.kms_key_id.clone())
            .set_snapshot_id(b.snapshot_id.clone())
            .set_volume_initialization_rate(b.volume_initialization_rate)
            .build();
        data = data.block_device_mappings(
            LaunchTemplateBlockDeviceMappingRequest::builder()
                .device_name(&b.device_name)
                .ebs(ebs)
                .build(),
        );
    }
    for rt in [ResourceType::Volume, ResourceType::NetworkInterface] {
        data = data.tag_specifications(
            LaunchTemplateTagSpecificationRequest::builder()
                .resource_type(rt)
                .set_tags(Some(tags(&spec.tags)))
                .build(),
        );
    }
    data.build()
}

/// Creates the template unless it exists; returns its name.
pub async fn ensure(ec2: &aws_sdk_ec2::Client, spec: &TemplateSpec) -> Result<String, NodeClassError> {
    let name = name(spec);
    let res = ec2
        .create_launch_template()
        .launch_template_name(&name)
        .launch_template_data(request_data(spec))
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::LaunchTemplate)
                .set_tags(Some(tags(&spec.tags)))
                .build(),
        )
        .send()
        .await;
    match res {
        Ok(_) => Ok(name),
        // Same name means same content: a concurrent launch made it first.
        Err(e) if e.code() == Some("InvalidLaunchTemplateName.AlreadyExistsException") => Ok(name),
        Err(e) => Err(NodeClassError::aws("ec2:CreateLaunchTemplate", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ec2nodeclass::BlockDevice as Ebs;
    use crate::quantity::Quantity;

    fn spec() -> TemplateSpec {
        TemplateSpec {
            cluster: "demo".into(),
            image_id: "ami-1".into(),
            user_data: "x".into(),
            security_groups: vec!["sg-1".into()],
            instance_profile: Some("KarpenterNodeRole".into()),
            block_devices: block_devices("AL2023", &[]),
            metadata: MetadataOptions::default(),
            monitoring: false,
            associate_public_ip: None,
            tags: BTreeMap::new(),
            capacity_reservation: None,
            ip_prefix_count: None,
            connection_tracking: None,
            nested_virtualization: None,
            placement_group_id: None,
        }
    }

    #[test]
    fn name_is_stable_and_changes_with_content() {
        let a = name(&spec());
        assert_eq!(a, name(&spec()));
        assert!(a.starts_with("nodesmith/") && a.len() == "nodesmith/".len() + 32);
        assert_ne!(
            a,
            name(&TemplateSpec {
                image_id: "ami-2".into(),
                ..spec()
            })
        );
        assert_ne!(
            a,
            name(&TemplateSpec {
                cluster: "other".into(),
                ..spec()
            })
        );
        assert_ne!(
            a,
            name(&TemplateSpec {
                user_data: "y".into(),
                ..spec()
            })
        );
        assert_ne!(
            a,
            name(&TemplateSpec {
                capacity_reservation: Some(ReservationRef {
                    id: "cr-1".into(),
                    reservation_type: "default".into(),
                }),
                ..spec()
            })
        );
    }

    #[test]
    fn a_reserved_template_targets_its_reservation() {
        let data = |reservation_type: &str| {
            request_data(&TemplateSpec {
                capacity_reservation: Some(ReservationRef {
                    id: "cr-1".into(),
                    reservation_type: reservation_type.into(),
                }),
                ..spec()
            })
        };
        let odcr = data("default");
        let target = odcr
            .capacity_reservation_specification()
            .and_then(|c| c.capacity_reservation_target())
            .and_then(|t| t.capacity_reservation_id());
        assert_eq!(target, Some("cr-1"));
        assert!(odcr.instance_market_options().is_none());
        let block = data("capacity-block");
        assert_eq!(
            block.instance_market_options().and_then(|m| m.market_type()),
            Some(&MarketType::CapacityBlock)
        );
        assert!(request_data(&spec()).capacity_reservation_specification().is_none());
    }

    #[test]
    fn block_devices_default_by_family_and_convert_sizes() {
        assert_eq!(
            block_devices("Bottlerocket", &[])
                .iter()
                .map(|b| b.device_name.as_str())
                .collect::<Vec<_>>(),
            vec!["/dev/xvda", "/dev/xvdb"]
        );
        assert_eq!(block_devices("AL2023", &[])[0].size_gib, Some(20));
        let m = BlockDeviceMapping {
            device_name: Some("/dev/xvda".into()),
            ebs: Some(Ebs {
                volume_size: Some(Quantity::parse("100Gi").unwrap()),
                volume_type: Some("io2".into()),
                iops: Some(3000),
                ..Default::default()
            }),
            root_volume: true,
        };
        let got = block_devices("AL2023", &[m]);
        assert_eq!(
            (got[0].size_gib, got[0].volume_type.as_str(), got[0].iops),
            (Some(100), "io2", Some(3000))
        );
    }

    #[test]
    fn request_data_encodes_user_data_and_sets_imds() {
        let d = request_data(&spec());
        let ud = base64::engine::general_purpose::STANDARD
            .decode(d.user_data().unwrap())
            .unwrap();
        assert_eq!(ud, b"x");
        let md = d.metadata_options().unwrap();
        assert_eq!(md.http_tokens(), Some(&LaunchTemplateHttpTokensState::Required));
        assert_eq!(md.http_put_response_hop_limit(), Some(1));
        assert_eq!(
            d.iam_instance_profile().and_then(|p| p.name()),
            Some("KarpenterNodeRole")
        );
    }

    #[test]
    fn a_public_ip_choice_moves_the_groups_onto_the_primary_interface() {
        let plain = request_data(&spec());
        assert_eq!(plain.security_group_ids(), ["sg-1"]);
        assert!(plain.network_interfaces().is_empty());
        // Unset, the content hash (the template's name) is what it was before the field existed.
        assert!(!serde_json::to_string(&spec()).unwrap().contains("associatePublicIp"));
        for public in [false, true] {
            let data = request_data(&TemplateSpec {
                associate_public_ip: Some(public),
                ..spec()
            });
            assert!(
                data.security_group_ids().is_empty(),
                "EC2 refuses groups in both places"
            );
            let nic = &data.network_interfaces()[0];
            assert_eq!(
                (nic.device_index(), nic.associate_public_ip_address(), nic.groups()),
                (Some(0), Some(public), &["sg-1".to_string()][..])
            );
        }
    }

    #[test]
    fn prefixes_tracking_cpu_and_placement_reach_the_request_and_leave_old_names_alone() {
        // Unset, none of them changes a template's name (its content hash).
        let json = serde_json::to_string(&spec()).unwrap();
        for field in [
            "ipPrefixCount",
            "connectionTracking",
            "nestedVirtualization",
            "placementGroupId",
        ] {
            assert!(!json.contains(field), "{field} in {json}");
        }
        let data = request_data(&TemplateSpec {
            ip_prefix_count: Some(3),
            connection_tracking: Some(ConnectionTracking {
                udp_timeout: Some(30),
                ..Default::default()
            }),
            nested_virtualization: Some("enabled".into()),
            placement_group_id: Some("pg-1".into()),
            ..spec()
        });
        assert!(data.security_group_ids().is_empty());
        let nic = &data.network_interfaces()[0];
        assert_eq!(
            (nic.ipv4_prefix_count(), nic.associate_public_ip_address()),
            (Some(3), None)
        );
        assert_eq!(nic.groups(), ["sg-1"]);
        let ct = nic.connection_tracking_specification().unwrap();
        assert_eq!((ct.udp_timeout(), ct.tcp_established_timeout()), (Some(30), None));
        assert_eq!(
            data.cpu_options().and_then(|c| c.nested_virtualization()),
            Some(&NestedVirtualizationSpecification::Enabled)
        );
        assert_eq!(data.placement().and_then(|p| p.group_id()), Some("pg-1"));
    }
}
