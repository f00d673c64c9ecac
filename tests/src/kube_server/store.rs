//! The in-memory object store: objects by resource, a global resourceVersion,
//! and an event log that watches replay from and subscribe to.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::resources::{PODS, Resource};

/// What happened to an object (a watch event type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Removed.
    Deleted,
}

impl Change {
    /// The watch event type string.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "ADDED",
            Change::Modified => "MODIFIED",
            Change::Deleted => "DELETED",
        }
    }
}

/// One recorded change, kept so a watch can start from an older resourceVersion.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// The resource it happened to.
    pub resource: Resource,
    /// The change.
    pub change: Change,
    /// The object after the change (before, for deletions).
    pub object: Value,
    /// The object before the change (modifications only).
    pub old: Option<Value>,
}

/// Why a write failed, mapped to a Kubernetes status by the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// 404.
    NotFound(String),
    /// 409 AlreadyExists.
    AlreadyExists(String),
    /// 409 Conflict (stale resourceVersion).
    Conflict(String),
    /// 400/422: the body is not a usable object.
    Invalid(String),
}

/// An object's namespace ("" when cluster-scoped) and name.
pub type Key = (String, String);

/// Objects of every resource, the resourceVersion counter, and the change log.
pub struct Store {
    objects: BTreeMap<(&'static str, &'static str), BTreeMap<Key, Value>>,
    rv: u64,
    uid: u64,
    /// The recent changes, oldest first, each with when it was made: those
    /// of the last `retention`, at most `history_limit` of them.
    /// Shared with the watches they are sent to: a change is never copied
    /// (a burst's watches replayed tens of thousands of changes each).
    log: VecDeque<(Instant, Arc<Recorded>)>,
    /// How long a change is kept, as kube-apiserver has etcd compact its
    /// revisions every five minutes: a paged list or a watch resumes within it.
    retention: Duration,
    /// How many changes the log keeps at most: a guard on this process's
    /// memory, not a limit a real API server has.
    history_limit: usize,
    /// How far the store's clock is ahead of the machine's (tests reach the
    /// retention by moving it, not by sleeping).
    clock_ahead: Duration,
    /// The resourceVersion of each resource's latest change, so a controller
    /// can tell that nothing it reads has moved since its last pass.
    changed: BTreeMap<(&'static str, &'static str), u64>,
    /// How many recorded changes are older than the log (watches from before get 410).
    compacted_below: u64,
    /// The pods on each node by `spec.nodeName` ("" for those not bound),
    /// as kube-apiserver's watch cache indexes them: a drain's or a
    /// kubelet's list of one node's pods does not walk every pod.
    pods_by_node: HashMap<String, BTreeSet<Key>>,
    /// The pods' names by namespace, label key and value: an eviction finds
    /// the pods its disruption budgets select without walking the namespace
    /// (kube-apiserver reads a budget's status, kept by its controller).
    pods_by_label: HashMap<(String, String, String), BTreeSet<String>>,
    tx: broadcast::Sender<Arc<Recorded>>,
}

/// How long the store keeps a change for watches and paged lists by
/// default: kube-apiserver's `--etcd-compaction-interval` (five minutes).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(300);

/// How many changes the store keeps at most by default: five minutes of a
/// 20,000-pod burst's changes, while a whole burst's versions of every pod
/// would not fit this machine.
pub const DEFAULT_HISTORY_LIMIT: usize = 100_000;

impl Default for Store {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            rv: 1,
            uid: 0,
            log: VecDeque::new(),
            retention: DEFAULT_RETENTION,
            history_limit: DEFAULT_HISTORY_LIMIT,
            clock_ahead: Duration::ZERO,
            changed: BTreeMap::new(),
            compacted_below: 0,
            pods_by_node: HashMap::new(),
            pods_by_label: HashMap::new(),
            tx: broadcast::channel(4096).0,
        }
    }
}

