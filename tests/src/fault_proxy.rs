//! A fault-injecting HTTP proxy in front of moto.
//!
//! Tests point the SDK at [`FaultProxy::endpoint`]; everything is forwarded
//! to moto except what the test's rules say:
//!
//! - capacity: CreateFleet overrides for chosen (instance type, zone[,
//!   capacity type]) are removed from the request before it is forwarded and
//!   come back as `errorSet` items with `InsufficientInstanceCapacity` (or a
//!   chosen code), exactly where real EC2 puts them; if no override is left
//!   the answer has only errors. The SDK parses them as it would EC2's.
//! - throttling: the next N calls of an action are answered with EC2's
//!   `RequestLimitExceeded` (HTTP 503) or, for JSON protocols, a
//!   `ThrottlingException` (HTTP 400), so the SDK's retry and backoff run.
//! - errors: the next N calls of an action are answered with an EC2 (query
//!   protocol) error of a chosen code and message, as EC2 words them.
//!
//! - idempotency (moto ignores ClientToken; EC2 does not): a CreateFleet whose
//!   ClientToken was seen within the hour gets the first call's answer back,
//!   launching nothing, when it carries the same parameters, and
//!   `IdempotentParameterMismatch` when it does not.
//! - instance profiles (moto launches with any): with [`FaultProxy::strict_instance_profiles`],
//!   a CreateFleet whose launch template names an instance profile IAM does not
//!   have is refused with EC2's `InvalidParameterValue`, and a profile IAM has is
//!   still refused for its first N CreateFleets (IAM's propagation delay).
//! - late answers: the next N calls of an action are served, then answered
//!   only after a chosen time (a slow service, e.g. a CreateFleet that takes
//!   longer than the invocation has left); or the next call's answer held
//!   until the test lets it go ([`FaultProxy::hold`]), so a test can act
//!   between a call being served and its caller going on, without timing.
//! - read lag: the next N DescribeInstances are answered with no instances,
//!   as EC2's eventually consistent reads do just after a launch.
//! - throttling of only the calls whose body contains a string (e.g. the
//!   DynamoDB write that records a launch).
//!
//! - DynamoDB errors (JSON protocol): the next N calls of an action are
//!   answered with a DynamoDB error document (e.g. a transient HTTP 500
//!   `InternalServerError`), and the next N TransactWriteItems are cancelled
//!   for a `TransactionConflict` as DynamoDB cancels them (HTTP 400,
//!   `TransactionCanceledException` with one cancellation reason per item).
//!
//! Every query-protocol call's form parameters are kept, so tests can see
//! what each call carried (e.g. how many `InstanceId.N` a TerminateInstances had).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use crate::capacity_units::{self, Consumed};

/// One capacity rule: overrides matching it fail.
#[derive(Debug, Clone)]
struct CapacityRule {
    instance_type: String,
    zone: String,
    capacity_type: Option<String>,
    code: String,
}

/// One CreateFleet override as the proxy saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeenOverride {
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Subnet.
    pub subnet_id: String,
}

/// One CreateFleet call as the proxy saw it (before filtering).
#[derive(Debug, Clone)]
pub struct SeenFleet {
    /// spot or on-demand.
    pub capacity_type: String,
    /// The ClientToken.
    pub client_token: String,
    /// Every override sent.
    pub overrides: Vec<SeenOverride>,
    /// How many were failed by a rule.
    pub failed: usize,
}

/// A canned EC2 error for the next calls of one action.
#[derive(Debug, Clone)]
struct ErrorRule {
    times: usize,
    status: u16,
    code: String,
    message: String,
}

/// How long EC2 keeps a ClientToken's answer.
const TOKEN_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// A CreateFleet answer kept under its ClientToken.
#[derive(Debug, Clone)]
struct CachedFleet {
    params: Vec<(String, String)>,
    body: Vec<u8>,
    at: std::time::Instant,
}

/// One held answer: the call was served (`served`), its answer waits for `answer`.
struct Hold {
    served: tokio::sync::Semaphore,
    answer: tokio::sync::Semaphore,
}

/// A test's handle on a held answer ([`FaultProxy::hold`]).
pub struct Held(Arc<Hold>);

impl Held {
    /// Waits until the held call has been served upstream.
    pub async fn served(&self) {
        let _ = self.0.served.acquire().await.map(|p| p.forget());
    }

