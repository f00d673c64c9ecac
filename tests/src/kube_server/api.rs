//! The HTTP surface: Kubernetes REST paths, verbs, patch types, watches and
//! Status errors, dispatched onto the store.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Shared;
use super::resources::{self, NAMESPACES, PDBS, PODS, RESOURCES, Resource};
use super::selectors::{FieldSelector, LabelSelector, labels_of};
use super::store::{Change, Recorded, StoreError, name_of, namespace_of};
use super::{discovery, disruption, table, workloads};

/// A Kubernetes `Status` failure response.
pub fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> Response {
    let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    if let (Some(d), Some(o)) = (details, body.as_object_mut()) {
        o.insert("details".into(), d);
    }
    let sc = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (sc, [("content-type", "application/json")], body.to_string()).into_response()
}

fn store_error(e: StoreError) -> Response {
    match e {
        StoreError::NotFound(m) => status(404, "NotFound", &m, None),
        StoreError::AlreadyExists(m) => status(409, "AlreadyExists", &m, None),
        StoreError::Conflict(m) => status(409, "Conflict", &m, None),
        StoreError::Invalid(m) => status(422, "Invalid", &m, None),
    }
}

/// A DELETE's `DeleteOptions.preconditions` (uid, resourceVersion) that the
/// object does not meet: 409 Conflict, worded as the API server words it.
fn failed_precondition(obj: Option<&Value>, res: &Resource, name: &str, body: &[u8]) -> Option<Response> {
    let obj = obj?;
    let options: Value = serde_json::from_slice(body).ok()?;
    let pre = options.get("preconditions")?;
    for (field, attr) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let Some(want) = pre.get(field).and_then(Value::as_str) else {
            continue;
        };
        let have = obj["metadata"][field].as_str().unwrap_or("");
        if want != have {
            return Some(status(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: {attr} in precondition: {want}, {attr} in object meta: {have}",
                    res.plural
                ),
                Some(json!({"name": name, "kind": res.plural})),
            ));
        }
    }
    None
}

