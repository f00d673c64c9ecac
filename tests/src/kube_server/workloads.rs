//! The workload controllers and the garbage collectors, one pass at a time
//! ([`reconcile`]): Deployments own ReplicaSets, ReplicaSets keep
//! `spec.replicas` pods, dependents of deleted owners go, and so do pods bound
//! to deleted Nodes. Every write goes through the store, so watches see it.
//!
//! Simplifications: a template change replaces every pod at once (the new
//! ReplicaSet gets all replicas, old ones are scaled to zero, as the
//! `Recreate` strategy does, whatever the Deployment's strategy says);
//! pods count as available as soon as they are Ready (`minReadySeconds` is
//! ignored); pods are not adopted by selector, only by ownerReferences; only
//! Deployment and ReplicaSet owners are garbage collected.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};

use super::resources::{DEPLOYMENTS, NODES, PODS, REPLICASETS, Resource};
use super::store::{Store, name_of, namespace_of, now_rfc3339};

/// The label a Deployment puts on its ReplicaSets' pods, naming the template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// What one [`reconcile`] pass changed (`namespace/name` of each object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// ReplicaSets created for Deployments.
    pub replica_sets_created: Vec<String>,
    /// Pods created by ReplicaSets.
    pub pods_created: Vec<String>,
    /// Surplus pods ReplicaSets deleted.
    pub pods_deleted: Vec<String>,
    /// Objects garbage collected: dependents of deleted owners and pods bound to deleted Nodes.
    pub collected: Vec<String>,
}

/// Whether a resource has the `/scale` subresource.
pub fn is_scalable(res: &Resource) -> bool {
    res == DEPLOYMENTS || res == REPLICASETS
}

fn replicas_of(obj: &Value) -> i64 {
    obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)
}

/// A `metav1.LabelSelector` in the query-string form (`a=b,c in (d)`).
fn selector_string(sel: Option<&Value>) -> String {
    let mut terms = Vec::new();
    if let Some(m) = sel.and_then(|s| s.get("matchLabels")).and_then(Value::as_object) {
        terms.extend(m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))));
    }
    for e in sel
        .and_then(|s| s.get("matchExpressions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|vs| vs.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => terms.push(format!("{key} in ({})", values.join(","))),
            "NotIn" => terms.push(format!("{key} notin ({})", values.join(","))),
            "Exists" => terms.push(key.to_string()),
            "DoesNotExist" => terms.push(format!("!{key}")),
            _ => {}
        }
    }
    terms.join(",")
}

/// The autoscaling/v1 Scale of a Deployment or ReplicaSet.
pub fn scale_of(obj: &Value) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let pick = |f: &str| meta.get(f).cloned().unwrap_or(Value::Null);
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": pick("name"), "namespace": pick("namespace"), "uid": pick("uid"),
            "resourceVersion": pick("resourceVersion"), "creationTimestamp": pick("creationTimestamp"),
        },
        "spec": {"replicas": replicas_of(obj)},
        "status": {
            "replicas": obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": selector_string(obj.pointer("/spec/selector")),
        },
    })
}

/// The uid of an object's controlling owner of `kind`.
fn controller_uid<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller") == Some(&json!(true)) && r.get("kind").and_then(Value::as_str) == Some(kind))
        .and_then(|r| r.get("uid"))
        .and_then(Value::as_str)
}

fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("")
}

fn owner_ref(owner: &Value, kind: &str) -> Value {
    json!([{"apiVersion": "apps/v1", "kind": kind, "name": name_of(owner), "uid": uid_of(owner),
        "controller": true, "blockOwnerDeletion": true}])
}

/// JSON with object keys sorted, so equal templates hash equally whatever
/// order their keys arrived in.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&m[*k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// A pod-template-hash: a 32-bit FNV-1a of the template, its decimal digits
/// spelled in the alphabet Kubernetes uses for names (so it is a valid label).
pub fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h: u32 = 0x811c_9dc5;
    for b in canonical(template).bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHABET[usize::from(b) % ALPHABET.len()] as char)
        .collect()
}

fn with_label(labels: Option<&Value>, key: &str, value: &str) -> Value {
    let mut m = labels.and_then(Value::as_object).cloned().unwrap_or_default();
    m.insert(key.into(), json!(value));
    Value::Object(m)
}