    /// Lets the held answer go to its caller.
    pub fn release(&self) {
        self.0.answer.close();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// Throttle the next `times` calls of an action whose body contains `needle`.
#[derive(Debug, Clone)]
struct MatchingThrottle {
    action: String,
    needle: String,
    times: usize,
}

#[derive(Default)]
struct Rules {
    capacity: Vec<CapacityRule>,
    throttle: HashMap<String, usize>,
    throttle_matching: Vec<MatchingThrottle>,
    /// Calls to answer on time first, calls still to answer late then, and
    /// by how much, by action.
    late: HashMap<String, (usize, usize, std::time::Duration)>,
    /// The next call of an action whose answer waits for the test.
    held: HashMap<String, Arc<Hold>>,
    hide_instances: usize,
    strict_profiles: Option<usize>,
    profile_seen: HashMap<String, usize>,
    profile_refusals: usize,
    tokens: HashMap<String, CachedFleet>,
    replays: usize,
    errors: HashMap<String, ErrorRule>,
    dynamo_errors: HashMap<String, ErrorRule>,
    transaction_conflicts: usize,
    forms: HashMap<String, Vec<Vec<(String, String)>>>,
    calls: HashMap<String, usize>,
    /// Time spent waiting for the upstream's answers, by action (summed over concurrent calls).
    upstream_time: HashMap<String, std::time::Duration>,
    /// Calls waiting for the upstream now, and since when one has been.
    in_flight: (usize, Option<std::time::Instant>),
    /// Time during which at least one call waited for the upstream.
    upstream_busy: std::time::Duration,
    /// The bodies of JSON-protocol calls (DynamoDB), by action, to count reads by what they ask.
    json_bodies: HashMap<String, Vec<String>>,
    throttled: HashMap<String, usize>,
    failed: HashMap<String, usize>,
    fleets: Vec<SeenFleet>,
    /// Whether DynamoDB's units are counted (each call's JSON parsed): only the scale harness asks.
    counting_units: bool,
    /// DynamoDB's read and write units of the calls passed upstream, by label.
    consumed: BTreeMap<String, Consumed>,
}

#[derive(Clone)]
struct Shared {
    upstream: String,
    http: reqwest::Client,
    rules: Arc<Mutex<Rules>>,
}

/// The running proxy; stops when dropped.
pub struct FaultProxy {
    endpoint: String,
    rules: Arc<Mutex<Rules>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 (a free port) in front of `upstream`.
    pub async fn start(upstream: &str) -> FaultProxy {
        let rules = Arc::new(Mutex::new(Rules::default()));
        let shared = Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            rules: rules.clone(),
        };
        let app = Router::new().fallback(handle).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("fault proxy cannot bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fault proxy has no address: {e}"));
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("fault proxy stopped: {e}");
            }
        });
        FaultProxy {
            endpoint: format!("http://{addr}"),
            rules,
            task,
        }
    }

    /// The URL to point SDK clients at.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// CreateFleet overrides for this type and zone fail with InsufficientInstanceCapacity
    /// (for one capacity type, or both when `None`).
    pub fn no_capacity(&self, instance_type: &str, zone: &str, capacity_type: Option<&str>) {
        self.fail_offering(instance_type, zone, capacity_type, "InsufficientInstanceCapacity");
    }

    /// CreateFleet overrides for this type and zone fail with `code`.
    pub fn fail_offering(&self, instance_type: &str, zone: &str, capacity_type: Option<&str>, code: &str) {
        self.rules().capacity.push(CapacityRule {
            instance_type: instance_type.into(),
            zone: zone.into(),
            capacity_type: capacity_type.map(String::from),
            code: code.into(),
        });
    }

    /// The next `times` calls of `action` (e.g. `CreateFleet`, `PutItem`) are throttled.
    pub fn throttle(&self, action: &str, times: usize) {
        self.rules().throttle.insert(action.into(), times);
    }

    /// The next `times` calls of `action` whose request body contains `needle` are throttled
    /// (e.g. `("PutItem", "Launched", 8)`: only the writes that record a launch).
    pub fn throttle_matching(&self, action: &str, needle: &str, times: usize) {
        self.rules().throttle_matching.push(MatchingThrottle {
            action: action.into(),
            needle: needle.into(),
            times,
        });
    }

    /// The next `times` calls of `action` are served at once but answered
    /// `by` later (a slow service: the work is done while the client waits).
    pub fn answer_late(&self, action: &str, times: usize, by: std::time::Duration) {
        self.answer_late_after(action, 0, times, by);
    }

    /// [`Self::answer_late`] for the calls after the next `on_time` (e.g. a
    /// lease's release, after its acquisition, in one invocation).
    pub fn answer_late_after(&self, action: &str, on_time: usize, times: usize, by: std::time::Duration) {
        self.rules().late.insert(action.into(), (on_time, times, by));
    }

    /// The next call of `action` is served, then its answer waits until the
    /// returned hold is released (or dropped).
    pub fn hold(&self, action: &str) -> Held {
        let hold = Arc::new(Hold {
            served: tokio::sync::Semaphore::new(0),
            answer: tokio::sync::Semaphore::new(0),
        });
        self.rules().held.insert(action.into(), hold.clone());
        Held(hold)
    }

    /// The next `times` DescribeInstances list no instance (EC2's read lag after a launch).
    pub fn hide_instances(&self, times: usize) {
        self.rules().hide_instances = times;
    }

    /// CreateFleet checks the instance profile of each launch template it names
    /// against IAM (through moto) as EC2 does, and refuses an existing profile
    /// for its first `propagation` calls.
    pub fn strict_instance_profiles(&self, propagation: usize) {
        self.rules().strict_profiles = Some(propagation);
    }

    /// How many CreateFleet calls were refused for their instance profile.
    pub fn profile_refusals(&self) -> usize {
        self.rules().profile_refusals
    }

    /// How many CreateFleet calls were answered from an earlier call with the same ClientToken.
    pub fn fleet_replays(&self) -> usize {
        self.rules().replays
    }

    /// How many calls of `action` reached the proxy (throttled ones included).
    pub fn calls(&self, action: &str) -> usize {
        self.rules().calls.get(action).copied().unwrap_or(0)
    }

    /// How many calls of each action reached the proxy so far.
    pub fn all_calls(&self) -> BTreeMap<String, usize> {
        self.rules().calls.iter().map(|(a, n)| (a.clone(), *n)).collect()
    }

    /// Time spent waiting for the upstream's answers (moto's, through the
    /// proxy's own HTTP client) so far, by action, summed over concurrent calls.
    pub fn upstream_time(&self) -> BTreeMap<String, std::time::Duration> {
        self.rules()
            .upstream_time
            .iter()
            .map(|(a, d)| (a.clone(), *d))
            .collect()
    }

    /// Time so far during which at least one call waited for the upstream
    /// (concurrent calls counted once): the wall time spent at the upstream's pace.
    pub fn upstream_busy(&self) -> std::time::Duration {
        let r = self.rules();
        let open = r.in_flight.1.map(|from| from.elapsed()).unwrap_or_default();
        r.upstream_busy + open
    }

    /// How many JSON-protocol calls of `action` (DynamoDB's `Query`, ...) had a
    /// body containing `needle` (e.g. `"S":"DRAIN"` for reads of that partition).
    pub fn calls_matching(&self, action: &str, needle: &str) -> usize {
        self.rules()
            .json_bodies
            .get(action)
            .map_or(0, |bodies| bodies.iter().filter(|b| b.contains(needle)).count())
    }

    /// The next `times` calls of `action` (a query-protocol API such as EC2) are answered with
    /// HTTP `status` and an EC2 error document carrying `code` and `message`.
    pub fn fail_next(&self, action: &str, times: usize, status: u16, code: &str, message: &str) {
        self.rules().errors.insert(
            action.into(),
            ErrorRule {
                times,
                status,
                code: code.into(),
                message: message.into(),
            },
        );
    }

    /// The next `times` calls of `action` (a DynamoDB operation such as `UpdateItem`) are
    /// answered with HTTP `status` and DynamoDB's JSON error document for `error_type`
    /// (the short name, e.g. `InternalServerError`) and `message`.
    pub fn fail_dynamo_next(&self, action: &str, times: usize, status: u16, error_type: &str, message: &str) {
        self.rules().dynamo_errors.insert(
            action.into(),
            ErrorRule {
                times,
                status,
                code: error_type.into(),
                message: message.into(),
            },
        );
    }

    /// The next `times` TransactWriteItems are cancelled as DynamoDB cancels a
    /// transaction that met another write of one of its items: HTTP 400,
    /// `TransactionCanceledException`, reason `TransactionConflict` on the
    /// last item and `None` on the others. Nothing is written.
    pub fn transaction_conflict(&self, times: usize) {
        self.rules().transaction_conflicts = times;
    }

    /// The form parameters of every query-protocol call of `action`, in order (failed ones included).
    pub fn forms(&self, action: &str) -> Vec<Vec<(String, String)>> {
        self.rules().forms.get(action).cloned().unwrap_or_default()
    }

    /// How many calls of `action` were answered with throttling.
    pub fn throttled(&self, action: &str) -> usize {
        self.rules().throttled.get(action).copied().unwrap_or(0)
    }

    /// How many calls of `action` were answered with an injected error ([`FaultProxy::fail_next`]).
    pub fn failed(&self, action: &str) -> usize {
        self.rules().failed.get(action).copied().unwrap_or(0)
    }

    /// Counts DynamoDB's read and write units from now on ([`FaultProxy::consumed_units`]).
    pub fn count_units(&self) {
        self.rules().counting_units = true;
    }

    /// DynamoDB's read and write units of every call passed upstream since
    /// [`FaultProxy::count_units`], by action and partition (see [`capacity_units`]).
    pub fn consumed_units(&self) -> BTreeMap<String, Consumed> {
        self.rules().consumed.clone()
    }

    /// Every CreateFleet call that was forwarded or answered, in order.
    pub fn fleets(&self) -> Vec<SeenFleet> {
        self.rules().fleets.clone()
    }
}

