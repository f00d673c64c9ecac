//! Karpenter v1 API types (NodePool, EC2NodeClass, NodeClaim), their defaults and validation.

pub mod duration;
pub mod ec2nodeclass;
pub(crate) mod hash;
pub mod manifest;
pub mod nodeclaim;
pub mod nodepool;
pub mod validation;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::labels;

pub use duration::NillableDuration;
pub use ec2nodeclass::{EC2NODECLASS_HASH_VERSION, EC2NodeClass, EC2NodeClassSpec, KubeletConfiguration};
pub use nodepool::{NODEPOOL_HASH_VERSION, NodePool, NodePoolSpec};
pub use validation::{Errors, Path};

/// Schema of a list of free-form objects (status conditions, resolved subnets):
/// a CRD's structural schema needs a type for the items, and their fields are kept as-is.
pub(crate) fn free_form_objects(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}})
}

/// Schema of a free-form object (the EC2NodeClass `kubelet` block, as Karpenter's CRD has it).
pub(crate) fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// A node taint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// The taint key.
    pub key: String,
    /// The taint value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: TaintEffect,
    /// When the taint was added (NoExecute only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

/// A taint's effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum TaintEffect {
    /// New pods that do not tolerate it are not scheduled.
    NoSchedule,
    /// The scheduler avoids the node when it can.
    PreferNoSchedule,
    /// Running pods that do not tolerate it are evicted.
    NoExecute,
}

impl Taint {
    /// A taint with a value.
    pub fn new(key: &str, value: Option<&str>, effect: TaintEffect) -> Self {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect,
            time_added: None,
        }
    }

    /// A Node's taint in this form (`None` for an unknown effect).
    pub fn from_k8s(t: &k8s_openapi::api::core::v1::Taint) -> Option<Taint> {
        let effect = match t.effect.as_str() {
            "NoSchedule" => TaintEffect::NoSchedule,
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            _ => return None,
        };
        Some(Taint {
            key: t.key.clone(),
            value: t.value.clone(),
            effect,
            time_added: None,
        })
    }

    fn validate(&self, errs: &mut Errors, p: &Path) {
        if self.key.is_empty() {
            errs.push(p.field("key"), "is required");
        } else if let Err(e) = labels::validate_key(&self.key) {
            errs.push(p.field("key"), e.to_string().replace("label key", "taint key"));
        }
        if let Some(v) = &self.value
            && !labels::is_label_value(v)
        {
            errs.push(p.field("value"), format!("invalid taint value {v:?}"));
        }
    }
}