/// Why the API server refuses an object's labels (its `ValidateObjectMeta`),
/// written here apart from nodesmith's own check so a bug there cannot hide.
/// Keys are qualified names: an optional DNS-1123 subdomain prefix of at most
/// 253 characters and `/`, then a name of 1-63 characters `[A-Za-z0-9_.-]`
/// starting and ending alphanumeric; values are empty or such a name.
fn label_problem(obj: &Value) -> Option<String> {
    fn name_ok(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
    }
    fn subdomain_ok(s: &str) -> bool {
        s.len() <= 253
            && s.split('.').all(|l| {
                let b = l.as_bytes();
                !b.is_empty()
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            })
    }
    let labels = obj.pointer("/metadata/labels")?.as_object()?;
    for (k, v) in labels {
        let (prefix, name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        if !name_ok(name) || prefix.is_some_and(|p| !subdomain_ok(p)) {
            return Some(format!(
                "metadata.labels: Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
            ));
        }
        let Some(v) = v.as_str() else {
            return Some(format!("metadata.labels[{k}]: Invalid value: not a string"));
        };
        if !v.is_empty() && !name_ok(v) {
            return Some(format!(
                "metadata.labels: Invalid value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
            ));
        }
    }
    None
}

/// The 422 the API server answers for an object with invalid labels.
fn check_labels(res: &Resource, obj: &Value) -> Result<(), StoreError> {
    match label_problem(obj) {
        Some(why) => Err(StoreError::Invalid(format!(
            "{} {:?} is invalid: {why}",
            res.kind,
            obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
        ))),
        None => Ok(()),
    }
}

/// The resourceVersion of an object as a number (0 when absent or unparsable).
pub fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The namespace of an object ("" for cluster-scoped).
pub fn namespace_of(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("")
}

/// The name of an object.
pub fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
}

impl Store {
    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The resourceVersion of the latest change to any object of `res` (0: none yet).
    pub fn changed_at(&self, res: &Resource) -> u64 {
        self.changed.get(&res.id()).copied().unwrap_or(0)
    }

