//! The template's operational settings: SQS event sources never take more
//! than their function's reserved concurrency (so throttled batches do not
//! come back late and fill the dead-letter queues), the scheduled sweep is
//! neither retried nor queued, the pending-pods queue takes messages only
//! from the forwarder and the functions, and CloudWatch alarms cover what an
//! operator must hear about (README, "Operations").

use std::collections::BTreeSet;

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

/// The code emits every metric an alarm of the `nodesmith` namespace watches.
#[test]
fn alarms_watch_metrics_the_code_emits() {
    let t = template();
    let src = |p: &str| {
        std::fs::read_to_string(std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)).unwrap()
    };
    let code = [src("shared/src/sweep/mod.rs"), src("shared/src/launch/batch.rs")].concat();
    let mut watched = 0;
    for (name, a) in alarms(&t) {
        if a["Properties"]["Namespace"].as_str() != Some("nodesmith") {
            continue;
        }
        watched += 1;
        let metric = a["Properties"]["MetricName"].as_str().unwrap();
        assert!(
            code.contains(&format!("\"{metric}\"")),
            "{name} watches {metric}, which no code emits"
        );
        assert!(strings(&a["Properties"]["Dimensions"]).contains(&"Function".to_string()));
    }
    assert_eq!(watched, 3);
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
