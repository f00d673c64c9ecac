//! AMI resolution: aliases through the public SSM parameters, SSM parameter
//! terms, and id / name / tag terms through DescribeImages; newest wins per
//! architecture.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::Filter;

use super::error::NodeClassError;
use crate::apis::ec2nodeclass::AmiSelectorTerm;
use crate::catalog::Catalog;
use crate::labels;

/// An AMI that may be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ami {
    /// The image id.
    pub id: String,
    /// Kubernetes architecture: amd64 or arm64.
    pub arch: String,
    /// Creation date (ISO 8601; compares as text).
    pub created: String,
}

/// EC2's architecture name for a Kubernetes one.
pub fn ec2_arch(k8s_arch: &str) -> Option<&'static str> {
    match k8s_arch {
        "amd64" => Some("x86_64"),
        "arm64" => Some("arm64"),
        _ => None,
    }
}

/// Kubernetes's architecture name for an EC2 one.
pub fn k8s_arch(ec2_arch: &str) -> Option<&'static str> {
    match ec2_arch {
        "x86_64" => Some("amd64"),
        "arm64" => Some("arm64"),
        _ => None,
    }
}

/// Which AMI an instance type needs: its architecture and whether it has NVIDIA GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AmiKey {
    /// Kubernetes architecture: amd64 or arm64.
    pub arch: String,
    /// NVIDIA GPUs: the accelerated AMI variant.
    pub nvidia: bool,
}

/// The public SSM parameter holding the AMI for an alias (pure).
pub fn alias_parameter(alias: &str, k8s_version: &str, key: &AmiKey) -> Result<String, String> {
    let (family, version) = alias
        .split_once('@')
        .ok_or_else(|| format!("alias {alias:?} is not family@version"))?;
    let a = ec2_arch(&key.arch).ok_or_else(|| format!("no AMI architecture for {:?}", key.arch))?;
    let variant = if key.nvidia { "nvidia" } else { "standard" };
    let br = if key.nvidia { "-nvidia" } else { "" };
    match (family, version) {
        ("al2023", "latest") => Ok(format!(
            "/aws/service/eks/optimized-ami/{k8s_version}/amazon-linux-2023/{a}/{variant}/recommended/image_id"
        )),
        ("al2023", v) => Ok(format!(
            "/aws/service/eks/optimized-ami/{k8s_version}/amazon-linux-2023/{a}/{variant}/amazon-eks-node-al2023-{a}-{variant}-{k8s_version}-{v}/image_id"
        )),
        ("bottlerocket", "latest") => Ok(format!(
            "/aws/service/bottlerocket/aws-k8s-{k8s_version}{br}/{a}/latest/image_id"
        )),
        ("bottlerocket", v) => Ok(format!(
            "/aws/service/bottlerocket/aws-k8s-{k8s_version}{br}/{a}/{}/image_id",
            v.trim_start_matches('v')
        )),
        (f, _) => Err(format!(
            "alias family {f:?} is not supported for launch (al2023, bottlerocket)"
        )),
    }
}

/// DescribeImages filters for one id / name / tags term (pure).
pub fn image_filters(term: &AmiSelectorTerm) -> Vec<Filter> {
    let mut f = Vec::new();
    if let Some(id) = &term.id {
        f.push(Filter::builder().name("image-id").values(id).build());
    }
    if let Some(name) = &term.name {
        f.push(Filter::builder().name("name").values(name).build());
    }
    for (k, v) in &term.tags {
        f.push(tag_filter(k, v));
    }
    f
}

/// A tag filter; `*` as the value means "has the key".
pub fn tag_filter(key: &str, value: &str) -> Filter {
    if value == "*" {
        Filter::builder().name("tag-key").values(key).build()
    } else {
        Filter::builder().name(format!("tag:{key}")).values(value).build()
    }
}

/// The newest AMI per architecture (ties: the higher id, for determinism) (pure).
pub fn newest_per_arch(amis: impl IntoIterator<Item = Ami>) -> BTreeMap<String, Ami> {
    let mut best: BTreeMap<String, Ami> = BTreeMap::new();
    for a in amis {
        let newer = best
            .get(&a.arch)
            .is_none_or(|b| (a.created.as_str(), a.id.as_str()) > (b.created.as_str(), b.id.as_str()));
        if newer {
            best.insert(a.arch.clone(), a);
        }
    }
    best
}