    /// Subscribes to changes made from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Recorded>> {
        self.tx.subscribe()
    }

    /// Changes after `rv`, or None when the log no longer reaches back that far.
    pub fn changes_since(&self, rv: u64) -> Option<Vec<Arc<Recorded>>> {
        if rv < self.compacted_below {
            return None;
        }
        // The log is in resourceVersion order.
        let first = self.log.partition_point(|(_, r)| r.rv <= rv);
        Some(self.log.range(first..).map(|(_, r)| Arc::clone(r)).collect())
    }

    /// Keeps at most `limit` changes from now on (compacting the older ones now).
    pub fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit;
        self.trim_history();
    }

    /// How many changes are kept.
    pub fn history_len(&self) -> usize {
        self.log.len()
    }

    /// The oldest resourceVersion a watch or a continued list can start from.
    pub fn oldest_resumable(&self) -> u64 {
        self.compacted_below
    }

    /// Keeps changes for `retention` from now on (compacting the older ones now).
    pub fn set_retention(&mut self, retention: Duration) {
        self.retention = retention;
        self.trim_history();
    }

    /// Moves the store's clock on by `by`: changes older than the retention
    /// are compacted, as they would be that much later.
    pub fn advance_clock(&mut self, by: Duration) {
        self.clock_ahead += by;
        self.trim_history();
    }

    /// Drops the changes past the window (older than the retention, or past
    /// the count): a watch or a continued list from before the newest
    /// dropped one gets 410 Gone.
    fn trim_history(&mut self) {
        let now = Instant::now() + self.clock_ahead;
        while let Some((at, r)) = self.log.front() {
            if self.log.len() <= self.history_limit && now.duration_since(*at) <= self.retention {
                break;
            }
            self.compacted_below = self.compacted_below.max(r.rv);
            self.log.pop_front();
        }
    }

    /// The objects of `res` (in one namespace, or all) as they were at `rv`,
    /// sorted by namespace and name; None when the log no longer reaches back
    /// that far (the revision is compacted).
    pub fn list_at(&self, res: &Resource, ns: Option<&str>, rv: u64) -> Option<Vec<Value>> {
        let mut out = Vec::new();
        self.scan(res, ns, Some(rv), None, |o| {
            out.push(o.clone());
            true
        })?;
        Some(out)
    }

    /// Visits the objects of `res` (in one namespace, or all) in namespace and
    /// name order, as they are now (`at` None) or were at revision `at`,
    /// starting after the key `after` when given, until `visit` returns false.
    /// None (nothing visited) when `at` is compacted. Objects are lent, not
    /// copied: a page of a large list costs its page, not the whole list.
    pub fn scan<'a>(
        &'a self,
        res: &Resource,
        ns: Option<&str>,
        at: Option<u64>,
        after: Option<(&str, &str)>,
        mut visit: impl FnMut(&'a Value) -> bool,
    ) -> Option<()> {
        // What the changes since `at` undo, by key: None where the object did
        // not exist then, else its version then. Undone newest first, so the
        // oldest change since `at` has the last word.
        let mut then: BTreeMap<Key, Option<&'a Value>> = BTreeMap::new();
        if let Some(rv) = at {
            if rv < self.compacted_below || rv > self.rv {
                return None;
            }
            for (_, r) in self.log.iter().rev().take_while(|(_, r)| r.rv > rv) {
                if r.resource.id() != res.id() {
                    continue;
                }
                let key = (namespace_of(&r.object).to_string(), name_of(&r.object).to_string());
                let was = match (r.change, &r.old) {
                    (Change::Added, _) => None,
                    (Change::Modified, Some(old)) => Some(old),
                    (Change::Modified, None) | (Change::Deleted, _) => Some(&r.object),
                };
                then.insert(key, was);
            }
        }
        static EMPTY: BTreeMap<Key, Value> = BTreeMap::new();
        let now = self.objects.get(&res.id()).unwrap_or(&EMPTY);
        let start = match after {
            Some((n, m)) => std::ops::Bound::Excluded((n.to_string(), m.to_string())),
            None => std::ops::Bound::Unbounded,
        };
        let range = || (start.clone(), std::ops::Bound::Unbounded);
        let mut current = now.range::<Key, _>(range()).peekable();
        let mut undone = then.range::<Key, _>(range()).peekable();
        loop {
            // The next key of either side; the undone version wins a tie.
            let next = match (current.peek(), undone.peek()) {
                (None, None) => return Some(()),
                (Some((k, _)), Some((u, _))) if u <= k => {
                    if u == k {
                        current.next();
                    }
                    undone.next().and_then(|(k, v)| (*v).map(|v| (k, v)))
                }
                (Some(_), _) => current.next(),
                (None, Some(_)) => undone.next().and_then(|(k, v)| (*v).map(|v| (k, v))),
            };
            let Some(((n, _), v)) = next else {
                continue;
            };
            if ns.is_some_and(|want| n != want) {
                continue;
            }
            if !visit(v) {
                return Some(());
            }
        }
    }

    /// Forgets the change log: watches from an older resourceVersion get 410 Gone.
    /// The resourceVersion moves on, so every version a client holds is too old,
    /// while a fresh list returns a version that can be watched from.
    pub fn compact(&mut self) {
        self.log.clear();
        self.rv += 1;
        self.compacted_below = self.rv;
    }

    /// Visits the pods bound to `node` ("" for those not bound; in one
    /// namespace, or all) as they are now, in namespace and name order,
    /// starting after `after`, until `visit` returns false: what [`Store::scan`]
    /// visits with a `spec.nodeName` selector, from the index.
    pub fn scan_pods_on<'a>(
        &'a self,
        node: &str,
        ns: Option<&str>,
        after: Option<(&str, &str)>,
        mut visit: impl FnMut(&'a Value) -> bool,
    ) {
        let (Some(keys), Some(pods)) = (self.pods_by_node.get(node), self.objects.get(&PODS.id())) else {
            return;
        };
        let after = after.map(|(n, m)| (n.to_string(), m.to_string()));
        let from = match &after {
            Some(k) => std::ops::Bound::Excluded(k),
            None => std::ops::Bound::Unbounded,
        };
        for key in keys.range::<Key, _>((from, std::ops::Bound::Unbounded)) {
            if ns.is_some_and(|want| key.0 != want) {
                continue;
            }
            if let Some(pod) = pods.get(key)
                && !visit(pod)
            {
                return;
            }
        }
    }

    /// Stores `obj` at `key`, keeping the pods' node index (moved only when
    /// the pod's node changed: most writes to a pod are to its status).
    fn put(&mut self, res: &Resource, key: Key, obj: Value) {
        let objects = self.objects.entry(res.id()).or_default();
        if res.id() != PODS.id() {
            objects.insert(key, obj);
            return;
        }
        let node = node_of(&obj).to_string();
        let old = objects.insert(key.clone(), obj);
        // Most writes to a pod leave its labels as they were: compared in place.
        let new = objects.get(&key);
        let was_labelled = old.as_ref().and_then(|o| o.pointer("/metadata/labels"));
        if was_labelled != new.and_then(|o| o.pointer("/metadata/labels")) {
            let labels = new.map(label_pairs).unwrap_or_default();
            self.unlabel(&key, old.as_ref().map(label_pairs).unwrap_or_default());
            for (k, v) in labels {
                self.pods_by_label
                    .entry((key.0.clone(), k, v))
                    .or_default()
                    .insert(key.1.clone());
            }
        }
        match old.as_ref().map(node_of) {
            Some(was) if was == node => {}
            was => {
                if let Some(was) = was {
                    self.unindex(was, &key);
                }
                self.pods_by_node.entry(node).or_default().insert(key);
            }
        }
    }

    /// Removes the object at `key`, keeping the pods' node index.
    fn take(&mut self, res: &Resource, key: &Key) -> Option<Value> {
        let old = self.objects.get_mut(&res.id()).and_then(|m| m.remove(key))?;
        if res.id() == PODS.id() {
            self.unindex(node_of(&old), key);
            self.unlabel(key, label_pairs(&old));
        }
        Some(old)
    }

    fn unlabel(&mut self, key: &Key, labels: Vec<(String, String)>) {
        for (k, v) in labels {
            let entry = (key.0.clone(), k, v);
            if let Some(names) = self.pods_by_label.get_mut(&entry) {
                names.remove(&key.1);
                if names.is_empty() {
                    self.pods_by_label.remove(&entry);
                }
            }
        }
    }

    /// The pods of `ns` labelled `label=value` as they are now, in name
    /// order: what a walk of the namespace's pods with that label finds.
    pub fn pods_labelled<'a>(&'a self, ns: &str, label: &str, value: &str) -> impl Iterator<Item = (Key, &'a Value)> {
        let pods = self.objects.get(&PODS.id());
        self.pods_by_label
            .get(&(ns.to_string(), label.to_string(), value.to_string()))
            .into_iter()
            .flatten()
            .filter_map(move |name| {
                let key = (ns.to_string(), name.clone());
                let pod = pods?.get(&key)?;
                Some((key, pod))
            })
    }

    fn unindex(&mut self, node: &str, key: &Key) {
        if let Some(keys) = self.pods_by_node.get_mut(node) {
            keys.remove(key);
            if keys.is_empty() {
                self.pods_by_node.remove(node);
            }
        }
    }

    /// One object.
    pub fn get(&self, res: &Resource, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&res.id())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
    }

    /// All objects of a resource, optionally in one namespace, sorted by namespace and name.
    pub fn list(&self, res: &Resource, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .get(&res.id())
            .map(|m| {
                m.iter()
                    .filter(|((n, _), _)| ns.is_none_or(|want| n == want))
                    .map(|(_, v)| v.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many objects of `res` satisfy `which`, read in place (nothing copied).
    pub fn count(&self, res: &Resource, which: impl Fn(&Value) -> bool) -> usize {
        self.objects
            .get(&res.id())
            .map_or(0, |m| m.values().filter(|v| which(v)).count())
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, resource: Resource, change: Change, object: Value, old: Option<Value>) {
        self.changed.insert(resource.id(), self.rv);
        let r = Arc::new(Recorded {
            rv: self.rv,
            resource,
            change,
            object,
            old,
        });
        self.log.push_back((Instant::now() + self.clock_ahead, Arc::clone(&r)));
        self.trim_history();
        // Nobody listening is fine.
        let _ = self.tx.send(r);
    }

    /// A free name: `prefix` and five random characters from the alphabet
    /// Kubernetes uses (no vowels, no look-alike digits).
    fn generate_name(&mut self, res: &Resource, ns: &str, prefix: &str) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let ns = if res.namespaced { ns } else { "" };
        loop {
            self.uid += 1;
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(self.uid);
            let mut x = h.finish();
            let suffix: String = (0..5)
                .map(|_| {
                    let c = ALPHABET[(x % ALPHABET.len() as u64) as usize];
                    x /= ALPHABET.len() as u64;
                    c as char
                })
                .collect();
            let name = format!("{prefix}{suffix}");
            if self.get(res, ns, &name).is_none() {
                return name;
            }
        }
    }

    /// Creates an object: fills uid, timestamps, resourceVersion, generated names.
    pub fn create(&mut self, res: &Resource, ns: &str, mut obj: Value) -> Result<Value, StoreError> {
        if !obj.is_object() {
            return Err(StoreError::Invalid("body must be a JSON object".into()));
        }
        check_labels(res, &obj)?;
        let named = name_of(&obj).to_string();
        self.fit_to_crd(res, &named, &mut obj)?;
        let meta = obj.as_object_mut().and_then(|o| {
            o.entry("metadata").or_insert_with(|| json!({}));
            o.get_mut("metadata").and_then(Value::as_object_mut)
        });
        let Some(meta) = meta else {
            return Err(StoreError::Invalid("metadata must be an object".into()));
        };
        let mut name = meta.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        if name.is_empty() {
            let Some(prefix) = meta.get("generateName").and_then(Value::as_str) else {
                return Err(StoreError::Invalid(
                    "metadata.name or metadata.generateName is required".into(),
                ));
            };
            name = self.generate_name(res, ns, prefix);
        }
        // Every object name is at most a DNS subdomain's 253 characters (some kinds allow fewer).
        if name.len() > 253 {
            return Err(StoreError::Invalid(format!(
                "{} \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": must be no more than 253 characters",
                res.kind
            )));
        }
        if res.namespaced {
            if ns.is_empty() {
                return Err(StoreError::Invalid(format!(
                    "{} is namespaced: a namespace is required",
                    res.plural
                )));
            }
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let key = (
            if res.namespaced { ns.to_string() } else { String::new() },
            name.clone(),
        );
        if self.objects.get(&res.id()).is_some_and(|m| m.contains_key(&key)) {
            return Err(StoreError::AlreadyExists(format!(
                "{} \"{}\" already exists",
                res.plural, name
            )));
        }
        self.uid += 1;
        let rv = self.rv + 1;
        meta.insert("name".into(), json!(name));
        meta.insert(
            "uid".into(),
            json!(format!("00000000-0000-4000-8000-{:012x}", self.uid)),
        );
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.entry("creationTimestamp").or_insert_with(|| json!(now_rfc3339()));
        // Only a DELETE starts a deletion.
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        if has_generation(res) {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), json!(res.api_version()));
            o.insert("kind".into(), json!(res.kind));
        }
        self.bump();
        self.put(res, key, obj.clone());
        self.record(*res, Change::Added, obj.clone(), None);
        Ok(obj)
    }

    /// The installed CRD (`<plural>.<group>`) that defines `res`, if any.
    pub fn crd_of(&self, res: &Resource) -> Option<&Value> {
        self.get(super::resources::CRDS, "", &format!("{}.{}", res.plural, res.group))
    }

    /// A custom resource as the API server stores it: pruned to, and checked
    /// against, the schema of its installed CRD (`<plural>.<group>`); kinds
    /// without an installed CRD are stored as sent.
    fn fit_to_crd(&self, res: &Resource, name: &str, obj: &mut Value) -> Result<(), StoreError> {
        let Some(schema) = self
            .crd_of(res)
            .and_then(|crd| super::schema::version_schema(crd, res.version))
        else {
            return Ok(());
        };
        super::schema::fit(obj, schema).map_err(|errors| {
            StoreError::Invalid(format!(
                "{}.{} {name:?} is invalid: {}",
                res.kind,
                res.group,
                errors.join(", ")
            ))
        })
    }

    /// Replaces an object. A resourceVersion in `new` must match the stored one.
    pub fn update(&mut self, res: &Resource, ns: &str, name: &str, mut new: Value) -> Result<Value, StoreError> {
        let key = (ns.to_string(), name.to_string());
        let Some(old) = self.objects.get(&res.id()).and_then(|m| m.get(&key)).cloned() else {
            return Err(StoreError::NotFound(format!("{} \"{}\" not found", res.plural, name)));
        };
        check_labels(res, &new)?;
        self.fit_to_crd(res, name, &mut new)?;
        let sent = new
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !sent.is_empty() && sent != rv_of(&old).to_string() {
            return Err(StoreError::Conflict(format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                res.plural, name
            )));
        }
        // The generation counts changes of the desired state only.
        let generation = has_generation(res).then(|| {
            let g = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
            g + i64::from(new.get("spec") != old.get("spec"))
        });
        let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) else {
            return Err(StoreError::Invalid("metadata must be an object".into()));
        };
        // Identity and deletion fields are the server's, whatever the client sent.
        for f in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generateName",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            match old.pointer(&format!("/metadata/{f}")) {
                Some(v) => meta.insert(f.into(), v.clone()),
                None => meta.remove(f),
            };
        }
        if let Some(g) = generation {
            meta.insert("generation".into(), json!(g));
        }
        let deleting = old.pointer("/metadata/deletionTimestamp").is_some();
        if deleting {
            // The API server's rule: an object being deleted may lose finalizers, never gain one.
            let had = finalizers(&old);
            let added: Vec<String> = finalizers(&new).into_iter().filter(|f| !had.contains(f)).collect();
            if !added.is_empty() {
                return Err(StoreError::Invalid(format!(
                    "{} \"{}\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {:?}",
                    res.kind, name, added
                )));
            }
        }
        if new == old {
            return Ok(old);
        }
        if deleting && finalizers(&new).is_empty() {
            // The last finalizer is gone: the deletion completes.
            self.take(res, &key);
            let rv = self.bump();
            if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), json!(rv.to_string()));
            }
            self.record(*res, Change::Deleted, new.clone(), None);
            return Ok(new);
        }
        let rv = self.bump();
        if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        if let Some(o) = new.as_object_mut() {
            o.insert("apiVersion".into(), json!(res.api_version()));
            o.insert("kind".into(), json!(res.kind));
        }
        self.put(res, key, new.clone());
        self.record(*res, Change::Modified, new.clone(), Some(old));
        Ok(new)
    }

    /// Moves an object's `creationTimestamp` back by `by`, as if it had been
    /// made that long ago: how tests reach an age (expiry) without waiting.
    /// Watchers see the change like any other.
    pub fn backdate(
        &mut self,
        res: &Resource,
        ns: &str,
        name: &str,
        by: std::time::Duration,
    ) -> Result<Value, StoreError> {
        let key = (ns.to_string(), name.to_string());
        let Some(old) = self.objects.get(&res.id()).and_then(|m| m.get(&key)).cloned() else {
            return Err(StoreError::NotFound(format!("{} \"{}\" not found", res.plural, name)));
        };
        let created = old
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .ok_or_else(|| StoreError::Invalid(format!("{} \"{}\" has no creationTimestamp", res.plural, name)))?;
        let span = jiff::SignedDuration::try_from(by).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let earlier = created
            .checked_sub(span)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let mut new = old.clone();
        let rv = self.bump();
        if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert(
                "creationTimestamp".into(),
                json!(earlier.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
            );
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        self.put(res, key, new.clone());
        self.record(*res, Change::Modified, new.clone(), Some(old));
        Ok(new)
    }

    /// Deletes an object and returns it. An object with finalizers is kept,
    /// marked with `deletionTimestamp` (and `deletionGracePeriodSeconds` 0),
    /// until an update removes its last finalizer; deleting it again changes nothing.
    pub fn delete(&mut self, res: &Resource, ns: &str, name: &str) -> Result<Value, StoreError> {
        let key = (ns.to_string(), name.to_string());
        if let Some(obj) = self.objects.get(&res.id()).and_then(|m| m.get(&key))
            && !finalizers(obj).is_empty()
        {
            if obj.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(obj.clone());
            }
            let old = obj.clone();
            let mut new = old.clone();
            let rv = self.bump();
            if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("deletionTimestamp".into(), json!(now_rfc3339()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                meta.insert("resourceVersion".into(), json!(rv.to_string()));
            }
            self.put(res, key, new.clone());
            self.record(*res, Change::Modified, new.clone(), Some(old));
            return Ok(new);
        }
        let Some(mut old) = self.take(res, &key) else {
            return Err(StoreError::NotFound(format!("{} \"{}\" not found", res.plural, name)));
        };
        let rv = self.bump();
        if let Some(meta) = old.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        self.record(*res, Change::Deleted, old.clone(), None);
        Ok(old)
    }
}

