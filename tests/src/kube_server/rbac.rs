//! Who is calling, and what they may do, as an API server decides it for
//! nodesmith's functions and its forwarder.
//!
//! In a real cluster the stack's access entries map each function's IAM role
//! to its own group `nodesmith:<function>`, which `infra/k8s/lambda-rbac.yaml`
//! binds to that function's ClusterRole `nodesmith-<function>`; the forwarder runs as the
//! ServiceAccount `nodesmith/nodesmith-forwarder`, which
//! `infra/k8s/forwarder.yaml` binds to its own ClusterRole. Here the bearer
//! token says who calls ([`identify`]): `nodesmith-<function>` is that
//! function ([`Function::token`]); an EKS token (`k8s-aws-v1.…`, what
//! `nodesmith::kubernetes::auth` mints, which names no role here) or the
//! literal [`LAMBDA_TOKEN`] is a principal in every function's group (the
//! union of their roles: for tests that drive several functions through one
//! client), [`FORWARDER_TOKEN`] is the forwarder's ServiceAccount; anything
//! else, no token included, is the test's cluster admin (the harness,
//! `kubectl` with the server's kubeconfig, the kubelet emulator), which is
//! never restricted. Each restricted identity is authorized against the
//! rules its real manifest binds to it ([`Policy::of`]), matched as RBAC
//! matches binding subjects to a user ([`User`]), with requests mapped to
//! (API group, resource[/subresource], verb) as kube-apiserver maps them
//! ([`attributes`]); non-resource paths (`/version`, discovery, OpenAPI) are
//! open to everyone, as `system:discovery` makes them.

use std::collections::HashMap;

use axum::http::{HeaderMap, Method};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// Where the functions' RBAC lives (compiled in, so the server needs no source tree).
pub const LAMBDA_RBAC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/k8s/lambda-rbac.yaml");
const LAMBDA_RBAC: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/k8s/lambda-rbac.yaml"));
/// Where the forwarder's ServiceAccount and RBAC live (compiled in too).
pub const FORWARDER_RBAC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/k8s/forwarder.yaml");
const FORWARDER_RBAC: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/k8s/forwarder.yaml"));

/// A bearer token that stands for a principal in every function's group,
/// without minting an EKS token.
pub const LAMBDA_TOKEN: &str = "nodesmith-lambda";
/// The user name that principal's requests are refused under.
pub const LAMBDA_USER: &str = "nodesmith-lambda";

/// One of nodesmith's functions, each its own identity in the cluster.
pub use nodesmith::lambda::Function;

/// A function's identity in the cluster.
pub trait FunctionIdentity {
    /// The group the stack's access entry gives its role: `nodesmith:<name>`.
    fn group(self) -> String;
    /// The ClusterRole its group is bound to: `nodesmith-<name>`.
    fn role(self) -> String;
    /// The bearer token (and user name) that stands for it: `nodesmith-<name>`.
    fn token(self) -> &'static str;
}

impl FunctionIdentity for Function {
    fn group(self) -> String {
        format!("nodesmith:{}", self.name())
    }

    fn role(self) -> String {
        format!("nodesmith-{}", self.name())
    }

    fn token(self) -> &'static str {
        match self {
            Function::Provision => "nodesmith-provision",
            Function::Launch => "nodesmith-launch",
            Function::Interrupt => "nodesmith-interrupt",
            Function::Sweep => "nodesmith-sweep",
        }
    }
}

/// The prefix of EKS bearer tokens (as `nodesmith::kubernetes::auth` mints them).
pub const EKS_TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// The forwarder's ServiceAccount namespace (its Deployment's).
pub const FORWARDER_NAMESPACE: &str = "nodesmith";
/// The forwarder's ServiceAccount.
pub const FORWARDER_SERVICE_ACCOUNT: &str = "nodesmith-forwarder";
/// The user name kube-apiserver gives that ServiceAccount's token.
pub const FORWARDER_USER: &str = "system:serviceaccount:nodesmith:nodesmith-forwarder";
/// A bearer token that stands for the forwarder's ServiceAccount token.
pub const FORWARDER_TOKEN: &str = "nodesmith-forwarder";
/// The admin's token in the server's kubeconfig (any unknown token is the admin).
pub const ADMIN_TOKEN: &str = "nodesmith-test";

/// A permission: (API group, resource[/subresource], verb).
pub type Permission = (String, String, String);

