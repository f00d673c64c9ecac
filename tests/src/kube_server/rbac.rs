//! Who is calling, and what they may do, as an EKS API server decides it for
//! nodesmith's functions.
//!
//! In a real cluster the stack's access entries map the functions' IAM roles
//! to the group `nodesmith:lambda`, which `infra/k8s/lambda-rbac.yaml` binds to
//! the ClusterRole `nodesmith-lambda`. Here the bearer token says who calls
//! ([`identify`]): an EKS token (`k8s-aws-v1.…`, what
//! `nodesmith::kubernetes::auth` mints) or the literal [`LAMBDA_TOKEN`] is
//! that group; anything else, no token included, is the test's cluster admin
//! (the harness, `kubectl` with the server's kubeconfig, the kubelet
//! emulator), which is never restricted. The functions' requests are
//! authorized against the rules of the real manifest ([`Policy::lambda`]),
//! mapped to (API group, resource[/subresource], verb) as kube-apiserver maps
//! them ([`attributes`]); non-resource paths (`/version`, discovery, OpenAPI)
//! are open to everyone, as `system:discovery` makes them.

use std::collections::HashMap;

use axum::http::{HeaderMap, Method};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use serde_json::Value;

/// Where the functions' RBAC lives (compiled in, so the server needs no source tree).
pub const LAMBDA_RBAC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/k8s/lambda-rbac.yaml");
const LAMBDA_RBAC: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/k8s/lambda-rbac.yaml"));

/// The Kubernetes group the stack's access entries give the functions' roles.
pub const LAMBDA_GROUP: &str = "nodesmith:lambda";
/// The ClusterRole that group is meant to be bound to.
pub const LAMBDA_ROLE: &str = "nodesmith-lambda";
/// A bearer token that stands for the functions without minting an EKS token.
pub const LAMBDA_TOKEN: &str = "nodesmith-lambda";
/// The user name the functions' requests are refused under.
pub const LAMBDA_USER: &str = "nodesmith-lambda";
/// The prefix of EKS bearer tokens (as `nodesmith::kubernetes::auth` mints them).
pub const EKS_TOKEN_PREFIX: &str = "k8s-aws-v1.";

/// Who sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// The test's cluster admin: no restriction.
    Admin,
    /// nodesmith's functions: a member of [`LAMBDA_GROUP`].
    Lambda,
}

/// Who sent a request, from its `Authorization: Bearer` token: an EKS token
/// or [`LAMBDA_TOKEN`] is [`Identity::Lambda`]; anything else, or none, is
/// [`Identity::Admin`].
pub fn identify(headers: &HeaderMap) -> Identity {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match token {
        Some(t) if t == LAMBDA_TOKEN || t.starts_with(EKS_TOKEN_PREFIX) => Identity::Lambda,
        _ => Identity::Admin,
    }
}

/// What a resource request asks for, as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRequest {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The API group ("" for core).
    pub group: String,
    /// The resource's plural.
    pub resource: String,
    /// The subresource, if any (`status`, `eviction`, `scale` ...).
    pub subresource: Option<String>,
    /// The namespace ("" for cluster-scoped requests).
    pub namespace: String,
    /// The object's name ("" for collections and creates).
    pub name: String,
}

impl ResourceRequest {
    /// `resource` or `resource/subresource`, as rules name it.
    pub fn resource_path(&self) -> String {
        match &self.subresource {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// A request's authorization attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attributes {
    /// A path outside the resource API (`/version`, `/api`, `/apis/g/v`, `/openapi/…`).
    NonResource,
    /// A request on a resource.
    Resource(ResourceRequest),
}

/// Maps a request to its attributes as kube-apiserver's request-info
/// resolver does: GET with a name is `get`, without one `list` (or `watch`
/// when `?watch` is set and not false), POST `create`, PUT `update`, PATCH
/// `patch`, DELETE with a name `delete`, without one `deletecollection`.
/// The resource need not be one the server serves: authorization comes first.
pub fn attributes(method: &Method, path: &str, query: &HashMap<String, String>) -> Attributes {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", g, _version, rest @ ..] => (*g, rest),
        _ => return Attributes::NonResource,
    };
    if rest.is_empty() {
        return Attributes::NonResource;
    }
    let mut parts: &[&str] = rest;
    let mut namespace = String::new();
    if parts[0] == "namespaces" && parts.len() > 1 {
        namespace = parts[1].to_string();
        // `/namespaces/x` and `/namespaces/x/status` are the Namespace itself.
        if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
            parts = &parts[2..];
        }
    }
    let resource = parts[0].to_string();
    let name = parts.get(1).map(|s| s.to_string()).unwrap_or_default();
    let subresource = parts.get(2).map(|s| s.to_string());
    let watch = query
        .get("watch")
        .is_some_and(|w| !matches!(w.to_ascii_lowercase().as_str(), "false" | "0"));
    let verb = match *method {
        Method::GET | Method::HEAD if !name.is_empty() => "get",
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if !name.is_empty() => "delete",
        Method::DELETE => "deletecollection",
        _ => "",
    };
    Attributes::Resource(ResourceRequest {
        verb: verb.to_string(),
        group: group.to_string(),
        resource,
        subresource,
        namespace,
        name,
    })
}

