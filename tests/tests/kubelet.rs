//! The simulated kubelets against moto and the Kubernetes API test server:
//! instances join late, not ready and uninitialized, with only what a real
//! node gets; reserved labels stop a kubelet; readiness keeps what others wrote.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::launch_fixtures::*;
use base64::Engine;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodesmith::labels;
use nodesmith::launch::LaunchOutcome;
use nodesmith_tests::kube_server::kubelet::{NOT_READY_TAINT, UNINITIALIZED_TAINT};
use nodesmith_tests::kube_server::{KubeServer, KubeletTiming, Kubelets};
use serde_json::json;

fn catalog() -> &'static nodesmith::catalog::Catalog {
    nodesmith::catalog::builtin().unwrap()
}

/// Runs one instance with this user data; returns its id.
async fn run(ec2: &aws_sdk_ec2::Client, itype: &str, zone: &str, user_data: &str) -> String {
    let ami = ec2.describe_images().send().await.unwrap().images()[0]
        .image_id()
        .unwrap()
        .to_string();
    let out = ec2
        .run_instances()
        .image_id(ami)
        .instance_type(itype.into())
        .min_count(1)
        .max_count(1)
        .placement(aws_sdk_ec2::types::Placement::builder().availability_zone(zone).build())
        .user_data(base64::engine::general_purpose::STANDARD.encode(user_data))
        .send()
        .await
        .unwrap();
    out.instances()[0].instance_id().unwrap().to_string()
}

async fn private_dns(ec2: &aws_sdk_ec2::Client, id: &str) -> String {
    let out = ec2.describe_instances().instance_ids(id).send().await.unwrap();
    out.reservations()[0].instances()[0]
        .private_dns_name()
        .unwrap()
        .to_string()
}

