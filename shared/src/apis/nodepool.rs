//! `karpenter.sh/v1` NodePool: what nodes a pool may launch and how they are disrupted.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Taint;
use super::duration::NillableDuration;
use super::hash;
use super::validation::{Errors, Path};
use crate::labels;
use crate::quantity::Quantity;
use crate::requirements::{Operator, Requirement, Requirements};

/// The spec of a NodePool.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    plural = "nodepools",
    category = "karpenter",
    status = "NodePoolStatus",
    printcolumn = r#"{"name":"NodeClass","type":"string","jsonPath":".spec.template.spec.nodeClassRef.name"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.resources.nodes"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".spec.weight","priority":1}"#,
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".status.resources.cpu","priority":1}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".status.resources.memory","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// The template every NodeClaim of this pool is made from.
    pub template: NodeClaimTemplate,
    /// How and when nodes of this pool may be disrupted.
    #[serde(default)]
    pub disruption: Disruption,
    /// Ceilings on the total resources of all the pool's nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    /// Priority among pools: higher weights are tried first (1..=100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Static pool: keep exactly this many nodes (replaced when lost, never
    /// consolidated; the pool is not used by dynamic provisioning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i64>,
}

/// Observed state of a NodePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Resources of all nodes of the pool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Quantity>,
    /// Current conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::free_form_objects")]
    pub conditions: Vec<serde_json::Value>,
    /// How many nodes the pool has (Karpenter's field; kept as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// The NodeClass generation last observed (Karpenter's field; kept as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_observed_generation: Option<i64>,
}

/// The NodeClaim template of a NodePool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplate {
    /// Labels and annotations put on every node.
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// The node's shape and constraints.
    pub spec: NodeClaimTemplateSpec,
}

/// Labels and annotations of the NodeClaim template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels for every node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations for every node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The spec of the NodeClaim template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplateSpec {
    /// Constraints on instance type, zone, capacity type and other labels.
    #[serde(default)]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// The node class (EC2NodeClass) that holds the AWS settings.
    pub node_class_ref: NodeClassReference,
    /// Taints every node carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints present at start-up and removed by a daemon once ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// Node lifetime before it is replaced, or `Never` (default 720h).
    #[serde(default = "default_expire_after")]
    pub expire_after: NillableDuration,
    /// Longest a node may take to drain before it is forcibly deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<NillableDuration>,
}

/// Karpenter's default `expireAfter` (720h), for NodePools and NodeClaims alike.
pub(crate) fn default_expire_after() -> NillableDuration {
    NillableDuration::parse("720h").unwrap_or(NillableDuration::Never)
}

/// A node selector requirement, with Karpenter's minValues.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirementWithMinValues {
    /// The label key.
    pub key: String,
    /// In, NotIn, Exists, DoesNotExist, Gt, Lt, Gte or Lte.
    pub operator: Operator,
    /// The values (one integer for Gt/Lt/Gte/Lte, none for Exists/DoesNotExist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// The least number of distinct values to keep open across launch options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_values: Option<i64>,
}

/// A reference to the node class.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClassReference {
    /// API group (karpenter.k8s.aws).
    pub group: String,
    /// Kind (EC2NodeClass).
    pub kind: String,
    /// Name of the node class.
    pub name: String,
}

/// Consolidation policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConsolidationPolicy {
    /// Only empty nodes are consolidated.
    WhenEmpty,
    /// Empty and underutilized nodes are consolidated.
    #[default]
    WhenEmptyOrUnderutilized,
    /// As `WhenEmptyOrUnderutilized`, but a move goes only when the share of
    /// the pool's cost it saves is at least half the share of the pool's
    /// disruption cost it causes (Karpenter 1.14, `disruption::balanced`).
    Balanced,
}

/// Disruption settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// Which nodes consolidation may remove.
    #[serde(default)]
    pub consolidation_policy: ConsolidationPolicy,
    /// How long a node must be consolidatable before it is acted on, or `Never`.
    #[serde(default = "zero_duration")]
    pub consolidate_after: NillableDuration,
    /// How many nodes may be disrupted at once, and when.
    #[serde(default = "default_budgets")]
    pub budgets: Vec<Budget>,
}