/// Who sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Identity {
    /// The test's cluster admin: no restriction.
    Admin,
    /// A principal in every function's group (an EKS token, or [`LAMBDA_TOKEN`]).
    Lambda,
    /// One function: a member of its own group only.
    Function(Function),
    /// The forwarder: the ServiceAccount [`FORWARDER_USER`].
    Forwarder,
}

impl Identity {
    /// The identities held to RBAC.
    pub const RESTRICTED: [Identity; 6] = [
        Identity::Lambda,
        Identity::Function(Function::Provision),
        Identity::Function(Function::Launch),
        Identity::Function(Function::Interrupt),
        Identity::Function(Function::Sweep),
        Identity::Forwarder,
    ];

    /// The bearer token that makes a request this identity's.
    pub fn token(self) -> &'static str {
        match self {
            Identity::Admin => ADMIN_TOKEN,
            Identity::Lambda => LAMBDA_TOKEN,
            Identity::Function(f) => f.token(),
            Identity::Forwarder => FORWARDER_TOKEN,
        }
    }

    /// The user (name and groups) RBAC sees, as the authenticator would
    /// report it: EKS maps a function's role to its group
    /// ([`Function::group`]); a ServiceAccount token is
    /// `system:serviceaccount:<ns>:<name>` in the groups
    /// `system:serviceaccounts` and `system:serviceaccounts:<ns>`.
    pub fn user(self) -> User {
        let (name, groups): (&str, Vec<String>) = match self {
            Identity::Admin => (ADMIN_TOKEN, vec!["system:masters".into()]),
            Identity::Lambda => (LAMBDA_USER, Function::ALL.iter().map(|f| f.group()).collect()),
            Identity::Function(f) => (f.token(), vec![f.group()]),
            Identity::Forwarder => (
                FORWARDER_USER,
                vec![
                    "system:serviceaccounts".into(),
                    "system:serviceaccounts:nodesmith".into(),
                ],
            ),
        };
        let mut groups = groups;
        groups.push("system:authenticated".into());
        User {
            name: name.to_string(),
            groups,
        }
    }
}

/// An authenticated user, as RBAC matches binding subjects against it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// The user name (`system:serviceaccount:<ns>:<name>` for a ServiceAccount).
    pub name: String,
    /// The groups the user is in.
    pub groups: Vec<String>,
}

impl User {
    /// Whether a binding's subject names this user, as RBAC's
    /// `appliesToUser` decides (a ServiceAccount subject without a namespace
    /// takes the RoleBinding's). Subjects with an apiGroup their kind may not
    /// have are ones kube-apiserver would not have stored, and match nobody.
    pub fn is(&self, s: &Subject, binding_namespace: Option<&str>) -> bool {
        const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
        match (s.kind.as_str(), s.api_group.as_deref().unwrap_or("")) {
            ("User", RBAC_GROUP) => s.name == self.name,
            ("Group", RBAC_GROUP) => self.groups.contains(&s.name),
            ("ServiceAccount", "") => {
                let namespace = s.namespace.as_deref().filter(|n| !n.is_empty()).or(binding_namespace);
                namespace.is_some_and(|ns| self.name == format!("system:serviceaccount:{ns}:{}", s.name))
            }
            _ => false,
        }
    }
}

/// Who sent a request, from its `Authorization: Bearer` token: a function's
/// token ([`Function::token`]) is that function, an EKS token or
/// [`LAMBDA_TOKEN`] is [`Identity::Lambda`], [`FORWARDER_TOKEN`]
/// [`Identity::Forwarder`]; anything else, or none, is [`Identity::Admin`].
pub fn identify(headers: &HeaderMap) -> Identity {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if let Some(f) = token.and_then(|t| Function::ALL.into_iter().find(|f| f.token() == t)) {
        return Identity::Function(f);
    }
    match token {
        Some(t) if t == LAMBDA_TOKEN || t.starts_with(EKS_TOKEN_PREFIX) => Identity::Lambda,
        Some(FORWARDER_TOKEN) => Identity::Forwarder,
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

/// A rule and where it applies.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// `None` everywhere (a ClusterRoleBinding's); `Some(ns)` only for
    /// requests in `ns` (a RoleBinding's).
    pub namespace: Option<String>,
    /// The rule.
    pub rule: PolicyRule,
}

/// The rules one user holds through the bindings of a manifest.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    grants: Vec<Grant>,
}