/// The API action of a request: the query `Action`, or the `X-Amz-Target` operation.
fn action(headers: &HeaderMap, form: &[(String, String)]) -> String {
    if let Some(t) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        return t.rsplit('.').next().unwrap_or(t).to_string();
    }
    form.iter()
        .find(|(k, _)| k == "Action")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn throttle_response(json: bool) -> Response {
    if json {
        let body = r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#;
        (
            StatusCode::BAD_REQUEST,
            [("content-type", "application/x-amz-json-1.0")],
            body,
        )
            .into_response()
    } else {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>";
        (StatusCode::SERVICE_UNAVAILABLE, [("content-type", "text/xml")], body).into_response()
    }
}

/// An error as EC2's query protocol answers it.
fn ec2_error_response(status: u16, code: &str, message: &str) -> Response {
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code>\
         <Message>{}</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>",
        esc(code),
        esc(message)
    );
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, [("content-type", "text/xml")], body).into_response()
}

/// An error document as DynamoDB's JSON protocol answers it.
fn dynamo_error_response(status: u16, doc: serde_json::Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (
        status,
        [("content-type", "application/x-amz-json-1.0")],
        doc.to_string(),
    )
        .into_response()
}

/// DynamoDB's `__type` for an error's short name.
fn dynamo_type(error_type: &str) -> String {
    format!("com.amazonaws.dynamodb.v20120810#{error_type}")
}

