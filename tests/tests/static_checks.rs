//! Static checks: the SAM template, the Kubernetes manifests and the RBAC
//! the code's calls need.

mod k8s_manifests;
mod kube_rbac;
mod layering;
mod template;
mod template_ops;

/// `scripts/lanes.py` names the executables it starts lanes with, splits
/// into shards and weighs; each must be a test target of the tests crate, so
/// a rename cannot quietly send the crash suite or the local cloud to the
/// back of the queue or leave the stack executable whole.
#[test]
fn the_test_lanes_name_real_test_targets() {
    let root = nodesmith_tests::moto::repo_root();
    let lanes = std::fs::read_to_string(root.join("scripts/lanes.py")).unwrap();
    let manifest: toml_edit::DocumentMut = std::fs::read_to_string(root.join("tests/Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let targets: Vec<String> = manifest["test"]
        .as_array_of_tables()
        .expect("[[test]] targets")
        .iter()
        .filter_map(|t| t.get("name").and_then(|n| n.as_str()).map(str::to_string))
        .collect();
    for lane in ["STARTS", "SHARDS", "WEIGHT"] {
        let line = lanes
            .lines()
            .find(|l| l.starts_with(&format!("{lane} = ")))
            .unwrap_or_else(|| panic!("{lane} is not set in scripts/lanes.py"));
        let names: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        assert!(!names.is_empty(), "{line}");
        for name in names {
            assert!(
                targets.iter().any(|t| t == name),
                "{lane} names {name}, not a test target: {targets:?}"
            );
        }
    }
}