fn ok_json(code: StatusCode, v: &Value) -> Response {
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

/// A parsed request path.
#[derive(Debug)]
struct Target {
    res: &'static Resource,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let find = |p: &str| resources::find(group, version, p);
    let s = |x: &&str| Some(x.to_string());
    match rest {
        ["namespaces", ns, plural, tail @ ..] if find(plural).is_some_and(|r| r.namespaced) => {
            let res = find(plural)?;
            match tail {
                [] => Some(Target {
                    res,
                    ns: s(ns),
                    name: None,
                    sub: None,
                }),
                [name] => Some(Target {
                    res,
                    ns: s(ns),
                    name: s(name),
                    sub: None,
                }),
                [name, sub] => Some(Target {
                    res,
                    ns: s(ns),
                    name: s(name),
                    sub: s(sub),
                }),
                _ => None,
            }
        }
        [plural] => Some(Target {
            res: find(plural)?,
            ns: None,
            name: None,
            sub: None,
        }),
        [plural, name] => Some(Target {
            res: find(plural)?,
            ns: None,
            name: s(name),
            sub: None,
        })
        .filter(|t| !t.res.namespaced),
        [plural, name, sub] => Some(Target {
            res: find(plural)?,
            ns: None,
            name: s(name),
            sub: s(sub),
        })
        .filter(|t| !t.res.namespaced),
        _ => None,
    }
}

/// Every request lands here.
pub async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    shared.record_request(&method, &uri, &headers);
    let identity = super::rbac::identify(&headers);
    // Injected faults stand for what comes before authorization (a rejected
    // token, throttling, an unavailable server); nothing below runs unless
    // the caller may make the request.
    if let Some(code) = shared.take_fault(&method, &path) {
        let reason = match code {
            401 => "Unauthorized",
            409 => "Conflict",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            _ => "Unknown",
        };
        return status(code, reason, &format!("injected fault {code}"), None);
    }
    if let Err(refused) = shared.authorize(identity, &method, &uri, &q) {
        return refused;
    }
    if path == "/version" {
        return ok_json(
            StatusCode::OK,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-nodesmith-test"}),
        );
    }
    if method == Method::GET
        && let Some(doc) = discovery::document(&path)
    {
        return ok_json(StatusCode::OK, &doc);
    }
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    if !body.is_empty() && content_type.starts_with("application/vnd.kubernetes.protobuf") {
        // Bodies are JSON here; an Eviction's body is not needed (the path names the pod).
        if !(method == Method::POST && path.ends_with("/eviction")) {
            return status(
                415,
                "UnsupportedMediaType",
                &format!("the test server takes JSON bodies, not {content_type}"),
                None,
            );
        }
    }
    let Some(t) = parse_path(&path) else {
        return status(
            404,
            "NotFound",
            &format!("the server could not find the requested resource ({path})"),
            None,
        );
    };
    let ns = t.ns.clone().unwrap_or_default();
    match (method.clone(), t.name.clone(), t.sub.as_deref()) {
        (method, Some(name), Some("scale")) if workloads::is_scalable(t.res) => {
            scale(&shared, t.res, &ns, &name, &method, &headers, &body)
        }
        (Method::GET, None, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch(shared, t.res, t.ns, &q).await
        }
        (Method::GET, None, None) => list(&shared, t.res, t.ns.as_deref(), &q, table::wants_table(&headers)),
        (Method::GET, Some(name), _) => {
            let mut store = shared.lock_store();
            let Some(v) = store.get(t.res, &ns, &name).cloned() else {
                return status(
                    404,
                    "NotFound",
                    &format!("{} \"{}\" not found", t.res.plural, name),
                    None,
                );
            };
            if shared.take_touch(&path) {
                let mut touched = v.clone();
                let n = store.resource_version();
                json_patch::merge(
                    &mut touched,
                    &json!({"metadata": {"annotations": {"test.nodesmith/touched": n.to_string()}}}),
                );
                let _ = store.update(t.res, &ns, &name, touched);
            }
            let v = if t.res == PDBS { pdb_with_status(&store, v) } else { v };
            if t.sub.is_none()
                && table::wants_table(&headers)
                && let Some(tbl) = table::table(t.res, store.crd_of(t.res), &[&v], store.resource_version())
            {
                return ok_json(StatusCode::OK, &tbl);
            }
            ok_json(StatusCode::OK, &v)
        }
        (Method::POST, None, None) => {
            let obj: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &format!("invalid JSON body: {e}"), None),
            };
            let body_ns = namespace_of(&obj).to_string();
            if t.res.namespaced && !body_ns.is_empty() && body_ns != ns {
                return status(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                    None,
                );
            }
            let mut store = shared.lock_store();
            // As the API server's namespace lifecycle admission: no objects in
            // a namespace that does not exist.
            if t.res.namespaced && store.get(NAMESPACES, "", &ns).is_none() {
                return status(404, "NotFound", &format!("namespaces \"{ns}\" not found"), None);
            }
            // The status of a resource with a status subresource is not taken on create.
            let mut obj = obj;
            if separates_status(t.res)
                && let Some(o) = obj.as_object_mut()
            {
                o.remove("status");
            }
            match store.create(t.res, &ns, obj) {
                Ok(v) => ok_json(StatusCode::CREATED, &v),
                Err(e) => store_error(e),
            }
        }
        (Method::POST, Some(name), Some("eviction")) if t.res == PODS => evict(&shared, &ns, &name),
        (Method::POST, Some(name), Some("binding")) if t.res == PODS => {
            let target = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|b| b.pointer("/target/name").and_then(Value::as_str).map(str::to_string));
            let Some(node) = target else {
                return status(400, "BadRequest", "binding needs target.name", None);
            };
            let mut store = shared.lock_store();
            let Some(mut pod) = store.get(PODS, &ns, &name).cloned() else {
                return status(404, "NotFound", &format!("pods \"{name}\" not found"), None);
            };
            super::bind_json(&mut pod, &node);
            match store.update(PODS, &ns, &name, pod) {
                Ok(_) => ok_json(
                    StatusCode::CREATED,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
                ),
                Err(e) => store_error(e),
            }
        }
        (Method::PUT, Some(name), sub @ (None | Some("status"))) => {
            let obj: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &format!("invalid JSON body: {e}"), None),
            };
            let mut store = shared.lock_store();
            let Some(old) = store.get(t.res, &ns, &name).cloned() else {
                return status(
                    404,
                    "NotFound",
                    &format!("{} \"{}\" not found", t.res.plural, name),
                    None,
                );
            };
            match store.update(t.res, &ns, &name, split_status(t.res, &old, obj, sub)) {
                Ok(v) => ok_json(StatusCode::OK, &v),
                Err(e) => store_error(e),
            }
        }
        (Method::PATCH, Some(name), sub @ (None | Some("status"))) => {
            patch(&shared, t.res, &ns, &name, sub, &headers, &body)
        }
        (Method::DELETE, Some(name), None) if t.res == NAMESPACES => delete_namespace(&shared, &name),
        (Method::DELETE, Some(name), None) => {
            let mut store = shared.lock_store();
            if let Some(refused) = failed_precondition(store.get(t.res, &ns, &name), t.res, &name, &body) {
                return refused;
            }
            match store.delete(t.res, &ns, &name) {
                Ok(v) => ok_json(StatusCode::OK, &v),
                Err(e) => store_error(e),
            }
        }
        _ => status(
            405,
            "MethodNotAllowed",
            &format!("{method} is not supported on {path}"),
            None,
        ),
    }
}

