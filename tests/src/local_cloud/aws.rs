//! The local cloud's AWS side in moto, made once at start: a VPC with one
//! discovery-tagged subnet per zone and a tagged security group, the EKS
//! cluster, the node role, the state table, the three queues with their
//! dead-letter queues (as `template.yaml` declares them), the template's
//! EventBridge rules routing interruption events, and spot prices.

use aws_config::SdkConfig;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use aws_sdk_sqs::types::QueueAttributeName;
use nodesmith::catalog::Catalog;
use nodesmith::state;

use crate::eventbridge;
use crate::moto::{MotoServer, ZONES};

/// The discovery tag key on subnets and security groups.
pub const DISCOVERY: &str = "karpenter.sh/discovery";
/// The state table's name.
pub const TABLE: &str = "nodesmith-state";

/// A queue and its dead-letter queue.
#[derive(Clone, Debug)]
pub struct Queue {
    /// The queue's URL.
    pub url: String,
    /// The queue's ARN (event sources name it).
    pub arn: String,
    /// Its dead-letter queue's URL.
    pub dlq_url: String,
}

/// What [`create`] made.
#[derive(Clone, Debug)]
pub struct World {
    /// Pending-pod references and solve requests, for `provision`.
    pub pending: Queue,
    /// Launch requests, for `launch`.
    pub launch: Queue,
    /// EC2 and Health events, for `interrupt`.
    pub interruption: Queue,
    /// The node role the EC2NodeClass names.
    pub node_role: String,
}

/// A failed AWS call while building the world, naming the step.
#[derive(Debug, thiserror::Error)]
#[error("setting up the local AWS ({step}): {message}")]
pub struct WorldError {
    /// What was being made.
    pub step: String,
    /// What AWS (moto) said.
    pub message: String,
}

fn fail(step: &str) -> impl Fn(String) -> WorldError + '_ {
    move |message| WorldError {
        step: step.to_string(),
        message,
    }
}

fn tags(resource: ResourceType, key: &str, value: &str) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(resource)
        .tags(Tag::builder().key(key).value(value).build())
        .build()
}

/// Makes the cluster's AWS resources; `visibility_timeout_secs` is the queues'.
pub async fn create(conf: &SdkConfig, cluster: &str, visibility_timeout_secs: u64) -> Result<World, WorldError> {
    let ec2 = aws_sdk_ec2::Client::new(conf);
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .send()
        .await
        .map_err(|e| fail("VPC")(e.to_string()))?;
    let vpc_id = vpc.vpc().and_then(|v| v.vpc_id()).unwrap_or_default().to_string();
    let mut subnet_ids = Vec::new();
    for (i, zone) in ZONES.iter().enumerate() {
        let out = ec2
            .create_subnet()
            .vpc_id(&vpc_id)
            .cidr_block(format!("10.0.{}.0/20", i * 16))
            .availability_zone(*zone)
            .tag_specifications(tags(ResourceType::Subnet, DISCOVERY, cluster))
            .send()
            .await
            .map_err(|e| fail("subnets")(e.to_string()))?;
        subnet_ids.push(out.subnet().and_then(|s| s.subnet_id()).unwrap_or_default().to_string());
    }
    ec2.create_security_group()
        .group_name(format!("{cluster}-nodes"))
        .description("nodes")
        .vpc_id(&vpc_id)
        .tag_specifications(tags(ResourceType::SecurityGroup, DISCOVERY, cluster))
        .send()
        .await
        .map_err(|e| fail("security group")(e.to_string()))?;
    aws_sdk_eks::Client::new(conf)
        .create_cluster()
        .name(cluster)
        .version("1.33")
        .role_arn("arn:aws:iam::123456789012:role/eks")
        .resources_vpc_config(
            aws_sdk_eks::types::VpcConfigRequest::builder()
                .set_subnet_ids(Some(subnet_ids))
                .build(),
        )
        .send()
        .await
        .map_err(|e| fail("EKS cluster")(e.to_string()))?;
    let node_role = format!("KarpenterNodeRole-{cluster}");
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    aws_sdk_iam::Client::new(conf)
        .create_role()
        .role_name(&node_role)
        .assume_role_policy_document(trust)
        .send()
        .await
        .map_err(|e| fail("node role")(e.to_string()))?;
    state::create_table(&aws_sdk_dynamodb::Client::new(conf), TABLE)
        .await
        .map_err(|e| fail("state table")(e.to_string()))?;
    let sqs = aws_sdk_sqs::Client::new(conf);
    let world = World {
        pending: queue(&sqs, "pending-pods", visibility_timeout_secs).await?,
        launch: queue(&sqs, "launch", visibility_timeout_secs).await?,
        interruption: queue(&sqs, "interruption", visibility_timeout_secs).await?,
        node_role,
    };
    let rules = eventbridge::repo_template_rules().map_err(fail("EventBridge rules"))?;
    eventbridge::route_to_queue(&aws_sdk_eventbridge::Client::new(conf), &rules, &world.interruption.arn)
        .await
        .map_err(fail("EventBridge rules"))?;
    Ok(world)
}

async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String, WorldError> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| fail("queue ARN")(e.to_string()))?;
    out.attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| fail("queue ARN")(format!("no ARN for {url}")))
}

/// A queue with a dead-letter queue after 5 receives, as the template has them.
async fn queue(sqs: &aws_sdk_sqs::Client, name: &str, visibility_timeout_secs: u64) -> Result<Queue, WorldError> {
    let create = |n: String| async move {
        sqs.create_queue()
            .queue_name(&n)
            .send()
            .await
            .map_err(|e| fail("queues")(e.to_string()))
            .map(|o| o.queue_url().unwrap_or_default().to_string())
    };
    let dlq_url = create(format!("{name}-dlq")).await?;
    let dlq_arn = queue_arn(sqs, &dlq_url).await?;
    let url = create(name.to_string()).await?;
    sqs.set_queue_attributes()
        .queue_url(&url)
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            visibility_timeout_secs.to_string(),
        )
        .attributes(
            QueueAttributeName::RedrivePolicy,
            serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )
        .send()
        .await
        .map_err(|e| fail("queues")(e.to_string()))?;
    let arn = queue_arn(sqs, &url).await?;
    Ok(Queue { url, arn, dlq_url })
}

/// Every spot offering of the catalog as (type, zone, price).
pub fn spot_prices(catalog: &Catalog) -> Vec<(&str, &str, f64)> {
    catalog
        .instance_types
        .iter()
        .flat_map(|t| {
            t.offerings
                .iter()
                .filter(|o| o.capacity_type == "spot")
                .map(move |o| (t.name.as_str(), o.zone.as_str(), o.price))
        })
        .collect()
}

/// Gives moto the catalog's spot prices (moto has none of its own), so spot
/// offerings are priced as in the built-in catalog.
pub fn seed_spot_prices(moto: &mut MotoServer, catalog: &Catalog) -> Result<(), WorldError> {
    let prices = spot_prices(catalog);
    moto.seed_spot_prices(&prices).map_err(fail("spot prices"))
}
