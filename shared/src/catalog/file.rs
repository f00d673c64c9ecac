//! The catalog file format of `nodesmith simulate --catalog` (see
//! docs/simulate-format.md): a region and instance types with capacity,
//! optional allocatable and labels, and priced offerings.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::labels;
use crate::quantity::Quantity;
use crate::resources::{self, Resources};

use super::facts::name_labels;
use super::{Catalog, CatalogError, InstanceTypeInfo, Offering};

/// Pods when a type's capacity does not say (the kubelet's default maxPods).
pub const DEFAULT_PODS: i64 = 110;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileCatalog {
    region: String,
    instance_types: Vec<FileType>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileType {
    name: String,
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    operating_systems: Option<Vec<String>>,
    capacity: Resources,
    #[serde(default)]
    allocatable: Option<Resources>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    offerings: Vec<Offering>,
}

/// Parses a catalog file. Errors name the field, e.g.
/// `instanceTypes[3].capacity.cpu: invalid quantity "x": ...`.
///
/// Defaults: `architecture` amd64 (or the `kubernetes.io/arch` label),
/// `operatingSystems` `[linux]`, `capacity.pods` 110, `available` true;
/// allocatable is computed from capacity with the EKS rules when absent, and
/// resources it leaves out are taken from capacity; labels are derived from
/// the name (family, size, category, generation), the architecture, the OS
/// and the capacity (cpu, GPUs), and given labels override derived ones.
pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let file: FileCatalog = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { "catalog".to_string() } else { path };
        CatalogError::Field {
            path,
            message: e.inner().to_string(),
        }
    })?;
    if file.region.trim().is_empty() {
        return Err(field("region", "must not be empty"));
    }
    let mut seen = BTreeSet::new();
    let mut instance_types = Vec::with_capacity(file.instance_types.len());
    for (i, t) in file.instance_types.into_iter().enumerate() {
        let at = format!("instanceTypes[{i}]");
        if !seen.insert(t.name.clone()) {
            return Err(field(
                &format!("{at}.name"),
                &format!("duplicate instance type {:?}", t.name),
            ));
        }
        instance_types.push(instance_type(&at, t)?);
    }
    instance_types.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Catalog {
        region: file.region,
        instance_types,
    })
}

fn field(path: &str, message: &str) -> CatalogError {
    CatalogError::Field {
        path: path.to_string(),
        message: message.to_string(),
    }
}