/// The pods of namespace `ns` that any of `pdbs` selects, typed: what their
/// budgets are computed over (typing every pod of the cluster for each
/// eviction or budget read is most of a large list's cost).
fn selected_pods(store: &super::store::Store, ns: &str, pdbs: &[&PodDisruptionBudget]) -> Vec<Pod> {
    let selectors: Vec<_> = pdbs
        .iter()
        .filter_map(|b| b.spec.as_ref().and_then(|s| s.selector.as_ref()))
        .collect();
    let mut pods = Vec::new();
    if selectors.is_empty() {
        return pods;
    }
    // From the label index when each selector names a label to match (a
    // budget's usual shape): its pods are among those so labelled.
    let named: Option<Vec<(&String, &String)>> = selectors
        .iter()
        .map(|s| s.match_labels.as_ref().and_then(|m| m.iter().next()))
        .collect();
    if let Some(named) = named {
        let mut found: BTreeMap<super::store::Key, &Value> = BTreeMap::new();
        for (label, value) in named {
            found.extend(store.pods_labelled(ns, label, value));
        }
        return found
            .into_values()
            .filter(|v| {
                let labels = labels_of(v);
                selectors.iter().any(|s| disruption::selector_matches(s, &labels))
            })
            .filter_map(|v| serde_json::from_value::<Pod>(v.clone()).ok())
            .collect();
    }
    store.scan(PODS, Some(ns), None, None, |v| {
        let labels = labels_of(v);
        if selectors.iter().any(|s| disruption::selector_matches(s, &labels))
            && let Ok(p) = serde_json::from_value::<Pod>(v.clone())
        {
            pods.push(p);
        }
        true
    });
    pods
}

/// A PodDisruptionBudget with its status computed from the pods it selects.
fn pdb_with_status(store: &super::store::Store, v: Value) -> Value {
    let Ok(pdb) = serde_json::from_value::<PodDisruptionBudget>(v.clone()) else {
        return v;
    };
    let ns = pdb.metadata.namespace.clone().unwrap_or_default();
    let pods = selected_pods(store, &ns, &[&pdb]);
    disruption::with_status(v, &pods)
}

#[allow(clippy::result_large_err)] // the error is the response to send
fn selectors(q: &HashMap<String, String>) -> Result<(LabelSelector, FieldSelector), Response> {
    let ls = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| status(400, "BadRequest", &e, None))?;
    let fs = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| status(400, "BadRequest", &e, None))?;
    Ok((ls, fs))
}

/// Where a paged list goes on from: the snapshot's resourceVersion and the
/// last object returned, base64 JSON as the apiserver's tokens are (clients
/// treat it as opaque).
#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