impl Default for Disruption {
    fn default() -> Self {
        Disruption {
            consolidation_policy: ConsolidationPolicy::default(),
            consolidate_after: zero_duration(),
            budgets: default_budgets(),
        }
    }
}

fn zero_duration() -> NillableDuration {
    NillableDuration::Duration(std::time::Duration::ZERO)
}

fn default_budgets() -> Vec<Budget> {
    vec![Budget {
        nodes: "10%".into(),
        reasons: None,
        schedule: None,
        duration: None,
    }]
}

/// Why a node is being disrupted, as budgets name it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum DisruptionReason {
    /// Consolidation of underutilized nodes.
    Underutilized,
    /// Removal of empty nodes.
    Empty,
    /// Replacement of drifted nodes.
    Drifted,
}

/// A disruption budget.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// Nodes that may be disrupted at once: a count or a percentage.
    #[serde(default = "default_budget_nodes")]
    pub nodes: String,
    /// The reasons this budget applies to (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<DisruptionReason>>,
    /// A cron schedule (UTC) when the budget becomes active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// How long the budget stays active after each scheduled start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<NillableDuration>,
}

fn default_budget_nodes() -> String {
    "10%".into()
}

impl Budget {
    /// How many of `total` nodes this budget lets be disrupted at once
    /// (percentages round up, as Kubernetes' intstr scaling does).
    pub fn allowed(&self, total: usize) -> usize {
        match self.nodes.strip_suffix('%') {
            Some(p) => {
                let p: usize = p.parse().unwrap_or(0);
                (total * p).div_ceil(100)
            }
            None => self.nodes.parse().unwrap_or(0),
        }
    }
}

/// Version of [`NodePool::hash`]'s field set and format, stamped beside the hash
/// (`karpenter.sh/nodepool-hash-version`). Bump it when a hashed field is added or
/// removed, a hashed default changes, or the format changes: a claim whose version
/// differs from the pool's is re-stamped, not drifted. Deliberately not Karpenter's
/// (`v3`): the digests differ, so hashes Karpenter stamped are never compared with ours.
pub const NODEPOOL_HASH_VERSION: &str = "nodesmith-v1";

/// A taint as hashed: no `timeAdded` (not a template setting), an empty value as none.
fn taint_for_hash(t: &Taint) -> serde_json::Value {
    serde_json::json!({
        "key": t.key,
        "value": t.value.as_deref().filter(|v| !v.is_empty()),
        "effect": t.effect,
    })
}

impl NodePool {
    /// The static-drift hash of the pool's NodeClaim template (16 hex digits; see [`NODEPOOL_HASH_VERSION`]).
    ///
    /// As Karpenter v1 (`NodePool.Hash()` hashes `spec.template`, with `requirements`
    /// tagged `hash:"ignore"`): template labels and annotations, taints, startupTaints,
    /// nodeClassRef, expireAfter and terminationGracePeriod. Karpenter v1 hashes the last
    /// two too, and its Drift docs say a change to either on the NodePool "will induce
    /// NodeClaim drift" (existing claims keep their value; replacements get the new one).
    /// Requirements are drifted dynamically (a node drifts only when its labels stop
    /// satisfying them), and weight, limits and disruption are behavioural: none is hashed.
    /// Taints are a set (order and repeats do not count); expireAfter's `720h` default
    /// is applied when the manifest is read, so spelling it out changes nothing.
    pub fn hash(&self) -> String {
        let t = &self.spec.template;
        let ref_ = &t.spec.node_class_ref;
        hash::digest(&serde_json::json!({
            "labels": t.metadata.labels,
            "annotations": t.metadata.annotations,
            "taints": hash::set(t.spec.taints.iter().map(taint_for_hash)),
            "startupTaints": hash::set(t.spec.startup_taints.iter().map(taint_for_hash)),
            "nodeClassRef": {"group": ref_.group, "kind": ref_.kind, "name": ref_.name},
            "expireAfter": t.spec.expire_after.to_string(),
            "terminationGracePeriod": t.spec.termination_grace_period.map(|d| d.to_string()),
        }))
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// A static pool (`replicas` set): it keeps that many nodes, launched by
    /// the sweep, and is never consolidated or used by dynamic provisioning.
    pub fn is_static(&self) -> bool {
        self.spec.replicas.is_some()
    }

    /// The pool's weight (0 when unset).
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }

    /// The requirements a node of this pool satisfies: the spec's
    /// requirements, the template labels, the pool label itself, and
    /// on-demand capacity unless the pool names a capacity type.
    pub fn requirements(&self) -> Result<Requirements, crate::requirements::RequirementError> {
        let mut r = Requirements::new();
        for q in &self.spec.template.spec.requirements {
            let req = Requirement::new(&q.key, q.operator, &q.values)?
                .with_min_values(q.min_values.map(|m| m.max(0) as usize));
            r.add(req);
        }
        for (k, v) in &self.spec.template.metadata.labels {
            r.add(Requirement::in_values(k, &[v]));
        }
        r.add(Requirement::in_values(labels::NODEPOOL, &[self.name()]));
        // Karpenter's AWS provider documents on-demand as the default when a
        // pool says nothing about capacity type: spot is opt-in.
        if !r.has(labels::CAPACITY_TYPE) {
            r.add(Requirement::in_values(
                labels::CAPACITY_TYPE,
                &[labels::CAPACITY_ON_DEMAND],
            ));
        }
        Ok(r)
    }

    /// Checks what Karpenter's CRD validation checks; errors name the field path.
    pub fn validate(&self) -> Result<(), Errors> {
        let mut errs = Errors::new("NodePool", self.name());
        let spec = Path::root("spec");
        if self.name().is_empty() {
            errs.push(Path::root("metadata").field("name"), "is required");
        }
        if let Some(w) = self.spec.weight
            && !(1..=100).contains(&w)
        {
            errs.push(spec.field("weight"), format!("must be between 1 and 100, got {w}"));
        }
        let tmpl = spec.field("template");
        let meta = tmpl.field("metadata");
        if self.spec.template.metadata.labels.len() > 100 {
            errs.push(meta.field("labels"), "may have at most 100 labels");
        }
        for (k, v) in &self.spec.template.metadata.labels {
            let p = meta.field("labels").key(k);
            if let Err(e) = labels::validate_key(k) {
                errs.push(p.clone(), e.to_string());
            } else if let Some(why) = labels::nodepool_label_restriction(k) {
                errs.push(p.clone(), why);
            }
            if !labels::is_label_value(v) {
                errs.push(p, format!("invalid label value {v:?}"));
            }
        }
        let tspec = tmpl.field("spec");
        let reqs = &self.spec.template.spec.requirements;
        if reqs.len() > 100 {
            errs.push(tspec.field("requirements"), "may have at most 100 requirements");
        }
        for (i, q) in reqs.iter().enumerate() {
            validate_requirement(&mut errs, &tspec.field("requirements").index(i), q);
        }
        let ncr = &self.spec.template.spec.node_class_ref;
        let ncp = tspec.field("nodeClassRef");
        for (name, v) in [("group", &ncr.group), ("kind", &ncr.kind), ("name", &ncr.name)] {
            if v.is_empty() {
                errs.push(ncp.field(name), "is required");
            }
        }
        for (field, taints) in [
            ("taints", &self.spec.template.spec.taints),
            ("startupTaints", &self.spec.template.spec.startup_taints),
        ] {
            for (i, t) in taints.iter().enumerate() {
                t.validate(&mut errs, &tspec.field(field).index(i));
            }
        }
        let dp = spec.field("disruption");
        let budgets = &self.spec.disruption.budgets;
        if budgets.len() > 50 {
            errs.push(dp.field("budgets"), "may have at most 50 budgets");
        }
        for (i, b) in budgets.iter().enumerate() {
            let bp = dp.field("budgets").index(i);
            if !valid_budget_nodes(&b.nodes) {
                errs.push(
                    bp.field("nodes"),
                    format!(
                        "must be a non-negative integer or a percentage up to 100%, got {:?}",
                        b.nodes
                    ),
                );
            }
            if b.schedule.is_some() != b.duration.is_some() {
                errs.push(bp.clone(), "'schedule' must be set with 'duration'");
            }
            if let Some(s) = &b.schedule
                && let Err(e) = super::validation::validate_cron(s)
            {
                errs.push(bp.field("schedule"), e);
            }
        }
        // Karpenter's CEL rules for static pools (replicas set).
        if let Some(r) = self.spec.replicas {
            if r < 0 {
                errs.push(spec.field("replicas"), format!("must be at least 0, got {r}"));
            }
            if self.spec.weight.is_some() {
                errs.push(spec.field("weight"), "'weight' is not supported on static NodePools");
            }
            if self.spec.limits.keys().any(|k| k != "nodes") {
                errs.push(
                    spec.field("limits"),
                    "only 'limits.nodes' is supported on static NodePools",
                );
            }
        }
        if self.spec.limits.keys().any(String::is_empty) {
            errs.push(spec.field("limits"), "resource names must not be empty");
        }
        errs.into_result()
    }
}

