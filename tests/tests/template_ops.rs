//! The template's operational settings: SQS event sources never take more
//! than their function's reserved concurrency (so throttled batches do not
//! come back late and fill the dead-letter queues), the scheduled sweep is
//! neither retried nor queued, the pending-pods queue takes messages only
//! from the forwarder and the functions, and CloudWatch alarms cover what an
//! operator must hear about (README, "Operations").

use std::collections::{BTreeMap, BTreeSet};

use nodesmith::metrics;
use serde_yaml_ng::Value;

use super::template::{iam, int, may_send, reference, resource, resources_of, strings, template};

/// The alarms of the template, by resource name.
fn alarms(t: &Value) -> Vec<(String, &Value)> {
    resources_of(t, "AWS::CloudWatch::Alarm")
}

/// The dimension `name` of an alarm, as written (`!Ref X` gives `X`).
fn dimension(alarm: &Value, name: &str) -> Option<String> {
    alarm["Properties"]["Dimensions"]
        .as_sequence()?
        .iter()
        .find(|d| d["Name"].as_str() == Some(name))
        .and_then(|d| reference(&d["Value"]).or_else(|| d["Value"].as_str().map(str::to_string)))
}

/// Alarms on `metric` in `namespace`.
fn alarms_on<'a>(t: &'a Value, namespace: &str, metric: &str) -> Vec<(String, &'a Value)> {
    alarms(t)
        .into_iter()
        .filter(|(_, a)| {
            a["Properties"]["Namespace"].as_str() == Some(namespace)
                && a["Properties"]["MetricName"].as_str() == Some(metric)
        })
        .collect()
}

#[test]
fn sqs_event_sources_cap_their_concurrency_at_the_functions_reserved_concurrency() {
    let t = template();
    let mut sources = 0;
    for (name, f) in resources_of(&t, "AWS::Serverless::Function") {
        let p = &f["Properties"];
        for (_, e) in p["Events"].as_mapping().unwrap() {
            if e["Type"].as_str() != Some("SQS") {
                continue;
            }
            sources += 1;
            let max = &e["Properties"]["ScalingConfig"]["MaximumConcurrency"];
            assert!(!max.is_null(), "{name}: its SQS event source has no MaximumConcurrency");
            let max = int(max);
            // SQS allows 2 to 1000; above the reserved concurrency Lambda
            // throttles the batches the poller took, and they come back after
            // the visibility timeout.
            assert!((2..=1000).contains(&max), "{name}: MaximumConcurrency {max}");
            let reserved = int(&p["ReservedConcurrentExecutions"]);
            assert!(
                max <= reserved,
                "{name}: MaximumConcurrency {max} above its reserved concurrency {reserved}"
            );
        }
    }
    assert_eq!(sources, 3, "provision, launch and interrupt read a queue");
}

#[test]
fn the_scheduled_sweep_is_neither_retried_nor_kept_waiting() {
    let t = template();
    let invoke = &resource(&t, "SweepFunction")["Properties"]["EventInvokeConfig"];
    assert_eq!(
        invoke["MaximumRetryAttempts"].as_u64(),
        Some(0),
        "a failed sweep is not run again: the next minute's does its work"
    );
    let age = invoke["MaximumEventAgeInSeconds"]
        .as_u64()
        .expect("the sweep's queued invocations have a maximum age");
    // Lambda's minimum is 60 s; older than the next run's start is useless.
    assert!((60..=120).contains(&age), "MaximumEventAgeInSeconds {age}");
}

