//! The launch path's and the state writes' pure parts: user data rendering,
//! override building for a wide NodeClaim, and NodeClaim item encoding.

use std::collections::{BTreeMap, BTreeSet};

use criterion::{Criterion, black_box, criterion_main};
use nodesmith::apis::{KubeletConfiguration, Taint, TaintEffect};
use nodesmith::launch::fleet::{self, Scope};
use nodesmith::nodeclaim::NodeClaim;
use nodesmith::nodeclass::subnet::Subnet;
use nodesmith::nodeclass::userdata::{self, ClusterInfo, NodeSettings};
use nodesmith::state::{self, OfferingKey};

fn cluster() -> ClusterInfo {
    ClusterInfo {
        name: "demo".into(),
        endpoint: "https://ABCDEF.gr7.us-east-1.eks.amazonaws.com".into(),
        certificate_authority: "Q".repeat(1400),
        service_cidr: "172.20.0.0/16".into(),
        version: "1.33".into(),
    }
}

fn settings() -> NodeSettings {
    NodeSettings {
        labels: (0..10)
            .map(|i| (format!("example.com/label-{i}"), format!("value-{i}")))
            .collect(),
        taints: vec![Taint::new("dedicated", Some("web"), TaintEffect::NoSchedule)],
        kubelet: Some(KubeletConfiguration {
            max_pods: Some(110),
            ..Default::default()
        }),
        user_data: Some("#!/bin/bash\necho hello\n".into()),
        instance_store_raid0: false,
    }
}

fn claim(i: usize, types: &[String]) -> NodeClaim {
    NodeClaim {
        instance_type_options: types.to_vec(),
        ..NodeClaim::pending(format!("default-{i:05}"), "default", "default")
    }
}

fn bench(c: &mut Criterion) {
    let (cl, ns) = (cluster(), settings());
    c.bench_function("userdata/al2023", |b| {
        b.iter(|| userdata::al2023(black_box(&cl), black_box(&ns)))
    });
    c.bench_function("userdata/bottlerocket", |b| {
        let ns = NodeSettings {
            user_data: Some("[settings.host-containers.admin]\nenabled = true\n".into()),
            ..settings()
        };
        b.iter(|| userdata::bottlerocket(black_box(&cl), black_box(&ns)))
    });

    let types: Vec<String> = (0..60).map(|i| format!("m{}.{}xlarge", 5 + i % 3, i)).collect();
    let subnets: BTreeMap<String, Subnet> = ["us-east-1a", "us-east-1b", "us-east-1c"]
        .iter()
        .map(|z| {
            (
                z.to_string(),
                Subnet {
                    id: format!("subnet-{z}"),
                    zone: z.to_string(),
                    available_ips: 200,
                    zone_id: None,
                },
            )
        })
        .collect();
    let templates: BTreeMap<(String, String), String> = types
        .iter()
        .flat_map(|t| ["spot", "on-demand"].map(|ct| ((t.clone(), ct.to_string()), format!("nodesmith/{ct}"))))
        .collect();
    let cts = vec!["spot".to_string(), "on-demand".to_string()];
    let unavailable: BTreeSet<OfferingKey> = types
        .iter()
        .take(20)
        .map(|t| OfferingKey::new(t, "us-east-1a", "spot"))
        .collect();
    c.bench_function("fleet/candidates+plan 60 types x 3 zones x 2", |b| {
        b.iter(|| {
            let scope = Scope {
                instance_types: &types,
                zones: None,
                capacity_types: &cts,
                subnets: &subnets,
                templates: &templates,
                catalog: None,
            };
            let cands = fleet::candidates(&scope, black_box(&unavailable));
            let ct = fleet::capacity_type(&cands).unwrap_or("on-demand");
            fleet::plan("token".to_string(), &cands, ct)
        })
    });

    let claims: Vec<NodeClaim> = (0..100).map(|i| claim(i, &types)).collect();
    c.bench_function("state/encode 100 nodeclaim items", |b| {
        b.iter(|| {
            claims
                .iter()
                .map(|c| state::node_claim_item(black_box(c), 1).map(|i| i.len()).unwrap_or(0))
                .sum::<usize>()
        })
    });
    let items: Vec<_> = claims
        .iter()
        .filter_map(|c| state::node_claim_item(c, 1).ok())
        .collect();
    c.bench_function("state/decode 100 nodeclaim items", |b| {
        b.iter(|| {
            items
                .iter()
                .filter(|i| state::node_claim_from_item(black_box(i)).is_ok())
                .count()
        })
    });
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