fn node_labels(n: &Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

fn taints(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .iter()
        .map(|t| match &t.value {
            Some(v) => format!("{}={v}:{}", t.key, t.effect),
            None => format!("{}:{}", t.key, t.effect),
        })
        .collect()
}

fn ready(n: &Node) -> (String, String) {
    let c = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .expect("a Ready condition");
    (c.status.clone(), c.reason.clone().unwrap_or_default())
}

fn nodeconfig(flags: &str, taints: &str) -> String {
    format!(
        "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"b\"\n\n--b\nContent-Type: application/node.eks.aws\n\n\
apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  cluster: {{name: demo}}\n  kubelet:\n    flags: [\"{flags}\"]\n    config:\n      registerWithTaints: {taints}\n--b--\n"
    )
}

#[tokio::test]
async fn a_launched_instance_joins_late_not_ready_and_becomes_ready_keeping_others_writes() {
    let m = nodesmith_tests::moto::moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("default-k1", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let LaunchOutcome::Launched(c) = l.launch(&req).await.unwrap() else {
        panic!("expected a launch")
    };
    let id = c.instance_id.clone().unwrap();
    let zone = c.zone.clone().unwrap();
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let name = private_dns(&ec2, &id).await;
    assert!(
        name.starts_with("ip-10-0-") && name.ends_with(".ec2.internal"),
        "{name}"
    );

    let kubelets = Kubelets::new(KubeletTiming::millis(400, 400));
    // Booting: no Node yet.
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r.waiting, vec![id.clone()], "{r:?}");
    assert!(r.registered.is_empty() && kube.node(&name).is_none());

    tokio::time::sleep(Duration::from_millis(450)).await;
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r.registered, vec![name.clone()], "{r:?}");
    assert!(r.ready.is_empty() && r.refused.is_empty(), "{r:?}");
    let n = kube.node(&name).unwrap();
    assert_eq!(
        n.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(format!("aws:///{zone}/{id}").as_str())
    );
    let l0 = node_labels(&n);
    assert_eq!(l0[labels::HOSTNAME], name);
    assert_eq!(l0[labels::OS], "linux");
    assert_eq!(l0[labels::ARCH], "amd64");
    // From user data: the claim's labels and the capacity type nodesmith wrote.
    assert_eq!(l0[labels::NODEPOOL], "default");
    // The claim's name is no longer in user data (shared launch templates):
    // registration applies it from the instance's tag.
    assert!(!l0.contains_key(labels::NODECLAIM), "{l0:?}");
    assert_eq!(l0["workload"], "web");
    assert_eq!(l0[labels::CAPACITY_TYPE], "on-demand");
    // Not the catalog's, and no cloud labels before initialization.
    assert!(
        !l0.keys().any(|k| k.starts_with("karpenter.k8s.aws/instance-")),
        "{l0:?}"
    );
    assert!(
        !l0.contains_key(labels::INSTANCE_TYPE) && !l0.contains_key(labels::ZONE),
        "{l0:?}"
    );
    let t0 = taints(&n);
    for want in [
        "dedicated=web:NoSchedule",
        "node.cilium.io/agent-not-ready=true:NoExecute",
        "node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule",
        "node.kubernetes.io/not-ready:NoSchedule",
    ] {
        assert!(t0.contains(&want.to_string()), "{want} not in {t0:?}");
    }
    assert_eq!(ready(&n), ("False".into(), "KubeletNotReady".into()));
    let status = n.status.clone().unwrap();
    assert_eq!(status.capacity.unwrap()["pods"].0, "29");

    // Another writer labels, annotates and taints the node meanwhile.
    let nodes: Api<Node> = Api::all(kube.client());
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "x"}, "annotations": {"a": "b"}}})),
        )
        .await
        .unwrap();
    let mut spec_taints = serde_json::to_value(n.spec.clone().unwrap().taints.unwrap()).unwrap();
    spec_taints
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}));
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": spec_taints}})),
        )
        .await
        .unwrap();

    // Not ready before ready_after.
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert!(r.ready.is_empty() && r.registered.is_empty(), "{r:?}");
    assert_eq!(ready(&kube.node(&name).unwrap()).0, "False");

    tokio::time::sleep(Duration::from_millis(450)).await;
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r.ready, vec![name.clone()], "{r:?}");
    let n = kube.node(&name).unwrap();
    assert_eq!(ready(&n), ("True".into(), "KubeletReady".into()));
    let l1 = node_labels(&n);
    assert_eq!(l1[labels::INSTANCE_TYPE], "m5.large");
    assert_eq!(l1["beta.kubernetes.io/instance-type"], "m5.large");
    assert_eq!(l1[labels::ZONE], zone);
    assert_eq!(l1[labels::REGION], "us-east-1");
    assert_eq!(l1["team"], "x", "another writer's label survives");
    assert_eq!(n.metadata.annotations.clone().unwrap()["a"], "b");
    // The not-ready and uninitialized taints are gone; user data's and the
    // other writer's stay.
    let mut want: Vec<String> = t0
        .iter()
        .filter(|t| !t.starts_with(NOT_READY_TAINT) && !t.starts_with(UNINITIALIZED_TAINT))
        .cloned()
        .collect();
    want.push("karpenter.sh/disrupted:NoSchedule".into());
    assert_eq!(taints(&n), want);

    // The CNI DaemonSet removes its startup taint; the kubelets never do.
    assert!(kube.remove_node_taint(&name, "node.cilium.io/agent-not-ready").unwrap());
    assert!(!kube.remove_node_taint(&name, "node.cilium.io/agent-not-ready").unwrap());
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r, Default::default());
    want.retain(|t| !t.starts_with("node.cilium.io/agent-not-ready"));
    assert_eq!(taints(&kube.node(&name).unwrap()), want);
    assert!(want.contains(&"dedicated=web:NoSchedule".to_string()));
}