impl ContinueToken {
    fn encode(rv: u64, last: &Value) -> String {
        use base64::Engine as _;
        let t = ContinueToken {
            v: "meta.k8s.io/v1".into(),
            rv,
            start: format!("{}/{}", namespace_of(last), name_of(last)),
        };
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&t).unwrap_or_default())
    }

    fn decode(s: &str) -> Result<Self, String> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| e.to_string())?;
        let t: ContinueToken = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        if t.v != "meta.k8s.io/v1" {
            return Err(format!("unknown version {:?}", t.v));
        }
        Ok(t)
    }

    /// The (namespace, name) key the next page starts after.
    fn after(&self) -> (&str, &str) {
        self.start.split_once('/').unwrap_or(("", &self.start))
    }
}

/// Serves a LIST as the apiserver does: with `limit`, a page of at most that
/// many objects and a `continue` token while more remain (and
/// `remainingItemCount` when no selector narrows the list); with `continue`,
/// the next page of the same snapshot (the same resourceVersion), or 410
/// Expired once that revision is compacted.
fn list(
    shared: &Shared,
    res: &'static Resource,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    as_table: bool,
) -> Response {
    let (ls, fs) = match selectors(q) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let limit: usize = match q.get("limit").map(|l| l.parse::<i64>()) {
        None => 0,
        Some(Ok(n)) if n >= 0 => n as usize,
        Some(_) => return status(400, "BadRequest", "limit must be a non-negative integer", None),
    };
    let token = match q.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(_) if q.get("resourceVersion").is_some_and(|rv| !rv.is_empty()) => {
            return status(
                400,
                "BadRequest",
                "specifying resource version is not allowed when using continue",
                None,
            );
        }
        Some(c) => match ContinueToken::decode(c) {
            Ok(t) => Some(t),
            Err(e) => return status(400, "BadRequest", &format!("invalid continue token: {e}"), None),
        },
    };
    let store = shared.lock_store();
    let (snapshot_rv, at) = match &token {
        None => (store.resource_version(), None),
        Some(t) => (t.rv, Some(t.rv)),
    };
    let selected = |o: &Value| (ls.is_empty() || ls.matches(&labels_of(o))) && fs.matches(o);
    // Without a selector the apiserver counts what remains; with one it only
    // says whether more remain, so the walk stops at the first further match.
    let counting = ls.is_empty() && fs.is_empty();
    let page = if limit == 0 { usize::MAX } else { limit };
    // Lent by the store, not copied: a page is written out from the objects
    // themselves, as the apiserver's watch cache serves a list.
    let mut items: Vec<&Value> = Vec::new();
    let mut remaining = 0usize;
    let after = token.as_ref().map(ContinueToken::after);
    let mut visit = |o| {
        if !selected(o) {
            return true;
        }
        if items.len() < page {
            items.push(o);
            return true;
        }
        remaining += 1;
        counting
    };
    // One node's pods (or the unbound ones) come from the index of the
    // current revision; an older snapshot's page walks every pod.
    let on_node = (res == PODS && at.is_none())
        .then(|| fs.0.iter().find(|(k, eq, _)| k == "spec.nodeName" && *eq))
        .flatten();
    let walked = match on_node {
        Some((_, _, node)) => {
            store.scan_pods_on(node, ns, after, &mut visit);
            Some(())
        }
        None => store.scan(res, ns, at, after, &mut visit),
    };
    if walked.is_none() {
        return status(
            410,
            "Expired",
            &format!(
                "the continue token's resourceVersion {snapshot_rv} is compacted (oldest kept {}): start the list again",
                store.oldest_resumable()
            ),
            None,
        );
    }
    // A PDB is served with its status worked out now; other kinds as stored.
    let computed: Vec<Value>;
    if res == PDBS {
        computed = items.iter().map(|o| pdb_with_status(&store, (*o).clone())).collect();
        items = computed.iter().collect();
    }
    let mut metadata = json!({"resourceVersion": snapshot_rv.to_string()});
    if remaining > 0
        && let Some(last) = items.last()
    {
        metadata["continue"] = json!(ContinueToken::encode(snapshot_rv, last));
        let selected = ["labelSelector", "fieldSelector"]
            .iter()
            .any(|k| q.get(*k).is_some_and(|v| !v.is_empty()));
        if !selected {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    if as_table && let Some(mut tbl) = table::table(res, store.crd_of(res), &items, snapshot_rv) {
        tbl["metadata"] = metadata;
        return ok_json(StatusCode::OK, &tbl);
    }
    let head = json!({
        "apiVersion": res.api_version(),
        "kind": format!("{}List", res.kind),
        "metadata": metadata,
    })
    .to_string();
    // The head without its closing brace, then the items written one by one.
    let mut body = Vec::with_capacity(head.len() + 1024 * items.len());
    body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    body.extend_from_slice(br#","items":["#);
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if let Err(e) = serde_json::to_writer(&mut body, o) {
            return status(500, "InternalError", &format!("writing the list: {e}"), None);
        }
    }
    body.extend_from_slice(b"]}");
    (StatusCode::OK, [("content-type", "application/json")], body).into_response()
}

/// Applies a PATCH body to `doc` by its content type; errors are the response.
#[allow(clippy::result_large_err)] // the error is the response to send
fn apply_patch(doc: &mut Value, headers: &HeaderMap, body: &[u8]) -> Result<(), Response> {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let patch_doc: Value = serde_json::from_slice(body)
        .map_err(|e| status(400, "BadRequest", &format!("invalid patch body: {e}"), None))?;
    if ct.starts_with("application/json-patch+json") {
        let p: json_patch::Patch = serde_json::from_value(patch_doc)
            .map_err(|e| status(400, "BadRequest", &format!("invalid JSON patch: {e}"), None))?;
        if let Err(e) = json_patch::patch(doc, &p) {
            // A failed `test` operation is how clients do compare-and-swap.
            let code = if matches!(e.kind, json_patch::PatchErrorKind::TestFailed) {
                409
            } else {
                422
            };
            return Err(status(
                code,
                if code == 409 { "Conflict" } else { "Invalid" },
                &format!("JSON patch failed: {e}"),
                None,
            ));
        }
    } else if ct.starts_with("application/merge-patch+json")
        || ct.starts_with("application/strategic-merge-patch+json")
        || ct.starts_with("application/apply-patch")
    {
        // Strategic merge and apply are treated as JSON merge patches: lists are
        // replaced whole. Callers in this project send merge or JSON patches.
        json_patch::merge(doc, &patch_doc);
    } else {
        return Err(status(
            415,
            "UnsupportedMediaType",
            &format!("unsupported patch content type {ct:?}"),
            None,
        ));
    }
    Ok(())
}

/// Resources whose status is written only through `/status`, as the API
/// server does for custom resources that declare the status subresource (the
/// NodePool, EC2NodeClass and NodeClaim CRDs do); other kinds take either write whole.
pub fn separates_status(res: &Resource) -> bool {
    matches!(res.group, "karpenter.sh" | "karpenter.k8s.aws")
}

/// What a write of `new` over `old` stores: through `/status` only the status
/// changes (the resourceVersion sent still guards the write); through the
/// object everything but the status does. Kinds that do not separate the two
/// take `new` whole (pure).
pub fn split_status(res: &Resource, old: &Value, new: Value, sub: Option<&str>) -> Value {
    if !separates_status(res) {
        return new;
    }
    let (mut kept, from) = if sub == Some("status") {
        let mut kept = old.clone();
        let sent_rv = new.pointer("/metadata/resourceVersion").cloned();
        if let Some(m) = kept.get_mut("metadata").and_then(Value::as_object_mut) {
            match sent_rv {
                Some(rv) => m.insert("resourceVersion".into(), rv),
                None => m.remove("resourceVersion"),
            };
        }
        (kept, new)
    } else {
        (new, old.clone())
    };
    if let Some(o) = kept.as_object_mut() {
        match from.get("status") {
            Some(st) => o.insert("status".into(), st.clone()),
            None => o.remove("status"),
        };
    }
    kept
}

fn patch(
    shared: &Shared,
    res: &'static Resource,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut store = shared.lock_store();
    let Some(old) = store.get(res, ns, name).cloned() else {
        return status(404, "NotFound", &format!("{} \"{}\" not found", res.plural, name), None);
    };
    let mut doc = old.clone();
    if let Err(r) = apply_patch(&mut doc, headers, body) {
        return r;
    }
    match store.update(res, ns, name, split_status(res, &old, doc, sub)) {
        Ok(v) => ok_json(StatusCode::OK, &v),
        Err(e) => store_error(e),
    }
}

/// The `/scale` subresource: an autoscaling/v1 Scale read from and written
/// to the object's `spec.replicas`.
fn scale(
    shared: &Shared,
    res: &'static Resource,
    ns: &str,
    name: &str,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut store = shared.lock_store();
    let Some(obj) = store.get(res, ns, name).cloned() else {
        return status(404, "NotFound", &format!("{} \"{}\" not found", res.plural, name), None);
    };
    let current = workloads::scale_of(&obj);
    let wanted = match *method {
        Method::GET => return ok_json(StatusCode::OK, &current),
        Method::PUT => match serde_json::from_slice::<Value>(body) {
            Ok(v) => v,
            Err(e) => return status(400, "BadRequest", &format!("invalid JSON body: {e}"), None),
        },
        Method::PATCH => {
            let mut doc = current.clone();
            if let Err(r) = apply_patch(&mut doc, headers, body) {
                return r;
            }
            doc
        }
        _ => {
            return status(
                405,
                "MethodNotAllowed",
                &format!("{method} is not supported on scale"),
                None,
            );
        }
    };
    let sent_rv = wanted
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut updated = obj;
    if !sent_rv.is_empty()
        && let Some(m) = updated.get_mut("metadata").and_then(Value::as_object_mut)
    {
        // The Scale's resourceVersion is the object's: a stale one is a 409.
        m.insert("resourceVersion".into(), json!(sent_rv));
    }
    let Some(replicas) = wanted.pointer("/spec/replicas").and_then(Value::as_i64) else {
        return status(422, "Invalid", "spec.replicas: Required value", None);
    };
    if replicas < 0 {
        return status(
            422,
            "Invalid",
            "spec.replicas: must be greater than or equal to 0",
            None,
        );
    }
    updated["spec"]["replicas"] = json!(replicas);
    match store.update(res, ns, name, updated) {
        Ok(v) => ok_json(StatusCode::OK, &workloads::scale_of(&v)),
        Err(e) => store_error(e),
    }
}

/// Namespaces the API server refuses to delete.
const UNDELETABLE_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// Deletes a namespace and everything in it at once (no Terminating phase).
fn delete_namespace(shared: &Shared, name: &str) -> Response {
    if UNDELETABLE_NAMESPACES.contains(&name) {
        return status(
            403,
            "Forbidden",
            &format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
            None,
        );
    }
    let mut store = shared.lock_store();
    if store.get(NAMESPACES, "", name).is_none() {
        return status(404, "NotFound", &format!("namespaces \"{name}\" not found"), None);
    }
    for res in RESOURCES.iter().filter(|r| r.namespaced) {
        for obj in store.list(res, Some(name)) {
            let _ = store.delete(res, name, super::store::name_of(&obj));
        }
    }
    match store.delete(NAMESPACES, "", name) {
        Ok(v) => ok_json(StatusCode::OK, &v),
        Err(e) => store_error(e),
    }
}

fn evict(shared: &Shared, ns: &str, name: &str) -> Response {
    let mut store = shared.lock_store();
    let Some(pod_json) = store.get(PODS, ns, name).cloned() else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"), None);
    };
    let Ok(pod) = serde_json::from_value::<Pod>(pod_json) else {
        return status(500, "InternalError", "stored pod does not parse", None);
    };
    let pdbs: Vec<PodDisruptionBudget> = store
        .list(PDBS, Some(ns))
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    // Only the pods a budget covering this one selects count toward it.
    let covering: Vec<&PodDisruptionBudget> = pdbs.iter().filter(|b| disruption::covers(b, &pod)).collect();
    let pods = if covering.is_empty() {
        Vec::new()
    } else {
        selected_pods(&store, ns, &covering)
    };
    if let Some(why) = disruption::eviction_blocked_by(&pod, &pdbs, &pods) {
        return status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            Some(json!({"causes": [{"reason": "DisruptionBudget", "message": why}]})),
        );
    }
    match store.delete(PODS, ns, name) {
        Ok(_) => ok_json(
            StatusCode::CREATED,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ),
        Err(e) => store_error(e),
    }
}

