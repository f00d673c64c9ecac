//! EventBridge on moto, wired as `template.yaml` wires it: every
//! `AWS::Events::Rule` of the template becomes a rule on moto's default bus
//! with its very `EventPattern`, targeting a queue. moto matches patterns and
//! delivers matching `PutEvents` entries to SQS targets itself, so events reach
//! the queue the way the deployed stack's do.
//!
//! One difference from AWS: EventBridge refuses `PutEvents` with an `aws.*`
//! source (only AWS services emit those); moto accepts them, which is what
//! lets a test stand in for EC2 and AWS Health.

pub use aws_sdk_eventbridge::Client;
use aws_sdk_eventbridge::primitives::DateTime;
use aws_sdk_eventbridge::types::{PutEventsRequestEntry, Target};
use serde_json::Value;

/// An EventBridge client for moto.
pub async fn client(m: &crate::moto::Moto) -> Client {
    Client::new(&m.sdk_config().await)
}

/// One rule of the template: its logical id and event pattern (as JSON).
#[derive(Clone, Debug, PartialEq)]
pub struct TemplateRule {
    /// The resource's logical id (e.g. `SpotInterruptionRule`).
    pub name: String,
    /// Its `EventPattern`.
    pub pattern: Value,
}

/// The `AWS::Events::Rule` resources of `template` (the SAM template's text).
pub fn template_rules(template: &str) -> Result<Vec<TemplateRule>, String> {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(template).map_err(|e| format!("template.yaml: {e}"))?;
    let resources = doc
        .get("Resources")
        .and_then(|r| r.as_mapping())
        .ok_or("template.yaml has no Resources")?;
    let mut rules = Vec::new();
    for (name, resource) in resources {
        if resource.get("Type").and_then(|t| t.as_str()) != Some("AWS::Events::Rule") {
            continue;
        }
        let name = name.as_str().ok_or("a resource name is not a string")?.to_string();
        let pattern = resource
            .get("Properties")
            .and_then(|p| p.get("EventPattern"))
            .ok_or_else(|| format!("{name} has no EventPattern"))?;
        let pattern = serde_json::to_value(pattern).map_err(|e| format!("{name}'s EventPattern: {e}"))?;
        rules.push(TemplateRule { name, pattern });
    }
    Ok(rules)
}

/// The repository's `template.yaml` rules.
pub fn repo_template_rules() -> Result<Vec<TemplateRule>, String> {
    let path = crate::moto::repo_root().join("template.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    template_rules(&text)
}

/// Creates each rule on the default bus with the queue `queue_arn` as its target.
pub async fn route_to_queue(client: &Client, rules: &[TemplateRule], queue_arn: &str) -> Result<(), String> {
    for rule in rules {
        client
            .put_rule()
            .name(&rule.name)
            .event_pattern(rule.pattern.to_string())
            .send()
            .await
            .map_err(|e| format!("PutRule {}: {e:?}", rule.name))?;
        let target = Target::builder()
            .id("queue")
            .arn(queue_arn)
            .build()
            .map_err(|e| e.to_string())?;
        client
            .put_targets()
            .rule(&rule.name)
            .targets(target)
            .send()
            .await
            .map_err(|e| format!("PutTargets {}: {e:?}", rule.name))?;
    }
    Ok(())
}

/// Puts one event on the default bus; returns the id EventBridge gave it.
pub async fn put_event(
    client: &Client,
    source: &str,
    detail_type: &str,
    detail: &Value,
    time: jiff::Timestamp,
) -> Result<String, String> {
    let entry = PutEventsRequestEntry::builder()
        .source(source)
        .detail_type(detail_type)
        .detail(detail.to_string())
        .time(DateTime::from_millis(time.as_millisecond()))
        .build();
    let out = client
        .put_events()
        .entries(entry)
        .send()
        .await
        .map_err(|e| format!("PutEvents: {e:?}"))?;
    match out.entries().first() {
        Some(e) if e.error_code().is_none() => e.event_id().map(str::to_string).ok_or("PutEvents gave no id".into()),
        Some(e) => Err(format!(
            "PutEvents refused the entry: {:?} {:?}",
            e.error_code(),
            e.error_message()
        )),
        None => Err("PutEvents answered no entry".into()),
    }
}

/// Puts EC2's two-minute spot interruption warning for `instance`, dated now.
pub async fn put_spot_warning(client: &Client, instance: &str) -> Result<String, String> {
    put_event(
        client,
        "aws.ec2",
        "EC2 Spot Instance Interruption Warning",
        &serde_json::json!({"instance-id": instance, "instance-action": "terminate"}),
        jiff::Timestamp::now(),
    )
    .await
}
