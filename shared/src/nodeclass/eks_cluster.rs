//! The cluster's endpoint, CA, service CIDR and version, from `eks:DescribeCluster`.

use super::error::NodeClassError;
use super::userdata::ClusterInfo;

/// Describes the cluster.
pub async fn describe(eks: &aws_sdk_eks::Client, name: &str) -> Result<ClusterInfo, NodeClassError> {
    let out = eks
        .describe_cluster()
        .name(name)
        .send()
        .await
        .map_err(|e| NodeClassError::aws("eks:DescribeCluster", e))?;
    let c = out
        .cluster()
        .ok_or_else(|| NodeClassError::Cluster(format!("eks:DescribeCluster {name} returned no cluster")))?;
    let missing = |what: &str| NodeClassError::Cluster(format!("cluster {name} has no {what}"));
    Ok(ClusterInfo {
        name: name.to_string(),
        endpoint: c.endpoint().ok_or_else(|| missing("endpoint"))?.to_string(),
        certificate_authority: c
            .certificate_authority()
            .and_then(|a| a.data())
            .ok_or_else(|| missing("certificate authority"))?
            .to_string(),
        service_cidr: c
            .kubernetes_network_config()
            .and_then(|n| n.service_ipv4_cidr())
            .ok_or_else(|| missing("service IPv4 CIDR"))?
            .to_string(),
        version: c.version().ok_or_else(|| missing("version"))?.to_string(),
    })
}