fn valid_budget_nodes(s: &str) -> bool {
    match s.strip_suffix('%') {
        Some(p) => {
            !p.is_empty()
                && p.len() <= 3
                && p.bytes().all(|c| c.is_ascii_digit())
                && p.parse::<u32>().is_ok_and(|v| v <= 100)
        }
        None => !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()),
    }
}

fn validate_requirement(errs: &mut Errors, p: &Path, q: &NodeSelectorRequirementWithMinValues) {
    let key = labels::normalize(&q.key);
    if let Err(e) = labels::validate_key(&q.key) {
        errs.push(p.field("key"), e.to_string());
    }
    if key == labels::NODEPOOL || key == labels::HOSTNAME {
        errs.push(p.field("key"), format!("label {key:?} is restricted"));
    } else if !labels::is_well_known(key)
        && let Some(why) = labels::restricted_reason(key)
    {
        errs.push(p.field("key"), why);
    }
    if let Err(e) = Requirement::new(&q.key, q.operator, &q.values) {
        errs.push(p.field("values"), e.to_string());
    }
    if matches!(q.operator, Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte)
        && q.values.first().is_some_and(|v| v.parse::<i64>().is_ok_and(|n| n < 0))
    {
        errs.push(
            p.field("values"),
            format!("operator {} needs a non-negative integer", q.operator),
        );
    }
    for v in &q.values {
        if !labels::is_label_value(v) {
            errs.push(p.field("values"), format!("invalid label value {v:?}"));
        }
    }
    if let Some(m) = q.min_values {
        if !(1..=50).contains(&m) {
            errs.push(p.field("minValues"), format!("must be between 1 and 50, got {m}"));
        } else if q.operator == Operator::In && (q.values.len() as i64) < m {
            errs.push(
                p.field("minValues"),
                "requirements with 'minValues' must have at least that many values specified in the 'values' field",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(requirements: &str) -> NodePool {
        let yaml = format!(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: p}}\nspec:\n  template:\n    metadata: {{labels: {{team: a}}}}\n    spec:\n      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: d}}\n      requirements: {requirements}\n"
        );
        serde_yaml_ng::from_str(&yaml).unwrap()
    }

    #[test]
    fn capacity_type_defaults_to_on_demand() {
        let r = pool("[]").requirements().unwrap();
        let ct = r.get(labels::CAPACITY_TYPE).unwrap();
        assert!(ct.has("on-demand") && !ct.has("spot"));
        assert!(r.get("team").unwrap().has("a"));
        assert!(r.get(labels::NODEPOOL).unwrap().has("p"));
        let r = pool("[{key: karpenter.sh/capacity-type, operator: In, values: [spot]}]")
            .requirements()
            .unwrap();
        let ct = r.get(labels::CAPACITY_TYPE).unwrap();
        assert!(ct.has("spot") && !ct.has("on-demand"));
        let r = pool("[{key: karpenter.sh/capacity-type, operator: Exists}]")
            .requirements()
            .unwrap();
        assert!(r.get(labels::CAPACITY_TYPE).unwrap().has("spot"));
    }

    const HASHED_POOL: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: hashed}
