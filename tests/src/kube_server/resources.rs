//! The resources the test server knows: group, version, plural, kind, scope.

/// One served resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group ("" for core).
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Plural name in URLs.
    pub plural: &'static str,
    /// Kind of its objects.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Short names kubectl accepts (`po`, `deploy` ...).
    pub short_names: &'static [&'static str],
}

impl Resource {
    /// A key unique among served resources.
    pub fn id(&self) -> (&'static str, &'static str) {
        (self.group, self.plural)
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const fn r(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        group,
        version,
        plural,
        kind,
        namespaced,
        short_names,
    }
}

/// Every resource the server serves. The first entries are named below by
/// index: keep their order.
pub const RESOURCES: &[Resource] = &[
    r("", "v1", "pods", "Pod", true, &["po"]),
    r("", "v1", "nodes", "Node", false, &["no"]),
    r("", "v1", "events", "Event", true, &["ev"]),
    r("", "v1", "namespaces", "Namespace", false, &["ns"]),
    r("", "v1", "persistentvolumes", "PersistentVolume", false, &["pv"]),
    r(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
    ),
    r("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"]),
    r(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        &["pdb"],
    ),
    r("storage.k8s.io", "v1", "storageclasses", "StorageClass", false, &["sc"]),
    r("events.k8s.io", "v1", "events", "Event", true, &["ev"]),
    r("karpenter.sh", "v1", "nodepools", "NodePool", false, &[]),
    r(
        "karpenter.k8s.aws",
        "v1",
        "ec2nodeclasses",
        "EC2NodeClass",
        false,
        &["ec2nc", "ec2ncs"],
    ),
    r("apps", "v1", "deployments", "Deployment", true, &["deploy"]),
    r("apps", "v1", "replicasets", "ReplicaSet", true, &["rs"]),
    r(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
    ),
    r("karpenter.sh", "v1", "nodeclaims", "NodeClaim", false, &[]),
    // What `nodesmith install` applies besides the above.
    r("", "v1", "configmaps", "ConfigMap", true, &["cm"]),
    r("", "v1", "serviceaccounts", "ServiceAccount", true, &["sa"]),
    r(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        &[],
    ),
    r(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
    ),
];

/// Looks a resource up by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Looks a resource up by apiVersion and kind (for seeding typed objects).
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// The pods resource.
pub const PODS: &Resource = &RESOURCES[0];
/// The nodes resource.
pub const NODES: &Resource = &RESOURCES[1];
/// The core events resource.
pub const EVENTS: &Resource = &RESOURCES[2];
/// The namespaces resource.
pub const NAMESPACES: &Resource = &RESOURCES[3];
/// The DaemonSets resource.
pub const DAEMONSETS: &Resource = &RESOURCES[6];
/// The PodDisruptionBudgets resource.
pub const PDBS: &Resource = &RESOURCES[7];
/// The Deployments resource.
pub const DEPLOYMENTS: &Resource = &RESOURCES[12];
/// The ReplicaSets resource.
pub const REPLICASETS: &Resource = &RESOURCES[13];
/// The CustomResourceDefinitions resource: a CRD installed here makes the
/// server prune and check its kind's objects against the CRD's schema.
pub const CRDS: &Resource = &RESOURCES[14];

/// Subresources the server serves: (resource plural, subresource, the kind
/// it takes and returns as `group/version/kind`, or "" for the parent's kind).
pub const SUBRESOURCES: &[(&str, &str, &str)] = &[
    ("pods", "status", ""),
    ("pods", "binding", "/v1/Binding"),
    ("pods", "eviction", "policy/v1/Eviction"),
    ("nodes", "status", ""),
    ("namespaces", "status", ""),
    ("daemonsets", "status", ""),
    ("deployments", "status", ""),
    ("deployments", "scale", "autoscaling/v1/Scale"),
    ("replicasets", "status", ""),
    ("replicasets", "scale", "autoscaling/v1/Scale"),
    ("poddisruptionbudgets", "status", ""),
    ("nodepools", "status", ""),
    ("ec2nodeclasses", "status", ""),
    ("nodeclaims", "status", ""),
];