impl Policy {
    /// The rules of a restricted identity, from its manifest; `None` for the
    /// admin, who is not restricted. Errors name the file and what is wrong.
    pub fn of(identity: Identity) -> Result<Option<Policy>, String> {
        match identity {
            Identity::Admin => Ok(None),
            Identity::Lambda => Policy::lambda().map(Some),
            Identity::Function(f) => Policy::function(f).map(Some),
            Identity::Forwarder => Policy::forwarder().map(Some),
        }
    }

    /// The rules `infra/k8s/lambda-rbac.yaml` gives one function's group:
    /// exactly its own ClusterRole. Errors name the file and what is wrong
    /// with it, including a group bound to another role or to none.
    pub fn function(f: Function) -> Result<Policy, String> {
        Policy::function_in(LAMBDA_RBAC, f).map_err(|e| format!("{LAMBDA_RBAC_PATH}: {e}"))
    }

    /// [`Policy::function`] over any manifest; errors say what is wrong.
    pub fn function_in(yaml: &str, f: Function) -> Result<Policy, String> {
        Policy::bound(yaml, Identity::Function(f)).and_then(|p| {
            let names: Vec<&str> = p.bound_roles.iter().map(|r| r.name.as_str()).collect();
            let only_its_own = p.bound_roles.len() == 1
                && p.bound_roles[0].kind == "ClusterRole"
                && p.bound_roles[0].name == f.role()
                && p.bound_roles[0].namespace.is_none();
            if only_its_own {
                Ok(p.policy)
            } else {
                Err(format!(
                    "the group {:?} must be bound to the ClusterRole {:?} only (bound: {names:?})",
                    f.group(),
                    f.role()
                ))
            }
        })
    }

    /// The rules of a principal in every function's group: the union of the
    /// functions' roles, each checked as [`Policy::function`] does.
    pub fn lambda() -> Result<Policy, String> {
        for f in Function::ALL {
            Policy::function(f)?;
        }
        Policy::bound(LAMBDA_RBAC, Identity::Lambda)
            .map(|b| b.policy)
            .map_err(|e| format!("{LAMBDA_RBAC_PATH}: {e}"))
    }

    /// The rules `infra/k8s/forwarder.yaml` gives the forwarder's
    /// ServiceAccount. Errors name the file and what is wrong with it,
    /// including that no binding binds the ServiceAccount.
    pub fn forwarder() -> Result<Policy, String> {
        Policy::bound(FORWARDER_RBAC, Identity::Forwarder)
            .map(|b| b.policy)
            .map_err(|e| format!("{FORWARDER_RBAC_PATH}: {e}"))
    }

    /// What `yaml` binds to `identity`, which must be something: a manifest
    /// meant to give an identity its rules and binding nothing to it is broken.
    pub fn bound(yaml: &str, identity: Identity) -> Result<Bound, String> {
        let user = identity.user();
        let b = Policy::parse(yaml, &user)?;
        if b.bound_roles.is_empty() {
            return Err(format!(
                "no ClusterRoleBinding or RoleBinding binds the user {:?} or one of its groups {:?}",
                user.name, user.groups
            ));
        }
        Ok(b)
    }