/// A TransactWriteItems cancelled for a conflict on its last item, with one
/// reason per item of the request, as DynamoDB words it (this exception
/// spells its message `Message`).
fn transaction_conflict_response(body: &[u8]) -> Response {
    let items = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("TransactItems").and_then(|t| t.as_array()).map(Vec::len))
        .unwrap_or(1)
        .max(1);
    let codes: Vec<&str> = (0..items)
        .map(|i| if i + 1 == items { "TransactionConflict" } else { "None" })
        .collect();
    let reasons: Vec<serde_json::Value> = codes
        .iter()
        .map(|c| match *c {
            "None" => serde_json::json!({"Code": "None"}),
            c => serde_json::json!({"Code": c, "Message": "Transaction is ongoing for the item"}),
        })
        .collect();
    dynamo_error_response(
        400,
        serde_json::json!({
            "__type": dynamo_type("TransactionCanceledException"),
            "CancellationReasons": reasons,
            "Message": format!(
                "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
                codes.join(", ")
            ),
        }),
    )
}

async fn handle(State(s): State<Shared>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let form: Vec<(String, String)> = if headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.contains("x-www-form-urlencoded"))
    {
        form_urlencoded::parse(&body).into_owned().collect()
    } else {
        Vec::new()
    };
    let act = action(&headers, &form);
    let strict = strict_profiles(&s.rules);
    // Each template's instance profile and whether IAM has it (asked before the lock is taken).
    let mut profiles: Vec<(String, bool)> = Vec::new();
    if act == "CreateFleet" && strict.is_some() {
        for (k, template) in &form {
            if k.starts_with("LaunchTemplateConfigs.") && k.ends_with(".LaunchTemplateSpecification.LaunchTemplateName")
            {
                let Some(profile) = template_profile(&s, template).await else {
                    continue;
                };
                let exists = upstream_query(
                    &s,
                    "iam",
                    &[
                        ("Action", "GetInstanceProfile"),
                        ("Version", "2010-05-08"),
                        ("InstanceProfileName", &profile),
                    ],
                )
                .await
                .is_some();
                profiles.push((profile, exists));
            }
        }
    }
    let mut errors_xml = String::new();
    let mut fleet_token: Option<String> = None;
    let mut body = body;
    {
        let mut r = s.rules.lock().unwrap_or_else(|p| p.into_inner());
        *r.calls.entry(act.clone()).or_default() += 1;
        if !form.is_empty() {
            r.forms.entry(act.clone()).or_default().push(form.clone());
        }
        if headers.contains_key("x-amz-target") {
            r.json_bodies
                .entry(act.clone())
                .or_default()
                .push(String::from_utf8_lossy(&body).into_owned());
        }
        if let Some(n) = r.throttle.get_mut(&act).filter(|n| **n > 0) {
            *n -= 1;
            *r.throttled.entry(act.clone()).or_default() += 1;
            return throttle_response(headers.contains_key("x-amz-target"));
        }
        if let Some(t) = r
            .throttle_matching
            .iter_mut()
            .find(|t| t.action == act && t.times > 0 && contains(&body, &t.needle))
        {
            t.times -= 1;
            *r.throttled.entry(act.clone()).or_default() += 1;
            return throttle_response(headers.contains_key("x-amz-target"));
        }
        if let Some(e) = r.errors.get_mut(&act).filter(|e| e.times > 0) {
            e.times -= 1;
            let answer = ec2_error_response(e.status, &e.code, &e.message);
            *r.failed.entry(act.clone()).or_default() += 1;
            return answer;
        }
        if let Some(e) = r.dynamo_errors.get_mut(&act).filter(|e| e.times > 0) {
            e.times -= 1;
            let answer = dynamo_error_response(
                e.status,
                serde_json::json!({"__type": dynamo_type(&e.code), "message": e.message}),
            );
            *r.failed.entry(act.clone()).or_default() += 1;
            return answer;
        }
        if act == "TransactWriteItems" && r.transaction_conflicts > 0 {
            r.transaction_conflicts -= 1;
            *r.failed.entry(act.clone()).or_default() += 1;
            return transaction_conflict_response(&body);
        }
        if act == "DescribeInstances" && r.hide_instances > 0 {
            r.hide_instances -= 1;
            let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-proxy</requestId><reservationSet/></DescribeInstancesResponse>";
            return (StatusCode::OK, [("content-type", "text/xml")], xml).into_response();
        }
        if act == "CreateFleet" {
            fleet_token = form
                .iter()
                .find(|(k, _)| k == "ClientToken")
                .map(|(_, v)| v.clone())
                .filter(|t| !t.is_empty());
            if let Some(token) = &fleet_token {
                r.tokens.retain(|_, c| c.at.elapsed() < TOKEN_TTL);
                if let Some(c) = r.tokens.get(token) {
                    if c.params != params(&form) {
                        return ec2_error_response(
                            400,
                            "IdempotentParameterMismatch",
                            &format!(
                                "Parameters for the request do not match the parameters of the earlier request with client token {token}."
                            ),
                        );
                    }
                    let body = c.body.clone();
                    r.replays += 1;
                    return (StatusCode::OK, [("content-type", "text/xml")], body).into_response();
                }
            }
            let propagation = strict.unwrap_or(0);
            for (profile, exists) in &profiles {
                let seen = r.profile_seen.entry(profile.clone()).or_default();
                let refuse = if *exists {
                    *seen += 1;
                    *seen <= propagation
                } else {
                    true
                };
                if refuse {
                    r.profile_refusals += 1;
                    return ec2_error_response(
                        400,
                        "InvalidParameterValue",
                        &format!(
                            "Value ({profile}) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
                        ),
                    );
                }
            }
            let (kept, failed, seen) = filter_fleet(&form, &r.capacity);
            errors_xml = failed;
            r.fleets.push(seen.clone());
            if seen.failed > 0 {
                match kept {
                    Some(f) => body = Bytes::from(f),
                    None => {
                        let xml = format!(
                            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CreateFleetResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-proxy</requestId><fleetId>fleet-faultproxy{}</fleetId><errorSet>{errors_xml}</errorSet><fleetInstanceSet/></CreateFleetResponse>",
                            r.fleets.len()
                        );
                        if let Some(token) = &fleet_token {
                            remember(&mut r, token, &form, xml.as_bytes());
                        }
                        return (StatusCode::OK, [("content-type", "text/xml")], xml).into_response();
                    }
                }
            }
        }
    }
    let url = format!(
        "{}{}",
        s.upstream,
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut req = s.http.request(method, &url);
    for (k, v) in headers.iter() {
        if k != "host" && k != "content-length" {
            req = req.header(k, v);
        }
    }
    let wait = Wait::start(&s.rules);
    let answered = async {
        let up = req.body(body.clone()).send().await?;
        let status = up.status();
        let mut out_headers = HeaderMap::new();
        for (k, v) in up.headers() {
            if k != "content-length" && k != "transfer-encoding" && k != "connection" {
                out_headers.insert(k.clone(), v.clone());
            }
        }
        let bytes = up.bytes().await?.to_vec();
        Ok::<_, reqwest::Error>((status, out_headers, bytes))
    }
    .await;
    let sent = wait.sent;
    drop(wait);
    *s.rules
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .upstream_time
        .entry(act.clone())
        .or_default() += sent.elapsed();
    let (status, out_headers, mut bytes) = match answered {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("fault proxy: upstream failed: {e}")).into_response(),
    };
    let counting = s.rules.lock().unwrap_or_else(|p| p.into_inner()).counting_units;
    if counting && headers.contains_key("x-amz-target") {
        count_units(&s.rules, &act, &body, &bytes, status.is_success());
    }
    if !errors_xml.is_empty() && status.is_success() {
        let text = String::from_utf8_lossy(&bytes).to_string();
        bytes = text
            .replacen(
                "</CreateFleetResponse>",
                &format!("<errorSet>{errors_xml}</errorSet></CreateFleetResponse>"),
                1,
            )
            .into_bytes();
    }
    if let Some(token) = &fleet_token
        && status.is_success()
    {
        let mut r = s.rules.lock().unwrap_or_else(|p| p.into_inner());
        remember(&mut r, token, &form, &bytes);
    }
    // A late answer: the call is served, its answer held back.
    let late = {
        let mut r = s.rules.lock().unwrap_or_else(|p| p.into_inner());
        match r.late.get_mut(&act) {
            Some((on_time, _, _)) if *on_time > 0 => {
                *on_time -= 1;
                None
            }
            Some((_, n, by)) if *n > 0 => {
                *n -= 1;
                Some(*by)
            }
            _ => None,
        }
    };
    if let Some(by) = late {
        tokio::time::sleep(by).await;
    }
    let held = s.rules.lock().unwrap_or_else(|p| p.into_inner()).held.remove(&act);
    if let Some(hold) = held {
        hold.served.add_permits(1);
        // Closed when the test releases it: every waiter goes on.
        let _ = hold.answer.acquire().await;
    }
    (status, out_headers, bytes).into_response()
}

