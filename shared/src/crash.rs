//! Crash points, for the crash tests: in debug builds a function can be made
//! to die right after any one of its external calls (AWS or Kubernetes), so
//! tests can show that the state it leaves behind is repaired. Release builds
//! compile the hook out: [`after`] and [`begin_invocation`] do nothing there.
//!
//! The hook sits in the two HTTP stacks every call goes through (the AWS
//! SDK's HTTP client from [`crate::lambda::start`], and the kube client from
//! [`crate::kubernetes::client::client_for`]), so every external call is a crash
//! point and a new call cannot escape: nothing at a call site needs marking.
//!
//! Two environment variables drive it (debug builds only):
//! - [`CALL_LOG_ENV`]: a file every external call is appended to, one JSON
//!   [`Logged`] line each, to enumerate the points a scenario reaches;
//! - [`CRASH_FILE_ENV`]: a file holding one [`Point`] as JSON. When the call it
//!   names completes for the `occurrence`th time within one invocation, the
//!   file is renamed to `<file>.fired` (so exactly one process fires it) and
//!   the process aborts, as a Lambda sandbox that dies mid-invocation.

use serde::{Deserialize, Serialize};

/// Names the file that arms a crash (honoured in debug builds only).
pub const CRASH_FILE_ENV: &str = "NODESMITH_CRASH_FILE";
/// Names the file every external call is logged to (honoured in debug builds only).
pub const CALL_LOG_ENV: &str = "NODESMITH_CALL_LOG";

/// One external call, named as IAM and RBAC name it: `ec2:CreateFleet`,
/// `dynamodb:PutItem`, `kube:create pods/eviction`, `kube:patch nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// The call's name.
    pub name: String,
    /// Whether it may change anything (only writes make distinct crash states:
    /// dying after a read leaves what dying after the write before it leaves).
    pub write: bool,
}

/// Where to crash: right after the `occurrence`th call named `call` (1-based)
/// within one invocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Point {
    /// The call's name (as in [`Call::name`]).
    pub call: String,
    /// Which of its calls in one invocation.
    pub occurrence: u32,
}

/// One line of the call log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logged {
    /// The process's invocation number (1 for its first).
    pub invocation: u64,
    /// The call.
    pub call: String,
    /// Whether it may change anything.
    pub write: bool,
    /// Its occurrence within the invocation.
    pub occurrence: u32,
}

/// AWS operations that only read (by the verb the operation starts with).
const READ_PREFIXES: [&str; 7] = ["Describe", "Get", "List", "Query", "Scan", "BatchGet", "Receive"];

/// The call an AWS operation of `service` makes (pure).
pub fn aws_call(service: &str, operation: &str) -> Call {
    Call {
        name: format!("{service}:{operation}"),
        write: !READ_PREFIXES.iter().any(|p| operation.starts_with(p)),
    }
}

/// The call a Kubernetes request makes, named by its RBAC verb and resource
/// (`kube:create pods/eviction`, `kube:list pods`); pure.
pub fn kube_call(method: &str, path: &str) -> Call {
    let path = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segments.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => &[],
    };
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let (resource, named) = match rest {
        [] => ("".to_string(), false),
        [r] => (r.to_string(), false),
        [r, _] => (r.to_string(), true),
        [r, _, sub, ..] => (format!("{r}/{sub}"), true),
    };
    let verb = match (method, named) {
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    };
    Call {
        name: format!("kube:{verb} {resource}"),
        write: !matches!(verb, "get" | "list"),
    }
}

/// The AWS call an HTTP request makes: the service from the signature's
/// credential scope, the operation from `X-Amz-Target` (JSON protocols) or
/// the form's `Action` (query protocols), else the method and path (REST).
pub fn aws_call_of_request(headers: &[(&str, &str)], body: Option<&[u8]>, method: &str, path: &str) -> Call {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    };
    // Credential=AKID/20260101/us-east-1/ec2/aws4_request
    let service = header("authorization")
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split('/').nth(3))
        .unwrap_or("aws");
    if let Some(target) = header("x-amz-target") {
        return aws_call(service, target.rsplit('.').next().unwrap_or(target));
    }
    let action = body
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|form| form.split('&').find_map(|kv| kv.strip_prefix("Action=")));
    match action {
        Some(a) => aws_call(service, a),
        None => Call {
            name: format!("{service}:{method} {path}"),
            write: method != "GET" && method != "HEAD",
        },
    }
}

#[cfg(debug_assertions)]
mod hook {
    use std::collections::HashMap;
    use std::io::Write;
    use std::path::PathBuf;
    use std::sync::{Mutex, OnceLock};

    use super::{Call, Logged, Point};

    /// What the environment asked for, read once per process.
    struct Setup {
        crash_file: Option<PathBuf>,
        call_log: Option<PathBuf>,
    }

    #[derive(Default)]
    struct Counts {
        invocation: u64,
        calls: HashMap<String, u32>,
    }