#[test]
fn the_pending_pods_queue_takes_messages_only_from_the_forwarder_and_the_functions() {
    let t = template();
    let policies: Vec<(String, &Value)> = resources_of(&t, "AWS::SQS::QueuePolicy")
        .into_iter()
        .filter(|(_, p)| {
            p["Properties"]["Queues"]
                .as_sequence()
                .unwrap()
                .iter()
                .filter_map(reference)
                .any(|q| q == "PendingPodsQueue")
        })
        .collect();
    assert_eq!(policies.len(), 1, "one policy for the pending-pods queue");
    let statements = policies[0].1["Properties"]["PolicyDocument"]["Statement"]
        .as_sequence()
        .unwrap();
    let deny = statements
        .iter()
        .find(|s| {
            s["Effect"].as_str() == Some("Deny")
                && s["Principal"].as_str() == Some("*")
                && s["Action"].as_str() == Some("sqs:SendMessage")
        })
        .expect("the pending-pods queue denies other senders");
    assert_eq!(reference(&deny["Resource"]).as_deref(), Some("PendingPodsQueue.Arn"));
    let allowed: BTreeSet<String> = deny["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]
        .as_sequence()
        .expect("the deny spares only the listed principals")
        .iter()
        .filter_map(reference)
        .collect();
    // Exactly the forwarder and the functions whose roles may send there.
    let mut senders: BTreeSet<String> = resources_of(&t, "AWS::Serverless::Function")
        .into_iter()
        .filter(|(n, _)| may_send(&t, n, "PendingPodsQueue"))
        .map(|(n, _)| format!("{n}Role.Arn"))
        .collect();
    assert!(
        senders.len() >= 3,
        "launch, interrupt and sweep ask for solves: {senders:?}"
    );
    senders.insert("ForwarderRole.Arn".to_string());
    assert_eq!(allowed, senders);
}

#[test]
fn every_alarm_notifies_the_stacks_topic() {
    let t = template();
    let all = alarms(&t);
    assert!(!all.is_empty());
    assert_eq!(resource(&t, "AlarmTopic")["Type"].as_str(), Some("AWS::SNS::Topic"));
    for (name, a) in all {
        let actions: Vec<String> = a["Properties"]["AlarmActions"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{name} has no AlarmActions"))
            .iter()
            .filter_map(reference)
            .collect();
        assert_eq!(actions, ["AlarmTopic"], "{name}");
        assert!(
            !a["Properties"]["AlarmDescription"].is_null(),
            "{name} says what it means"
        );
    }
    assert!(
        !t["Outputs"]["AlarmTopicArn"].is_null(),
        "the topic is an output, to subscribe to"
    );
}

#[test]
fn any_message_in_a_dead_letter_queue_raises_an_alarm() {
    let t = template();
    let dead_letter_queues: BTreeSet<String> = resources_of(&t, "AWS::SQS::Queue")
        .iter()
        .filter_map(|(_, q)| reference(&q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]))
        .map(|arn| arn.trim_end_matches(".Arn").to_string())
        .collect();
    assert_eq!(dead_letter_queues.len(), 3);
    let watched: BTreeSet<String> = alarms_on(&t, "AWS/SQS", "ApproximateNumberOfMessagesVisible")
        .into_iter()
        .map(|(name, a)| {
            let p = &a["Properties"];
            assert_eq!(int(&p["Threshold"]), 0, "{name}");
            assert_eq!(p["ComparisonOperator"].as_str(), Some("GreaterThanThreshold"), "{name}");
            assert_eq!(p["Statistic"].as_str(), Some("Maximum"), "{name}");
            dimension(a, "QueueName")
                .unwrap_or_else(|| panic!("{name} names no queue"))
                .trim_end_matches(".QueueName")
                .to_string()
        })
        .collect();
    assert_eq!(watched, dead_letter_queues);
}

#[test]
fn every_function_has_an_errors_and_a_throttles_alarm() {
    let t = template();
    let functions: BTreeSet<String> = resources_of(&t, "AWS::Serverless::Function")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for metric in ["Errors", "Throttles"] {
        let watched: BTreeSet<String> = alarms_on(&t, "AWS/Lambda", metric)
            .into_iter()
            .map(|(name, a)| {
                let p = &a["Properties"];
                assert_eq!(p["Statistic"].as_str(), Some("Sum"), "{name}");
                assert_eq!(p["TreatMissingData"].as_str(), Some("notBreaching"), "{name}");
                dimension(a, "FunctionName").unwrap_or_else(|| panic!("{name} names no function"))
            })
            .collect();
        assert_eq!(watched, functions, "{metric} alarms");
    }
}

#[test]
fn a_sweep_that_has_not_completed_for_minutes_raises_an_alarm() {
    let t = template();
    let stalled = alarms_on(&t, "nodesmith", "SweepsCompleted");
    assert_eq!(stalled.len(), 1, "one alarm on the sweep's completion metric");
    let (name, a) = &stalled[0];
    let p = &a["Properties"];
    assert_eq!(dimension(a, "Function").as_deref(), Some("sweep"), "{name}");
    assert_eq!(p["ComparisonOperator"].as_str(), Some("LessThanThreshold"), "{name}");
    assert_eq!(int(&p["Threshold"]), 1, "{name}");
    // No data is the point: a sweep that does not run emits nothing.
    assert_eq!(p["TreatMissingData"].as_str(), Some("breaching"), "{name}");
    let minutes = int(&p["Period"]) * int(&p["EvaluationPeriods"]) / 60;
    assert!((3..=15).contains(&minutes), "{name}: {minutes} minutes");
}

#[test]
fn nodes_left_unregistered_and_launches_failing_raise_alarms() {
    let t = template();
    for (metric, function) in [
        ("NodeClaimsRegistrationTimedOut", "sweep"),
        ("LaunchesFailed", "launch"),
    ] {
        let found = alarms_on(&t, "nodesmith", metric);
        assert_eq!(found.len(), 1, "one alarm on {metric}");
        let (name, a) = &found[0];
        assert_eq!(dimension(a, "Function").as_deref(), Some(function), "{name}");
        assert_eq!(a["Properties"]["Statistic"].as_str(), Some("Sum"), "{name}");
        assert_eq!(
            a["Properties"]["TreatMissingData"].as_str(),
            Some("notBreaching"),
            "{name}"
        );
    }
}

/// Every alarm of the `nodesmith` namespace watches a metric the code emits
/// (the catalogue, checked against the code in `nodesmith::metrics`), in
/// a function that emits it.
#[test]
fn alarms_watch_metrics_the_code_emits() {
    let t = template();
    let mut watched = 0;
    for (name, a) in alarms(&t) {
        if a["Properties"]["Namespace"].as_str() != Some("nodesmith") {
            continue;
        }
        watched += 1;
        let metric = a["Properties"]["MetricName"].as_str().unwrap();
        let def = metrics::def(metric).unwrap_or_else(|| panic!("{name} watches {metric}, which no code emits"));
        let function = dimension(a, "Function").unwrap_or_else(|| panic!("{name} names no function"));
        assert!(
            def.functions.contains(&function.as_str()),
            "{name}: {function} does not emit {metric}"
        );
        assert!(
            def.labels.is_empty(),
            "{name}: {metric} is labelled, an alarm would see one series"
        );
    }
    assert_eq!(watched, 3);
}

/// One metric a dashboard widget shows: its namespace, name, and dimension
/// names with their values (None for a SEARCH's dimension schema).
#[derive(Debug)]
struct Shown {
    namespace: String,
    name: String,
    dimensions: BTreeMap<String, Option<String>>,
}

/// The dashboard's body with `${...}` resolved, and the metrics it shows.
fn dashboard(t: &Value) -> (serde_json::Value, Vec<Shown>) {
    let d = resource(t, "Dashboard");
    assert_eq!(d["Type"].as_str(), Some("AWS::CloudWatch::Dashboard"));
    let body = match &d["Properties"]["DashboardBody"] {
        Value::Tagged(tagged) if tagged.tag == "!Sub" => tagged.value.as_str().unwrap().to_string(),
        other => panic!("DashboardBody is not a !Sub string: {other:?}"),
    };
    // Every substitution is the region or a resource of the stack.
    let mut resolved = String::new();
    let mut rest = body.as_str();
    while let Some(at) = rest.find("${") {
        resolved.push_str(&rest[..at]);
        let end = rest[at..].find('}').unwrap() + at;
        let name = &rest[at + 2..end];
        if name != "AWS::Region" {
            resource(t, name);
        }
        resolved.push_str(name);
        rest = &rest[end + 1..];
    }
    resolved.push_str(rest);
    let body: serde_json::Value = serde_json::from_str(&resolved).expect("the dashboard body is JSON");
    let mut shown = Vec::new();
    for w in body["widgets"].as_array().expect("widgets") {
        for m in w["properties"]["metrics"]
            .as_array()
            .expect("each widget shows metrics")
        {
            let m = m.as_array().unwrap();
            if let Some(expression) = m[0]["expression"].as_str() {
                shown.push(searched(expression));
                continue;
            }
            let parts: Vec<&str> = m.iter().filter_map(|p| p.as_str()).collect();
            let dimensions = parts[2..]
                .chunks(2)
                .map(|kv| (kv[0].to_string(), Some(kv[1].to_string())))
                .collect();
            shown.push(Shown {
                namespace: parts[0].to_string(),
                name: parts[1].to_string(),
                dimensions,
            });
        }
    }
    (body, shown)
}

/// The metric of `SEARCH('{namespace,dim,...} MetricName="name" ...', ...)`.
fn searched(expression: &str) -> Shown {
    let inner = expression
        .strip_prefix("SEARCH('{")
        .unwrap_or_else(|| panic!("{expression}: only SEARCH expressions are expected"));
    let (schema, rest) = inner.split_once('}').unwrap();
    let mut schema = schema.split(',');
    let namespace = schema.next().unwrap().to_string();
    let name = rest
        .split_once("MetricName=\"")
        .and_then(|(_, r)| r.split_once('"'))
        .unwrap_or_else(|| panic!("{expression} names no metric"))
        .0
        .to_string();
    Shown {
        namespace,
        name,
        dimensions: schema.map(|d| (d.to_string(), None)).collect(),
    }
}

#[test]
fn the_dashboard_shows_only_metrics_the_code_emits_with_the_labels_it_emits_them_with() {
    let t = template();
    let (_, shown) = dashboard(&t);
    let functions: BTreeSet<String> = resources_of(&t, "AWS::Serverless::Function")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut names = BTreeSet::new();
    for s in &shown {
        match s.namespace.as_str() {
            "nodesmith" => {
                let def = metrics::def(&s.name)
                    .unwrap_or_else(|| panic!("the dashboard shows {}, which no code emits", s.name));
                let want: BTreeSet<&str> = def.labels.iter().copied().chain(["Function"]).collect();
                let got: BTreeSet<&str> = s.dimensions.keys().map(String::as_str).collect();
                assert_eq!(
                    got, want,
                    "{}: CloudWatch keeps a series per dimension set, so these must be exact",
                    s.name
                );
                if let Some(Some(function)) = s.dimensions.get("Function") {
                    assert!(
                        def.functions.contains(&function.as_str()),
                        "{function} does not emit {}",
                        s.name
                    );
                }
                names.insert(s.name.clone());
            }
            "AWS/Lambda" => {
                let f = s.dimensions["FunctionName"].clone().unwrap();
                assert!(functions.contains(&f), "{f} is no function of the stack");
                names.insert(format!("AWS/Lambda {}", s.name));
            }
            other => panic!("the dashboard shows a metric in namespace {other}"),
        }
    }
    // What an operator looks at first (issue: fleet $/h, nodes by pool and
    // capacity type, pending pods, scale-out, disruptions by reason,
    // interruptions, errors, nodesmith's own cost).
    for want in [
        "FleetUsdPerHour",
        "NodeClaims",
        "karpenter_scheduler_queue_depth",
        "karpenter_scheduler_scheduling_duration_seconds",
        "karpenter_nodeclaims_created_total",
        "karpenter_nodeclaims_disrupted_total",
        "karpenter_interruption_received_messages_total",
        "karpenter_cloudprovider_errors_total",
        "OwnCostUsd",
        "AWS/Lambda Errors",
    ] {
        assert!(names.contains(want), "the dashboard does not show {want}");
    }
    let errors = shown
        .iter()
        .filter(|s| s.namespace == "AWS/Lambda" && s.name == "Errors")
        .filter_map(|s| s.dimensions["FunctionName"].clone())
        .collect::<BTreeSet<_>>();
    assert_eq!(errors, functions, "every function's errors are on the dashboard");
}

#[test]
fn metrics_md_lists_every_metric_with_its_labels_and_functions() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let cell = |c: &str| c.trim().trim_matches('`').to_string();
    let list =
        |c: &str| -> BTreeSet<String> { c.split(',').map(cell).filter(|s| !s.is_empty() && s != "—").collect() };
    let rows: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = doc
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').collect();
            (cell(cells[0]), (list(cells[2]), list(cells[3])))
        })
        .collect();
    for d in metrics::CATALOG {
        let (labels, functions) = rows
            .get(d.name)
            .unwrap_or_else(|| panic!("docs/metrics.md does not list {}", d.name));
        let want = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(labels, &want(d.labels), "{}'s labels", d.name);
        assert_eq!(functions, &want(d.functions), "{}'s functions", d.name);
    }
    assert_eq!(
        rows.len(),
        metrics::CATALOG.len(),
        "docs/metrics.md lists a metric no code emits"
    );
}