    /// The rules of every role that a binding in the multi-document `yaml`
    /// binds to `user`: a ClusterRoleBinding's ClusterRole everywhere; a
    /// RoleBinding's Role or ClusterRole in the RoleBinding's namespace.
    pub fn parse(yaml: &str, user: &User) -> Result<Bound, String> {
        let mut cluster_roles: HashMap<String, Vec<PolicyRule>> = HashMap::new();
        let mut roles: HashMap<(String, String), Vec<PolicyRule>> = HashMap::new();
        let mut cluster_bindings: Vec<ClusterRoleBinding> = Vec::new();
        let mut bindings: Vec<(String, RoleBinding)> = Vec::new();
        // Namespaced objects must say where they go: the file is applied as is.
        let namespace = |kind: &str, m: &ObjectMeta| {
            m.namespace.clone().filter(|n| !n.is_empty()).ok_or_else(|| {
                format!(
                    "the {kind} {:?} has no namespace",
                    m.name.as_deref().unwrap_or_default()
                )
            })
        };
        for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
            let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| format!("not YAML: {e}"))?;
            match v.get("kind").and_then(Value::as_str) {
                Some("ClusterRole") => {
                    let r: ClusterRole = serde_json::from_value(v).map_err(|e| format!("a ClusterRole: {e}"))?;
                    let name = r.metadata.name.clone().unwrap_or_default();
                    cluster_roles.insert(name, r.rules.unwrap_or_default());
                }
                Some("Role") => {
                    let r: Role = serde_json::from_value(v).map_err(|e| format!("a Role: {e}"))?;
                    let ns = namespace("Role", &r.metadata)?;
                    let name = r.metadata.name.clone().unwrap_or_default();
                    roles.insert((ns, name), r.rules.unwrap_or_default());
                }
                Some("ClusterRoleBinding") => {
                    cluster_bindings.push(serde_json::from_value(v).map_err(|e| format!("a ClusterRoleBinding: {e}"))?);
                }
                Some("RoleBinding") => {
                    let b: RoleBinding = serde_json::from_value(v).map_err(|e| format!("a RoleBinding: {e}"))?;
                    bindings.push((namespace("RoleBinding", &b.metadata)?, b));
                }
                _ => {}
            }
        }
        let mut bound = Bound::default();
        let mut grant = |rules: &[PolicyRule], role: BoundRole| {
            bound.policy.grants.extend(rules.iter().map(|rule| Grant {
                namespace: role.namespace.clone(),
                rule: rule.clone(),
            }));
            bound.bound_roles.push(role);
        };
        let missing = |binding: &str, kind: &str, name: &str| {
            format!(
                "the {binding} binds {:?} to the {kind} {name:?}, which the file does not define",
                user.name
            )
        };
        for b in cluster_bindings {
            if !b.subjects.iter().flatten().any(|s| user.is(s, None)) {
                continue;
            }
            let name = &b.role_ref.name;
            if b.role_ref.kind != "ClusterRole" {
                return Err(format!(
                    "the ClusterRoleBinding {:?} refers to a {} (only ClusterRoles apply cluster-wide)",
                    b.metadata.name.as_deref().unwrap_or_default(),
                    b.role_ref.kind
                ));
            }
            let rules = cluster_roles
                .get(name)
                .ok_or_else(|| missing("ClusterRoleBinding", "ClusterRole", name))?;
            grant(
                rules,
                BoundRole {
                    kind: "ClusterRole".into(),
                    name: name.clone(),
                    namespace: None,
                },
            );
        }
        for (ns, b) in bindings {
            if !b.subjects.iter().flatten().any(|s| user.is(s, Some(&ns))) {
                continue;
            }
            let (kind, name) = (b.role_ref.kind.as_str(), &b.role_ref.name);
            let rules = match kind {
                "ClusterRole" => cluster_roles.get(name),
                "Role" => roles.get(&(ns.clone(), name.clone())),
                other => return Err(format!("a RoleBinding refers to a {other}")),
            }
            .ok_or_else(|| missing("RoleBinding", kind, name))?;
            grant(
                rules,
                BoundRole {
                    kind: kind.to_string(),
                    name: name.clone(),
                    namespace: Some(ns),
                },
            );
        }
        Ok(bound)
    }

    /// The rules, each with where it applies.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// Whether some rule allows the request where it is made (RBAC only
    /// adds, never denies).
    pub fn allows(&self, r: &ResourceRequest) -> bool {
        self.grants
            .iter()
            .any(|g| g.namespace.as_ref().is_none_or(|ns| *ns == r.namespace) && rule_allows(&g.rule, r))
    }
}

/// A role a binding gives a user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundRole {
    /// `ClusterRole` or `Role`.
    pub kind: String,
    /// The role's name.
    pub name: String,
    /// The RoleBinding's namespace; `None` for a ClusterRoleBinding.
    pub namespace: Option<String>,
}

