//! Golden tests: `nodesmith simulate` on the four bundled examples with the
//! built-in catalog. Each plan is checked against its meaning (what the
//! example is about) and against the committed golden JSON, so any change in
//! the plan is visible in review. Regenerate goldens with
//! `NODESMITH_BLESS=1 cargo test -p nodesmith --test simulate_examples`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn simulate(example: &str) -> Value {
    let path = root().join("../examples").join(example);
    let out = Command::new(env!("CARGO_BIN_EXE_nodesmith"))
        .args(["simulate", "--output", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Wall time is the only non-deterministic field.
    v["stats"].as_object_mut().unwrap().remove("solveMillis");
    v
}

fn golden(name: &str, v: &Value) {
    let path = root().join("tests/golden").join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(v).unwrap() + "\n";
    if std::env::var_os("NODESMITH_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with NODESMITH_BLESS=1)", path.display()));
    assert_eq!(text, want, "plan for {name} changed; review and bless");
}

/// Checks what holds for every plan: each pod once, labels, prices.
fn common(v: &Value, pending: usize) {
    let mut pods: Vec<String> = Vec::new();
    let mut total = 0.0;
    for c in v["nodeClaims"].as_array().unwrap() {
        pods.extend(
            c["pods"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_string()),
        );
        total += c["pricePerHour"].as_f64().unwrap();
        assert_eq!(c["instanceTypeOptions"][0], c["instanceType"]);
        assert_eq!(c["labels"]["kubernetes.io/hostname"], c["name"]);
        assert_eq!(c["labels"]["node.kubernetes.io/instance-type"], c["instanceType"]);
        assert_eq!(c["labels"]["topology.kubernetes.io/zone"], c["zone"]);
        assert_eq!(c["labels"]["karpenter.sh/capacity-type"], c["capacityType"]);
        assert_eq!(c["labels"]["karpenter.sh/nodepool"], c["nodePool"]);
        assert_eq!(c["labels"]["topology.kubernetes.io/region"], "us-east-1");
        for k in ["kubernetes.io/arch", "kubernetes.io/os"] {
            assert!(c["labels"][k].is_string(), "{k} missing");
        }
    }
    for e in v["existingNodes"].as_array().unwrap() {
        pods.extend(
            e["pods"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_string()),
        );
    }
    pods.extend(
        v["unschedulable"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["pod"].as_str().unwrap().to_string()),
    );
    let unique: BTreeSet<&String> = pods.iter().collect();
    assert_eq!(pods.len(), pending, "{pods:?}");
    assert_eq!(unique.len(), pending, "a pod appears twice");
    assert_eq!(v["stats"]["pendingPods"], pending);
    assert!((v["totalPricePerHour"].as_f64().unwrap() - total).abs() < 1e-6);
}

fn claims_with<'a>(v: &'a Value, prefix: &str) -> Vec<&'a Value> {
    v["nodeClaims"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["pods"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p.as_str().unwrap().starts_with(prefix))
        })
        .collect()
}

#[test]
fn example_01_inflate() {
    let v = simulate("01-inflate.yaml");
    common(&v, 100);
    assert!(v["unschedulable"].as_array().unwrap().is_empty());
    for c in v["nodeClaims"].as_array().unwrap() {
        assert_eq!(c["capacityType"], "spot", "spot is allowed and cheaper");
    }
    golden("01-inflate", &v);
}

#[test]
fn example_02_spread_across_zones() {
    let v = simulate("02-spread-across-zones.yaml");
    common(&v, 6);
    assert!(v["unschedulable"].as_array().unwrap().is_empty());
    for app in ["default/spread-across-az-1-", "default/spread-across-az-2-"] {
        let mut zones = Vec::new();
        for c in v["nodeClaims"].as_array().unwrap() {
            let n = c["pods"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p.as_str().unwrap().starts_with(app))
                .count();
            zones.extend(std::iter::repeat_n(c["zone"].as_str().unwrap().to_string(), n));
        }
        let distinct: BTreeSet<&String> = zones.iter().collect();
        assert_eq!((zones.len(), distinct.len()), (3, 3), "{app}: one per zone: {zones:?}");
    }
    for c in v["nodeClaims"].as_array().unwrap() {
        assert_eq!(c["capacityType"], "on-demand");
    }
    golden("02-spread-across-zones", &v);
}

#[test]
fn example_03_guard_rails_and_gpu() {
    let v = simulate("03-guard-rails-and-gpu.yaml");
    common(&v, 8);
    assert!(v["unschedulable"].as_array().unwrap().is_empty());
    for c in claims_with(&v, "default/trainer-") {
        assert_eq!(c["nodePool"], "specialist-compute");
        assert!(
            ["p3.8xlarge", "p3.16xlarge", "g5.xlarge", "g5.2xlarge"].contains(&c["instanceType"].as_str().unwrap())
        );
        assert_eq!(c["taints"][0]["key"], "nvidia.com/gpu");
    }
    for c in claims_with(&v, "default/web-") {
        assert_eq!(c["nodePool"], "default");
        assert!(c["taints"].as_array().unwrap().is_empty());
        let family = c["labels"]["karpenter.k8s.aws/instance-family"].as_str().unwrap();
        assert!(["m5", "r5", "c5"].contains(&family), "{family}");
        for o in c["instanceTypeOptions"].as_array().unwrap() {
            let o = o.as_str().unwrap();
            assert!(
                o.starts_with("m5.") || o.starts_with("r5.") || o.starts_with("c5."),
                "{o}"
            );
        }
    }
    golden("03-guard-rails-and-gpu", &v);
}

#[test]
fn example_04_pinned_instance() {
    let v = simulate("04-pinned-instance.yaml");
    common(&v, 3);
    let claims = v["nodeClaims"].as_array().unwrap();
    assert_eq!(claims.len(), 1, "three 1-cpu pods fit one t4g.2xlarge");
    let c = &claims[0];
    assert_eq!(c["instanceType"], "t4g.2xlarge");
    assert_eq!(c["instanceTypeOptions"], serde_json::json!(["t4g.2xlarge"]));
    assert_eq!(c["capacityType"], "on-demand");
    assert_eq!(c["zone"], "us-east-1a");
    assert_eq!(c["labels"]["kubernetes.io/arch"], "arm64");
    golden("04-pinned-instance", &v);
}

#[test]
fn output_is_deterministic() {
    assert_eq!(
        simulate("02-spread-across-zones.yaml"),
        simulate("02-spread-across-zones.yaml")
    );
}