#[test]
fn a_rebalance_recommendation_does_nothing_unless_asked_as_in_karpenter() {
    let t = template();
    let p = &t["Parameters"]["RebalanceAction"];
    assert_eq!(p["Default"].as_str(), Some("ignore"));
    assert_eq!(strings(&p["AllowedValues"]), ["ignore", "replace", "drain"]);
}

#[test]
fn node_repair_is_on_unless_the_stack_turns_it_off() {
    let t = template();
    let p = &t["Parameters"]["NodeRepair"];
    assert_eq!(p["Default"].as_str(), Some("true"));
    assert_eq!(strings(&p["AllowedValues"]), ["true", "false"]);
    let f = &t["Resources"]["SweepFunction"]["Properties"]["Environment"]["Variables"];
    assert_eq!(
        reference(&f["NODESMITH_NODE_REPAIR"]).as_deref(),
        Some("NodeRepair"),
        "the sweep reads the parameter"
    );
}

#[test]
fn spot_to_spot_consolidation_is_off_unless_the_stack_turns_it_on_as_in_karpenter() {
    let t = template();
    let p = &t["Parameters"]["SpotToSpotConsolidation"];
    assert_eq!(p["Default"].as_str(), Some("false"));
    assert_eq!(strings(&p["AllowedValues"]), ["false", "true"]);
    let f = &t["Resources"]["SweepFunction"]["Properties"]["Environment"]["Variables"];
    assert_eq!(
        reference(&f["NODESMITH_SPOT_TO_SPOT_CONSOLIDATION"]).as_deref(),
        Some("SpotToSpotConsolidation"),
        "the sweep reads the parameter"
    );
}