/// The rules one group holds through the ClusterRoleBindings of a manifest.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    rules: Vec<PolicyRule>,
}

impl Policy {
    /// The rules `infra/k8s/lambda-rbac.yaml` gives [`LAMBDA_GROUP`]. Errors
    /// name the file and what is wrong with it, including a binding that does
    /// not bind the group to [`LAMBDA_ROLE`].
    pub fn lambda() -> Result<Policy, String> {
        Policy::parse(LAMBDA_RBAC, LAMBDA_GROUP)
            .and_then(|p| {
                if p.bound_roles.iter().any(|r| r == LAMBDA_ROLE) {
                    Ok(p.policy)
                } else {
                    Err(format!(
                        "no ClusterRoleBinding binds the group {LAMBDA_GROUP:?} to the ClusterRole {LAMBDA_ROLE:?} (bound: {:?})",
                        p.bound_roles
                    ))
                }
            })
            .map_err(|e| format!("{LAMBDA_RBAC_PATH}: {e}"))
    }

    /// The rules of every ClusterRole that a ClusterRoleBinding in the
    /// multi-document `yaml` binds to `group`.
    pub fn parse(yaml: &str, group: &str) -> Result<Bound, String> {
        let mut roles: HashMap<String, Vec<PolicyRule>> = HashMap::new();
        let mut bindings: Vec<ClusterRoleBinding> = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
            let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| format!("not YAML: {e}"))?;
            match v.get("kind").and_then(Value::as_str) {
                Some("ClusterRole") => {
                    let r: ClusterRole = serde_json::from_value(v).map_err(|e| format!("a ClusterRole: {e}"))?;
                    let name = r.metadata.name.clone().unwrap_or_default();
                    roles.insert(name, r.rules.unwrap_or_default());
                }
                Some("ClusterRoleBinding") => {
                    bindings.push(serde_json::from_value(v).map_err(|e| format!("a ClusterRoleBinding: {e}"))?);
                }
                _ => {}
            }
        }
        let mut bound = Bound::default();
        for b in bindings {
            let binds_group = b.subjects.iter().flatten().any(|s| {
                s.kind == "Group" && s.name == group && s.api_group.as_deref() == Some("rbac.authorization.k8s.io")
            });
            if !binds_group || b.role_ref.kind != "ClusterRole" {
                continue;
            }
            let rules = roles.get(&b.role_ref.name).ok_or_else(|| {
                format!(
                    "the ClusterRoleBinding binds {group:?} to the ClusterRole {:?}, which the file does not define",
                    b.role_ref.name
                )
            })?;
            bound.policy.rules.extend(rules.iter().cloned());
            bound.bound_roles.push(b.role_ref.name.clone());
        }
        Ok(bound)
    }

    /// The rules.
    pub fn rules(&self) -> &[PolicyRule] {
        &self.rules
    }

    /// Whether some rule allows the request (RBAC only adds, never denies).
    pub fn allows(&self, r: &ResourceRequest) -> bool {
        self.rules.iter().any(|rule| rule_allows(rule, r))
    }
}

/// What [`Policy::parse`] found for a group.
#[derive(Clone, Debug, Default)]
pub struct Bound {
    /// The group's rules.
    pub policy: Policy,
    /// The ClusterRoles bound to the group.
    pub bound_roles: Vec<String>,
}

fn has(list: Option<&Vec<String>>, want: &str) -> bool {
    list.is_some_and(|l| l.iter().any(|x| x == "*" || x == want))
}