#[tokio::test]
async fn ec2_facts_win_over_user_data_and_user_data_taints_survive_readiness() {
    let m = nodesmith_tests::moto::moto().await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    // AL2023 claiming another type and zone; taints in the NodeConfig's config.
    let al2023 = run(
        &ec2,
        "m5.large",
        "us-east-1b",
        &nodeconfig(
            "--node-labels=node.kubernetes.io/instance-type=c5.24xlarge,topology.kubernetes.io/zone=us-east-1z,team=a",
            "[{key: dedicated, value: batch, effect: NoSchedule}, {key: example.com/agent-not-ready, effect: NoExecute}]",
        ),
    )
    .await;
    // Bottlerocket on Graviton, taints in settings.kubernetes.node-taints.
    let bottlerocket = run(
        &ec2,
        "m6g.large",
        "us-east-1c",
        "[settings.kubernetes]\ncluster-name = \"demo\"\n[settings.kubernetes.node-labels]\n\"karpenter.sh/nodepool\" = \"default\"\n[settings.kubernetes.node-taints]\ngpu = [\"true:NoSchedule\"]\n",
    )
    .await;

    let kube = KubeServer::start().await;
    let kubelets = Kubelets::new(KubeletTiming::instant());
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert!(r.refused.is_empty(), "{r:?}");
    assert_eq!(r.registered.len(), 2, "{r:?}");
    // Registered and made ready in one step, in that order.
    assert_eq!(r.ready, r.registered);

    let n = kube.node(&private_dns(&ec2, &al2023).await).unwrap();
    let l = node_labels(&n);
    assert_eq!(l[labels::INSTANCE_TYPE], "m5.large");
    assert_eq!(l[labels::ZONE], "us-east-1b");
    assert_eq!(l["team"], "a");
    assert!(!l.contains_key(labels::CAPACITY_TYPE), "{l:?}");
    assert_eq!(
        taints(&n),
        vec![
            "dedicated=batch:NoSchedule".to_string(),
            "example.com/agent-not-ready:NoExecute".to_string()
        ]
    );
    assert_eq!(ready(&n).0, "True");

    let n = kube.node(&private_dns(&ec2, &bottlerocket).await).unwrap();
    let l = node_labels(&n);
    // moto calls its stock AMI x86_64; the catalog knows m6g is arm64.
    assert_eq!(l[labels::ARCH], "arm64");
    assert_eq!(l[labels::NODEPOOL], "default");
    assert_eq!(l[labels::INSTANCE_TYPE], "m6g.large");
    assert_eq!(taints(&n), vec!["gpu=true:NoSchedule".to_string()]);

    // Nothing more to do, and nothing undone.
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r, Default::default());
    assert_eq!(taints(&n).len(), 1);
}

#[tokio::test]
async fn kubelets_refuse_reserved_or_malformed_node_labels_and_never_register() {
    let m = nodesmith_tests::moto::moto().await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let cases = [
        (
            "node-restriction.kubernetes.io/team=a",
            Some("node-restriction.kubernetes.io/team"),
        ),
        ("kubernetes.io/role=worker", Some("kubernetes.io/role")),
        (
            "node-role.kubernetes.io/worker=",
            Some("node-role.kubernetes.io/worker"),
        ),
        ("k8s.io/x=y", Some("k8s.io/x")),
        ("team.k8s.io/x=y", Some("team.k8s.io/x")),
        ("novalue", Some("malformed pair")),
        ("kubelet.kubernetes.io/x=y", None),
        ("x.node.kubernetes.io/y=z", None),
        ("kubernetes.io/arch=arm64", None),
    ];
    let mut ids = Vec::new();
    for (flag_labels, _) in &cases {
        let ud = nodeconfig(&format!("--node-labels={flag_labels}"), "[]");
        ids.push(run(&ec2, "m5.large", "us-east-1a", &ud).await);
    }
    let empty = run(&ec2, "m5.large", "us-east-1a", "").await;

    let kube = KubeServer::start().await;
    let kubelets = Kubelets::new(KubeletTiming::instant());
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    for ((labels, refused), id) in cases.iter().zip(&ids) {
        let name = private_dns(&ec2, id).await;
        let refusal = r.refused.iter().find(|f| &f.instance_id == id);
        match refused {
            Some(what) => {
                let f = refusal.unwrap_or_else(|| panic!("{labels}: not refused: {r:?}"));
                assert!(f.reason.contains(what), "{labels}: {}", f.reason);
                assert!(kube.node(&name).is_none(), "{labels}: a Node was created");
            }
            None => {
                assert!(refusal.is_none(), "{labels}: {refusal:?}");
                assert!(kube.node(&name).is_some(), "{labels}: no Node");
            }
        }
    }
    // --node-labels overrides the kubelet's own default.
    let arm = kube.node(&private_dns(&ec2, ids.last().unwrap()).await).unwrap();
    assert_eq!(node_labels(&arm)[labels::ARCH], "arm64");
    let f = r.refused.iter().find(|f| f.instance_id == empty).unwrap();
    assert!(f.reason.contains("empty"), "{f:?}");

    // Refusals are final: nothing registers later, and they are remembered.
    let again = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert!(again.registered.is_empty() && again.refused.is_empty(), "{again:?}");
    assert_eq!(kubelets.refusals().await.len(), r.refused.len());
    // The one-shot helper reports refusals as an error naming them.
    let err = KubeServer::start()
        .await
        .register_ec2_instances(&ec2, catalog())
        .await
        .unwrap_err();
    assert!(err.contains(&empty) && err.contains("k8s.io/x"), "{err}");
}