/// A query-protocol call straight to moto (moto reads the service from the
/// credential scope and checks no signature); the body when it succeeded.
async fn upstream_query(s: &Shared, service: &str, params: &[(&str, &str)]) -> Option<String> {
    let body = {
        let mut ser = form_urlencoded::Serializer::new(String::new());
        for (k, v) in params {
            ser.append_pair(k, v);
        }
        ser.finish()
    };
    let res = s
        .http
        .post(format!("{}/", s.upstream))
        .header("content-type", "application/x-www-form-urlencoded; charset=utf-8")
        .header(
            "authorization",
            format!("AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"),
        )
        .body(body)
        .send()
        .await
        .ok()?;
    if !res.status().is_success() {
        return None;
    }
    res.text().await.ok()
}

/// The instance profile name (or ARN's last segment) a launch template's latest version names.
async fn template_profile(s: &Shared, template: &str) -> Option<String> {
    let xml = upstream_query(
        s,
        "ec2",
        &[
            ("Action", "DescribeLaunchTemplateVersions"),
            ("Version", "2016-11-15"),
            ("LaunchTemplateName", template),
            ("LaunchTemplateVersion.1", "$Latest"),
        ],
    )
    .await?;
    let inner = between(&xml, "<iamInstanceProfile>", "</iamInstanceProfile>")?;
    between(inner, "<name>", "</name>").map(str::to_string).or_else(|| {
        between(inner, "<arn>", "</arn>")
            .and_then(|a| a.rsplit('/').next())
            .map(str::to_string)
    })
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = s.find(start)? + start.len();
    let to = s[from..].find(end)? + from;
    Some(&s[from..to])
}