/// An object's labels with string values (what a selector can match).
fn label_pairs(obj: &Value) -> Vec<(String, String)> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A pod's `spec.nodeName`, "" when it is not bound.
fn node_of(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("")
}

/// An object's `metadata.finalizers`.
fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|fs| fs.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default()
}

/// Whether objects of a resource carry `metadata.generation` (as the API
/// server keeps it for workloads, budgets and custom resources, not for
/// pods, nodes, events or namespaces).
fn has_generation(res: &Resource) -> bool {
    !res.group.is_empty() && res.group != "events.k8s.io"
}

/// The current time as Kubernetes writes timestamps.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_server::resources::NODES;

    #[test]
    fn labels_the_api_server_refuses_are_refused_with_422() {
        let mut store = Store::default();
        let node = |labels: Value| json!({"metadata": {"name": "n1", "labels": labels}});
        for bad in [
            json!({"team": "a,dedicated=payments"}),
            json!({"team": "x".repeat(64)}),
            json!({"team": "a b"}),
            json!({"team,x": "a"}),
            json!({"Example.com/team": "a"}),
            json!({"a/b/c": "a"}),
        ] {
            let e = store.create(NODES, "", node(bad.clone())).unwrap_err();
            assert!(
                matches!(&e, StoreError::Invalid(m) if m.contains("metadata.labels")),
                "{bad}: {e:?}"
            );
        }
        store
            .create(NODES, "", node(json!({"team": "", "example.com/tier": "web-1"})))
            .unwrap();
        let e = store
            .update(NODES, "", "n1", node(json!({"team": "a,dedicated=payments"})))
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Invalid(m) if m.contains("\"a,dedicated=payments\"")),
            "{e:?}"
        );
        assert_eq!(store.get(NODES, "", "n1").unwrap()["metadata"]["labels"]["team"], "");
    }

    #[test]
    fn the_label_index_finds_what_a_walk_of_the_namespace_finds() {
        let mut store = Store::default();
        let pod = |ns: &str, name: &str, app: &str| json!({"metadata": {"name": name, "namespace": ns, "labels": {"app": app, "tier": "web"}}, "spec": {"containers": []}});
        for (ns, name, app) in [
            ("a", "p1", "x"),
            ("a", "p2", "y"),
            ("b", "p3", "x"),
            ("a", "p4", "x"),
            ("a", "p5", "x"),
        ] {
            store.create(PODS, ns, pod(ns, name, app)).unwrap();
        }
        // Relabelled, deleted, and a label dropped.
        let mut moved = store.get(PODS, "a", "p2").unwrap().clone();
        moved["metadata"]["labels"]["app"] = json!("x");
        store.update(PODS, "a", "p2", moved).unwrap();
        store.delete(PODS, "a", "p4").unwrap();
        let mut bare = store.get(PODS, "a", "p5").unwrap().clone();
        bare["metadata"]["labels"] = json!({"tier": "web"});
        store.update(PODS, "a", "p5", bare).unwrap();
        for (ns, label, value) in [
            ("a", "app", "x"),
            ("a", "app", "y"),
            ("b", "app", "x"),
            ("a", "tier", "web"),
            ("c", "app", "x"),
        ] {
            let indexed: Vec<String> = store.pods_labelled(ns, label, value).map(|(k, _)| k.1).collect();
            let mut walked = Vec::new();
            store.scan(PODS, Some(ns), None, None, |p| {
                if p.pointer(&format!("/metadata/labels/{label}")) == Some(&json!(value)) {
                    walked.push(name_of(p).to_string());
                }
                true
            });
            assert_eq!(indexed, walked, "{ns} {label}={value}");
        }
        assert_eq!(store.pods_labelled("a", "app", "x").count(), 2, "p1 and p2");
    }

    #[test]
    fn the_node_index_visits_what_a_walk_with_the_selector_visits() {
        let mut store = Store::default();
        let pod = |ns: &str, name: &str, node: Option<&str>| {
            let mut p = json!({"metadata": {"name": name, "namespace": ns}, "spec": {"containers": []}});
            if let Some(n) = node {
                p["spec"]["nodeName"] = json!(n);
            }
            p
        };
        for (ns, name, node) in [
            ("a", "p1", None),
            ("a", "p2", Some("n1")),
            ("b", "p3", Some("n1")),
            ("b", "p4", Some("n2")),
            ("a", "p5", None),
        ] {
            store.create(PODS, ns, pod(ns, name, node)).unwrap();
        }
        // Bound, deleted, and a pod with a finalizer marked for deletion.
        let mut bound = store.get(PODS, "a", "p1").unwrap().clone();
        bound["spec"]["nodeName"] = json!("n2");
        store.update(PODS, "a", "p1", bound).unwrap();
        store.delete(PODS, "a", "p2").unwrap();
        let mut held = store.get(PODS, "b", "p4").unwrap().clone();
        held["metadata"]["finalizers"] = json!(["example.com/x"]);
        store.update(PODS, "b", "p4", held).unwrap();
        store.delete(PODS, "b", "p4").unwrap();
        let indexed = |node: &str, ns: Option<&str>, after: Option<(&str, &str)>| {
            let mut out = Vec::new();
            store.scan_pods_on(node, ns, after, |o| {
                out.push(name_of(o).to_string());
                true
            });
            out
        };
        for node in ["", "n1", "n2", "n3"] {
            for ns in [None, Some("a"), Some("b")] {
                for after in [None, Some(("a", "p1"))] {
                    let mut walked = Vec::new();
                    store.scan(PODS, ns, None, after, |o| {
                        if node_of(o) == node {
                            walked.push(name_of(o).to_string());
                        }
                        true
                    });
                    assert_eq!(
                        indexed(node, ns, after),
                        walked,
                        "node {node:?}, namespace {ns:?}, after {after:?}"
                    );
                }
            }
        }
        assert_eq!(indexed("n2", None, None), ["p1", "p4"]);
        assert_eq!(indexed("", None, None), ["p5"]);
    }

    #[test]
    fn finalizers_hold_a_deleted_object_until_the_last_is_removed() {
        let mut store = Store::default();
        let node = |finalizers: Value| json!({"metadata": {"name": "n1", "finalizers": finalizers}});
        store
            .create(NODES, "", node(json!(["karpenter.sh/termination", "example.com/x"])))
            .unwrap();
        let marked = store.delete(NODES, "", "n1").unwrap();
        assert!(marked["metadata"]["deletionTimestamp"].is_string(), "{marked}");
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 0);
        assert_eq!(store.get(NODES, "", "n1"), Some(&marked));
        // A second delete changes nothing.
        assert_eq!(store.delete(NODES, "", "n1").unwrap(), marked);
        // No finalizer may be added to an object being deleted.
        let mut more = marked.clone();
        more["metadata"]["finalizers"] = json!(["karpenter.sh/termination", "example.com/x", "example.com/y"]);
        let e = store.update(NODES, "", "n1", more).unwrap_err();
        assert!(
            matches!(&e, StoreError::Invalid(m) if m.contains("no new finalizers can be added") && m.contains("example.com/y")),
            "{e:?}"
        );
        // Nor can a write clear the deletion.
        let mut undelete = marked.clone();
        undelete["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("deletionTimestamp");
        undelete["metadata"]["finalizers"] = json!(["example.com/x"]);
        let kept = store.update(NODES, "", "n1", undelete).unwrap();
        assert_eq!(
            kept["metadata"]["deletionTimestamp"],
            marked["metadata"]["deletionTimestamp"]
        );
        // The last finalizer removed: the object is gone.
        let mut last = kept.clone();
        last["metadata"]["finalizers"] = json!([]);
        store.update(NODES, "", "n1", last).unwrap();
        assert_eq!(store.get(NODES, "", "n1"), None);
        // Without finalizers a delete removes at once, and a create cannot start a deletion.
        store
            .create(
                NODES,
                "",
                json!({"metadata": {"name": "n2", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            )
            .unwrap();
        assert!(
            store.get(NODES, "", "n2").unwrap()["metadata"]
                .get("deletionTimestamp")
                .is_none()
        );
        store.delete(NODES, "", "n2").unwrap();
        assert_eq!(store.get(NODES, "", "n2"), None);
    }

    #[test]
    fn backdating_moves_creation_back_and_is_seen_as_a_change() {
        let mut store = Store::default();
        let made = store
            .create(
                NODES,
                "",
                json!({"metadata": {"name": "n1", "creationTimestamp": "2026-11-27T10:00:00Z"}}),
            )
            .unwrap();
        let aged = store
            .backdate(NODES, "", "n1", std::time::Duration::from_secs(721 * 3600))
            .unwrap();
        assert_eq!(aged["metadata"]["creationTimestamp"], "2026-10-28T09:00:00Z");
        assert!(rv_of(&aged) > rv_of(&made), "watchers must see the change");
        assert_eq!(store.get(NODES, "", "n1"), Some(&aged));
        // An update cannot move it back: creationTimestamp stays the server's.
        let mut sent = aged.clone();
        sent["metadata"]["creationTimestamp"] = json!("2026-11-27T10:00:00Z");
        let updated = store.update(NODES, "", "n1", sent).unwrap();
        assert_eq!(updated["metadata"]["creationTimestamp"], "2026-10-28T09:00:00Z");
        assert!(matches!(
            store.backdate(NODES, "", "gone", std::time::Duration::from_secs(1)),
            Err(StoreError::NotFound(_))
        ));
    }
}