#[test]
fn zonal_shift_handling_is_off_unless_the_stack_turns_it_on_and_reads_only_this_cluster() {
    let t = template();
    let p = &t["Parameters"]["EnableZonalShift"];
    assert_eq!(
        p["Default"].as_str(),
        Some("false"),
        "Karpenter's ENABLE_ZONAL_SHIFT default"
    );
    assert_eq!(strings(&p["AllowedValues"]), ["false", "true"]);
    let cluster = |name: &str| format!("arn:aws:eks:{}:{}:cluster/{name}", iam::REGION, iam::ACCOUNT);
    for f in ["ProvisionFunction", "SweepFunction"] {
        let env = &t["Resources"][f]["Properties"]["Environment"]["Variables"];
        assert_eq!(
            reference(&env["ENABLE_ZONAL_SHIFT"]).as_deref(),
            Some("EnableZonalShift"),
            "{f}"
        );
        assert_eq!(
            iam::resolve(&t, &env["NODESMITH_CLUSTER_ARN"]),
            serde_json::json!(cluster(iam::CLUSTER)),
            "{f}"
        );
        let s = iam::statements(&t, f);
        let read = |c: &str| {
            iam::Request::new("arc-zonal-shift:GetManagedResource", "*")
                .key("arc-zonal-shift:ResourceIdentifier", &cluster(c))
        };
        assert!(iam::allows(&s, &read(iam::CLUSTER)), "{f}");
        assert!(
            !iam::allows(&s, &read("other")),
            "{f} may read another resource's shifts"
        );
    }
}