/// AMI id per needed [`AmiKey`]. Aliases pick the variant by key (a variant
/// the alias does not publish, such as arm64 with NVIDIA GPUs, is left out);
/// other terms pick the newest matching image of the key's architecture.
pub async fn resolve(
    ec2: &aws_sdk_ec2::Client,
    ssm: &aws_sdk_ssm::Client,
    terms: &[AmiSelectorTerm],
    k8s_version: &str,
    keys: &BTreeSet<AmiKey>,
) -> Result<BTreeMap<AmiKey, String>, NodeClassError> {
    if let Some(alias) = terms.iter().find_map(|t| t.alias.as_deref()) {
        let mut out = BTreeMap::new();
        for key in keys {
            let name = alias_parameter(alias, k8s_version, key).map_err(NodeClassError::unusable)?;
            if let Some(id) = parameter(ssm, &name).await? {
                out.insert(key.clone(), id);
            }
        }
        return Ok(out);
    }
    let mut found = Vec::new();
    for term in terms {
        let mut ids = Vec::new();
        if let Some(p) = &term.ssm_parameter {
            ids.extend(parameter(ssm, p).await?);
        }
        let filters = image_filters(term);
        if filters.is_empty() && ids.is_empty() {
            continue;
        }
        let mut req = ec2
            .describe_images()
            .set_filters((!filters.is_empty()).then_some(filters))
            .set_image_ids((!ids.is_empty()).then_some(ids));
        if let Some(o) = &term.owner {
            req = req.owners(o);
        }
        let out = req
            .send()
            .await
            .map_err(|e| NodeClassError::aws("ec2:DescribeImages", e))?;
        for img in out.images() {
            let (Some(id), Some(arch)) = (img.image_id(), img.architecture().and_then(|a| k8s_arch(a.as_str()))) else {
                continue;
            };
            found.push(Ami {
                id: id.to_string(),
                arch: arch.to_string(),
                created: img.creation_date().unwrap_or_default().to_string(),
            });
        }
    }
    let newest = newest_per_arch(found);
    Ok(keys
        .iter()
        .filter_map(|k| newest.get(&k.arch).map(|ami| (k.clone(), ami.id.clone())))
        .collect())
}

/// Every AMI key nodesmith launches for: both architectures, with and without NVIDIA GPUs.
pub fn all_keys() -> BTreeSet<AmiKey> {
    ["amd64", "arm64"]
        .into_iter()
        .flat_map(|arch| {
            [false, true].map(|nvidia| AmiKey {
                arch: arch.to_string(),
                nvidia,
            })
        })
        .collect()
}

/// The names of these images, by id (DescribeImages).
pub async fn names(
    ec2: &aws_sdk_ec2::Client,
    ids: &BTreeSet<String>,
) -> Result<BTreeMap<String, String>, NodeClassError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let out = ec2
        .describe_images()
        .set_image_ids(Some(ids.iter().cloned().collect()))
        .send()
        .await
        .map_err(|e| NodeClassError::aws("ec2:DescribeImages", e))?;
    Ok(out
        .images()
        .iter()
        .filter_map(|i| Some((i.image_id()?.to_string(), i.name()?.to_string())))
        .collect())
}

/// The value of an SSM parameter; None when it does not exist.
async fn parameter(ssm: &aws_sdk_ssm::Client, name: &str) -> Result<Option<String>, NodeClassError> {
    let out = match ssm.get_parameter().name(name).send().await {
        Ok(out) => out,
        Err(e) if e.as_service_error().is_some_and(|s| s.is_parameter_not_found()) => return Ok(None),
        Err(e) => return Err(NodeClassError::aws("ssm:GetParameter", e)),
    };
    out.parameter()
        .and_then(|p| p.value())
        .map(|v| Some(v.to_string()))
        .ok_or_else(|| NodeClassError::unusable(format!("SSM parameter {name} has no value")))
}

/// The Kubernetes architecture of an instance type: the catalog's label, else
/// the naming rule (a `g` after the generation digit means Graviton) (pure).
pub fn arch_of(instance_type: &str, catalog: Option<&Catalog>) -> String {
    if let Some(a) = catalog
        .and_then(|c| c.instance_types.iter().find(|i| i.name == instance_type))
        .and_then(|i| i.labels.get(labels::ARCH))
    {
        return a.clone();
    }
    let family = instance_type.split('.').next().unwrap_or_default();
    let after_digit = family
        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
        .trim_start_matches(|c: char| c.is_ascii_digit());
    if after_digit.starts_with('g') {
        "arm64".into()
    } else {
        "amd64".into()
    }
}

/// Whether an instance type has NVIDIA GPUs: the catalog's label, else the
/// naming rule (g and p families, but not the AMD-GPU g4ad) (pure).
pub fn has_nvidia_gpu(instance_type: &str, catalog: Option<&Catalog>) -> bool {
    if let Some(info) = catalog.and_then(|c| c.instance_types.iter().find(|i| i.name == instance_type)) {
        return info
            .labels
            .get(labels::aws::GPU_MANUFACTURER)
            .is_some_and(|m| m == "nvidia");
    }
    let family = instance_type.split('.').next().unwrap_or_default();
    let mut chars = family.chars();
    matches!(chars.next(), Some('g' | 'p'))
        && chars.next().is_some_and(|c| c.is_ascii_digit())
        && !family.starts_with("g4ad")
}