#[tokio::test]
async fn spawned_kubelets_bring_nodes_up_in_the_background() {
    let m = nodesmith_tests::moto::moto().await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let id = run(
        &ec2,
        "m5.large",
        "us-east-1a",
        &nodeconfig("--node-labels=team=a", "[]"),
    )
    .await;
    let name = private_dns(&ec2, &id).await;
    let kube = KubeServer::start().await;
    let kubelets = Kubelets::new(KubeletTiming::millis(200, 200));
    let handle = kubelets.spawn(
        &kube,
        ec2.clone(),
        Arc::new(catalog().clone()),
        Duration::from_millis(50),
    );
    let mut seen_not_ready = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(n) = kube.node(&name) {
            if ready(&n).0 == "True" {
                assert!(
                    !taints(&n)
                        .iter()
                        .any(|t| t.starts_with(NOT_READY_TAINT) || t.starts_with(UNINITIALIZED_TAINT))
                );
                break;
            }
            seen_not_ready = true;
        }
        assert!(tokio::time::Instant::now() < deadline, "the node never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen_not_ready, "the node was never seen before it was ready");
    drop(handle);
    assert!(kubelets.refusals().await.is_empty());
}

#[tokio::test]
async fn a_deleted_node_comes_back_while_its_instance_runs_and_goes_when_it_stops_or_terminates() {
    let m = nodesmith_tests::moto::moto().await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let id = run(
        &ec2,
        "m5.large",
        "us-east-1a",
        &nodeconfig("--node-labels=team=a", "[]"),
    )
    .await;
    let name = private_dns(&ec2, &id).await;
    assert!(
        name.ends_with(".ec2.internal"),
        "the Node is named by the full private DNS name: {name}"
    );
    let kube = KubeServer::start().await;
    let kubelets = Kubelets::new(KubeletTiming::instant());
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert!(r.registered.contains(&name), "{r:?}");
    let first_uid = kube.node(&name).unwrap().metadata.uid;

    // Deleted under a running kubelet: registered again, not ready, then Ready.
    kube.delete("v1", "Node", "", &name).unwrap();
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r.registered, vec![name.clone()], "{r:?}");
    let n = kube.node(&name).expect("the kubelet re-registers its Node");
    assert_ne!(n.metadata.uid, first_uid);
    assert_eq!(ready(&n).0, "False");
    assert!(
        taints(&n).iter().any(|t| t.starts_with(NOT_READY_TAINT)),
        "{:?}",
        taints(&n)
    );
    assert_eq!(node_labels(&n)["team"], "a");
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r.ready, vec![name.clone()], "{r:?}");
    assert_eq!(ready(&kube.node(&name).unwrap()).0, "True");

    // Stopped: the Node goes; started again: it joins anew.
    ec2.stop_instances().instance_ids(&id).send().await.unwrap();
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r.deleted, vec![name.clone()], "{r:?}");
    assert!(kube.node(&name).is_none());
    ec2.start_instances().instance_ids(&id).send().await.unwrap();
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert!(r.registered.contains(&name), "{r:?}");
    assert!(kube.node(&name).is_some());

    // Terminated: the Node goes for good.
    ec2.terminate_instances().instance_ids(&id).send().await.unwrap();
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert_eq!(r.deleted, vec![name.clone()], "{r:?}");
    assert!(kube.node(&name).is_none());
    let r = kubelets.step(&kube, &ec2, catalog()).await.unwrap();
    assert!(r.registered.is_empty() && r.deleted.is_empty(), "{r:?}");
}