/// One Deployment: its current ReplicaSet exists with its replicas, older ones are at zero.
fn reconcile_deployment(store: &mut Store, d: &Value, report: &mut ReconcileReport) {
    let (ns, name) = (namespace_of(d).to_string(), name_of(d).to_string());
    let template = d.pointer("/spec/template").cloned().unwrap_or_else(|| json!({}));
    let hash = template_hash(&template);
    let rs_name = format!("{name}-{hash}");
    let replicas = replicas_of(d);
    let owned: Vec<Value> = store
        .list(REPLICASETS, Some(&ns))
        .into_iter()
        .filter(|rs| controller_uid(rs, "Deployment") == Some(uid_of(d)))
        .collect();
    for rs in &owned {
        let want = if name_of(rs) == rs_name { replicas } else { 0 };
        if replicas_of(rs) != want {
            let mut next = rs.clone();
            next["spec"]["replicas"] = json!(want);
            let _ = store.update(REPLICASETS, &ns, name_of(rs), next);
        }
    }
    if owned.iter().any(|rs| name_of(rs) == rs_name) {
        return;
    }
    let mut pod_template = template;
    if !pod_template.is_object() {
        pod_template = json!({});
    }
    let labels = with_label(pod_template.pointer("/metadata/labels"), POD_TEMPLATE_HASH, &hash);
    pod_template["metadata"] = pod_template.get("metadata").cloned().unwrap_or_else(|| json!({}));
    pod_template["metadata"]["labels"] = labels.clone();
    let mut selector = d.pointer("/spec/selector").cloned().unwrap_or_else(|| json!({}));
    selector["matchLabels"] = with_label(selector.get("matchLabels"), POD_TEMPLATE_HASH, &hash);
    let rs = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": rs_name, "labels": labels, "ownerReferences": owner_ref(d, "Deployment")},
        "spec": {"replicas": replicas, "selector": selector, "template": pod_template},
    });
    if store.create(REPLICASETS, &ns, rs).is_ok() {
        report.replica_sets_created.push(format!("{ns}/{rs_name}"));
    }
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

fn node_of(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("")
}

/// A new pod from a ReplicaSet's template, with the API server's defaults.
fn pod_from(rs: &Value) -> Value {
    let template = rs.pointer("/spec/template").cloned().unwrap_or_else(|| json!({}));
    let mut meta: Map<String, Value> = template
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    meta.remove("name");
    meta.insert("generateName".into(), json!(format!("{}-", name_of(rs))));
    meta.insert("ownerReferences".into(), owner_ref(rs, "ReplicaSet"));
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(s) = spec.as_object_mut() {
        for (k, v) in [
            ("restartPolicy", json!("Always")),
            ("schedulerName", json!("default-scheduler")),
            ("dnsPolicy", json!("ClusterFirst")),
            ("terminationGracePeriodSeconds", json!(30)),
        ] {
            s.entry(k).or_insert(v);
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}})
}

/// Which surplus pod goes first: unbound, then pending, then not ready, then the newest.
fn deletion_rank(pod: &Value) -> (bool, bool, bool, Reverse<String>, Reverse<String>) {
    (
        !node_of(pod).is_empty(),
        pod.pointer("/status/phase").and_then(Value::as_str) != Some("Pending"),
        is_ready(pod),
        Reverse(
            pod.pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        ),
        Reverse(name_of(pod).to_string()),
    )
}