    fn setup() -> &'static Setup {
        static SETUP: OnceLock<Setup> = OnceLock::new();
        SETUP.get_or_init(|| {
            let settings = crate::settings::Settings::from_env();
            let path = |name: &str| settings.optional(name).map(PathBuf::from);
            Setup {
                crash_file: path(super::CRASH_FILE_ENV),
                call_log: path(super::CALL_LOG_ENV),
            }
        })
    }

    fn counts() -> std::sync::MutexGuard<'static, Counts> {
        static COUNTS: OnceLock<Mutex<Counts>> = OnceLock::new();
        COUNTS
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn enabled() -> bool {
        let s = setup();
        s.crash_file.is_some() || s.call_log.is_some()
    }

    pub fn begin_invocation() {
        if !enabled() {
            return;
        }
        let mut c = counts();
        c.invocation += 1;
        c.calls.clear();
    }

    pub fn after(call: &Call) {
        let s = setup();
        if s.crash_file.is_none() && s.call_log.is_none() {
            return;
        }
        let (invocation, occurrence) = {
            let mut c = counts();
            let n = c.calls.entry(call.name.clone()).or_default();
            *n += 1;
            let n = *n;
            (c.invocation, n)
        };
        let logged = Logged {
            invocation,
            call: call.name.clone(),
            write: call.write,
            occurrence,
        };
        if let Some(log) = &s.call_log
            && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log)
            && let Ok(line) = serde_json::to_string(&logged)
        {
            let _ = writeln!(f, "{line}");
        }
        let Some(file) = &s.crash_file else { return };
        let Ok(text) = std::fs::read_to_string(file) else {
            return;
        };
        let Ok(point) = serde_json::from_str::<Point>(&text) else {
            return;
        };
        if point.call != call.name || point.occurrence != occurrence {
            return;
        }
        let fired = file.with_extension("fired");
        // The rename is the claim: of several processes, exactly one fires.
        if std::fs::rename(file, &fired).is_err() {
            return;
        }
        let _ = std::fs::write(&fired, serde_json::to_string(&logged).unwrap_or_default());
        tracing::error!(call = %call.name, occurrence, "crash point reached: aborting the process");
        let _ = std::io::stdout().flush();
        std::process::abort();
    }
}

/// Starts counting a new invocation's calls (occurrences are per invocation).
pub fn begin_invocation() {
    #[cfg(debug_assertions)]
    hook::begin_invocation();
}

/// Logs `call` and dies here when a crash is armed for it (debug builds only).
pub fn after(call: &Call) {
    #[cfg(debug_assertions)]
    hook::after(call);
    #[cfg(not(debug_assertions))]
    let _ = call;
}

/// Whether the environment armed the hook (always false in release builds):
/// only then are the HTTP stacks wrapped.
pub fn enabled() -> bool {
    #[cfg(debug_assertions)]
    return hook::enabled();
    #[cfg(not(debug_assertions))]
    false
}

/// The AWS SDK's HTTP client with every call seen by an observer once it
/// completes: the crash hook's [`after`] (debug builds) and the usage meter
/// ([`crate::usage`], every build) both watch the calls through it.
pub mod observe {
    use aws_smithy_runtime_api::client::http::{
        HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
    };
    use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
    use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

    use super::Call;

    /// One call, once its response came (or failed).
    #[derive(Debug, Clone)]
    pub struct Observed {
        /// The call, as IAM names it.
        pub call: Call,
        /// The request body's size.
        pub request_bytes: u64,
        /// The response body's size (None: no response).
        pub response_bytes: Option<u64>,
    }

    #[derive(Debug)]
    struct Client(SharedHttpClient, fn(&Observed));

    #[derive(Debug)]
    struct Connector(SharedHttpConnector, fn(&Observed));

    impl HttpClient for Client {
        fn http_connector(
            &self,
            settings: &HttpConnectorSettings,
            components: &RuntimeComponents,
        ) -> SharedHttpConnector {
            SharedHttpConnector::new(Connector(self.0.http_connector(settings, components), self.1))
        }
    }

    impl HttpConnector for Connector {
        fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
            let headers: Vec<(&str, &str)> = request.headers().iter().collect();
            let uri = request.uri();
            // The path alone: the endpoint differs between AWS and the local cloud.
            let path = uri
                .split_once("://")
                .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
                .unwrap_or(uri);
            let call = super::aws_call_of_request(&headers, request.body().bytes(), request.method(), path);
            let request_bytes = request.body().content_length().unwrap_or_default();
            let inner = self.0.call(request);
            let observe = self.1;
            HttpConnectorFuture::new(async move {
                let response = inner.await;
                let response_bytes = response.as_ref().ok().map(|r| {
                    r.headers()
                        .get("content-length")
                        .and_then(|v| v.parse().ok())
                        .or_else(|| r.body().content_length())
                        .unwrap_or_default()
                });
                observe(&Observed {
                    call,
                    request_bytes,
                    response_bytes,
                });
                response
            })
        }
    }

    /// `inner` with every call passed to `observe` once it completes.
    pub fn observe(inner: SharedHttpClient, observe: fn(&Observed)) -> SharedHttpClient {
        SharedHttpClient::new(Client(inner, observe))
    }
}

