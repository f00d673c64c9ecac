//! EKS authentication end to end: DescribeCluster against moto, and the
//! minted bearer token as the Kubernetes API test server receives it.

use base64::Engine;
use nodesmith::kubernetes::auth::{self, ClusterEndpoint};
use nodesmith::kubernetes::client::{ClientSource, EksClients};
use nodesmith::kubernetes::{Cluster, KubeCluster};
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::moto;

#[tokio::test]
async fn describe_cluster_reads_endpoint_and_ca_from_eks() {
    let m = moto().await;
    let conf = m.sdk_config().await;
    let eks = aws_sdk_eks::Client::new(&conf);
    eks.create_cluster()
        .name("prod")
        .role_arn("arn:aws:iam::123456789012:role/eks")
        .resources_vpc_config(
            aws_sdk_eks::types::VpcConfigRequest::builder()
                .subnet_ids("subnet-1")
                .build(),
        )
        .send()
        .await
        .unwrap();
    // moto answers with the endpoint and, as CA data, 1400 random characters
    // rather than a base64 PEM bundle: the error must say exactly that.
    // (Parsing real bundles is unit-tested in `auth::tests`.)
    let err = auth::describe_cluster(&eks, "prod").await.unwrap_err();
    assert!(matches!(err, auth::AuthError::Certificate(_)), "{err}");
    let err = auth::describe_cluster(&eks, "missing").await.unwrap_err();
    assert!(err.to_string().contains("eks:DescribeCluster \"missing\""), "{err}");
}

#[tokio::test]
async fn requests_carry_a_minted_token_bound_to_the_cluster() {
    let m = moto().await;
    let conf = m.sdk_config().await;
    let server = KubeServer::start().await;
    let endpoint = ClusterEndpoint {
        name: "prod".into(),
        endpoint: server.url().to_string(),
        ca_der: Vec::new(),
    };
    let cluster = KubeCluster::new(ClientSource::Eks(Box::new(EksClients::with_endpoint(conf, endpoint))));
    assert!(cluster.nodes().await.unwrap().is_empty());
    assert!(cluster.pods().await.unwrap().is_empty());
    let auths: Vec<String> = server
        .requests()
        .into_iter()
        .map(|r| r.authorization.unwrap())
        .collect();
    assert_eq!(auths.len(), 2);
    assert_eq!(auths[0], auths[1], "a fresh token is reused");
    // An EKS token is the functions' identity, held to their ClusterRole.
    let used: Vec<(String, String, String)> = server.lambda_permissions_used().into_iter().collect();
    let want = |r: &str| (String::new(), r.to_string(), "list".to_string());
    assert_eq!(used, [want("nodes"), want("pods")]);
    let token = auths[0].strip_prefix("Bearer ").unwrap();
    let b64 = token.strip_prefix(auth::TOKEN_PREFIX).unwrap();
    let url = String::from_utf8(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(b64).unwrap()).unwrap();
    assert!(
        url.starts_with("https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&"),
        "{url}"
    );
    assert!(url.contains("X-Amz-SignedHeaders=host%3Bx-k8s-aws-id"), "{url}");
    assert!(url.contains("X-Amz-Credential=testing%2F"), "{url}");
    assert!(url.contains("X-Amz-Expires=60"), "{url}");

    // A rejected token is replaced once and the call goes through.
    server.inject(nodesmith_tests::kube_server::Fault::new(401, 1));
    assert!(cluster.nodes().await.unwrap().is_empty());
    assert_eq!(server.requests().len(), 4);
    server.inject(nodesmith_tests::kube_server::Fault::new(401, 2));
    assert_eq!(cluster.nodes().await.unwrap_err().code(), Some(401));
}

#[tokio::test]
async fn functions_pick_the_cluster_from_their_environment() {
    let m = moto().await;
    let conf = m.sdk_config().await;
    let server = KubeServer::start().await;
    let env: std::collections::HashMap<&str, String> = server.env().into_iter().collect();
    let cluster = KubeCluster::from_lookup(conf.clone(), |k| env.get(k).cloned()).unwrap();
    assert!(cluster.nodes().await.unwrap().is_empty());
    assert_eq!(
        server.requests()[0].authorization.as_deref(),
        Some("Bearer nodesmith-lambda"),
        "the functions call the test server as themselves"
    );
    assert_eq!(server.lambda_permissions_used().len(), 1);
    let err = KubeCluster::from_lookup(conf.clone(), |_| None).err().unwrap();
    assert!(err.to_string().contains("NODESMITH_CLUSTER_NAME"), "{err}");
    // With a cluster name the adapter goes to EKS: moto knows no such cluster.
    let eks =
        KubeCluster::from_lookup(conf, |k| (k == "NODESMITH_CLUSTER_NAME").then(|| "absent".to_string())).unwrap();
    let err = eks.nodes().await.unwrap_err();
    assert!(err.to_string().contains("eks:DescribeCluster \"absent\""), "{err}");
}
