use super::*;

fn stack(irsa: bool) -> Stack {
    let mut s = Stack {
        name: "nodesmith-prod".into(),
        ..Stack::default()
    };
    s.outputs.insert(
        QUEUE_OUTPUT.into(),
        "https://sqs.eu-west-1.amazonaws.com/111122223333/nodesmith-prod-PendingPodsQueue-AbC".into(),
    );
    s.outputs.insert(
        IRSA_OUTPUT.into(),
        "eks.amazonaws.com/role-arn: arn:aws:iam::111122223333:role/fwd".into(),
    );
    s.parameters.insert(
        IRSA_PARAMETER.into(),
        if irsa {
            "oidc.eks.eu-west-1.amazonaws.com/id/ABC"
        } else {
            ""
        }
        .into(),
    );
    s
}

fn parsed(text: &str) -> Result<Vec<Value>, InstallError> {
    documents(text, "output")
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

#[test]
fn the_stacks_queue_and_the_image_are_filled_in_and_nothing_else_changes() -> Result<(), InstallError> {
    let out = manifests(
        &stack(false),
        "123.dkr.ecr.eu-west-1.amazonaws.com/nodesmith-forwarder:0.1.0",
    )?;
    let docs = parsed(&out)?;
    let bundled = [
        documents(NAMESPACE, "n")?,
        documents(FORWARDER, "f")?,
        documents(LAMBDA_RBAC, "r")?,
    ]
    .concat();
    assert_eq!(docs.len(), bundled.len(), "{out}");
    let config = kind(&docs, "ConfigMap");
    assert_eq!(
        config[0]["data"]["QUEUE_URL"],
        "https://sqs.eu-west-1.amazonaws.com/111122223333/nodesmith-prod-PendingPodsQueue-AbC"
    );
    let deployment = kind(&docs, "Deployment");
    assert_eq!(
        deployment[0]["spec"]["template"]["spec"]["containers"][0]["image"],
        "123.dkr.ecr.eu-west-1.amazonaws.com/nodesmith-forwarder:0.1.0"
    );
    // Pod Identity (the default): no IRSA annotation, which would override it.
    assert!(
        kind(&docs, "ServiceAccount")[0]["metadata"]["annotations"].is_null(),
        "{out}"
    );
    // Everything else as bundled; never a CRD.
    let changed: Vec<&Value> = docs
        .iter()
        .zip(&bundled)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a)
        .collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(kind(&docs, "CustomResourceDefinition").is_empty());
    assert!(parsed(CRDS)?.iter().all(|d| d["kind"] == "CustomResourceDefinition"));
    Ok(())
}

#[test]
fn a_stack_deployed_for_irsa_annotates_the_service_account() -> Result<(), InstallError> {
    let docs = parsed(&manifests(&stack(true), "fwd:1")?)?;
    let account = kind(&docs, "ServiceAccount");
    assert_eq!(
        account[0]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::111122223333:role/fwd"
    );
    Ok(())
}

#[test]
fn a_stack_without_the_queue_output_is_named_with_what_it_lacks() {
    let mut s = stack(false);
    s.outputs.remove(QUEUE_OUTPUT);
    let e = manifests(&s, "fwd:1").map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(
        e,
        Err("stack nodesmith-prod has no output PendingPodsQueueUrl: is it a nodesmith stack, deployed from this release's template.yaml?".to_string())
    );
}

#[test]
fn install_prints_what_the_kustomization_lists() -> Result<(), InstallError> {
    let kustomization = documents(
        include_str!("../../../infra/k8s/kustomization.yaml"),
        "kustomization.yaml",
    )?;
    let listed: Vec<&str> = kustomization[0]["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    // The three files `manifests` bundles, in its order.
    assert_eq!(listed, ["namespace.yaml", "forwarder.yaml", "lambda-rbac.yaml"]);
    Ok(())
}