/// What [`Policy::parse`] found for a user.
#[derive(Clone, Debug, Default)]
pub struct Bound {
    /// The user's rules.
    pub policy: Policy,
    /// The roles bound to the user (or its groups), in binding order.
    pub bound_roles: Vec<BoundRole>,
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
        assert_eq!(with(Some("Bearer nodesmith-forwarder")), Identity::Forwarder);
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
            grants: [
                rule(&[""], &["pods"], &["get", "list"], &[]),
                rule(&["apps"], &["*/scale"], &["patch"], &[]),
                rule(&["karpenter.sh"], &["nodepools"], &["get"], &["only"]),
            ]
            .into_iter()
            .map(|rule| Grant { namespace: None, rule })
            .collect(),
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
            LAMBDA_RBAC.replace("nodesmith:launch", "someone:else")
        );
        let someone = User {
            name: "someone".into(),
            groups: vec!["someone:else".into()],
        };
        let other = Policy::parse(&yaml, &someone).unwrap();
        assert_eq!(names(&other.bound_roles), ["nodesmith-launch"]);
        let none = Policy::parse(LAMBDA_RBAC, &someone).unwrap();
        assert!(none.bound_roles.is_empty() && none.policy.grants().is_empty());
        // A binding to a role the file lacks is an error naming it.
        let dangling = LAMBDA_RBAC.replace(
            "  kind: ClusterRole\n  name: nodesmith-launch",
            "  kind: ClusterRole\n  name: gone",
        );
        let e = Policy::parse(&dangling, &Identity::Lambda.user()).unwrap_err();
        assert!(e.contains("\"gone\""), "{e}");
    }

    #[test]
    fn each_function_holds_its_own_role_only() {
        let delete_pod = res(Method::DELETE, "/api/v1/namespaces/ns/pods/p", &[]);
        let delete_node = res(Method::DELETE, "/api/v1/nodes/n", &[]);
        let class_status = res(Method::PUT, "/apis/karpenter.k8s.aws/v1/ec2nodeclasses/c/status", &[]);
        let get_class = res(Method::GET, "/apis/karpenter.k8s.aws/v1/ec2nodeclasses/c", &[]);
        for (f, may) in [
            (Function::Provision, [false, false, false, false]),
            (Function::Launch, [false, false, false, true]),
            (Function::Interrupt, [true, true, false, false]),
            (Function::Sweep, [true, true, true, false]),
        ] {
            let p = Policy::function(f).unwrap();
            let got = [&delete_pod, &delete_node, &class_status, &get_class].map(|r| p.allows(r));
            assert_eq!(got, may, "{f:?}");
        }
        // A group bound to a second role is refused: each holds its own.
        let doubled = format!(
            "{LAMBDA_RBAC}\n---\n{}",
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: extra}\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodesmith-sweep}\n\
             subjects: [{kind: Group, apiGroup: rbac.authorization.k8s.io, name: \"nodesmith:provision\"}]\n"
        );
        let e = Policy::function_in(&doubled, Function::Provision).unwrap_err();
        assert!(e.contains("\"nodesmith-provision\", \"nodesmith-sweep\""), "{e}");
        assert!(Policy::function_in(LAMBDA_RBAC, Function::Provision).is_ok());
        // Tokens name the function.
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer nodesmith-sweep".parse().unwrap());
        assert_eq!(identify(&h), Identity::Function(Function::Sweep));
        assert_eq!(Identity::Function(Function::Launch).user().name, "nodesmith-launch");
        assert_eq!("interrupt".parse::<Function>().ok(), Some(Function::Interrupt));
    }

    fn names(roles: &[BoundRole]) -> Vec<&str> {
        roles.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn the_forwarder_policy_comes_from_its_manifest_and_its_service_account_binding() {
        let p = Policy::forwarder().unwrap();
        assert!(p.allows(&res(Method::GET, "/api/v1/pods", &[("watch", "true")])));
        assert!(p.allows(&res(Method::GET, "/api/v1/pods", &[])));
        // Nodes too, to report nodesmith's joining Nodes; it may not change them.
        assert!(p.allows(&res(Method::GET, "/api/v1/nodes", &[("watch", "true")])));
        for (m, path) in [
            (Method::PATCH, "/api/v1/nodes/n"),
            (Method::GET, "/api/v1/namespaces"),
            (Method::POST, "/api/v1/namespaces/ns/pods"),
            (Method::GET, "/api/v1/namespaces/ns/secrets/s"),
            (Method::POST, "/api/v1/namespaces/ns/pods/p/eviction"),
        ] {
            assert!(!p.allows(&res(m.clone(), path, &[])), "{m} {path}");
        }
        let sa = Identity::Forwarder.user();
        assert_eq!(sa.name, FORWARDER_USER);
        assert_eq!(
            sa.name,
            format!("system:serviceaccount:{FORWARDER_NAMESPACE}:{FORWARDER_SERVICE_ACCOUNT}")
        );
        // The same ServiceAccount name in another namespace is someone else.
        let elsewhere = FORWARDER_RBAC.replace("    namespace: nodesmith\n", "    namespace: other\n");
        let e = Policy::bound(&elsewhere, Identity::Forwarder).unwrap_err();
        assert!(e.contains(FORWARDER_USER) && e.contains("no ClusterRoleBinding"), "{e}");
        // Its user name, or a group every ServiceAccount of the namespace is in, binds it too.
        let by_user = FORWARDER_RBAC.replace(
            "  - kind: ServiceAccount\n    name: nodesmith-forwarder\n    namespace: nodesmith\n",
            &format!("  - kind: User\n    apiGroup: rbac.authorization.k8s.io\n    name: {FORWARDER_USER}\n"),
        );
        let by_group = by_user.replace(
            &format!("kind: User\n    apiGroup: rbac.authorization.k8s.io\n    name: {FORWARDER_USER}"),
            "kind: Group\n    apiGroup: rbac.authorization.k8s.io\n    name: system:serviceaccounts:nodesmith",
        );
        for yaml in [&by_user, &by_group] {
            assert_ne!(yaml.as_str(), FORWARDER_RBAC);
            let b = Policy::bound(yaml, Identity::Forwarder).unwrap();
            assert_eq!(names(&b.bound_roles), ["nodesmith-forwarder"], "{yaml}");
        }
        // The functions are not bound by it, nor the forwarder by theirs.
        assert!(
            Policy::parse(FORWARDER_RBAC, &Identity::Lambda.user())
                .unwrap()
                .bound_roles
                .is_empty()
        );
        assert!(Policy::bound(LAMBDA_RBAC, Identity::Forwarder).is_err());
    }

    #[test]
    fn role_bindings_grant_only_in_their_namespace() {
        let yaml = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leases, namespace: nodesmith}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, update]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