/// The strict-profiles setting (a plain function: no lock guard lives in the handler's future).
fn strict_profiles(rules: &Mutex<Rules>) -> Option<usize> {
    rules.lock().unwrap_or_else(|p| p.into_inner()).strict_profiles
}

/// One call's wait for the upstream, counted from its start until it is
/// dropped: answered, or its handler dropped mid-call (the client gone).
struct Wait<'a> {
    rules: &'a Mutex<Rules>,
    sent: std::time::Instant,
}

impl<'a> Wait<'a> {
    fn start(rules: &'a Mutex<Rules>) -> Self {
        Wait {
            rules,
            sent: waiting(rules, true),
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        waiting(self.rules, false);
    }
}

/// Counts a call starting (`true`) or ending its wait for the upstream, for
/// the time during which any call waited; returns when it was called.
fn waiting(rules: &Mutex<Rules>, starts: bool) -> std::time::Instant {
    let now = std::time::Instant::now();
    let mut r = rules.lock().unwrap_or_else(|p| p.into_inner());
    if starts {
        r.in_flight.0 += 1;
        r.in_flight.1.get_or_insert(now);
    } else {
        r.in_flight.0 = r.in_flight.0.saturating_sub(1);
        if r.in_flight.0 == 0
            && let Some(from) = r.in_flight.1.take()
        {
            r.upstream_busy += now - from;
        }
    }
    now
}

/// Adds a DynamoDB call's units to the count (a call refused is counted only
/// when a refusal consumes units).
fn count_units(rules: &Mutex<Rules>, action: &str, request: &[u8], answer: &[u8], succeeded: bool) {
    let (Ok(request), Ok(answer)) = (
        serde_json::from_slice::<serde_json::Value>(request),
        serde_json::from_slice::<serde_json::Value>(answer),
    ) else {
        return;
    };
    if !succeeded && !capacity_units::refusal_consumes(action, &answer) {
        return;
    }
    let answer = if succeeded { answer } else { serde_json::Value::Null };
    let c = capacity_units::consumed(action, &request, &answer);
    let mut r = rules.lock().unwrap_or_else(|p| p.into_inner());
    r.consumed
        .entry(capacity_units::label(action, &request))
        .or_default()
        .add(&c);
}

/// Whether a request body contains `needle`.
fn contains(body: &[u8], needle: &str) -> bool {
    !needle.is_empty() && body.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A query-protocol request's parameters, in a canonical order.
fn params(form: &[(String, String)]) -> Vec<(String, String)> {
    let mut p = form.to_vec();
    p.sort();
    p
}

/// Keeps a successful CreateFleet answer under its ClientToken.
fn remember(r: &mut Rules, token: &str, form: &[(String, String)], body: &[u8]) {
    r.tokens.insert(
        token.to_string(),
        CachedFleet {
            params: params(form),
            body: body.to_vec(),
            at: std::time::Instant::now(),
        },
    );
}

/// Splits a CreateFleet form into the request to forward (None if no override
/// is left), the errorSet items for the failed overrides, and what was seen.
fn filter_fleet(form: &[(String, String)], rules: &[CapacityRule]) -> (Option<String>, String, SeenFleet) {
    let get = |k: &str| {
        form.iter()
            .find(|(fk, _)| fk == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let capacity_type = get("TargetCapacitySpecification.DefaultTargetCapacityType");
    // LaunchTemplateConfigs.<i>.Overrides.<j>.<field> → (i, j) → field → value
    let mut overrides: BTreeMap<(usize, usize), BTreeMap<String, String>> = BTreeMap::new();
    let mut rest: Vec<(String, String)> = Vec::new();
    for (k, v) in form {
        let parts: Vec<&str> = k.split('.').collect();
        if parts.len() == 5
            && parts[0] == "LaunchTemplateConfigs"
            && parts[2] == "Overrides"
            && let (Ok(i), Ok(j)) = (parts[1].parse::<usize>(), parts[3].parse::<usize>())
        {
            overrides
                .entry((i, j))
                .or_default()
                .insert(parts[4].to_string(), v.clone());
            continue;
        }
        rest.push((k.clone(), v.clone()));
    }
    let matches = |o: &BTreeMap<String, String>| {
        rules.iter().find(|r| {
            o.get("InstanceType") == Some(&r.instance_type)
                && o.get("AvailabilityZone") == Some(&r.zone)
                && r.capacity_type.as_ref().is_none_or(|c| c == &capacity_type)
        })
    };
    let mut errors = String::new();
    let mut kept: BTreeMap<usize, Vec<&BTreeMap<String, String>>> = BTreeMap::new();
    let mut seen = SeenFleet {
        capacity_type: capacity_type.clone(),
        client_token: get("ClientToken"),
        overrides: vec![],
        failed: 0,
    };
    for ((i, _), o) in &overrides {
        let field = |f: &str| o.get(f).cloned().unwrap_or_default();
        seen.overrides.push(SeenOverride {
            instance_type: field("InstanceType"),
            zone: field("AvailabilityZone"),
            subnet_id: field("SubnetId"),
        });
        match matches(o) {
            Some(rule) => {
                seen.failed += 1;
                let lt = get(&format!(
                    "LaunchTemplateConfigs.{i}.LaunchTemplateSpecification.LaunchTemplateName"
                ));
                errors.push_str(&format!(
                    "<item><launchTemplateAndOverrides><launchTemplateSpecification><launchTemplateName>{lt}</launchTemplateName><version>$Latest</version></launchTemplateSpecification><overrides><instanceType>{}</instanceType><subnetId>{}</subnetId><availabilityZone>{}</availabilityZone></overrides></launchTemplateAndOverrides><lifecycle>{capacity_type}</lifecycle><errorCode>{}</errorCode><errorMessage>We currently do not have sufficient {} capacity in the Availability Zone you requested ({}).</errorMessage></item>",
                    field("InstanceType"), field("SubnetId"), field("AvailabilityZone"), rule.code, field("InstanceType"), field("AvailabilityZone")
                ));
            }
            None => kept.entry(*i).or_default().push(o),
        }
    }
    if kept.is_empty() {
        return (None, errors, seen);
    }
    // Renumber: configs without overrides go, indexes stay contiguous from 1.
    let mut out: Vec<(String, String)> = Vec::new();
    let mut new_index: BTreeMap<usize, usize> = BTreeMap::new();
    for (n, i) in kept.keys().enumerate() {
        new_index.insert(*i, n + 1);
    }
    for (k, v) in rest {
        let parts: Vec<&str> = k.splitn(3, '.').collect();
        if parts.len() == 3 && parts[0] == "LaunchTemplateConfigs" {
            match parts[1].parse::<usize>().ok().and_then(|i| new_index.get(&i)) {
                Some(n) => out.push((format!("LaunchTemplateConfigs.{n}.{}", parts[2]), v)),
                None => continue,
            }
        } else {
            out.push((k, v));
        }
    }
    for (i, os) in &kept {
        for (j, o) in os.iter().enumerate() {
            for (f, v) in o.iter() {
                out.push((
                    format!("LaunchTemplateConfigs.{}.Overrides.{}.{f}", new_index[i], j + 1),
                    v.clone(),
                ));
            }
        }
    }
    let mut ser = form_urlencoded::Serializer::new(String::new());
    for (k, v) in &out {
        ser.append_pair(k, v);
    }
    (Some(ser.finish()), errors, seen)
}
