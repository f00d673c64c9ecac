//! Reading a list one object at a time: an object this release cannot read
//! (an enum value or field a newer CRD allows) is set aside with why, and the
//! others are used, so one bad NodePool does not stop every solve (pure).

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// An object of kind `K` as the API server sent it, not yet read as `K`: a
/// list of these always decodes, and [`decode_each`] reads them one by one.
#[derive(Clone, Debug)]
pub struct Raw<K> {
    /// The object's JSON.
    pub value: Value,
    metadata: ObjectMeta,
    kind: PhantomData<fn() -> K>,
}

impl<'de, K> Deserialize<'de> for Raw<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        // Only for naming the object: a metadata block that does not read is empty here.
        let metadata = value
            .get("metadata")
            .and_then(|m| ObjectMeta::deserialize(m).ok())
            .unwrap_or_default();
        Ok(Raw {
            value,
            metadata,
            kind: PhantomData,
        })
    }
}

impl<K: kube::Resource<DynamicType = ()>> kube::Resource for Raw<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An object of a list that could not be read as its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Undecodable {
    /// The object, for an Event on it.
    pub object: ObjectReference,
    /// What serde found wrong, with the field path where it knows it.
    pub error: String,
}

/// Splits a list's raw items into those that read as `K` and those that do
/// not; `api_version` and `kind` name the objects when an item omits them.
pub fn decode_each<K: DeserializeOwned>(
    items: Vec<Value>,
    api_version: &str,
    kind: &str,
) -> (Vec<K>, Vec<Undecodable>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for item in items {
        let object = reference(&item, api_version, kind);
        match serde_path_to_error::deserialize::<_, K>(item) {
            Ok(k) => good.push(k),
            Err(e) => bad.push(Undecodable {
                object,
                error: format!("{}: {}", e.path(), e.inner()),
            }),
        }
    }
    (good, bad)
}

fn reference(item: &Value, api_version: &str, kind: &str) -> ObjectReference {
    let text = |ptr: &str| item.pointer(ptr).and_then(Value::as_str).map(str::to_string);
    ObjectReference {
        api_version: text("/apiVersion").or_else(|| Some(api_version.into())),
        kind: text("/kind").or_else(|| Some(kind.into())),
        name: text("/metadata/name"),
        namespace: text("/metadata/namespace"),
        uid: text("/metadata/uid"),
        resource_version: text("/metadata/resourceVersion"),
        field_path: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::{EC2NodeClass, NodePool};
    use serde_json::json;

    fn pool(name: &str, disruption: Value) -> Value {
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "7"},
            "spec": {"disruption": disruption, "limits": {"cpu": "1e21", "memory": "500u"},
                "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []}}}})
    }

    #[test]
    fn one_bad_object_is_set_aside_and_the_rest_are_read() {
        let items = vec![
            pool("a", json!({"consolidationPolicy": "WhenEmpty"})),
            // An enum value this release does not know (`Balanced` was, before 1.14's was honoured).
            pool("b", json!({"consolidationPolicy": "WhenIdle"})),
            pool("c", json!({})),
        ];
        let (good, bad) = decode_each::<NodePool>(items, "karpenter.sh/v1", "NodePool");
        let names: Vec<&str> = good.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].object.name.as_deref(), Some("b"));
        assert_eq!(bad[0].object.uid.as_deref(), Some("uid-b"));
        assert_eq!(bad[0].object.kind.as_deref(), Some("NodePool"));
        assert!(bad[0].error.contains("WhenIdle"), "{}", bad[0].error);
        assert!(
            bad[0].error.starts_with("spec.disruption.consolidationPolicy"),
            "{}",
            bad[0].error
        );
    }

    #[test]
    fn items_without_type_fields_are_named_by_the_list() {
        let (good, bad) = decode_each::<EC2NodeClass>(
            vec![json!({"metadata": {"name": "x"}, "spec": {"role": 5}})],
            "karpenter.k8s.aws/v1",
            "EC2NodeClass",
        );
        assert!(good.is_empty());
        assert_eq!(bad[0].object.api_version.as_deref(), Some("karpenter.k8s.aws/v1"));
        assert_eq!(bad[0].object.kind.as_deref(), Some("EC2NodeClass"));
    }
}