/// One rule against one request, as RBAC's rule matching does: groups and
/// verbs by name or `*`; resources by `resource[/sub]`, `*`, or `*/sub`;
/// `resourceNames`, when set, only for requests naming one of them.
fn rule_allows(rule: &PolicyRule, r: &ResourceRequest) -> bool {
    let verb = rule.verbs.iter().any(|v| v == "*" || *v == r.verb);
    let group = has(rule.api_groups.as_ref(), &r.group);
    let path = r.resource_path();
    let resource = rule
        .resources
        .iter()
        .flatten()
        .any(|x| x == "*" || *x == path || r.subresource.as_ref().is_some_and(|s| *x == format!("*/{s}")));
    let name = match &rule.resource_names {
        Some(names) if !names.is_empty() => names.contains(&r.name),
        _ => true,
    };
    verb && group && resource && name
}

/// The message kube-apiserver answers a refused request with, e.g.
/// `pods "x" is forbidden: User "u" cannot delete resource "pods" in API group "" in the namespace "default"`.
pub fn forbidden_message(user: &str, r: &ResourceRequest) -> String {
    let scope = if r.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {:?}", r.namespace)
    };
    let why = format!(
        "User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
        r.verb,
        r.resource_path(),
        r.group
    );
    let qualified = if r.group.is_empty() {
        r.resource.clone()
    } else {
        format!("{}.{}", r.resource, r.group)
    };
    if r.name.is_empty() {
        format!("{qualified} is forbidden: {why}")
    } else {
        format!("{qualified} {:?} is forbidden: {why}", r.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, path: &str, query: &[(&str, &str)]) -> Attributes {
        let q = query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        attributes(&method, path, &q)
    }

    fn res(method: Method, path: &str, query: &[(&str, &str)]) -> ResourceRequest {
        match req(method.clone(), path, query) {
            Attributes::Resource(r) => r,
            Attributes::NonResource => panic!("{method} {path} is a resource request"),
        }
    }

    fn short(r: &ResourceRequest) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            r.verb,
            r.group,
            r.resource_path(),
            r.namespace,
            r.name
        )
    }

    #[test]
    fn requests_map_to_verbs_resources_and_scopes_as_kube_apiserver_maps_them() {
        let cases = [
            (Method::GET, "/api/v1/nodes/n1", &[][..], "get||nodes||n1"),
            (Method::GET, "/api/v1/nodes", &[], "list||nodes||"),
            (Method::GET, "/api/v1/pods", &[("watch", "true")], "watch||pods||"),
            (Method::GET, "/api/v1/pods", &[("watch", "false")], "list||pods||"),
            (
                Method::GET,
                "/api/v1/namespaces/ns/pods",
                &[("watch", "1")],
                "watch||pods|ns|",
            ),
            (Method::POST, "/api/v1/namespaces/ns/pods", &[], "create||pods|ns|"),
            (
                Method::POST,
                "/api/v1/namespaces/ns/pods/p/eviction",
                &[],
                "create||pods/eviction|ns|p",
            ),
            (
                Method::PUT,
                "/apis/karpenter.k8s.aws/v1/ec2nodeclasses/c/status",
                &[],
                "update|karpenter.k8s.aws|ec2nodeclasses/status||c",
            ),
            (
                Method::PATCH,
                "/apis/apps/v1/namespaces/ns/deployments/d/scale",
                &[],
                "patch|apps|deployments/scale|ns|d",
            ),
            (Method::DELETE, "/api/v1/namespaces/ns/pods/p", &[], "delete||pods|ns|p"),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/pods",
                &[],
                "deletecollection||pods|ns|",
            ),
            // The Namespace object itself.
            (Method::DELETE, "/api/v1/namespaces/ns", &[], "delete||namespaces|ns|ns"),
            (Method::GET, "/api/v1/namespaces", &[], "list||namespaces||"),
            (
                Method::PUT,
                "/api/v1/namespaces/ns/status",
                &[],
                "update||namespaces/status|ns|ns",
            ),
            // Unknown resources are still resource requests.
            (Method::GET, "/api/v1/namespaces/ns/secrets/s", &[], "get||secrets|ns|s"),
        ];
        for (m, path, q, want) in cases {
            assert_eq!(short(&res(m.clone(), path, q)), want, "{m} {path} {q:?}");
        }
        for path in [
            "/version",
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/openapi/v3",
            "/openapi/v3/apis/apps/v1",
            "/healthz",
        ] {
            assert_eq!(req(Method::GET, path, &[]), Attributes::NonResource, "{path}");
        }
    }

    #[test]
    fn bearer_tokens_decide_the_identity() {
        let with = |v: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = v {
                h.insert("authorization", v.parse().unwrap());
            }
            identify(&h)
        };
        assert_eq!(with(Some("Bearer nodesmith-lambda")), Identity::Lambda);
        assert_eq!(with(Some("Bearer k8s-aws-v1.aHR0cHM6Ly9zdHM")), Identity::Lambda);
        assert_eq!(with(Some("Bearer nodesmith-test")), Identity::Admin);
        assert_eq!(with(Some("Basic bm9kZXNtaXRoLWxhbWJkYQ==")), Identity::Admin);
        assert_eq!(with(None), Identity::Admin);
    }

    #[test]
    fn rules_match_groups_resources_subresources_verbs_and_names() {
        let rule = |groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]| PolicyRule {
            api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
            resources: Some(resources.iter().map(|s| s.to_string()).collect()),
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resource_names: (!names.is_empty()).then(|| names.iter().map(|s| s.to_string()).collect()),
            non_resource_urls: None,
        };
        let policy = Policy {
            rules: vec![
                rule(&[""], &["pods"], &["get", "list"], &[]),
                rule(&["apps"], &["*/scale"], &["patch"], &[]),
                rule(&["karpenter.sh"], &["nodepools"], &["get"], &["only"]),
            ],
        };
        let allowed = |m: Method, p: &str| policy.allows(&res(m, p, &[]));
        assert!(allowed(Method::GET, "/api/v1/namespaces/ns/pods/p"));
        assert!(allowed(Method::GET, "/api/v1/pods"));
        assert!(!allowed(Method::DELETE, "/api/v1/namespaces/ns/pods/p"));
        // A subresource is not its parent.
        assert!(!allowed(Method::POST, "/api/v1/namespaces/ns/pods/p/eviction"));
        assert!(
            !allowed(Method::GET, "/apis/apps/v1/namespaces/ns/pods/p"),
            "wrong group"
        );
        assert!(allowed(
            Method::PATCH,
            "/apis/apps/v1/namespaces/ns/deployments/d/scale"
        ));
        assert!(!allowed(Method::PATCH, "/apis/apps/v1/namespaces/ns/deployments/d"));
        assert!(allowed(Method::GET, "/apis/karpenter.sh/v1/nodepools/only"));
        assert!(!allowed(Method::GET, "/apis/karpenter.sh/v1/nodepools/other"));
    }

    #[test]
    fn the_lambda_policy_comes_from_the_manifest_and_its_binding() {
        let p = Policy::lambda().unwrap();
        assert!(p.allows(&res(Method::POST, "/api/v1/namespaces/ns/pods/p/eviction", &[])));
        assert!(!p.allows(&res(Method::POST, "/api/v1/namespaces/ns/pods", &[])));
        // Only bindings to the group count.
        let yaml = format!(
            "{LAMBDA_RBAC}\n---\n{}",
            LAMBDA_RBAC.replace("nodesmith:lambda", "someone:else")
        );
        let other = Policy::parse(&yaml, "someone:else").unwrap();
        assert_eq!(other.bound_roles, [LAMBDA_ROLE]);
        let none = Policy::parse(LAMBDA_RBAC, "someone:else").unwrap();
        assert!(none.bound_roles.is_empty() && none.policy.rules().is_empty());
        // A binding to a role the file lacks is an error naming it.
        let dangling = LAMBDA_RBAC.replace(
            "  kind: ClusterRole\n  name: nodesmith-lambda",
            "  kind: ClusterRole\n  name: gone",
        );
        let e = Policy::parse(&dangling, LAMBDA_GROUP).unwrap_err();
        assert!(e.contains("\"gone\""), "{e}");
    }

    #[test]
    fn refusals_read_as_kube_apiserver_writes_them() {
        let r = res(Method::DELETE, "/api/v1/namespaces/default/pods/x", &[]);
        assert_eq!(
            forbidden_message("nodesmith-lambda", &r),
            "pods \"x\" is forbidden: User \"nodesmith-lambda\" cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let r = res(Method::PATCH, "/apis/karpenter.k8s.aws/v1/ec2nodeclasses/c", &[]);
        assert_eq!(
            forbidden_message("u", &r),
            "ec2nodeclasses.karpenter.k8s.aws \"c\" is forbidden: User \"u\" cannot patch resource \"ec2nodeclasses\" in API group \"karpenter.k8s.aws\" at the cluster scope"
        );
        let r = res(Method::GET, "/api/v1/nodes", &[("watch", "true")]);
        assert_eq!(
            forbidden_message("u", &r),
            "nodes is forbidden: User \"u\" cannot watch resource \"nodes\" in API group \"\" at the cluster scope"
        );
    }
}