/// One ReplicaSet: creates or deletes pods to match `spec.replicas`, then writes its status.
/// `owned`: the live pods it controls.
fn reconcile_replica_set(store: &mut Store, rs: &Value, owned: Owned, report: &mut ReconcileReport) {
    let (ns, name) = (namespace_of(rs).to_string(), name_of(rs).to_string());
    let want = usize::try_from(replicas_of(rs)).unwrap_or(0);
    let Owned { mut names, mut ready } = owned;
    while names.len() < want {
        match store.create(PODS, &ns, pod_from(rs)) {
            Ok(p) => {
                report.pods_created.push(format!("{ns}/{}", name_of(&p)));
                names.push(name_of(&p).to_string());
            }
            Err(e) => {
                tracing::warn!(replicaset = %name, error = ?e, "test server: creating a pod failed");
                break;
            }
        }
    }
    if names.len() > want {
        // Only a scale-down reads the pods themselves, to pick which go.
        let mut pods: Vec<Value> = names.iter().filter_map(|n| store.get(PODS, &ns, n).cloned()).collect();
        pods.sort_by_key(deletion_rank);
        for p in pods.drain(..pods.len().saturating_sub(want)) {
            if store.delete(PODS, &ns, name_of(&p)).is_ok() {
                report.pods_deleted.push(format!("{ns}/{}", name_of(&p)));
            }
        }
        names = pods.iter().map(|p| name_of(p).to_string()).collect();
        ready = pods.iter().filter(|p| is_ready(p)).count();
    }
    let status = json!({
        "replicas": names.len(),
        "fullyLabeledReplicas": names.len(),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": rs.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
    });
    write_status(store, REPLICASETS, rs, status);
}

/// A ReplicaSet's live pods as its controller counts them: their names, and how many are ready.
#[derive(Default)]
struct Owned {
    names: Vec<String>,
    ready: usize,
}