/// What a watcher sees of a change, after namespace and selector filtering
/// (an object leaving the selection is reported as DELETED, entering as ADDED).
fn visible<'r>(
    r: &'r Recorded,
    res: &Resource,
    ns: Option<&str>,
    ls: &LabelSelector,
    fs: &FieldSelector,
) -> Option<(Change, &'r Value)> {
    if r.resource != *res || ns.is_some_and(|n| namespace_of(&r.object) != n) {
        return None;
    }
    let sel = |o: &Value| ls.matches(&labels_of(o)) && fs.matches(o);
    let now = sel(&r.object);
    match (r.change, r.old.as_ref().map(sel)) {
        (Change::Modified, Some(true)) if !now => Some((Change::Deleted, &r.object)),
        (Change::Modified, Some(false)) if now => Some((Change::Added, &r.object)),
        (Change::Modified, Some(false)) => None,
        (c, _) if now => Some((c, &r.object)),
        _ => None,
    }
}

/// One watch event's line, written from the object in place (not copied into a new document).
fn line(change: &str, obj: &Value) -> Bytes {
    Bytes::from(format!("{{\"type\":{},\"object\":{obj}}}\n", Value::from(change)))
}

async fn watch(
    shared: Arc<Shared>,
    res: &'static Resource,
    ns: Option<String>,
    q: &HashMap<String, String>,
) -> Response {
    let (ls, fs) = match selectors(q) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let rv: u64 = q.get("resourceVersion").and_then(|s| s.parse().ok()).unwrap_or(0);
    let timeout = Duration::from_secs(q.get("timeoutSeconds").and_then(|s| s.parse().ok()).unwrap_or(300));
    let (tx, mut rx_lines) = mpsc::channel::<Bytes>(256);
    let mut breaker = shared.watch_breaker.subscribe();
    // Replay and subscription happen under one lock so no change falls between them.
    let (backlog, mut changes, expired) = {
        let store = shared.lock_store();
        let since = (rv != 0).then(|| store.changes_since(rv));
        let expired = matches!(since, Some(None));
        let backlog: Vec<Bytes> = match since {
            None => {
                let mut lines = Vec::new();
                store.scan(res, ns.as_deref(), None, None, |o| {
                    if ls.matches(&labels_of(o)) && fs.matches(o) {
                        lines.push(line("ADDED", o));
                    }
                    true
                });
                lines
            }
            Some(Some(rs)) => rs
                .iter()
                .filter_map(|r| visible(r, res, ns.as_deref(), &ls, &fs))
                .map(|(c, o)| line(c.as_str(), o))
                .collect(),
            Some(None) => {
                let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                    "message": format!("too old resource version: {rv} ({})", store.resource_version())});
                vec![line("ERROR", &gone)]
            }
        };
        (backlog, store.subscribe(), expired)
    };
    tokio::spawn(async move {
        for b in backlog {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                // A break requested before a change was made must win over that
                // change, or a client could resume past the break.
                biased;
                _ = breaker.changed() => return,
                _ = &mut deadline => return,
                r = changes.recv() => match r {
                    Ok(r) => {
                        if let Some(l) = visible(&r, res, ns.as_deref(), &ls, &fs).map(|(c, o)| line(c.as_str(), o))
                            && tx.send(l).await.is_err()
                        {
                            return;
                        }
                    }
                    // Lagged or closed: end the watch; the client re-lists or resumes.
                    Err(_) => return,
                },
            }
        }
    });
    let stream = futures::stream::poll_fn(move |cx| rx_lines.poll_recv(cx).map(|o| o.map(Ok::<Bytes, Infallible>)));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| status(500, "InternalError", &e.to_string(), None))
}