---
# A ServiceAccount subject without a namespace is the RoleBinding's.
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leases, namespace: nodesmith}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leases}
subjects: [{kind: ServiceAccount, name: nodesmith-forwarder}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: pods, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects: [{kind: ServiceAccount, name: nodesmith-forwarder, namespace: nodesmith}]
---
# Unbound here: the subject is team-a's ServiceAccount of that name.
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: elsewhere, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leases}
subjects: [{kind: ServiceAccount, name: nodesmith-forwarder}]
"#;
        let b = Policy::bound(yaml, Identity::Forwarder).unwrap();
        assert_eq!(names(&b.bound_roles), ["leases", "pod-reader"]);
        let allowed = |m: Method, p: &str| b.policy.allows(&res(m, p, &[]));
        assert!(allowed(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/nodesmith/leases/l"
        ));
        assert!(allowed(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/nodesmith/leases/l"
        ));
        assert!(!allowed(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/team-a/leases/l"
        ));
        assert!(allowed(Method::GET, "/api/v1/namespaces/team-a/pods/p"));
        assert!(!allowed(Method::GET, "/api/v1/namespaces/nodesmith/pods/p"));
        // A namespaced grant never reaches the cluster scope.
        assert!(!allowed(Method::GET, "/api/v1/pods/p"));
        // A RoleBinding to a Role the file lacks, or a namespaced object with no namespace, is an error.
        let e = Policy::parse(
            &yaml.replace("name: leases}\nsubjects", "name: gone}\nsubjects"),
            &Identity::Forwarder.user(),
        )
        .unwrap_err();
        assert!(e.contains("the Role \"gone\""), "{e}");
        let e = Policy::parse(
            &yaml.replace("{name: pods, namespace: team-a}", "{name: pods}"),
            &Identity::Forwarder.user(),
        )
        .unwrap_err();
        assert!(e.contains("the RoleBinding \"pods\" has no namespace"), "{e}");
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
        let r = res(Method::GET, "/api/v1/nodes", &[]);
        assert_eq!(
            forbidden_message(FORWARDER_USER, &r),
            "nodes is forbidden: User \"system:serviceaccount:nodesmith:nodesmith-forwarder\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
        let r = res(Method::GET, "/api/v1/nodes", &[("watch", "true")]);
        assert_eq!(
            forbidden_message("u", &r),
            "nodes is forbidden: User \"u\" cannot watch resource \"nodes\" in API group \"\" at the cluster scope"
        );
    }
}
