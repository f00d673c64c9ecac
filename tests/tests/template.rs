//! The SAM template agrees with the code it deploys: every function is a
//! workspace binary, the state table has the keys, index and TTL the state
//! store uses, and each function gets the environment its code reads.

use std::path::PathBuf;

use serde_yaml_ng::Value;

fn template() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

fn resource<'a>(t: &'a Value, name: &str) -> &'a Value {
    t.get("Resources")
        .and_then(|r| r.get(name))
        .unwrap_or_else(|| panic!("template has no resource {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Sequence(s) => s.iter().flat_map(strings).collect(),
        Value::Mapping(m) => m
            .iter()
            .flat_map(|(k, v)| strings(k).into_iter().chain(strings(v)))
            .collect(),
        Value::Tagged(t) => strings(&t.value),
        _ => vec![],
    }
}

#[test]
fn every_function_is_a_workspace_binary() {
    let t = template();
    for (resource_name, binary) in [
        ("ProvisionFunction", "provision"),
        ("LaunchFunction", "launch"),
        ("InterruptFunction", "interrupt"),
        ("SweepFunction", "sweep"),
    ] {
        let r = resource(&t, resource_name);
        assert_eq!(r["Type"].as_str(), Some("AWS::Serverless::Function"));
        assert_eq!(r["Metadata"]["BuildProperties"]["Binary"].as_str(), Some(binary));
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../functions/{binary}/Cargo.toml"));
        let text = std::fs::read_to_string(&manifest).unwrap_or_else(|_| panic!("no crate for {binary}"));
        assert!(
            text.contains(&format!("name = \"{binary}\"")),
            "{manifest:?} builds {binary}"
        );
    }
}

