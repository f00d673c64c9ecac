//! The `nodesmith simulate` command line: exit status 2 with a one-line error
//! naming file, document and field for bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodesmith")).arg("simulate").args(args).output().unwrap()
}

fn one_line_error(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "stdout: {}\nstderr: {}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(o.stdout.is_empty());
    err
}

#[test]
fn bad_pod_field_exits_2_naming_file_document_and_field() {
    let f = fixtures().join("bad-requirement.yaml");
    let err = one_line_error(&simulate(&[f.to_str().unwrap()]));
    assert!(err.contains("bad-requirement.yaml: document 1: spec.template.spec.tolerations[0].operator"), "{err}");
}

#[test]
fn bad_quantity_exits_2() {
    let f = fixtures().join("bad-quantity.yaml");
    let err = one_line_error(&simulate(&[f.to_str().unwrap()]));
    assert!(err.contains("bad-quantity.yaml: document 0: spec.containers[0].resources.requests.memory"), "{err}");
}

#[test]
fn missing_file_exits_2() {
    let err = one_line_error(&simulate(&["/nonexistent/nodesmith.yaml"]));
    assert!(err.contains("/nonexistent/nodesmith.yaml") && err.contains("cannot read"), "{err}");
}

#[test]
fn unreadable_catalog_exits_2() {
    let f = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/01-inflate.yaml");
    let err = one_line_error(&simulate(&["--catalog", "/nonexistent/catalog.json", f.to_str().unwrap()]));
    assert!(err.contains("/nonexistent/catalog.json"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(simulate(&[]).status.code(), Some(2));
    assert_eq!(simulate(&["--output", "xml", "x.yaml"]).status.code(), Some(2));
}
