//! The catalog built from EC2's API (moto, real SDK) agrees with the built-in
//! snapshot: same types, labels, capacity and allocatable; seeded spot prices
//! come through as spot offerings.

use std::collections::BTreeSet;

use nodesmith::catalog::{self, Catalog, InstanceTypeInfo, ec2};
use nodesmith_tests::moto::moto;

const SAMPLE: &[&str] = &[
    "m5.large",
    "c5.4xlarge",
    "t4g.2xlarge",
    "g5.xlarge",
    "c6g.medium",
    "inf2.xlarge",
    "trn1.32xlarge",
    "p4d.24xlarge",
    "m5.metal",
    "c6gn.16xlarge",
    "u-6tb1.112xlarge",
];

fn find<'a>(c: &'a Catalog, name: &str) -> &'a InstanceTypeInfo {
    c.instance_types
        .iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("{name} missing"))
}

async fn moto_catalog(m: &nodesmith_tests::moto::Moto) -> Catalog {
    let client = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    ec2::catalog(&client, "us-east-1", &ec2::PriceTable::bundled().unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn ec2_catalog_matches_the_builtin_snapshot() {
    let m = moto().await;
    let live = moto_catalog(&m).await;
    let builtin = catalog::builtin().unwrap();
    assert_eq!(live.region, "us-east-1");

    // Same types, except the hand-written supplement moto has no data for.
    let live_names: BTreeSet<&str> = live.instance_types.iter().map(|i| i.name.as_str()).collect();
    let builtin_names: BTreeSet<&str> = builtin.instance_types.iter().map(|i| i.name.as_str()).collect();
    let only_builtin: Vec<&str> = builtin_names.difference(&live_names).copied().collect();
    assert_eq!(only_builtin, ["p3.16xlarge", "p3.2xlarge", "p3.8xlarge"]);
    assert!(live_names.is_subset(&builtin_names));
    assert!(live.instance_types.len() >= 1000);

    // Same labels, capacity and ENI limits for every shared type.
    for l in &live.instance_types {
        let b = find(builtin, &l.name);
        assert_eq!(l.labels, b.labels, "{}", l.name);
        assert_eq!(l.capacity, b.capacity, "{}", l.name);
        assert_eq!((l.vcpus, l.eni_max_pods), (b.vcpus, b.eni_max_pods), "{}", l.name);
        let od = |i: &InstanceTypeInfo| {
            i.offerings
                .iter()
                .filter(|o| o.capacity_type == "on-demand")
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(od(l), od(b), "{}", l.name);
    }

    // Same allocatable for the sample, by the shared formulas.
    let (lr, br) = (live.resolve(None), builtin.resolve(None));
    for name in SAMPLE {
        let l = lr
            .iter()
            .find(|t| t.name == *name)
            .unwrap_or_else(|| panic!("{name} missing from EC2 catalog"));
        let b = br.iter().find(|t| t.name == *name).unwrap();
        assert_eq!(l.allocatable, b.allocatable, "{name}");
        assert_eq!(l.labels, b.labels, "{name}");
    }

    // Spot prices are not invented: moto has none until seeded.
    assert!(
        live.instance_types
            .iter()
            .all(|i| i.offerings.iter().all(|o| o.capacity_type == "on-demand"))
    );
}

#[tokio::test]
async fn sample_labels_are_karpenters() {
    let m = moto().await;
    let live = moto_catalog(&m).await;
    let l = |name: &str, key: &str| {
        find(&live, name)
            .labels
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("{name} has no {key}"))
    };
    use nodesmith::labels::{self as k, aws};
    let table: &[(&str, &str, &str)] = &[
        ("m5.large", aws::FAMILY, "m5"),
        ("m5.large", aws::CPU_MANUFACTURER, "intel"),
        ("m5.large", aws::MEMORY, "8192"),
        ("m5.large", aws::NETWORK_BANDWIDTH, "750"),
        ("m5.large", aws::EBS_BANDWIDTH, "4750"),
        ("m5.large", aws::HYPERVISOR, "nitro"),
        ("c6g.medium", k::ARCH, "arm64"),
        ("c6g.medium", aws::CPU_MANUFACTURER, "aws"),
        ("g5.xlarge", aws::GPU_NAME, "a10g"),
        ("g5.xlarge", aws::GPU_MANUFACTURER, "nvidia"),
        ("g5.xlarge", aws::GPU_COUNT, "1"),
        ("g5.xlarge", aws::LOCAL_NVME, "250"),
        ("inf2.xlarge", aws::ACCELERATOR_NAME, "inferentia2"),
        ("inf2.xlarge", aws::ACCELERATOR_MANUFACTURER, "aws"),
        ("trn1.32xlarge", aws::ACCELERATOR_COUNT, "16"),
        ("p4d.24xlarge", aws::NETWORK_BANDWIDTH, "400000"),
        ("m5.metal", aws::HYPERVISOR, ""),
        ("u-6tb1.112xlarge", aws::CATEGORY, "u"),
        ("u-6tb1.112xlarge", aws::GENERATION, "1"),
    ];
    for (name, key, want) in table {
        assert_eq!(l(name, key), *want, "{name} {key}");
    }
    let inf2 = find(&live, "inf2.xlarge");
    assert_eq!(inf2.capacity.get("aws.amazon.com/neuron").to_string(), "1");
    assert_eq!(inf2.capacity.get("aws.amazon.com/neuroncore").to_string(), "2");
    assert_eq!(
        find(&live, "p4d.24xlarge")
            .capacity
            .get("vpc.amazonaws.com/efa")
            .to_string(),
        "4"
    );
}

#[tokio::test]
async fn seeded_spot_prices_become_spot_offerings() {
    let m = moto().await;
    m.seed_spot_prices(&[
        ("m5.large", "us-east-1a", 0.0312),
        ("m5.large", "us-east-1c", 0.0333),
        ("c6g.medium", "us-east-1b", 0.0101),
    ]);
    let live = moto_catalog(&m).await;
    let spot = |name: &str| {
        find(&live, name)
            .offerings
            .iter()
            .filter(|o| o.capacity_type == "spot")
            .map(|o| (o.zone.clone(), o.price))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        spot("m5.large"),
        [("us-east-1a".to_string(), 0.0312), ("us-east-1c".to_string(), 0.0333)]
    );
    assert_eq!(spot("c6g.medium"), [("us-east-1b".to_string(), 0.0101)]);
    assert!(spot("c5.4xlarge").is_empty());
    // The solver's choice follows: spot in the cheapest zone.
    let types = live.resolve(None);
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    let best = m5
        .cheapest_offering(&nodesmith::requirements::Requirements::default())
        .unwrap();
    assert_eq!(
        (best.zone.as_str(), best.capacity_type.as_str(), best.price),
        ("us-east-1a", "spot", 0.0312)
    );
}
