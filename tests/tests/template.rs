//! The SAM template agrees with the code it deploys: every function is a
//! workspace binary, the state table has the keys, index and TTL the state
//! store uses, and each function gets the environment its code reads.

use std::collections::BTreeMap;
use std::path::PathBuf;

use nodesmith::lambda::Function;
use serde_yaml_ng::Value;

pub(super) fn template() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

pub(super) fn resource<'a>(t: &'a Value, name: &str) -> &'a Value {
    t.get("Resources")
        .and_then(|r| r.get(name))
        .unwrap_or_else(|| panic!("template has no resource {name}"))
}

pub(super) fn strings(v: &Value) -> Vec<String> {
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
fn every_function_is_served_by_the_lambda_binary_as_its_handler() {
    let t = template();
    let mut handlers = Vec::new();
    for (resource_name, r) in resources_of(&t, "AWS::Serverless::Function") {
        assert_eq!(
            r["Metadata"]["BuildMethod"].as_str(),
            Some("makefile"),
            "{resource_name}"
        );
        let handler = r["Properties"]["Handler"].as_str().unwrap_or_default();
        let function: Function = handler
            .parse()
            .unwrap_or_else(|e| panic!("{resource_name}'s Handler {handler:?}: {e}"));
        assert_eq!(format!("{}Function", capitalised(function.name())), resource_name);
        handlers.push(function);
    }
    assert_eq!(handlers, Function::ALL, "one resource per function, in order");
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../functions/lambda/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains(&format!("name = \"{}\"", nodesmith_tests::LAMBDA_BINARY)));
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// What `sam build` runs for one function: the Makefile's commands, printed
/// by `make -n` as SAM would invoke it (in the source, ARTIFACTS_DIR set).
fn sam_build_commands(logical_id: &str) -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("make")
        .current_dir(&root)
        .args(["-n", "-s", &format!("build-{logical_id}"), "ARTIFACTS_DIR=ARTIFACTS"])
        .env_remove("LAMBDA_ARCH")
        .output()
        .expect("make runs");
    assert!(
        out.status.success(),
        "make build-{logical_id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn sam_build_compiles_and_links_one_binary_for_all_four_functions() {
    let t = template();
    let arch = t["Globals"]["Function"]["Architectures"][0].as_str();
    assert_eq!(arch, Some("arm64"), "the Makefile's default target is arm64");
    let functions = resources_of(&t, "AWS::Serverless::Function");
    assert_eq!(functions.len(), 4);
    let binary = nodesmith_tests::LAMBDA_BINARY;
    for (logical_id, _) in &functions {
        // Every target asks for the one binary: whichever SAM runs first
        // builds it and the rest find it fresh.
        assert_eq!(
            sam_build_commands(logical_id),
            [
                format!("cargo lambda build --release --locked --arm64 --package {binary}"),
                format!("cp target/lambda/{binary}/bootstrap \"ARTIFACTS/bootstrap\""),
            ],
            "build-{logical_id}"
        );
    }
    // Without build_in_source SAM would copy the source, target/ included,
    // once per function and compile four times.
    let samconfig =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../samconfig.toml")).unwrap();
    let config: toml_edit::DocumentMut = samconfig.parse().unwrap();
    assert_eq!(
        config["default"]["build"]["parameters"]["build_in_source"].as_bool(),
        Some(true)
    );
    assert!(
        config["default"]["build"]["parameters"].get("beta_features").is_none(),
        "the makefile build needs no beta features"
    );
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

/// The table is a cache nodesmith can rebuild (it re-adopts its nodes), but
/// losing it costs a fleet's history: it outlives a `sam delete` and a
/// replacement, and can be restored to any point of the last 35 days.
#[test]
fn the_state_table_is_retained_and_recoverable() {
    let t = template();
    let table = resource(&t, "StateTable");
    assert_eq!(table["DeletionPolicy"].as_str(), Some("Retain"));
    assert_eq!(table["UpdateReplacePolicy"].as_str(), Some("Retain"));
    assert_eq!(
        table["Properties"]["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"].as_bool(),
        Some(true)
    );
    // Instances carry the stack's identity, so a second stack of the same
    // cluster never takes this one's nodes for leaks.
    let env = &t["Globals"]["Function"]["Environment"]["Variables"]["NODESMITH_STACK_NAME"];
    assert_eq!(strings(env), vec!["AWS::StackName".to_string()], "{env:?}");
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
    for f in ["LaunchFunction", "SweepFunction", "InterruptFunction"] {
        assert!(
            may_send(&t, f, "PendingPodsQueue"),
            "{f} cannot send to the pending-pods queue"
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

pub(super) fn int(v: &Value) -> i64 {
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
    // interrupt reads its rebalance mode.
    let f = &resource(&t, "InterruptFunction")["Properties"];
    assert!(strings(&f["Environment"]).contains(&"NODESMITH_REBALANCE".to_string()));
}

/// The resources of one type, by name.
pub(super) fn resources_of<'a>(t: &'a Value, kind: &str) -> Vec<(String, &'a Value)> {
    t["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some(kind))
        .map(|(k, r)| (k.as_str().unwrap().to_string(), r))
        .collect()
}

/// The target of a `!Ref` or `!GetAtt`, if `v` is one.
pub(super) fn reference(v: &Value) -> Option<String> {
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
        // The functions filter by Lambda's level (AWS_LAMBDA_LOG_LEVEL): no
        // RUST_LOG may override it.
        assert_eq!(
            reference(&logging["ApplicationLogLevel"]).as_deref(),
            Some("LogLevel"),
            "{name}"
        );
        assert!(
            f["Properties"]["Environment"]["Variables"]["RUST_LOG"].is_null(),
            "{name}"
        );
        let group = reference(&logging["LogGroup"]).unwrap_or_else(|| panic!("{name} has no log group"));
        let g = resource(&t, &group);
        assert_eq!(g["Type"].as_str(), Some("AWS::Logs::LogGroup"));
        assert!(
            !g["Properties"]["RetentionInDays"].is_null(),
            "{group} keeps logs forever"
        );
    }
    assert!(t["Globals"]["Function"]["Environment"]["Variables"]["RUST_LOG"].is_null());
    assert_eq!(
        strings(&t["Parameters"]["LogLevel"]["AllowedValues"]),
        ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"],
        "Lambda's application log levels"
    );
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

/// Whether a function's role may send to one of the stack's queues.
pub(super) fn may_send(t: &Value, function: &str, queue: &str) -> bool {
    let arn = format!("arn:aws:sqs:{}:{}:{queue}", iam::REGION, iam::ACCOUNT);
    iam::allows(
        &iam::statements(t, function),
        &iam::Request::new("sqs:SendMessage", arn),
    )
}

#[test]
fn launch_passes_only_the_node_roles_the_stack_knows_and_only_to_ec2() {
    let t = template();
    let node_role = format!("arn:aws:iam::{}:role/NodeRole", iam::ACCOUNT);
    for (name, _) in resources_of(&t, "AWS::Serverless::Function") {
        let s = iam::statements(&t, &name);
        let pass =
            iam::Request::new("iam:PassRole", node_role.as_str()).key("iam:PassedToService", "ec2.amazonaws.com");
        assert_eq!(
            iam::allows(&s, &pass),
            name == "LaunchFunction",
            "{name} passes the node role"
        );
    }
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
fn each_function_role_enters_the_cluster_as_its_own_group_bound_to_its_own_role_and_nothing_more() {
    let t = template();
    let rbac = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../infra/k8s/lambda-rbac.yaml"))
        .unwrap();
    // Group -> the ClusterRoles bound to it.
    let mut bound: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in
        serde_yaml_ng::Deserializer::from_str(&rbac).map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
    {
        if d["kind"].as_str() != Some("ClusterRoleBinding") {
            continue;
        }
        for s in d["subjects"].as_sequence().into_iter().flatten() {
            assert_eq!(s["kind"].as_str(), Some("Group"), "{s:?}");
            bound
                .entry(s["name"].as_str().unwrap().to_string())
                .or_default()
                .push(d["roleRef"]["name"].as_str().unwrap().to_string());
        }
    }
    let entries = resources_of(&t, "AWS::EKS::AccessEntry");
    let functions = resources_of(&t, "AWS::Serverless::Function");
    assert_eq!(functions.len(), 4);
    for (name, f) in functions {
        let binary = f["Properties"]["Handler"].as_str().unwrap();
        let role = format!("{name}Role.Arn");
        let entry = entries
            .iter()
            .find(|(_, e)| reference(&e["Properties"]["PrincipalArn"]).as_deref() == Some(role.as_str()))
            .unwrap_or_else(|| panic!("{name} has no access entry"));
        let p = &entry.1["Properties"];
        assert_eq!(p["Type"].as_str(), Some("STANDARD"));
        // Its own group, and that group bound to its own ClusterRole only: a
        // function may do what its code does, not what the others' do.
        let group = format!("nodesmith:{binary}");
        assert_eq!(strings(&p["KubernetesGroups"]), std::slice::from_ref(&group), "{name}");
        assert_eq!(
            bound.get(&group).map(Vec::as_slice),
            Some(&[format!("nodesmith-{binary}")][..]),
            "{group} in lambda-rbac.yaml"
        );
    }
    assert!(
        !bound.contains_key("nodesmith:lambda"),
        "no group shared by every function"
    );
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
        .filter(|(n, _)| may_send(&t, n, "LaunchQueue"))
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
    let Value::Tagged(trust) = &role["AssumeRolePolicyDocument"] else {
        panic!("the forwarder's trust depends on ForwarderUsesIrsa")
    };
    // Pod Identity always; IRSA, when asked for, for exactly the forwarder's ServiceAccount.
    let pod_identity = iam::resolve(&t, &trust.value[2]);
    assert_eq!(
        pod_identity["Statement"][0]["Principal"]["Service"],
        "pods.eks.amazonaws.com"
    );
    let irsa = iam::resolve(&t, &trust.value[1]);
    let irsa: serde_json::Value = serde_json::from_str(irsa.as_str().unwrap()).unwrap();
    let host = "ForwarderOidcProvider-value";
    assert_eq!(irsa["Statement"][0], pod_identity["Statement"][0]);
    let web = &irsa["Statement"][1];
    assert_eq!(web["Action"], "sts:AssumeRoleWithWebIdentity");
    assert!(
        web["Principal"]["Federated"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":oidc-provider/{host}"))
    );
    assert_eq!(
        web["Condition"]["StringEquals"][format!("{host}:sub")].as_str(),
        Some(
            format!(
                "system:serviceaccount:{}:{}",
                sa["metadata"]["namespace"].as_str().unwrap(),
                sa["metadata"]["name"].as_str().unwrap()
            )
            .as_str()
        )
    );
    assert_eq!(
        web["Condition"]["StringEquals"][format!("{host}:aud")],
        "sts.amazonaws.com"
    );
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

/// A small IAM policy evaluator over the template's policies, with the
/// template's intrinsics resolved for a stack in account 111122223333,
/// us-east-1, cluster `demo`, every optional parameter left empty.
pub(super) mod iam {
    use std::collections::BTreeMap;

    use serde_json::{Value as J, json};
    use serde_yaml_ng::Value;

    pub const CLUSTER: &str = "demo";
    pub const ACCOUNT: &str = "111122223333";
    pub const REGION: &str = "us-east-1";

    /// What a resource's `!GetAtt X.Arn` is in the evaluated stack.
    fn arn_of(t: &Value, name: &str) -> String {
        let kind = t["Resources"][name]["Type"]
            .as_str()
            .unwrap_or_else(|| panic!("no resource {name}"));
        match kind {
            "AWS::IAM::Role" => format!("arn:aws:iam::{ACCOUNT}:role/{name}"),
            "AWS::SQS::Queue" => format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"),
            "AWS::Events::Rule" => format!("arn:aws:events:{REGION}:{ACCOUNT}:rule/{name}"),
            "AWS::IAM::ManagedPolicy" => format!("arn:aws:iam::{ACCOUNT}:policy/{name}"),
            _ => format!("arn:aws:{kind}:{name}"),
        }
    }

    fn lookup(t: &Value, name: &str) -> J {
        match name {
            "AWS::Partition" => json!("aws"),
            "AWS::Region" => json!(REGION),
            "AWS::AccountId" => json!(ACCOUNT),
            "AWS::StackName" => json!("nodesmith"),
            "AWS::NoValue" => J::Null,
            "ClusterName" => json!(CLUSTER),
            _ if t["Parameters"].get(name).is_some() => match t["Parameters"][name]["Type"].as_str() {
                Some("CommaDelimitedList") => json!([]),
                _ => json!(format!("{name}-value")),
            },
            _ if name.ends_with(".Arn") => json!(arn_of(t, name.trim_end_matches(".Arn"))),
            _ if name.contains('.') => json!(name.split('.').next().unwrap()),
            _ => match t["Resources"][name]["Type"].as_str() {
                Some("AWS::IAM::ManagedPolicy" | "AWS::IAM::Role") => json!(arn_of(t, name)),
                Some(_) => json!(name),
                None => panic!("template refers to unknown {name}"),
            },
        }
    }

    /// `v` with `!Sub`, `!Ref`, `!GetAtt`, `!If` (every condition false),
    /// `!Join` and `!Split` worked out.
    pub fn resolve(t: &Value, v: &Value) -> J {
        match v {
            Value::Null => J::Null,
            Value::Bool(b) => json!(b),
            Value::Number(n) => serde_json::to_value(n).unwrap(),
            Value::String(s) => json!(s),
            Value::Sequence(s) => J::Array(s.iter().map(|x| resolve(t, x)).filter(|x| !x.is_null()).collect()),
            Value::Mapping(m) => J::Object(
                m.iter()
                    .map(|(k, v)| (k.as_str().unwrap().to_string(), resolve(t, v)))
                    .filter(|(_, v)| !v.is_null())
                    .collect(),
            ),
            Value::Tagged(tag) => {
                let arg = &tag.value;
                match tag.tag.to_string().trim_start_matches('!') {
                    "Ref" | "GetAtt" => lookup(t, arg.as_str().unwrap()),
                    "Sub" => {
                        let text = arg.as_str().expect("!Sub with a string");
                        let mut out = String::new();
                        let mut rest = text;
                        while let Some(i) = rest.find("${") {
                            out.push_str(&rest[..i]);
                            let end = rest[i..].find('}').unwrap() + i;
                            let name = &rest[i + 2..end];
                            out.push_str(
                                lookup(t, name)
                                    .as_str()
                                    .unwrap_or_else(|| panic!("${{{name}}} is no string")),
                            );
                            rest = &rest[end + 1..];
                        }
                        out.push_str(rest);
                        json!(out)
                    }
                    // No condition holds with the optional parameters empty.
                    "If" => resolve(t, &arg[2]),
                    "Join" => {
                        let sep = arg[0].as_str().unwrap().to_string();
                        let parts: Vec<String> = flat(&resolve(t, &arg[1]));
                        json!(parts.join(&sep))
                    }
                    "Split" => {
                        let sep = arg[0].as_str().unwrap();
                        let s = resolve(t, &arg[1]);
                        json!(s.as_str().unwrap().split(sep).collect::<Vec<_>>())
                    }
                    other => panic!("the evaluator does not know !{other}"),
                }
            }
        }
    }

    fn flat(v: &J) -> Vec<String> {
        match v {
            J::String(s) => vec![s.clone()],
            J::Array(a) => a.iter().flat_map(flat).collect(),
            J::Null => vec![],
            other => panic!("not a string or list: {other}"),
        }
    }

    /// The role resource a function runs as.
    pub fn role_of<'a>(t: &'a Value, function: &str) -> &'a Value {
        let Value::Tagged(tag) = &t["Resources"][function]["Properties"]["Role"] else {
            panic!("{function} names no role of the stack's")
        };
        let name = tag.value.as_str().unwrap().trim_end_matches(".Arn");
        &t["Resources"][name]
    }

    fn document(t: &Value, v: &Value, what: &str) -> Vec<J> {
        let doc = match resolve(t, v) {
            J::String(s) => serde_json::from_str(&s).unwrap_or_else(|e| panic!("{what}'s policy is not JSON: {e}")),
            d => d,
        };
        doc["Statement"].as_array().unwrap().clone()
    }

    /// Every IAM statement a function's role holds: its inline policies and
    /// the stack's managed policies it attaches. AWS-managed policies are
    /// refused but for the VPC one, which only a function in a VPC gets.
    pub fn statements(t: &Value, function: &str) -> Vec<J> {
        let role = &role_of(t, function)["Properties"];
        let mut out = Vec::new();
        for p in role["Policies"].as_sequence().into_iter().flatten() {
            out.extend(document(t, &p["PolicyDocument"], function));
        }
        for arn in role["ManagedPolicyArns"].as_sequence().into_iter().flatten() {
            if let Value::Tagged(tag) = arn
                && tag.tag.to_string().trim_start_matches('!') == "If"
            {
                assert_eq!(tag.value[0].as_str(), Some("InVpc"), "{function}: {arn:?}");
                let vpc = resolve(t, &tag.value[1]);
                assert!(
                    vpc.as_str()
                        .unwrap()
                        .ends_with(":policy/service-role/AWSLambdaVPCAccessExecutionRole")
                );
                continue;
            }
            let Value::Tagged(tag) = arn else {
                panic!("{function} attaches a policy not of this stack: {arn:?}")
            };
            let name = tag.value.as_str().unwrap();
            let policy = &t["Resources"][name];
            assert_eq!(
                policy["Type"].as_str(),
                Some("AWS::IAM::ManagedPolicy"),
                "{function}: {name}"
            );
            out.extend(document(t, &policy["Properties"]["PolicyDocument"], name));
        }
        out
    }

    /// One authorization IAM makes: an action on a resource, with the request's context keys.
    #[derive(Clone, Debug)]
    pub struct Request {
        pub action: String,
        pub resource: String,
        pub context: BTreeMap<String, Vec<String>>,
    }

    impl Request {
        pub fn new(action: &str, resource: impl Into<String>) -> Self {
            Request {
                action: action.into(),
                resource: resource.into(),
                context: BTreeMap::new(),
            }
        }
        /// With `aws:<prefix>/<key>` for every tag, and `aws:TagKeys` for request tags.
        pub fn tags(mut self, prefix: &str, tags: &BTreeMap<String, String>) -> Self {
            for (k, v) in tags {
                self.context.insert(format!("aws:{prefix}/{k}"), vec![v.clone()]);
            }
            if prefix == "RequestTag" {
                self.context
                    .insert("aws:TagKeys".into(), tags.keys().cloned().collect());
            }
            self
        }
        pub fn key(mut self, k: &str, v: &str) -> Self {
            self.context.insert(k.into(), vec![v.into()]);
            self
        }
    }

    /// IAM's wildcard match: `*` any run of characters, `?` one.
    fn glob(pattern: &str, s: &str) -> bool {
        fn go(p: &[u8], s: &[u8]) -> bool {
            match p.split_first() {
                None => s.is_empty(),
                Some((b'*', rest)) => (0..=s.len()).any(|i| go(rest, &s[i..])),
                Some((b'?', rest)) => !s.is_empty() && go(rest, &s[1..]),
                Some((c, rest)) => s.first() == Some(c) && go(rest, &s[1..]),
            }
        }
        go(pattern.as_bytes(), s.as_bytes())
    }

    fn condition_holds(op: &str, key: &str, wanted: &[String], r: &Request) -> bool {
        let have = r.context.get(key);
        match op {
            "StringEquals" | "ArnEquals" => have.is_some_and(|h| h.iter().any(|v| wanted.contains(v))),
            "StringLike" | "ArnLike" => have.is_some_and(|h| h.iter().any(|v| wanted.iter().any(|w| glob(w, v)))),
            "ArnNotEquals" | "StringNotEquals" => have.is_none_or(|h| h.iter().all(|v| !wanted.contains(v))),
            "Bool" => have.is_some_and(|h| h.iter().any(|v| wanted.contains(v))),
            "Null" => wanted.iter().all(|w| (w == "true") == have.is_none()),
            other => panic!("the evaluator does not know the condition operator {other}"),
        }
    }

    fn matches(s: &J, r: &Request) -> bool {
        let action = flat(&s["Action"])
            .iter()
            .any(|a| glob(&a.to_lowercase(), &r.action.to_lowercase()));
        let resource = flat(&s["Resource"]).iter().any(|p| glob(p, &r.resource));
        let conditions = s["Condition"].as_object().into_iter().flatten().all(|(op, keys)| {
            keys.as_object()
                .unwrap()
                .iter()
                .all(|(k, v)| condition_holds(op, k, &flat(v), r))
        });
        action && resource && conditions
    }

    /// Whether the statements allow the request: some Allow matches and no Deny does.
    pub fn allows(statements: &[J], r: &Request) -> bool {
        let any = |effect: &str| statements.iter().any(|s| s["Effect"] == effect && matches(s, r));
        any("Allow") && !any("Deny")
    }

    /// Every action some statement names.
    pub fn actions(statements: &[J]) -> Vec<String> {
        let mut out: Vec<String> = statements.iter().flat_map(|s| flat(&s["Action"])).collect();
        out.sort();
        out.dedup();
        out
    }
}

fn ec2_arn(kind: &str, id: &str) -> String {
    if kind == "image" || kind == "snapshot" {
        format!("arn:aws:ec2:{}::{kind}/{id}", iam::REGION)
    } else {
        format!("arn:aws:ec2:{}:{}:{kind}/{id}", iam::REGION, iam::ACCOUNT)
    }
}

/// The tags launch puts on what it creates for a claim of pool `default` in `cluster`:
/// (instance and fleet, launch template and its volumes and network interfaces).
fn launch_tags(cluster: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let class = nodesmith::apis::ec2nodeclass::EC2NodeClass::new("default", Default::default());
    let claim = nodesmith::nodeclaim::NodeClaim::pending("default-x1y2z", "default", "default");
    (
        nodesmith::nodeclass::template::instance_tags(cluster, &claim, &class),
        nodesmith::nodeclass::template::template_tags(cluster, &claim, &class),
    )
}

/// The authorizations one launch needs from IAM: CreateLaunchTemplate, then
/// CreateFleet, which EC2 also authorizes as RunInstances and, for the tags,
/// CreateTags, resource by resource.
fn launch_requests(instance: &BTreeMap<String, String>, template: &BTreeMap<String, String>) -> Vec<iam::Request> {
    use iam::Request;
    let mut out = vec![
        Request::new("ec2:CreateLaunchTemplate", ec2_arn("launch-template", "*")).tags("RequestTag", template),
        Request::new("ec2:CreateTags", ec2_arn("launch-template", "lt-1"))
            .tags("RequestTag", template)
            .key("ec2:CreateAction", "CreateLaunchTemplate"),
    ];
    for action in ["ec2:CreateFleet", "ec2:RunInstances"] {
        for (kind, id) in [("image", "ami-1"), ("subnet", "subnet-1"), ("security-group", "sg-1")] {
            out.push(Request::new(action, ec2_arn(kind, id)));
        }
        out.push(Request::new(action, ec2_arn("launch-template", "lt-1")).tags("ResourceTag", template));
        for (kind, tags) in [
            ("fleet", instance),
            ("instance", instance),
            ("volume", template),
            ("network-interface", template),
        ] {
            out.push(Request::new(action, ec2_arn(kind, "*")).tags("RequestTag", tags));
            out.push(
                Request::new("ec2:CreateTags", ec2_arn(kind, "x-1"))
                    .tags("RequestTag", tags)
                    .key("ec2:CreateAction", action.trim_start_matches("ec2:")),
            );
        }
    }
    out
}

#[test]
fn launch_may_create_only_what_it_tags_for_this_cluster_and_a_pool() {
    let t = template();
    let launch = iam::statements(&t, "LaunchFunction");
    let (instance, lt) = launch_tags(iam::CLUSTER);
    for r in launch_requests(&instance, &lt) {
        assert!(iam::allows(&launch, &r), "launch's own request is refused: {r:?}");
    }
    // Another cluster's tags, or none for the pool: refused, request by request.
    let (other_i, other_t) = launch_tags("other");
    let mut untagged = (instance.clone(), lt.clone());
    untagged.0.remove(nodesmith::labels::NODEPOOL);
    untagged.1.remove(nodesmith::labels::NODEPOOL);
    for (what, (i, l)) in [("another cluster's", (other_i, other_t)), ("pool-less", untagged)] {
        for r in launch_requests(&i, &l).into_iter().filter(|r| !r.context.is_empty()) {
            assert!(!iam::allows(&launch, &r), "{what} tags are allowed: {r:?}");
        }
    }
    // Tags only at creation; an untagged fleet is refused (so launch tags the fleet too).
    let after = iam::Request::new("ec2:CreateTags", ec2_arn("instance", "i-1")).tags("RequestTag", &instance);
    assert!(!iam::allows(&launch, &after), "CreateTags after creation is allowed");
    let bare_fleet = iam::Request::new("ec2:CreateFleet", ec2_arn("fleet", "*"));
    assert!(!iam::allows(&launch, &bare_fleet), "an untagged fleet is allowed");
    // Terminate: a claim's own second instance, never someone else's.
    let mine = iam::Request::new("ec2:TerminateInstances", ec2_arn("instance", "i-1")).tags("ResourceTag", &instance);
    assert!(iam::allows(&launch, &mine));
    let (theirs, _) = launch_tags("other");
    let theirs = iam::Request::new("ec2:TerminateInstances", ec2_arn("instance", "i-2")).tags("ResourceTag", &theirs);
    assert!(!iam::allows(&launch, &theirs));
    assert!(!iam::allows(
        &launch,
        &iam::Request::new("ec2:TerminateInstances", ec2_arn("instance", "i-3"))
    ));
}

#[test]
fn the_sweep_deletes_only_what_nodesmith_tagged_for_this_cluster() {
    let t = template();
    let sweep = iam::statements(&t, "SweepFunction");
    let (instance, lt) = launch_tags(iam::CLUSTER);
    let (other_i, other_t) = launch_tags("other");
    for (action, kind, mine, theirs) in [
        ("ec2:TerminateInstances", "instance", &instance, &other_i),
        ("ec2:DeleteLaunchTemplate", "launch-template", &lt, &other_t),
    ] {
        let r =
            |tags: &BTreeMap<String, String>| iam::Request::new(action, ec2_arn(kind, "x-1")).tags("ResourceTag", tags);
        assert!(iam::allows(&sweep, &r(mine)), "{action} on this cluster's {kind}");
        assert!(!iam::allows(&sweep, &r(theirs)), "{action} on another cluster's {kind}");
        assert!(
            !iam::allows(&sweep, &r(&BTreeMap::new())),
            "{action} on an untagged {kind}"
        );
    }
    for f in ["ProvisionFunction", "InterruptFunction"] {
        let s = iam::statements(&t, f);
        let acts: Vec<String> = iam::actions(&s).into_iter().filter(|a| a.starts_with("ec2:")).collect();
        assert!(
            !acts
                .iter()
                .any(|a| a.contains("Terminate") || a.contains("Delete") || a.contains("Create")),
            "{f} may write EC2: {acts:?}"
        );
    }
}

#[test]
fn instance_profiles_and_roles_are_touched_only_under_the_nodesmith_path_and_tag() {
    use nodesmith::nodeclass::profile;
    let t = template();
    let launch = iam::statements(&t, "LaunchFunction");
    let sweep = iam::statements(&t, "SweepFunction");
    let arn = |name: &str, path: &str| format!("arn:aws:iam::{}:instance-profile{path}{name}", iam::ACCOUNT);
    let mine = arn(
        &profile::profile_name(iam::CLUSTER, "default", "NodeRole"),
        profile::PROFILE_PATH,
    );
    let tags = profile::profile_tags(iam::CLUSTER, "default");
    let others = profile::profile_tags("other", "default");
    let req = |a: &str, res: &str| iam::Request::new(a, res);
    // What ensure() and collect_profiles() call.
    assert!(iam::allows(&launch, &req("iam:GetInstanceProfile", &mine)));
    assert!(iam::allows(
        &launch,
        &req("iam:CreateInstanceProfile", &mine).tags("RequestTag", &tags)
    ));
    assert!(!iam::allows(
        &launch,
        &req("iam:CreateInstanceProfile", &mine).tags("RequestTag", &others)
    ));
    assert!(!iam::allows(
        &launch,
        &req("iam:CreateInstanceProfile", &arn("p", "/")).tags("RequestTag", &tags)
    ));
    for a in ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile"] {
        assert!(iam::allows(&launch, &req(a, &mine).tags("ResourceTag", &tags)), "{a}");
        assert!(
            !iam::allows(&launch, &req(a, &mine).tags("ResourceTag", &others)),
            "{a}"
        );
    }
    assert!(iam::allows(
        &sweep,
        &req("iam:ListInstanceProfiles", &arn("", profile::PROFILE_PATH))
    ));
    for a in ["iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"] {
        assert!(iam::allows(&sweep, &req(a, &mine).tags("ResourceTag", &tags)), "{a}");
        assert!(!iam::allows(&sweep, &req(a, &mine).tags("ResourceTag", &others)), "{a}");
        assert!(!iam::allows(&sweep, &req(a, &arn("theirs", "/"))), "{a}");
    }
    // The sweep checks a class's own named profile, wherever it lives.
    assert!(iam::allows(
        &sweep,
        &req("iam:GetInstanceProfile", &arn("theirs", "/team/"))
    ));
    // PassRole: the stack's node role, to EC2 only.
    let node_role = format!("arn:aws:iam::{}:role/NodeRole", iam::ACCOUNT);
    let pass = |role: &str, to: &str| req("iam:PassRole", role).key("iam:PassedToService", to);
    assert!(iam::allows(&launch, &pass(&node_role, "ec2.amazonaws.com")));
    assert!(!iam::allows(&launch, &pass(&node_role, "lambda.amazonaws.com")));
    assert!(!iam::allows(
        &launch,
        &pass(
            &format!("arn:aws:iam::{}:role/Admin", iam::ACCOUNT),
            "ec2.amazonaws.com"
        )
    ));
}

#[test]
fn cluster_and_parameter_reads_are_scoped() {
    let t = template();
    let cluster = |name: &str| format!("arn:aws:eks:{}:{}:cluster/{name}", iam::REGION, iam::ACCOUNT);
    let parameter = |name: &str| format!("arn:aws:ssm:{}::parameter{name}", iam::REGION);
    let ami = "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id";
    for f in [
        "ProvisionFunction",
        "LaunchFunction",
        "InterruptFunction",
        "SweepFunction",
    ] {
        let s = iam::statements(&t, f);
        let describe = |c: &str| iam::Request::new("eks:DescribeCluster", cluster(c));
        assert!(iam::allows(&s, &describe(iam::CLUSTER)), "{f}");
        assert!(!iam::allows(&s, &describe("other")), "{f} may describe other clusters");
        let get = |p: &str| iam::Request::new("ssm:GetParameter", parameter(p));
        let resolves = f == "LaunchFunction" || f == "SweepFunction";
        assert_eq!(iam::allows(&s, &get(ami)), resolves, "{f} reads AMI parameters");
        assert!(
            !iam::allows(&s, &get("/team/db-password")),
            "{f} may read any parameter"
        );
    }
}

const ALL: &[&str] = &[
    "ProvisionFunction",
    "LaunchFunction",
    "InterruptFunction",
    "SweepFunction",
];
/// Who asks for launches, and who asks provision for a solve.
const LAUNCH_ASKERS: &[&str] = &["ProvisionFunction", "InterruptFunction", "SweepFunction"];
const SOLVE_ASKERS: &[&str] = &["LaunchFunction", "InterruptFunction", "SweepFunction"];

/// Which function runs the code in each file that calls AWS, action by action.
/// A new call, or a file a function starts to use, must be added here; the
/// test below then holds each role to exactly these actions.
const CALLERS: &[(&str, &str, &[&str])] = &[
    // The state store, which every function uses.
    ("state/catalog.rs", "dynamodb:DeleteItem", ALL),
    ("state/catalog.rs", "dynamodb:PutItem", ALL),
    ("state/disruptions.rs", "dynamodb:PutItem", ALL),
    ("state/drains.rs", "dynamodb:DeleteItem", ALL),
    ("state/drains.rs", "dynamodb:PutItem", ALL),
    ("state/terminations.rs", "dynamodb:DeleteItem", ALL),
    ("state/terminations.rs", "dynamodb:PutItem", ALL),
    ("state/idempotency.rs", "dynamodb:PutItem", ALL),
    ("state/leases.rs", "dynamodb:DeleteItem", ALL),
    ("state/leases.rs", "dynamodb:UpdateItem", ALL),
    // Every function meters its own invocations into the day's counter.
    ("state/costs.rs", "dynamodb:UpdateItem", ALL),
    ("state/markers.rs", "dynamodb:PutItem", ALL),
    ("state/markers.rs", "dynamodb:UpdateItem", ALL),
    ("state/mod.rs", "dynamodb:DeleteItem", ALL),
    // Every strongly consistent item read (StateStore::read_item).
    ("state/mod.rs", "dynamodb:GetItem", ALL),
    ("state/mod.rs", "dynamodb:PutItem", ALL),
    ("state/mod.rs", "dynamodb:Query", ALL),
    ("state/nodeclaims.rs", "dynamodb:PutItem", ALL),
    ("state/nodeclaims.rs", "dynamodb:Query", ALL),
    ("state/nodeclaims.rs", "dynamodb:TransactWriteItems", ALL),
    ("state/offerings.rs", "dynamodb:BatchWriteItem", ALL),
    ("state/prices.rs", "dynamodb:PutItem", ALL),
    // Provision records its nominations; the sweep reads them (state/mod.rs).
    ("state/nominations.rs", "dynamodb:PutItem", ALL),
    // Only scripts/dev-stack and tests make the table; the stack makes it in AWS.
    ("state/table.rs", "dynamodb:CreateTable", &[]),
    ("messages/launch_requests.rs", "sqs:SendMessageBatch", LAUNCH_ASKERS),
    ("messages/pending_pods.rs", "sqs:SendMessage", SOLVE_ASKERS),
    // A failed interruption event is given back within seconds.
    (
        "messages/redelivery.rs",
        "sqs:ChangeMessageVisibility",
        &["InterruptFunction"],
    ),
    // Pending pods that cannot be read go to the dead-letter queue.
    ("provisioning/mod.rs", "sqs:SendMessage", &["ProvisionFunction"]),
    (
        "kubernetes/auth.rs",
        "eks:DescribeCluster",
        &[
            "ProvisionFunction",
            "LaunchFunction",
            "InterruptFunction",
            "SweepFunction",
        ],
    ),
    (
        "catalog/ec2.rs",
        "ec2:DescribeInstanceTypes",
        &["ProvisionFunction", "SweepFunction"],
    ),
    (
        "catalog/ec2.rs",
        "ec2:DescribeInstanceTypeOfferings",
        &["ProvisionFunction", "SweepFunction"],
    ),
    (
        "catalog/ec2.rs",
        "ec2:DescribeSpotPriceHistory",
        &["ProvisionFunction", "SweepFunction"],
    ),
    // The region's on-demand prices, read where the catalog is built.
    (
        "catalog/price_list.rs",
        "pricing:GetProducts",
        &["ProvisionFunction", "SweepFunction"],
    ),
    // ARC zonal shifts, read before a provisioning solve and once a disruption pass.
    (
        "zonal_shift.rs",
        "arc-zonal-shift:GetManagedResource",
        &["ProvisionFunction", "SweepFunction"],
    ),
    (
        "ec2/instances.rs",
        "ec2:DescribeInstances",
        &["LaunchFunction", "SweepFunction"],
    ),
    (
        "ec2/instances.rs",
        "ec2:TerminateInstances",
        &["LaunchFunction", "SweepFunction"],
    ),
    // Node repair: the sweep reads impaired status checks.
    ("ec2/status.rs", "ec2:DescribeInstanceStatus", &["SweepFunction"]),
    (
        "nodeclass/eks_cluster.rs",
        "eks:DescribeCluster",
        &["LaunchFunction", "SweepFunction"],
    ),
    ("launch/fleet.rs", "ec2:CreateFleet", &["LaunchFunction"]),
    (
        "nodeclass/launchtemplate.rs",
        "ec2:CreateLaunchTemplate",
        &["LaunchFunction"],
    ),
    (
        "nodeclass/ami.rs",
        "ec2:DescribeImages",
        &["LaunchFunction", "SweepFunction"],
    ),
    (
        "nodeclass/ami.rs",
        "ssm:GetParameter",
        &["LaunchFunction", "SweepFunction"],
    ),
    (
        "nodeclass/subnet.rs",
        "ec2:DescribeSubnets",
        &["LaunchFunction", "SweepFunction"],
    ),
    (
        "nodeclass/securitygroup.rs",
        "ec2:DescribeSecurityGroups",
        &["LaunchFunction", "SweepFunction"],
    ),
    (
        "nodeclass/capacityreservation.rs",
        "ec2:DescribeCapacityReservations",
        &["LaunchFunction", "SweepFunction"],
    ),
    (
        "nodeclass/placementgroup.rs",
        "ec2:DescribePlacementGroups",
        &["LaunchFunction", "SweepFunction"],
    ),
    ("launch/gc.rs", "ec2:DescribeLaunchTemplates", &["SweepFunction"]),
    ("launch/gc.rs", "ec2:DeleteLaunchTemplate", &["SweepFunction"]),
    // Which instance profiles live instances run with.
    ("launch/gc.rs", "ec2:DescribeInstances", &["SweepFunction"]),
    // ensure() (launch) and exists() (the sweep's class status).
    (
        "nodeclass/profile.rs",
        "iam:GetInstanceProfile",
        &["LaunchFunction", "SweepFunction"],
    ),
    ("nodeclass/profile.rs", "iam:CreateInstanceProfile", &["LaunchFunction"]),
    (
        "nodeclass/profile.rs",
        "iam:AddRoleToInstanceProfile",
        &["LaunchFunction"],
    ),
    (
        "nodeclass/profile.rs",
        "iam:RemoveRoleFromInstanceProfile",
        &["LaunchFunction", "SweepFunction"],
    ),
    ("nodeclass/profile.rs", "iam:ListInstanceProfiles", &["SweepFunction"]),
    ("nodeclass/profile.rs", "iam:DeleteInstanceProfile", &["SweepFunction"]),
];

/// Calls IAM authorizes as more than their own action: CreateFleet also as
/// RunInstances and CreateTags and, launching with an instance profile,
/// PassRole; a tagged CreateInstanceProfile also as TagInstanceProfile; a
/// transaction as its items' actions (and TransactWriteItems is no action).
const AUTHORIZED_AS: &[(&str, &[&str])] = &[
    (
        "ec2:CreateFleet",
        &["ec2:CreateFleet", "ec2:RunInstances", "ec2:CreateTags", "iam:PassRole"],
    ),
    (
        "iam:CreateInstanceProfile",
        &["iam:CreateInstanceProfile", "iam:TagInstanceProfile"],
    ),
    (
        "dynamodb:TransactWriteItems",
        &["dynamodb:ConditionCheckItem", "dynamodb:PutItem"],
    ),
    ("sqs:SendMessageBatch", &["sqs:SendMessage"]),
];

/// What a role needs that no code calls: every function writes its logs, and
/// an SQS event source reads and deletes messages as the function.
fn implied(function: &str) -> Vec<&'static str> {
    let mut out = vec!["logs:CreateLogStream", "logs:PutLogEvents"];
    if function != "SweepFunction" {
        out.extend(["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"]);
    }
    out
}

#[test]
fn each_function_may_call_exactly_what_its_code_calls() {
    let t = template();
    let calls = nodesmith_tests::calls::sdk_calls();
    // The scan must find the calls it exists for.
    for known in [
        "ec2:CreateFleet",
        "ec2:DescribeInstanceTypes",
        "eks:DescribeCluster",
        "iam:CreateInstanceProfile",
    ] {
        assert!(calls.iter().any(|(a, _)| a == known), "scan missed {known}: {calls:?}");
    }
    for (action, file) in &calls {
        assert!(
            CALLERS.iter().any(|(f, a, _)| f == file && a == action),
            "{file} calls {action}: add to CALLERS which functions run it"
        );
    }
    for (file, action, _) in CALLERS {
        assert!(
            calls.iter().any(|(a, f)| f == file && a == action),
            "CALLERS lists {action} in {file}, which the code no longer calls"
        );
    }
    for (name, _) in resources_of(&t, "AWS::Serverless::Function") {
        let mut needed: Vec<String> = CALLERS
            .iter()
            .filter(|(_, _, fs)| fs.contains(&name.as_str()))
            .flat_map(|(_, a, _)| match AUTHORIZED_AS.iter().find(|(x, _)| x == a) {
                Some((_, all)) => all.iter().map(|s| s.to_string()).collect(),
                None => vec![a.to_string()],
            })
            .chain(implied(&name).into_iter().map(str::to_string))
            .collect();
        needed.sort();
        needed.dedup();
        let granted = iam::actions(&iam::statements(&t, &name));
        assert_eq!(granted, needed, "{name}'s role against what its code calls");
    }
}

#[test]
fn the_sweep_runs_every_minute_on_a_schedule_named_for_its_stack() {
    let t = template();
    let events = &resource(&t, "SweepFunction")["Properties"]["Events"];
    let schedule = events
        .as_mapping()
        .unwrap()
        .values()
        .find(|e| e["Type"].as_str() == Some("ScheduleV2"))
        .expect("the sweep has an EventBridge Scheduler schedule");
    let p = &schedule["Properties"];
    assert_eq!(p["ScheduleExpression"].as_str(), Some("rate(1 minute)"));
    // Two clusters' stacks in one account must not collide on the name.
    let name = iam::resolve(&t, &p["Name"]);
    assert!(name.as_str().is_some_and(|n| n.starts_with("nodesmith-")), "{name}");
    // A run that could not start is skipped, not piled up behind the running one.
    assert_eq!(p["RetryPolicy"]["MaximumRetryAttempts"].as_u64(), Some(0));
}

#[test]
fn no_role_may_write_to_every_resource_without_a_condition() {
    let t = template();
    let read = |a: &str| {
        let op = a.split(':').nth(1).unwrap_or("");
        ["Describe", "Get", "List"].iter().any(|p| op.starts_with(p))
    };
    let mut checked = 0;
    for (name, _) in resources_of(&t, "AWS::Serverless::Function") {
        for s in iam::statements(&t, &name) {
            let everything = match &s["Resource"] {
                serde_json::Value::String(r) => r == "*",
                serde_json::Value::Array(rs) => rs.iter().any(|r| r == "*"),
                _ => false,
            };
            if !everything || s.get("Condition").is_some() {
                continue;
            }
            checked += 1;
            let actions: Vec<String> = serde_json::from_value::<Vec<String>>(s["Action"].clone())
                .or_else(|_| serde_json::from_value::<String>(s["Action"].clone()).map(|a| vec![a]))
                .unwrap();
            for a in actions {
                assert!(read(&a), "{name} may {a} on every resource without a condition");
            }
        }
    }
    assert!(checked > 0, "no statement on every resource was looked at");
}