fn instance_type(at: &str, t: FileType) -> Result<InstanceTypeInfo, CatalogError> {
    if t.name.is_empty() || !labels::is_label_value(&t.name) {
        return Err(field(
            &format!("{at}.name"),
            &format!("{:?} is not a valid instance type name", t.name),
        ));
    }
    let given = t.labels.unwrap_or_default();
    for (k, v) in &given {
        labels::validate_key(k).map_err(|e| field(&format!("{at}.labels"), &e.to_string()))?;
        if !labels::is_label_value(v) {
            return Err(field(
                &format!("{at}.labels.{k}"),
                &format!("invalid label value {v:?}"),
            ));
        }
    }
    let arch = match (&t.architecture, given.get(labels::ARCH)) {
        (Some(a), _) => a.clone(),
        (None, Some(a)) => a.clone(),
        (None, None) => "amd64".to_string(),
    };
    if arch.is_empty() || !labels::is_label_value(&arch) {
        return Err(field(
            &format!("{at}.architecture"),
            &format!("invalid architecture {arch:?}"),
        ));
    }
    let oss = t.operating_systems.unwrap_or_else(|| vec!["linux".to_string()]);
    if oss.is_empty() {
        return Err(field(
            &format!("{at}.operatingSystems"),
            "must list at least one operating system",
        ));
    }
    for (j, os) in oss.iter().enumerate() {
        if os.is_empty() || !labels::is_label_value(os) {
            return Err(field(
                &format!("{at}.operatingSystems[{j}]"),
                &format!("invalid operating system {os:?}"),
            ));
        }
    }
    let os = if oss.iter().any(|o| o == "linux") {
        "linux"
    } else {
        oss[0].as_str()
    };

    let mut capacity = t.capacity;
    for (name, q) in &capacity.0 {
        if *q < Quantity::ZERO {
            return Err(field(
                &format!("{at}.capacity.{name}"),
                &format!("must not be negative, got {q}"),
            ));
        }
    }
    for required in [resources::CPU, resources::MEMORY] {
        if capacity.get(required) <= Quantity::ZERO {
            return Err(field(
                &format!("{at}.capacity.{required}"),
                "is required and must be positive",
            ));
        }
    }
    if !capacity.0.contains_key(resources::PODS) {
        capacity.set(resources::PODS, Quantity::from_units(DEFAULT_PODS));
    }
    let pods = capacity.get(resources::PODS);
    if pods.milli() % 1000 != 0 || pods <= Quantity::ZERO {
        return Err(field(
            &format!("{at}.capacity.pods"),
            &format!("must be a positive whole number, got {pods}"),
        ));
    }
    let allocatable = match t.allocatable {
        None => None,
        Some(mut a) => {
            for (name, q) in &a.0 {
                if *q < Quantity::ZERO {
                    return Err(field(
                        &format!("{at}.allocatable.{name}"),
                        &format!("must not be negative, got {q}"),
                    ));
                }
            }
            for (name, q) in &capacity.0 {
                a.0.entry(name.clone()).or_insert(*q);
            }
            Some(a)
        }
    };

    for (j, o) in t.offerings.iter().enumerate() {
        let oat = format!("{at}.offerings[{j}]");
        if o.zone.is_empty() || !labels::is_label_value(&o.zone) {
            return Err(field(&format!("{oat}.zone"), &format!("invalid zone {:?}", o.zone)));
        }
        if ![
            labels::CAPACITY_SPOT,
            labels::CAPACITY_ON_DEMAND,
            labels::CAPACITY_RESERVED,
        ]
        .contains(&o.capacity_type.as_str())
        {
            return Err(field(
                &format!("{oat}.capacityType"),
                &format!("{:?} is not one of spot, on-demand, reserved", o.capacity_type),
            ));
        }
        if !o.price.is_finite() || o.price < 0.0 {
            return Err(field(
                &format!("{oat}.price"),
                &format!("must be a non-negative number, got {}", o.price),
            ));
        }
    }

    let vcpus = capacity.get(resources::CPU).units_ceil();
    let mut l = name_labels(&t.name);
    l.insert(labels::INSTANCE_TYPE.to_string(), t.name.clone());
    l.insert(labels::ARCH.to_string(), arch);
    l.insert(labels::OS.to_string(), os.to_string());
    l.insert(labels::aws::CPU.to_string(), vcpus.to_string());
    for (resource, manufacturer) in [(resources::NVIDIA_GPU, "nvidia"), (resources::AMD_GPU, "amd")] {
        let n = capacity.get(resource);
        if n > Quantity::ZERO {
            l.insert(labels::aws::GPU_COUNT.to_string(), n.units_ceil().to_string());
            l.insert(labels::aws::GPU_MANUFACTURER.to_string(), manufacturer.to_string());
        }
    }
    l.extend(given);

    Ok(InstanceTypeInfo {
        name: t.name,
        labels: l,
        eni_max_pods: pods.units_ceil(),
        vcpus,
        capacity,
        allocatable,
        offerings: t.offerings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
      "region": "test-region",
      "instanceTypes": [
        {
          "name": "m5.large",
          "architecture": "amd64",
          "operatingSystems": ["linux"],
          "capacity": {"cpu": "2", "memory": "8Gi", "pods": "29", "ephemeral-storage": "20Gi"},
          "allocatable": {"cpu": "1930m", "memory": "6903Mi", "pods": "29"},
          "labels": {"karpenter.k8s.aws/instance-family": "m5"},
          "offerings": [
            {"zone": "test-zone-a", "capacityType": "on-demand", "price": 0.096, "available": true},
            {"zone": "test-zone-a", "capacityType": "spot", "price": 0.035}
          ]
        },
        {
          "name": "c6g.xlarge",
          "architecture": "arm64",
          "capacity": {"cpu": 4, "memory": "7577Mi", "pods": 58},
          "offerings": [{"zone": "test-zone-b", "capacityType": "spot", "price": 0.05, "available": false}]
        },
        {
          "name": "gpu.box",
          "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
          "labels": {"karpenter.k8s.aws/instance-family": "special", "example.com/team": "ml"},
          "offerings": []
        }
      ]
    }"#;

    fn get<'a>(c: &'a Catalog, name: &str) -> &'a InstanceTypeInfo {
        c.instance_types.iter().find(|i| i.name == name).unwrap()
    }

    #[test]
    fn parses_the_documented_example_and_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.region, "test-region");
        assert_eq!(
            c.instance_types.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["c6g.xlarge", "gpu.box", "m5.large"]
        );

        let m5 = get(&c, "m5.large");
        let a = m5.allocatable.as_ref().unwrap();
        assert_eq!(a.get("cpu"), Quantity::from_milli(1930));
        assert_eq!(a.get("memory"), Quantity::from_mib(6903));
        // Left out of allocatable: taken from capacity.
        assert_eq!(a.get("ephemeral-storage"), Quantity::from_units(20 << 30));
        assert_eq!(m5.offerings.len(), 2);
        assert!(m5.offerings[1].available, "available defaults to true");
        assert_eq!(m5.labels[labels::aws::CATEGORY], "m");
        assert_eq!(m5.labels[labels::aws::GENERATION], "5");
        assert_eq!(m5.labels[labels::aws::SIZE], "large");
        assert_eq!(m5.labels[labels::OS], "linux");
        assert_eq!((m5.vcpus, m5.eni_max_pods), (2, 29));

        let c6g = get(&c, "c6g.xlarge");
        assert_eq!(c6g.labels[labels::ARCH], "arm64");
        assert_eq!(c6g.labels[labels::aws::FAMILY], "c6g");
        assert_eq!(c6g.labels[labels::aws::CPU], "4");
        assert!(!c6g.offerings[0].available);
        assert!(c6g.allocatable.is_none());

        let gpu = get(&c, "gpu.box");
        assert_eq!(
            gpu.labels[labels::aws::FAMILY],
            "special",
            "given labels override derived ones"
        );
        assert_eq!(gpu.labels["example.com/team"], "ml");
        assert_eq!(gpu.labels[labels::aws::GPU_COUNT], "2");
        assert_eq!(gpu.labels[labels::ARCH], "amd64");
        assert_eq!(gpu.eni_max_pods, DEFAULT_PODS);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn arbitrary_fields_give_field_errors_or_a_catalog(name in "\\PC{0,20}", cpu in "\\PC{0,8}", zone in "\\PC{0,8}", price in proptest::num::f64::ANY) {
            let doc = serde_json::json!({"region": "r", "instanceTypes": [{"name": name, "capacity": {"cpu": cpu, "memory": "1Gi"}, "offerings": [{"zone": zone, "capacityType": "spot", "price": price}]}]});
            match parse(&doc.to_string()) {
                Ok(c) => {
                    let t = &c.instance_types[0];
                    proptest::prop_assert!(t.labels.iter().all(|(k, v)| labels::validate_key(k).is_ok() && labels::is_label_value(v)));
                    proptest::prop_assert!(t.vcpus > 0);
                }
                Err(CatalogError::Field { path, .. }) => proptest::prop_assert!(path.starts_with("instanceTypes[0]"), "{path}"),
                Err(e) => proptest::prop_assert!(false, "unexpected error kind {e:?}"),
            }
        }
    }

    #[test]
    fn computes_allocatable_when_absent() {
        let c = parse(r#"{"region":"r","instanceTypes":[{"name":"m5.large","architecture":"amd64","capacity":{"cpu":"2","memory":"7577Mi","pods":"29"},"offerings":[{"zone":"z","capacityType":"spot","price":0.03}]}]}"#).unwrap();
        let t = &c.resolve(None)[0];
        assert_eq!(t.allocatable.get("cpu"), Quantity::from_milli(1930));
        assert_eq!(t.allocatable.get("memory"), Quantity::from_mib(6903));
        assert_eq!(t.allocatable.get("pods"), Quantity::from_units(29));
    }

    #[test]
    fn bad_files_name_the_field() {
        let ty = |body: &str| {
            format!(
                r#"{{"region":"r","instanceTypes":[{{"name":"ok.large","capacity":{{"cpu":"1","memory":"1Gi"}}}},{body}]}}"#
            )
        };
        let table: Vec<(String, &str, &str)> = vec![
            ("not json".into(), "catalog", "expected"),
            (r#"{"instanceTypes":[]}"#.into(), "catalog", "missing field `region`"),
            (
                r#"{"region":"","instanceTypes":[]}"#.into(),
                "region",
                "must not be empty",
            ),
            (
                r#"{"region":"r","instanceTypes":{}}"#.into(),
                "instanceTypes",
                "expected a sequence",
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"cpu":"x","memory":"1Gi"}}"#),
                "instanceTypes[1].capacity.cpu",
                r#"invalid quantity "x""#,
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"memory":"1Gi"}}"#),
                "instanceTypes[1].capacity.cpu",
                "is required",
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"cpu":"1"}}"#),
                "instanceTypes[1].capacity.memory",
                "is required",
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"-1Gi"}}"#),
                "instanceTypes[1].capacity.memory",
                "negative",
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi","pods":"2.5"}}"#),
                "instanceTypes[1].capacity.pods",
                "whole number",
            ),
            (
                ty(r#"{"capacity":{"cpu":"1","memory":"1Gi"}}"#),
                "instanceTypes[1]",
                "missing field `name`",
            ),
            (
                ty(r#"{"name":"ok.large","capacity":{"cpu":"1","memory":"1Gi"}}"#),
                "instanceTypes[1].name",
                "duplicate",
            ),
            (
                ty(r#"{"name":"bad name","capacity":{"cpu":"1","memory":"1Gi"}}"#),
                "instanceTypes[1].name",
                "not a valid",
            ),
            (
                ty(r#"{"name":"m5.large","architecture":"x 86","capacity":{"cpu":"1","memory":"1Gi"}}"#),
                "instanceTypes[1].architecture",
                "invalid",
            ),
            (
                ty(r#"{"name":"m5.large","operatingSystems":[],"capacity":{"cpu":"1","memory":"1Gi"}}"#),
                "instanceTypes[1].operatingSystems",
                "at least one",
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"allocatable":{"cpu":"1q"}}"#),
                "instanceTypes[1].allocatable.cpu",
                "invalid quantity",
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"labels":{"Bad Key/x":"v"}}"#),
                "instanceTypes[1].labels",
                "invalid",
            ),
            (
                ty(r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"labels":{"team":"a b"}}"#),
                "instanceTypes[1].labels.team",
                "invalid label value",
            ),
            (
                ty(
                    r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"offerings":[{"zone":"z","capacityType":"cheap","price":1}]}"#,
                ),
                "instanceTypes[1].offerings[0].capacityType",
                "not one of",
            ),
            (
                ty(
                    r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"offerings":[{"zone":"z","capacityType":"spot","price":-1}]}"#,
                ),
                "instanceTypes[1].offerings[0].price",
                "non-negative",
            ),
            (
                ty(
                    r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"offerings":[{"zone":"z","capacityType":"spot","price":"1"}]}"#,
                ),
                "instanceTypes[1].offerings[0].price",
                "expected f64",
            ),
            (
                ty(
                    r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"offerings":[{"zone":"","capacityType":"spot","price":1}]}"#,
                ),
                "instanceTypes[1].offerings[0].zone",
                "invalid zone",
            ),
            (
                ty(
                    r#"{"name":"m5.large","capacity":{"cpu":"1","memory":"1Gi"},"offerings":[{"capacityType":"spot","price":1}]}"#,
                ),
                "instanceTypes[1].offerings[0]",
                "missing field `zone`",
            ),
        ];
        for (text, path, msg) in table {
            let e = parse(&text).expect_err(&text);
            let CatalogError::Field { path: got, message } = &e else {
                panic!("{e:?}")
            };
            assert_eq!(got, path, "{text}: {e}");
            assert!(message.contains(msg), "{text}: {e}");
        }
    }
}