/// A condition with its lastTransitionTime kept when its status did not change.
fn condition(old: &Value, kind: &str, ok: bool, reason: &str, message: &str) -> Value {
    let status = if ok { "True" } else { "False" };
    let previous = old
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind));
    let since = match previous {
        Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
        _ => json!(now_rfc3339()),
    };
    json!({"type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since, "lastUpdateTime": since})
}

/// A Deployment's status from its ReplicaSets' statuses.
fn deployment_status(store: &mut Store, d: &Value) {
    let ns = namespace_of(d).to_string();
    let current = format!(
        "{}-{}",
        name_of(d),
        template_hash(&d.pointer("/spec/template").cloned().unwrap_or(json!({})))
    );
    let owned: Vec<Value> = store
        .list(REPLICASETS, Some(&ns))
        .into_iter()
        .filter(|rs| controller_uid(rs, "Deployment") == Some(uid_of(d)))
        .collect();
    let sum = |f: &str| -> i64 {
        owned
            .iter()
            .map(|rs| rs.pointer(&format!("/status/{f}")).and_then(Value::as_i64).unwrap_or(0))
            .sum()
    };
    let (replicas, ready, available) = (sum("replicas"), sum("readyReplicas"), sum("availableReplicas"));
    let updated = owned
        .iter()
        .find(|rs| name_of(rs) == current)
        .and_then(|rs| rs.pointer("/status/replicas").and_then(Value::as_i64))
        .unwrap_or(0);
    let want = replicas_of(d);
    let mut status = json!({
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": d.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
        "conditions": [
            condition(d, "Available", available >= want, if available >= want { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                if available >= want { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }),
            condition(d, "Progressing", true, if updated == want && available >= want { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                &format!("ReplicaSet \"{current}\" is progressing.")),
        ],
    });
    if want > available {
        status["unavailableReplicas"] = json!(want - available);
    }
    write_status(store, DEPLOYMENTS, d, status);
}

/// Writes `status` when it differs from the stored one (no needless writes).
fn write_status(store: &mut Store, res: &Resource, obj: &Value, status: Value) {
    let (ns, name) = (namespace_of(obj).to_string(), name_of(obj).to_string());
    let Some(mut latest) = store.get(res, &ns, &name).cloned() else {
        return;
    };
    if latest.get("status") == Some(&status) {
        return;
    }
    latest["status"] = status;
    let _ = store.update(res, &ns, &name, latest);
}

/// Deletes objects of `res` whose controlling owner of `owner_kind` no longer exists.
fn collect_orphans(store: &mut Store, res: &Resource, owner: &Resource, report: &mut ReconcileReport) {
    // Owners looked up once: a list per object is quadratic in a burst of thousands of pods.
    // By namespace, so an object is looked up by reference (no strings made per object).
    let mut owners: HashMap<String, HashSet<String>> = HashMap::new();
    for o in store.list(owner, None) {
        owners
            .entry(namespace_of(&o).to_string())
            .or_default()
            .insert(uid_of(&o).to_string());
    }
    // Read in place: a pass runs on every pod change, and a copy of 20,000 pods each time held the store.
    let mut orphans = Vec::new();
    store.scan(res, None, None, None, |obj| {
        if let Some(uid) = controller_uid(obj, owner.kind)
            && !owners.get(namespace_of(obj)).is_some_and(|uids| uids.contains(uid))
        {
            orphans.push((namespace_of(obj).to_string(), name_of(obj).to_string()));
        }
        true
    });
    for (ns, name) in orphans {
        if store.delete(res, &ns, &name).is_ok() {
            report.collected.push(format!("{ns}/{name}"));
        }
    }
}

/// One pass of every controller: garbage collection first (so controllers
/// replace what it removed), then Deployments, ReplicaSets, and statuses.
pub fn reconcile(store: &mut Store) -> ReconcileReport {
    let mut report = ReconcileReport::default();
    collect_orphans(store, REPLICASETS, DEPLOYMENTS, &mut report);
    collect_orphans(store, PODS, REPLICASETS, &mut report);
    // The pod garbage collector: pods bound to a Node that is gone.
    let nodes: HashSet<String> = store.list(NODES, None).iter().map(|n| name_of(n).to_string()).collect();
    let mut stranded = Vec::new();
    store.scan(PODS, None, None, None, |pod| {
        let node = node_of(pod);
        if !node.is_empty() && !nodes.contains(node) {
            stranded.push((namespace_of(pod).to_string(), name_of(pod).to_string()));
        }
        true
    });
    for (ns, name) in stranded {
        if store.delete(PODS, &ns, &name).is_ok() {
            report.collected.push(format!("{ns}/{name}"));
        }
    }
    for d in store.list(DEPLOYMENTS, None) {
        reconcile_deployment(store, &d, &mut report);
    }
    // Each ReplicaSet's live pods, grouped in one walk over the pods.
    let mut owned: HashMap<String, Owned> = HashMap::new();
    store.scan(PODS, None, None, None, |pod| {
        if let Some(uid) = controller_uid(pod, "ReplicaSet").filter(|_| !is_terminal(pod)) {
            let o = owned.entry(format!("{}/{uid}", namespace_of(pod))).or_default();
            o.names.push(name_of(pod).to_string());
            o.ready += usize::from(is_ready(pod));
        }
        true
    });
    for rs in store.list(REPLICASETS, None) {
        let pods = owned
            .remove(&format!("{}/{}", namespace_of(&rs), uid_of(&rs)))
            .unwrap_or_default();
        reconcile_replica_set(store, &rs, pods, &mut report);
    }
    for d in store.list(DEPLOYMENTS, None) {
        deployment_status(store, &d);
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_hash_ignores_key_order_and_is_a_label_value() {
        let a = json!({"metadata": {"labels": {"app": "x", "b": "y"}}, "spec": {"containers": []}});
        let b = json!({"spec": {"containers": []}, "metadata": {"labels": {"b": "y", "app": "x"}}});
        assert_eq!(template_hash(&a), template_hash(&b));
        assert_ne!(template_hash(&a), template_hash(&json!({})));
        assert!(template_hash(&a).chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn selector_strings_cover_labels_and_expressions() {
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]}, {"key": "x", "operator": "DoesNotExist"}]});
        assert_eq!(selector_string(Some(&sel)), "app=web,tier in (a,b),!x");
    }

    #[test]
    fn surplus_pods_go_unbound_first_then_newest() {
        let pod = |name: &str, node: &str, ts: &str| {
            json!({"metadata": {"name": name, "creationTimestamp": ts}, "spec": {"nodeName": node},
                "status": {"phase": if node.is_empty() { "Pending" } else { "Running" }}})
        };
        let mut pods = [
            pod("old", "n", "2024-01-01T00:00:00Z"),
            pod("new", "n", "2024-01-02T00:00:00Z"),
            pod("unbound", "", "2023-01-01T00:00:00Z"),
        ];
        pods.sort_by_key(deletion_rank);
        let names: Vec<&str> = pods.iter().map(name_of).collect();
        assert_eq!(names, ["unbound", "new", "old"]);
    }
}
