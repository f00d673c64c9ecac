//! nodesmith's CRDs accept what Karpenter v1.14's accept: NodePools,
//! EC2NodeClasses and a NodeClaim with every field set (tests/fixtures/karpenter-v1.14),
//! applied to the test server, which prunes and checks custom resources
//! against the installed CRD's schema as the API server does, read back
//! unchanged — spec, status and metadata.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use nodesmith_tests::kube_server::KubeServer;
use serde_json::{Value, json};

const NODEPOOLS: &str = include_str!("../fixtures/karpenter-v1.14/nodepool.yaml");
const EC2NODECLASSES: &str = include_str!("../fixtures/karpenter-v1.14/ec2nodeclass.yaml");
const NODECLAIMS: &str = include_str!("../fixtures/karpenter-v1.14/nodeclaim.yaml");

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn api(server: &KubeServer, doc: &Value) -> Api<DynamicObject> {
    let (group, version) = doc["apiVersion"].as_str().unwrap().split_once('/').unwrap();
    let kind = doc["kind"].as_str().unwrap();
    let plural = match kind {
        "NodePool" => "nodepools",
        "EC2NodeClass" => "ec2nodeclasses",
        "NodeClaim" => "nodeclaims",
        other => panic!("no plural for {other}"),
    };
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::all_with(server.client(), &ar)
}

/// Creates `doc`, writes its status through the status subresource, and
/// returns what the server then serves.
async fn round_trip(server: &KubeServer, doc: &Value) -> Result<Value, kube::Error> {
    let api = api(server, doc);
    let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
    let created = api.create(&PostParams::default(), &obj).await?;
    let name = created.metadata.name.clone().unwrap();
    if let Some(status) = doc.get("status") {
        let mut with_status = serde_json::to_value(&created).unwrap();
        with_status["status"] = status.clone();
        let with_status: DynamicObject = serde_json::from_value(with_status).unwrap();
        api.replace_status(&name, &PostParams::default(), &with_status).await?;
    }
    Ok(serde_json::to_value(api.get(&name).await?).unwrap())
}

#[tokio::test]
async fn karpenter_v1_14_manifests_with_every_field_read_back_unchanged() {
    let server = KubeServer::start().await;
    let docs: Vec<Value> = documents(NODEPOOLS)
        .into_iter()
        .chain(documents(EC2NODECLASSES))
        .chain(documents(NODECLAIMS))
        .collect();
    assert_eq!(docs.len(), 5);
    for doc in &docs {
        let name = doc["metadata"]["name"].as_str().unwrap();
        let got = round_trip(&server, doc)
            .await
            .unwrap_or_else(|e| panic!("{} {name}: {e}", doc["kind"]));
        for part in ["spec", "status"] {
            assert_eq!(
                got.get(part),
                doc.get(part),
                "{} {name}: {part} changed on the way through",
                doc["kind"]
            );
        }
        for meta in ["labels", "annotations"] {
            assert_eq!(got["metadata"].get(meta), doc["metadata"].get(meta), "{name}: {meta}");
        }
    }
}

#[tokio::test]
async fn the_server_prunes_undeclared_fields_and_refuses_wrong_types_as_the_api_server_does() {
    let server = KubeServer::start().await;
    let pool = json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "typo"},
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "nodeClasRef": {"name": "misspelt"},
                "requirements": []
            }},
            "limits": {"cpu": "10"}
        }
    });
    let got = round_trip(&server, &pool).await.unwrap();
    assert_eq!(
        got["spec"]["template"]["spec"].get("nodeClasRef"),
        None,
        "pruned: {got}"
    );
    assert_eq!(got["spec"]["limits"], json!({"cpu": "10"}));

    let class = json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "typed"},
        "spec": {"role": "R", "amiSelectorTerms": [{"alias": "al2023@latest"}], "ipPrefixCount": "two",
                 "kubelet": {"anyField": {"kept": true}}}
    });
    match round_trip(&server, &class).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("spec.ipPrefixCount"), "{}", s.message);
        }
        other => panic!("expected a 422 naming spec.ipPrefixCount, got {other:?}"),
    }
    let mut class = class;
    class["spec"]["ipPrefixCount"] = json!(2);
    let got = round_trip(&server, &class).await.unwrap();
    assert_eq!(
        got["spec"]["kubelet"],
        json!({"anyField": {"kept": true}}),
        "preserved: x-kubernetes-preserve-unknown-fields"
    );
}