spec:
  weight: 10
  limits: {cpu: "100"}
  disruption:
    consolidationPolicy: WhenEmpty
    consolidateAfter: 5m
    budgets: [{nodes: "20%"}]
  template:
    metadata:
      labels: {team: a, tier: web}
      annotations: {owner: ops}
    spec:
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements:
        - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}
      taints:
        - {key: dedicated, value: web, effect: NoSchedule}
        - {key: gpu, effect: NoExecute}
      startupTaints:
        - {key: node.cilium.io/agent-not-ready, value: "true", effect: NoExecute}
      expireAfter: 24h
      terminationGracePeriod: 1h
"#;

    fn hashed_pool() -> NodePool {
        serde_yaml_ng::from_str(HASHED_POOL).unwrap()
    }

    type Edit = (&'static str, fn(&mut NodePool));

    #[test]
    fn hash_changes_with_every_hashed_field() {
        use super::super::TaintEffect;
        let edits: &[Edit] = &[
            ("label value", |p| {
                p.spec.template.metadata.labels.insert("team".into(), "b".into());
            }),
            ("label added", |p| {
                p.spec.template.metadata.labels.insert("new".into(), "x".into());
            }),
            ("label removed", |p| {
                p.spec.template.metadata.labels.remove("tier");
            }),
            ("annotation value", |p| {
                p.spec
                    .template
                    .metadata
                    .annotations
                    .insert("owner".into(), "dev".into());
            }),
            ("annotation added", |p| {
                p.spec.template.metadata.annotations.insert("new".into(), "x".into());
            }),
            ("taint effect", |p| {
                p.spec.template.spec.taints[0].effect = TaintEffect::NoExecute
            }),
            ("taint value", |p| {
                p.spec.template.spec.taints[1].value = Some("yes".into())
            }),
            ("taint removed", |p| {
                p.spec.template.spec.taints.pop();
            }),
            ("taint added", |p| {
                p.spec
                    .template
                    .spec
                    .taints
                    .push(Taint::new("x", None, TaintEffect::NoSchedule))
            }),
            ("startup taint key", |p| {
                p.spec.template.spec.startup_taints[0].key = "other".into()
            }),
            ("startup taints cleared", |p| {
                p.spec.template.spec.startup_taints.clear()
            }),
            ("nodeClassRef name", |p| {
                p.spec.template.spec.node_class_ref.name = "other".into()
            }),
            ("nodeClassRef group", |p| {
                p.spec.template.spec.node_class_ref.group = "example.com".into()
            }),
            ("nodeClassRef kind", |p| {
                p.spec.template.spec.node_class_ref.kind = "OtherNodeClass".into()
            }),
            ("expireAfter", |p| {
                p.spec.template.spec.expire_after = NillableDuration::parse("48h").unwrap()
            }),
            ("expireAfter Never", |p| {
                p.spec.template.spec.expire_after = NillableDuration::Never
            }),
            ("terminationGracePeriod", |p| {
                p.spec.template.spec.termination_grace_period = NillableDuration::parse("2h").ok()
            }),
            ("terminationGracePeriod unset", |p| {
                p.spec.template.spec.termination_grace_period = None
            }),
        ];
        let base = hashed_pool().hash();
        let mut seen = std::collections::BTreeSet::from([base.clone()]);
        for (what, edit) in edits {
            let mut p = hashed_pool();
            edit(&mut p);
            let h = p.hash();
            assert_ne!(h, base, "{what} must change the hash");
            assert!(seen.insert(h), "{what} collides with another edit");
        }
    }

    #[test]
    fn hash_ignores_behavioural_fields_and_requirements() {
        let edits: &[Edit] = &[
            ("requirement values", |p| {
                p.spec.template.spec.requirements[0].values = vec!["on-demand".into()]
            }),
            ("requirements cleared", |p| p.spec.template.spec.requirements.clear()),
            ("weight", |p| p.spec.weight = Some(90)),
            ("weight unset", |p| p.spec.weight = None),
            ("limits", |p| {
                p.spec.limits.insert("memory".into(), Quantity::from_mib(1024));
            }),
            ("consolidation policy", |p| {
                p.spec.disruption.consolidation_policy = ConsolidationPolicy::WhenEmptyOrUnderutilized
            }),
            ("consolidateAfter", |p| {
                p.spec.disruption.consolidate_after = NillableDuration::Never
            }),
            ("budgets", |p| p.spec.disruption.budgets[0].nodes = "0".into()),
            ("replicas", |p| p.spec.replicas = Some(3)),
            ("pool name", |p| p.metadata.name = Some("renamed".into())),
            ("taint order", |p| p.spec.template.spec.taints.reverse()),
            ("taint repeated", |p| {
                let t = p.spec.template.spec.taints[0].clone();
                p.spec.template.spec.taints.push(t)
            }),
            ("taint timeAdded", |p| {
                p.spec.template.spec.taints[0].time_added = Some("2026-01-01T00:00:00Z".into())
            }),
        ];
        let base = hashed_pool().hash();
        for (what, edit) in edits {
            let mut p = hashed_pool();
            edit(&mut p);
            assert_eq!(p.hash(), base, "{what} must not change the hash");
        }
    }

    #[test]
    fn hash_ignores_key_order_and_spelled_out_defaults() {
        let reordered = r#"
kind: NodePool
apiVersion: karpenter.sh/v1
spec:
  template:
    spec:
      terminationGracePeriod: 60m
      expireAfter: 1440m
      startupTaints:
        - {effect: NoExecute, value: "true", key: node.cilium.io/agent-not-ready}
      taints:
        - {effect: NoExecute, key: gpu, value: ""}
        - {effect: NoSchedule, key: dedicated, value: web}
      requirements: []
      nodeClassRef: {name: default, kind: EC2NodeClass, group: karpenter.k8s.aws}
    metadata:
      annotations: {owner: ops}
      labels: {tier: web, team: a}
metadata: {name: hashed}
"#;
        let p: NodePool = serde_yaml_ng::from_str(reordered).unwrap();
        assert_eq!(p.hash(), hashed_pool().hash());

        // expireAfter's default (720h) spelled out or left to the default: one hash.
        let with_default = |extra: &str| {
            let y = format!(
                "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: d}}\nspec:\n  template:\n    \
                 spec:\n      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n{extra}"
            );
            serde_yaml_ng::from_str::<NodePool>(&y).unwrap().hash()
        };
        assert_eq!(with_default(""), with_default("      expireAfter: 720h\n"));
        assert_eq!(
            with_default(""),
            with_default("      taints: []\n    metadata: {labels: {}}\n")
        );
        assert_ne!(with_default(""), with_default("      expireAfter: 721h\n"));
    }

    #[test]
    fn restricted_template_labels_are_rejected_with_their_path() {
        let with_label = |k: &str| {
            let mut p = pool("[]");
            p.spec.template.metadata.labels.insert(k.into(), "v".into());
            p.validate().err().map(|e| e.fields)
        };
        let table: &[(&str, Option<&str>)] = &[
            ("example.com/team", None),
            ("topology.kubernetes.io/zone", None),
            ("node.kubernetes.io/instance-type", None),
            ("node-restriction.kubernetes.io/team", None),
            ("kops.k8s.io/instancegroup", None),
            ("karpenter.sh/capacity-type", None),
            ("karpenter.k8s.aws/instance-family", None),
            (
                "kubernetes.io/hostname",
                Some("label \"kubernetes.io/hostname\" is restricted"),
            ),
            (
                "karpenter.sh/nodepool",
                Some("label \"karpenter.sh/nodepool\" is restricted"),
            ),
            (
                "kubernetes.io/team",
                Some("label domain \"kubernetes.io\" is restricted"),
            ),
            (
                "node-role.kubernetes.io/worker",
                Some("label domain \"kubernetes.io\" is restricted"),
            ),
            ("k8s.io/x", Some("label domain \"k8s.io\" is restricted")),
            (
                "karpenter.sh/custom",
                Some("label domain \"karpenter.sh\" is restricted"),
            ),
            (
                "karpenter.k8s.aws/ec2nodeclass",
                Some("label domain \"karpenter.k8s.aws\" is restricted"),
            ),
            (
                "karpenter.k8s.aws/capacity-reservation-id",
                Some("label domain \"karpenter.k8s.aws\" is restricted"),
            ),
        ];
        for (k, want) in table {
            let got = with_label(k);
            match want {
                None => assert_eq!(got, None, "{k}"),
                Some(msg) => assert_eq!(
                    got,
                    Some(vec![super::super::validation::FieldError {
                        path: format!("spec.template.metadata.labels[{k:?}]"),
                        message: msg.to_string(),
                    }]),
                    "{k}"
                ),
            }
        }
    }

    /// A pool of `spec` lines (indented two spaces under `spec:`).
    fn parsed(spec: &str) -> Result<NodePool, serde_yaml_ng::Error> {
        serde_yaml_ng::from_str(&format!(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: p}}\nspec:\n  template:\n    spec:\n      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: d}}\n{spec}"
        ))
    }

    #[test]
    fn balanced_policy_is_read_and_consolidate_after_defaults_to_zero() {
        let p = parsed("  disruption:\n    consolidationPolicy: Balanced\n").unwrap();
        assert_eq!(format!("{:?}", p.spec.disruption.consolidation_policy), "Balanced");
        assert_eq!(
            p.spec.disruption.consolidate_after,
            NillableDuration::parse("0s").unwrap()
        );
        assert!(p.validate().is_ok());
        // A disruption block naming only budgets still gets consolidateAfter 0s.
        let p = parsed("  disruption:\n    budgets: [{nodes: '1'}]\n").unwrap();
        assert_eq!(
            p.spec.disruption.consolidate_after,
            NillableDuration::parse("0s").unwrap()
        );
        assert!(parsed("  disruption:\n    consolidationPolicy: WhenBored\n").is_err());
    }

    #[test]
    fn static_pools_refuse_weight_and_limits_other_than_nodes() {
        let paths = |spec: &str| -> Vec<String> {
            parsed(spec)
                .unwrap()
                .validate()
                .err()
                .map(|e| e.fields.into_iter().map(|f| f.path).collect())
                .unwrap_or_default()
        };
        let table: &[(&str, &[&str])] = &[
            ("  replicas: 3\n", &[]),
            ("  replicas: 0\n", &[]),
            ("  replicas: 3\n  limits: {nodes: '5'}\n", &[]),
            ("  replicas: -1\n", &["spec.replicas"]),
            ("  replicas: 3\n  weight: 10\n", &["spec.weight"]),
            ("  replicas: 3\n  limits: {cpu: '10', nodes: '5'}\n", &["spec.limits"]),
            // Dynamic pools keep both.
            ("  weight: 10\n  limits: {cpu: '10'}\n", &[]),
        ];
        for (spec, want) in table {
            assert_eq!(paths(spec), *want, "{spec}");
        }
        assert!(parsed("  replicas: 2\n").unwrap().is_static());
        assert!(!parsed("").unwrap().is_static());
    }

    #[test]
    fn budgets_round_percentages_up() {
        let b = |nodes: &str| Budget {
            nodes: nodes.into(),
            reasons: None,
            schedule: None,
            duration: None,
        };
        assert_eq!(b("10%").allowed(5), 1);
        assert_eq!(b("10%").allowed(0), 0);
        assert_eq!(b("50%").allowed(3), 2);
        assert_eq!(b("3").allowed(100), 3);
        assert_eq!(b("0").allowed(100), 0);
    }
}