#[test]
fn state_table_matches_the_state_store() {
    let t = template();
    let table = &resource(&t, "StateTable")["Properties"];
    let keys: Vec<(String, String)> = table["KeySchema"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["AttributeName"].as_str().unwrap().to_string(),
                k["KeyType"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(keys, vec![("pk".into(), "HASH".into()), ("sk".into(), "RANGE".into())]);
    let gsi = &table["GlobalSecondaryIndexes"][0];
    assert_eq!(gsi["IndexName"].as_str(), Some(nodesmith::state::INSTANCE_INDEX));
    assert_eq!(gsi["KeySchema"][0]["AttributeName"].as_str(), Some("instanceId"));
    assert_eq!(
        table["TimeToLiveSpecification"]["AttributeName"].as_str(),
        Some(nodesmith::state::TTL_ATTRIBUTE)
    );
}

#[test]
fn functions_get_the_environment_their_code_reads() {
    let t = template();
    let globals: Vec<String> = strings(&t["Globals"]["Function"]["Environment"]["Variables"]);
    for var in [
        "NODESMITH_CLUSTER_NAME",
        "NODESMITH_TABLE",
        "NODESMITH_LAUNCH_QUEUE_URL",
        "NODESMITH_PENDING_QUEUE_URL",
    ] {
        assert!(globals.contains(&var.to_string()), "{var} is not set for the functions");
    }
    // Whoever asks for solves may send to the pending-pods queue.
    for f in ["LaunchFunction", "SweepFunction"] {
        let policies = strings(&resource(&t, f)["Properties"]["Policies"]);
        assert!(
            policies.iter().any(|p| p == "PendingPodsQueue.QueueName"),
            "{f} cannot send to the pending-pods queue: {policies:?}"
        );
    }
    let provision = strings(&resource(&t, "ProvisionFunction")["Properties"]["Environment"]);
    assert!(provision.contains(&"NODESMITH_PENDING_DLQ_URL".to_string()));
    // SQS-triggered functions report partial batch failures.
    for f in ["ProvisionFunction", "LaunchFunction", "InterruptFunction"] {
        let events = strings(&resource(&t, f)["Properties"]["Events"]);
        assert!(
            events.contains(&"ReportBatchItemFailures".to_string()),
            "{f} must report batch item failures"
        );
    }
}

fn int(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not a number: {v:?}"))
}

/// The rules that feed the interruption queue, by resource name.
fn interruption_rules(t: &Value) -> Vec<(String, &Value)> {
    resources_of(t, "AWS::Events::Rule")
        .into_iter()
        .filter(|(_, r)| strings(&r["Properties"]["Targets"]).contains(&"InterruptionQueue.Arn".to_string()))
        .collect()
}

#[test]
fn a_failing_interruption_message_reaches_the_dead_letter_queue() {
    let t = template();
    let q = &resource(&t, "InterruptionQueue")["Properties"];
    let visibility = int(&q["VisibilityTimeout"]);
    let retention = int(&q["MessageRetentionPeriod"]);
    let receives = int(&q["RedrivePolicy"]["maxReceiveCount"]);
    assert!(
        retention > visibility * receives,
        "retention {retention}s must outlast {receives} receives of {visibility}s"
    );
    let timeout = int(&resource(&t, "InterruptFunction")["Properties"]["Timeout"]);
    assert!(
        visibility >= timeout,
        "a message must stay hidden while the function runs"
    );
    let dlq = strings(&q["RedrivePolicy"]);
    assert!(dlq.contains(&"InterruptionDLQ.Arn".to_string()));
}

#[test]
fn rules_subscribe_to_every_kind_the_parser_acts_on() {
    let t = template();
    let mut subscribed: Vec<(String, String)> = Vec::new();
    for (_, r) in interruption_rules(&t) {
        let p = &r["Properties"]["EventPattern"];
        for source in strings(&p["source"]) {
            for dt in strings(&p["detail-type"]) {
                subscribed.push((source.clone(), dt));
            }
        }
    }
    subscribed.sort();
    let mut want: Vec<(String, String)> = nodesmith::interruption::event::SUBSCRIBED
        .iter()
        .map(|(s, d)| (s.to_string(), d.to_string()))
        .collect();
    want.sort();
    assert_eq!(subscribed, want);
    // Every subscribed pair is something the parser classifies as a known kind.
    for (source, dt) in &want {
        let e = nodesmith::interruption::classify(&serde_json::json!({"source": source, "detail-type": dt}));
        let nodesmith::interruption::Kind::Unknown { error } = e.kind else {
            panic!()
        };
        assert!(error.starts_with("detail"), "{dt}: {error}");
    }
}

#[test]
fn only_the_interruption_rules_may_send_to_the_queue() {
    let t = template();
    let statements = resource(&t, "InterruptionQueuePolicy")["Properties"]["PolicyDocument"]["Statement"]
        .as_sequence()
        .unwrap();
    let mut rules: Vec<String> = interruption_rules(&t)
        .into_iter()
        .map(|(name, _)| format!("{name}.Arn"))
        .collect();
    rules.sort();
    assert_eq!(rules.len(), 5, "{rules:?}");
    for s in statements.iter().filter(|s| s["Effect"].as_str() == Some("Allow")) {
        assert_eq!(strings(&s["Principal"]), ["Service", "events.amazonaws.com"]);
        let mut allowed = strings(&s["Condition"]["ArnEquals"]["aws:SourceArn"]);
        allowed.sort();
        assert_eq!(allowed, rules);
    }
    // interrupt asks provision for solves and reads its rebalance mode.
    let f = &resource(&t, "InterruptFunction")["Properties"];
    assert!(strings(&f["Policies"]).contains(&"PendingPodsQueue.QueueName".to_string()));
    assert!(strings(&f["Environment"]).contains(&"NODESMITH_REBALANCE".to_string()));
}

#[test]
fn instance_profiles_are_managed_under_the_nodesmith_path_and_tag_only() {
    let t = template();
    let statements = |f: &str| -> Vec<Value> {
        resource(&t, f)["Properties"]["Policies"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|p| p.get("Statement"))
            .flat_map(|s| s.as_sequence().cloned().unwrap_or_default())
            .collect()
    };
    let allowing = |f: &str, action: &str| -> Vec<Value> {
        statements(f)
            .into_iter()
            .filter(|s| strings(&s["Action"]).iter().any(|a| a == action))
            .collect()
    };
    let path = nodesmith::launch::profile::PROFILE_PATH.trim_matches('/');
    for (f, action, tagged) in [
        (
            "LaunchFunction",
            "iam:CreateInstanceProfile",
            "aws:RequestTag/eks:eks-cluster-name",
        ),
        (
            "LaunchFunction",
            "iam:AddRoleToInstanceProfile",
            "aws:ResourceTag/eks:eks-cluster-name",
        ),
        ("LaunchFunction", "iam:GetInstanceProfile", ""),
        ("SweepFunction", "iam:ListInstanceProfiles", ""),
        ("SweepFunction", "iam:GetInstanceProfile", ""),
        (
            "SweepFunction",
            "iam:RemoveRoleFromInstanceProfile",
            "aws:ResourceTag/eks:eks-cluster-name",
        ),
        (
            "SweepFunction",
            "iam:DeleteInstanceProfile",
            "aws:ResourceTag/eks:eks-cluster-name",
        ),
    ] {
        let found = allowing(f, action);
        assert_eq!(found.len(), 1, "{f} is allowed {action} once: {found:?}");
        let resource = strings(&found[0]["Resource"]).join(" ");
        assert!(
            resource.contains(":instance-profile/"),
            "{f} {action} on instance profiles only: {resource}"
        );
        if action != "iam:GetInstanceProfile" || f == "SweepFunction" {
            assert!(
                resource.contains(&format!("instance-profile/{path}/")),
                "{f} {action} under the nodesmith path: {resource}"
            );
        }
        if !tagged.is_empty() {
            let condition = strings(&found[0]["Condition"]);
            assert!(
                condition.iter().any(|c| c == tagged) && condition.iter().any(|c| c == "ClusterName"),
                "{f} {action} needs {tagged}=<cluster>: {condition:?}"
            );
        }
    }
}

#[test]
fn the_sweep_may_resolve_node_classes_for_drift() {
    let t = template();
    let policies = strings(&resource(&t, "SweepFunction")["Properties"]["Policies"]);
    for action in [
        "eks:DescribeCluster",
        "ssm:GetParameter",
        "ec2:DescribeImages",
        "ec2:DescribeSubnets",
        "ec2:DescribeSecurityGroups",
    ] {
        assert!(
            policies.iter().any(|p| p == action),
            "the sweep cannot resolve EC2NodeClasses without {action}: {policies:?}"
        );
    }
}

/// The resources of one type, by name.
fn resources_of<'a>(t: &'a Value, kind: &str) -> Vec<(String, &'a Value)> {
    t["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some(kind))
        .map(|(k, r)| (k.as_str().unwrap().to_string(), r))
        .collect()
}

/// The target of a `!Ref` or `!GetAtt`, if `v` is one.
fn reference(v: &Value) -> Option<String> {
    match v {
        Value::Tagged(t) if t.tag == "Ref" || t.tag == "GetAtt" => t.value.as_str().map(str::to_string),
        _ => None,
    }
}

#[test]
fn every_queue_is_encrypted_refuses_plain_http_and_dead_letters() {
    let t = template();
    let queues = resources_of(&t, "AWS::SQS::Queue");
    assert_eq!(queues.len(), 6);
    let dead_letter_targets: Vec<String> = queues
        .iter()
        .filter_map(|(_, q)| reference(&q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]))
        .collect();
    // Queues under a policy that denies every request without TLS.
    let tls_only: Vec<String> = resources_of(&t, "AWS::SQS::QueuePolicy")
        .into_iter()
        .filter(|(_, p)| {
            p["Properties"]["PolicyDocument"]["Statement"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|s| {
                    s["Effect"].as_str() == Some("Deny")
                        && s["Principal"].as_str() == Some("*")
                        && s["Condition"]["Bool"]["aws:SecureTransport"].as_str() == Some("false")
                })
        })
        .flat_map(|(_, p)| {
            p["Properties"]["Queues"]
                .as_sequence()
                .unwrap()
                .iter()
                .filter_map(reference)
        })
        .collect();
    for (name, q) in &queues {
        let p = &q["Properties"];
        assert_eq!(
            p["SqsManagedSseEnabled"].as_bool(),
            Some(true),
            "{name} is not encrypted"
        );
        assert!(tls_only.contains(name), "{name} accepts requests without TLS");
        let is_dead_letter_queue = dead_letter_targets.contains(&format!("{name}.Arn"));
        let has_one = reference(&p["RedrivePolicy"]["deadLetterTargetArn"]).is_some();
        assert!(
            is_dead_letter_queue != has_one,
            "{name}: every queue has a dead-letter queue or is one"
        );
    }
}

#[test]
fn every_function_logs_json_to_a_group_with_retention() {
    let t = template();
    let functions = resources_of(&t, "AWS::Serverless::Function");
    assert_eq!(functions.len(), 4);
    for (name, f) in functions {
        let logging = &f["Properties"]["LoggingConfig"];
        assert_eq!(logging["LogFormat"].as_str(), Some("JSON"), "{name}");
        let group = reference(&logging["LogGroup"]).unwrap_or_else(|| panic!("{name} has no log group"));
        let g = resource(&t, &group);
        assert_eq!(g["Type"].as_str(), Some("AWS::Logs::LogGroup"));
        assert!(
            !g["Properties"]["RetentionInDays"].is_null(),
            "{group} keeps logs forever"
        );
    }
}

#[test]
fn sqs_batches_above_ten_wait_at_least_a_second() {
    // SQS refuses an event source mapping with BatchSize > 10 and no window.
    let t = template();
    for (name, f) in resources_of(&t, "AWS::Serverless::Function") {
        for (_, e) in f["Properties"]["Events"].as_mapping().unwrap() {
            if e["Type"].as_str() != Some("SQS") || int(&e["Properties"]["BatchSize"]) <= 10 {
                continue;
            }
            let window = &e["Properties"]["MaximumBatchingWindowInSeconds"];
            let least = match reference(window) {
                Some(param) => int(&t["Parameters"][param.as_str()]["MinValue"]),
                None => int(window),
            };
            assert!(least >= 1, "{name}: batch window may be {least} s");
        }
    }
}

/// The IAM actions of the AWS calls in `shared/src` (EC2, EKS, SSM, IAM):
/// every `.operation()` called on a client (`ec2`, `eks`, `ssm`, `iam`,
/// `client`) in a file that uses one of those SDKs, with its service told by
/// the operation's name.
fn actions_the_code_calls() -> Vec<(String, String)> {
    fn files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/src");
    let mut all = Vec::new();
    files(&root, &mut all);
    let verbs = [
        "describe_",
        "create_",
        "delete_",
        "terminate_",
        "run_",
        "list_",
        "add_",
        "remove_",
        "tag_",
        "get_parameter",
        "get_instance_profile",
    ];
    let mut out = Vec::new();
    for f in all {
        let text = std::fs::read_to_string(&f).unwrap();
        if !["aws_sdk_ec2", "aws_sdk_eks", "aws_sdk_ssm", "aws_sdk_iam"]
            .iter()
            .any(|c| text.contains(c))
        {
            continue;
        }
        let b = text.as_bytes();
        for (i, _) in text.match_indices('.') {
            let mut j = i + 1;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            let start = j;
            while j < b.len() && (b[j].is_ascii_lowercase() || b[j] == b'_') {
                j += 1;
            }
            let op = &text[start..j];
            if !text[j..].starts_with("()") || !verbs.iter().any(|v| op.starts_with(v)) {
                continue;
            }
            // An SDK operation is called on a client; getters and
            // nodesmith's own methods are called on other things.
            let before = text[..i].trim_end();
            let receiver: String = before
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if !["ec2", "eks", "ssm", "iam", "client"].contains(&receiver.as_str()) {
                continue;
            }
            let service = if op == "describe_cluster" {
                "eks"
            } else if op.starts_with("get_parameter") {
                "ssm"
            } else if op.contains("instance_profile") {
                "iam"
            } else {
                "ec2"
            };
            let pascal: String = op
                .split('_')
                .map(|w| {
                    let mut c = w.chars();
                    c.next()
                        .map(|h| h.to_ascii_uppercase().to_string() + c.as_str())
                        .unwrap_or_default()
                })
                .collect();
            let file = f.strip_prefix(&root).unwrap().display().to_string();
            out.push((format!("{service}:{pascal}"), file));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn every_aws_call_the_code_makes_is_allowed_to_some_function() {
    let t = template();
    let granted: Vec<String> = resources_of(&t, "AWS::Serverless::Function")
        .into_iter()
        .flat_map(|(_, f)| strings(&f["Properties"]["Policies"]))
        .collect();
    let calls = actions_the_code_calls();
    // The scan must find the calls it exists for.
    for known in [
        "ec2:CreateFleet",
        "ec2:DescribeInstanceTypes",
        "eks:DescribeCluster",
        "iam:CreateInstanceProfile",
    ] {
        assert!(calls.iter().any(|(a, _)| a == known), "scan missed {known}: {calls:?}");
    }
    for (action, file) in calls {
        assert!(
            granted.contains(&action),
            "{file} calls {action}, which no function may"
        );
    }
}

/// Every IAM policy statement of a function, with the function's name.
fn statements(t: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (name, f) in resources_of(t, "AWS::Serverless::Function") {
        for p in f["Properties"]["Policies"].as_sequence().unwrap() {
            for s in p["Statement"].as_sequence().into_iter().flatten() {
                out.push((name.clone(), s.clone()));
            }
        }
    }
    out
}

#[test]
fn launch_passes_only_the_node_roles_the_stack_knows_and_only_to_ec2() {
    let t = template();
    let pass: Vec<(String, Value)> = statements(&t)
        .into_iter()
        .filter(|(_, s)| strings(&s["Action"]).contains(&"iam:PassRole".to_string()))
        .collect();
    assert_eq!(pass.len(), 1, "{pass:?}");
    let (name, s) = &pass[0];
    assert_eq!(name, "LaunchFunction");
    let resources = strings(&s["Resource"]);
    assert!(
        !resources.contains(&"*".to_string()),
        "PassRole on any role: {resources:?}"
    );
    assert!(resources.contains(&"NodeRole.Arn".to_string()), "{resources:?}");
    assert_eq!(
        s["Condition"]["StringEquals"]["iam:PassedToService"].as_str(),
        Some("ec2.amazonaws.com")
    );
    // The node role is an EKS worker's and joins through an EC2_LINUX access entry.
    let policies = strings(&resource(&t, "NodeRole")["Properties"]["ManagedPolicyArns"]).join(" ");
    for p in [
        "AmazonEKSWorkerNodePolicy",
        "AmazonEKS_CNI_Policy",
        "AmazonEC2ContainerRegistryReadOnly",
        "AmazonSSMManagedInstanceCore",
    ] {
        assert!(policies.contains(p), "node role lacks {p}");
    }
    let entries = resources_of(&t, "AWS::EKS::AccessEntry");
    assert!(entries.iter().any(|(_, e)| {
        reference(&e["Properties"]["PrincipalArn"]).as_deref() == Some("NodeRole.Arn")
            && e["Properties"]["Type"].as_str() == Some("EC2_LINUX")
    }));
}

#[test]
fn every_function_role_enters_the_cluster_as_the_group_the_rbac_binds_and_nothing_more() {
    let t = template();
    let rbac = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../infra/k8s/lambda-rbac.yaml"))
        .unwrap();
    let binding = serde_yaml_ng::Deserializer::from_str(&rbac)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|d| d["kind"].as_str() == Some("ClusterRoleBinding"))
        .expect("lambda-rbac.yaml binds its ClusterRole");
    let group = binding["subjects"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|s| s["kind"].as_str() == Some("Group"))
        .and_then(|s| s["name"].as_str())
        .expect("the binding names a group")
        .to_string();
    let entries = resources_of(&t, "AWS::EKS::AccessEntry");
    for (name, _) in resources_of(&t, "AWS::Serverless::Function") {
        let role = format!("{name}Role.Arn");
        let entry = entries
            .iter()
            .find(|(_, e)| reference(&e["Properties"]["PrincipalArn"]).as_deref() == Some(role.as_str()))
            .unwrap_or_else(|| panic!("{name} has no access entry"));
        let p = &entry.1["Properties"];
        assert_eq!(p["Type"].as_str(), Some("STANDARD"));
        assert_eq!(strings(&p["KubernetesGroups"]), std::slice::from_ref(&group), "{name}");
    }
    for (name, e) in entries {
        let p = &e["Properties"];
        assert!(
            p["AccessPolicies"].is_null(),
            "{name} gets an access policy beyond the RBAC"
        );
        assert!(
            !strings(&p["KubernetesGroups"]).iter().any(|g| g.starts_with("system:")),
            "{name} maps to a system group"
        );
    }
}

#[test]
fn terminate_and_delete_touch_only_what_nodesmith_tagged_for_this_cluster() {
    let t = template();
    let key = format!("aws:ResourceTag/{}", nodesmith::ec2::instances::CLUSTER_NAME_TAG);
    let mut who = Vec::new();
    for (name, s) in statements(&t) {
        let actions = strings(&s["Action"]);
        if !actions
            .iter()
            .any(|a| a == "ec2:TerminateInstances" || a == "ec2:DeleteLaunchTemplate")
        {
            continue;
        }
        let scoped = reference(&s["Condition"]["StringEquals"][key.as_str()]);
        assert_eq!(scoped.as_deref(), Some("ClusterName"), "{name}: {actions:?} unscoped");
        who.extend(actions.into_iter().map(|a| (name.clone(), a)));
    }
    // The sweep collects and disrupts; launch ends a claim's second launches.
    for want in [
        ("SweepFunction", "ec2:TerminateInstances"),
        ("SweepFunction", "ec2:DeleteLaunchTemplate"),
        ("LaunchFunction", "ec2:TerminateInstances"),
    ] {
        assert!(
            who.iter().any(|(n, a)| n == want.0 && a == want.1),
            "{want:?} missing: {who:?}"
        );
    }
}

#[test]
fn each_queue_has_one_policy_and_only_the_three_askers_may_send_launches() {
    let t = template();
    let mut seen: Vec<String> = Vec::new();
    for (name, p) in resources_of(&t, "AWS::SQS::QueuePolicy") {
        for q in p["Properties"]["Queues"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(reference)
        {
            // A later policy on the same queue would replace the earlier one.
            assert!(!seen.contains(&q), "{q} is under two policies ({name})");
            seen.push(q);
        }
    }
    let statements = resource(&t, "LaunchQueuePolicy")["Properties"]["PolicyDocument"]["Statement"]
        .as_sequence()
        .unwrap()
        .clone();
    let deny = statements
        .iter()
        .find(|s| s["Effect"].as_str() == Some("Deny") && s["Action"].as_str() == Some("sqs:SendMessage"))
        .expect("the launch queue denies other senders");
    let mut allowed: Vec<String> = deny["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(reference)
        .collect();
    allowed.sort();
    // Exactly the functions whose policies may send to the launch queue.
    let mut senders: Vec<String> = resources_of(&t, "AWS::Serverless::Function")
        .into_iter()
        .filter(|(_, f)| strings(&f["Properties"]["Policies"]).contains(&"LaunchQueue.QueueName".to_string()))
        .map(|(n, _)| format!("{n}Role.Arn"))
        .collect();
    senders.sort();
    assert_eq!(allowed, senders);
    assert_eq!(senders.len(), 3);
}

#[test]
fn the_forwarder_may_only_send_pending_pods_through_its_service_account() {
    let t = template();
    let manifest =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../infra/k8s/forwarder.yaml")).unwrap();
    let sa = serde_yaml_ng::Deserializer::from_str(&manifest)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|d| d["kind"].as_str() == Some("ServiceAccount"))
        .expect("forwarder.yaml has a service account");
    let assoc = &resource(&t, "ForwarderPodIdentity")["Properties"];
    assert_eq!(assoc["ServiceAccount"], sa["metadata"]["name"]);
    assert_eq!(assoc["Namespace"], sa["metadata"]["namespace"]);
    assert_eq!(reference(&assoc["RoleArn"]).as_deref(), Some("ForwarderRole.Arn"));
    let role = &resource(&t, "ForwarderRole")["Properties"];
    assert!(strings(&role["AssumeRolePolicyDocument"]).contains(&"pods.eks.amazonaws.com".to_string()));
    let grants: Vec<&Value> = role["Policies"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|p| p["PolicyDocument"]["Statement"].as_sequence().unwrap().iter())
        .collect();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0]["Action"].as_str(), Some("sqs:SendMessage"));
    assert_eq!(
        reference(&grants[0]["Resource"]).as_deref(),
        Some("PendingPodsQueue.Arn")
    );
}