/// The AMI an instance type needs (pure).
pub fn ami_key_of(instance_type: &str, catalog: Option<&Catalog>) -> AmiKey {
    AmiKey {
        arch: arch_of(instance_type, catalog),
        nvidia: has_nvidia_gpu(instance_type, catalog),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    #[test]
    fn alias_parameters_follow_the_public_names() {
        let cases = [
            (
                "al2023@latest",
                "amd64",
                Ok("/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id"),
            ),
            (
                "al2023@latest",
                "amd64+nvidia",
                Ok("/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/nvidia/recommended/image_id"),
            ),
            (
                "bottlerocket@latest",
                "amd64+nvidia",
                Ok("/aws/service/bottlerocket/aws-k8s-1.33-nvidia/x86_64/latest/image_id"),
            ),
            (
                "al2023@latest",
                "arm64",
                Ok("/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/standard/recommended/image_id"),
            ),
            (
                "al2023@v20250101",
                "amd64",
                Ok(
                    "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/amazon-eks-node-al2023-x86_64-standard-1.33-v20250101/image_id",
                ),
            ),
            (
                "bottlerocket@latest",
                "arm64",
                Ok("/aws/service/bottlerocket/aws-k8s-1.33/arm64/latest/image_id"),
            ),
            (
                "bottlerocket@v1.40.0",
                "amd64",
                Ok("/aws/service/bottlerocket/aws-k8s-1.33/x86_64/1.40.0/image_id"),
            ),
            ("al2@latest", "amd64", Err("alias family \"al2\" is not supported")),
            ("al2023", "amd64", Err("is not family@version")),
            ("al2023@latest", "s390x", Err("no AMI architecture for \"s390x\"")),
        ];
        for (alias, arch, want) in cases {
            let key = match arch.strip_suffix("+nvidia") {
                Some(a) => AmiKey {
                    arch: a.into(),
                    nvidia: true,
                },
                None => AmiKey {
                    arch: arch.into(),
                    nvidia: false,
                },
            };
            let got = alias_parameter(alias, "1.33", &key);
            match want {
                Ok(p) => assert_eq!(got.as_deref(), Ok(p), "{alias} {arch}"),
                Err(e) => assert!(got.as_ref().is_err_and(|g| g.contains(e)), "{alias} {arch}: {got:?}"),
            }
        }
    }

    #[test]
    fn newest_wins_per_architecture() {
        let a = |id: &str, arch: &str, created: &str| Ami {
            id: id.into(),
            arch: arch.into(),
            created: created.into(),
        };
        let got = newest_per_arch([
            a("ami-1", "amd64", "2026-01-01T00:00:00.000Z"),
            a("ami-2", "amd64", "2026-03-01T00:00:00.000Z"),
            a("ami-3", "arm64", "2026-02-01T00:00:00.000Z"),
            a("ami-4", "amd64", "2026-02-01T00:00:00.000Z"),
        ]);
        assert_eq!(got["amd64"].id, "ami-2");
        assert_eq!(got["arm64"].id, "ami-3");
    }

    #[test]
    fn filters_from_terms() {
        let t = AmiSelectorTerm {
            name: Some("my-ami-*".into()),
            tags: [
                ("team".to_string(), "*".to_string()),
                ("env".to_string(), "prod".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let got: Vec<(String, Vec<String>)> = image_filters(&t)
            .iter()
            .map(|f| (f.name().unwrap_or_default().to_string(), f.values().to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("name".into(), vec!["my-ami-*".into()]),
                ("tag:env".into(), vec!["prod".into()]),
                ("tag-key".into(), vec!["team".into()]),
            ]
        );
    }

    #[test]
    fn architecture_from_catalog_or_name() {
        for (t, want) in [
            ("m5.large", "amd64"),
            ("m6g.large", "arm64"),
            ("c7gd.xlarge", "arm64"),
            ("g5.xlarge", "amd64"),
            ("t4g.micro", "arm64"),
            ("m7i.large", "amd64"),
        ] {
            assert_eq!(arch_of(t, None), want, "{t}");
        }
    }

    #[test]
    fn nvidia_gpus_from_catalog_or_name() {
        for (t, want) in [
            ("g5.xlarge", true),
            ("p4d.24xlarge", true),
            ("g5g.xlarge", true),
            ("g4ad.xlarge", false),
            ("m5.large", false),
            ("c7gd.large", false),
        ] {
            assert_eq!(has_nvidia_gpu(t, None), want, "{t}");
        }
        let info = crate::catalog::InstanceTypeInfo {
            name: "x1.large".into(),
            labels: BTreeMap::from([
                (labels::aws::GPU_MANUFACTURER.to_string(), "nvidia".to_string()),
                (labels::ARCH.to_string(), "arm64".to_string()),
            ]),
            capacity: Resources::new(),
            allocatable: None,
            vcpus: 2,
            eni_max_pods: 29,
            offerings: vec![],
        };
        let catalog = Catalog {
            region: "r".into(),
            instance_types: vec![info],
        };
        assert_eq!(
            ami_key_of("x1.large", Some(&catalog)),
            AmiKey {
                arch: "arm64".into(),
                nvidia: true
            }
        );
        assert_eq!(
            ami_key_of("g5.xlarge", Some(&catalog)),
            AmiKey {
                arch: "amd64".into(),
                nvidia: true
            },
            "unknown to the catalog: the name decides"
        );
        assert_eq!(
            ami_key_of("g5g.xlarge", None),
            AmiKey {
                arch: "arm64".into(),
                nvidia: true
            }
        );
    }
}
