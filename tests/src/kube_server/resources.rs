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
) -> Resource {
    Resource {
        group,
        version,
        plural,
        kind,
        namespaced,
    }
}

/// Every resource the server serves.
pub const RESOURCES: &[Resource] = &[
    r("", "v1", "pods", "Pod", true),
    r("", "v1", "nodes", "Node", false),
    r("", "v1", "events", "Event", true),
    r("", "v1", "namespaces", "Namespace", false),
    r("", "v1", "persistentvolumes", "PersistentVolume", false),
    r("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true),
    r("apps", "v1", "daemonsets", "DaemonSet", true),
    r("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true),
    r("storage.k8s.io", "v1", "storageclasses", "StorageClass", false),
    r("events.k8s.io", "v1", "events", "Event", true),
    r("karpenter.sh", "v1", "nodepools", "NodePool", false),
    r("karpenter.k8s.aws", "v1", "ec2nodeclasses", "EC2NodeClass", false),
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
/// The PodDisruptionBudgets resource.
pub const PDBS: &Resource = &RESOURCES[7];