/// The AWS SDK's HTTP client with every call passing through [`after`].
#[cfg(debug_assertions)]
pub mod aws {
    use aws_smithy_runtime_api::client::http::SharedHttpClient;

    /// `inner` with every call passing the hook.
    pub fn wrap(inner: SharedHttpClient) -> SharedHttpClient {
        super::observe::observe(inner, |o| super::after(&o.call))
    }
}

/// A tower layer for the kube client with every call passing through [`after`].
#[cfg(debug_assertions)]
pub mod kube {
    use std::task::{Context, Poll};

    use futures::future::BoxFuture;

    /// The layer.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Layer;

    /// The service it wraps.
    #[derive(Clone, Debug)]
    pub struct Service<S>(S);

    impl<S> tower_layer::Layer<S> for Layer {
        type Service = Service<S>;
        fn layer(&self, inner: S) -> Service<S> {
            Service(inner)
        }
    }

    impl<S, B> tower_service::Service<http::Request<B>> for Service<S>
    where
        S: tower_service::Service<http::Request<B>>,
        S::Future: Send + 'static,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.0.poll_ready(cx)
        }

        fn call(&mut self, request: http::Request<B>) -> Self::Future {
            let call = super::kube_call(request.method().as_str(), request.uri().path());
            let inner = self.0.call(request);
            Box::pin(async move {
                let response = inner.await;
                super::after(&call);
                response
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_calls_are_named_by_their_rbac_verb_and_resource() {
        let table = [
            ("GET", "/api/v1/pods", "kube:list pods", false),
            (
                "GET",
                "/api/v1/namespaces/default/pods?labelSelector=x",
                "kube:list pods",
                false,
            ),
            ("GET", "/api/v1/nodes/ip-10-0-1-1", "kube:get nodes", false),
            ("PATCH", "/api/v1/nodes/ip-10-0-1-1", "kube:patch nodes", true),
            ("DELETE", "/api/v1/nodes/ip-10-0-1-1", "kube:delete nodes", true),
            (
                "POST",
                "/api/v1/namespaces/default/pods/web-1/eviction",
                "kube:create pods/eviction",
                true,
            ),
            (
                "DELETE",
                "/api/v1/namespaces/default/pods/web-1",
                "kube:delete pods",
                true,
            ),
            ("POST", "/api/v1/namespaces/default/events", "kube:create events", true),
            (
                "PATCH",
                "/apis/karpenter.k8s.aws/v1/ec2nodeclasses/default/status",
                "kube:patch ec2nodeclasses/status",
                true,
            ),
            ("GET", "/apis/karpenter.sh/v1/nodepools", "kube:list nodepools", false),
        ];
        for (method, path, name, write) in table {
            assert_eq!(
                kube_call(method, path),
                Call {
                    name: name.into(),
                    write
                },
                "{method} {path}"
            );
        }
    }

    #[test]
    fn aws_calls_are_named_by_service_and_operation() {
        let auth =
            "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=x";
        let form = b"Action=CreateFleet&Version=2016-11-15&ClientToken=abc";
        let c = aws_call_of_request(&[("Authorization", auth)], Some(form), "POST", "/");
        assert_eq!((c.name.as_str(), c.write), ("ec2:CreateFleet", true));
        let form = b"Version=2016-11-15&Action=DescribeInstances";
        let c = aws_call_of_request(&[("authorization", auth)], Some(form), "POST", "/");
        assert_eq!((c.name.as_str(), c.write), ("ec2:DescribeInstances", false));

        let auth = "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/dynamodb/aws4_request";
        for (target, name, write) in [
            (
                "DynamoDB_20120810.TransactWriteItems",
                "dynamodb:TransactWriteItems",
                true,
            ),
            ("DynamoDB_20120810.Query", "dynamodb:Query", false),
            ("DynamoDB_20120810.GetItem", "dynamodb:GetItem", false),
        ] {
            let c = aws_call_of_request(
                &[("Authorization", auth), ("X-Amz-Target", target)],
                Some(b"{}"),
                "POST",
                "/",
            );
            assert_eq!((c.name.as_str(), c.write), (name, write));
        }
        let auth = "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/eks/aws4_request";
        let c = aws_call_of_request(&[("Authorization", auth)], None, "GET", "/clusters/demo");
        assert_eq!((c.name.as_str(), c.write), ("eks:GET /clusters/demo", false));
    }

    #[test]
    fn points_round_trip_as_the_crash_file_holds_them() {
        let p = Point {
            call: "ec2:CreateFleet".into(),
            occurrence: 1,
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"call":"ec2:CreateFleet","occurrence":1}"#);
        assert_eq!(serde_json::from_str::<Point>(&text).unwrap(), p);
    }
}
