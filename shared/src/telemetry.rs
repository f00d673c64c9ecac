//! Structured logs (JSON in Lambda) and metrics as CloudWatch Embedded Metric Format.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Initialises tracing: JSON lines when running in Lambda, human-readable
/// otherwise; the level comes from `RUST_LOG` (default `info`).
pub fn init() {
    let settings = crate::settings::Settings::from_env();
    let filter = settings
        .optional("RUST_LOG")
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    // A second init (tests, warm containers) is harmless: keep the first.
    let _ = if settings.optional("AWS_LAMBDA_FUNCTION_NAME").is_some() {
        builder.json().with_current_span(false).without_time().try_init()
    } else {
        builder.try_init()
    };
}

/// An error with every cause behind it, `outer: inner: root`, for a log
/// line: errors say what failed and keep why as their source, so a log that
/// printed only the outer message would lose the why.
pub fn causes<E: std::error::Error + ?Sized>(e: &E) -> impl std::fmt::Display + '_ {
    Causes(e)
}

struct Causes<'a, E: ?Sized>(&'a E);

impl<E: std::error::Error + ?Sized> std::fmt::Display for Causes<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// One metric value with its CloudWatch unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Metric name.
    pub name: &'static str,
    /// Value.
    pub value: f64,
    /// CloudWatch unit: Count, Milliseconds, None, ...
    pub unit: &'static str,
}

/// Renders metrics as one EMF log line in the `nodesmith` namespace.
pub fn emf(timestamp_ms: i64, dimensions: &BTreeMap<&str, String>, metrics: &[Metric]) -> String {
    let mut root = serde_json::Map::new();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": "nodesmith",
                "Dimensions": [dimensions.keys().collect::<Vec<_>>()],
                "Metrics": metrics.iter().map(|m| json!({"Name": m.name, "Unit": m.unit})).collect::<Vec<_>>(),
            }],
        }),
    );
    for (k, v) in dimensions {
        root.insert((*k).to_string(), Value::String(v.clone()));
    }
    for m in metrics {
        root.insert(m.name.to_string(), json!(m.value));
    }
    Value::Object(root).to_string()
}

/// Writes metrics to stdout, where Lambda ships them to CloudWatch.
pub fn publish(dimensions: &BTreeMap<&str, String>, metrics: &[Metric]) {
    let now = jiff::Timestamp::now().as_millisecond();
    println!("{}", emf(now, dimensions, metrics));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_has_the_documented_shape() {
        let dims = BTreeMap::from([("Function", "provision".to_string())]);
        let line = emf(
            1_700_000_000_000,
            &dims,
            &[Metric {
                name: "NodeClaimsCreated",
                value: 3.0,
                unit: "Count",
            }],
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["_aws"]["Timestamp"], 1_700_000_000_000i64);
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], "nodesmith");
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0][0], "Function");
        assert_eq!(
            v["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"],
            "NodeClaimsCreated"
        );
        assert_eq!(v["Function"], "provision");
        assert_eq!(v["NodeClaimsCreated"], 3.0);
    }
}
