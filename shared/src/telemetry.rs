//! Structured logs (JSON in Lambda) and metrics as CloudWatch Embedded Metric Format.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// How logs are written, from Lambda's `LoggingConfig` and `RUST_LOG`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// The `tracing` filter: `RUST_LOG` when set, else the function's
    /// application log level (`AWS_LAMBDA_LOG_LEVEL`), else `info`.
    pub filter: String,
    /// JSON lines, each with a `level` and an RFC 3339 `timestamp` (Lambda
    /// filters by the level only when both are there): when the function's
    /// log format is JSON, or in Lambda when the format is not stated.
    pub json: bool,
    /// The level metric lines carry: Lambda files a line without one under
    /// INFO and drops it when the application log level is WARN or above, so
    /// metric lines take the configured level when it is above INFO.
    pub metric_level: &'static str,
}

impl LogSettings {
    /// Reads the settings (pure over `settings`).
    pub fn read<F: Fn(&str) -> Option<String>>(settings: &crate::settings::Settings<F>) -> Self {
        let lambda_level = settings
            .optional("AWS_LAMBDA_LOG_LEVEL")
            .map(|l| l.trim().to_ascii_uppercase());
        let filter = settings.optional("RUST_LOG").unwrap_or_else(|| {
            match lambda_level.as_deref() {
                Some("TRACE") => "trace",
                Some("DEBUG") => "debug",
                Some("WARN") => "warn",
                // tracing has no FATAL: ERROR is the nearest.
                Some("ERROR" | "FATAL") => "error",
                _ => "info",
            }
            .to_string()
        });
        let metric_level = match lambda_level.as_deref() {
            Some("WARN") => "WARN",
            Some("ERROR") => "ERROR",
            Some("FATAL") => "FATAL",
            _ => "INFO",
        };
        let json = match settings.optional("AWS_LAMBDA_LOG_FORMAT") {
            Some(format) => format.trim().eq_ignore_ascii_case("json"),
            None => settings.optional("AWS_LAMBDA_FUNCTION_NAME").is_some(),
        };
        LogSettings {
            filter,
            json,
            metric_level,
        }
    }
}

/// The level metric lines carry, read once ([`LogSettings::metric_level`]).
fn metric_level() -> &'static str {
    static LEVEL: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    LEVEL.get_or_init(|| LogSettings::read(&crate::settings::Settings::from_env()).metric_level)
}

/// Initialises tracing as [`LogSettings`] says: the level from `RUST_LOG`
/// or Lambda's application log level, JSON when Lambda's log format is JSON.
pub fn init() {
    let settings = LogSettings::read(&crate::settings::Settings::from_env());
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(crate::usage::LogWriter);
    // A second init (tests, warm containers) is harmless: keep the first.
    let _ = if settings.json {
        builder.json().with_current_span(false).with_ansi(false).try_init()
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
    /// Value (with `samples`, their sum).
    pub value: f64,
    /// CloudWatch unit: Count, Milliseconds, None, ...
    pub unit: &'static str,
    /// A distribution's datapoints, written as EMF's value array (CloudWatch
    /// then has their percentiles); empty for a single value. At most
    /// [`MAX_SAMPLES`], EMF's limit: builders split more over several series.
    pub samples: Vec<f64>,
}

/// The most values one EMF metric may carry.
pub const MAX_SAMPLES: usize = 100;

/// Metrics sharing one set of label values: one EMF line.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    /// Label (dimension) names and values, besides `Function`.
    pub labels: BTreeMap<&'static str, String>,
    /// The values.
    pub metrics: Vec<Metric>,
}

impl Series {
    /// Metrics without labels.
    pub fn plain(metrics: Vec<Metric>) -> Self {
        Series {
            labels: BTreeMap::new(),
            metrics,
        }
    }
}

/// Each metric's total over `series` (its values under every label set summed).
pub fn totals(series: &[Series]) -> BTreeMap<&'static str, f64> {
    let mut out = BTreeMap::new();
    for m in series.iter().flat_map(|s| &s.metrics) {
        *out.entry(m.name).or_insert(0.0) += m.value;
    }
    out
}

/// The value of `name` in the series labelled exactly `labels`, if emitted.
pub fn value(series: &[Series], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    series
        .iter()
        .filter(|s| {
            s.labels.len() == labels.len() && labels.iter().all(|(k, v)| s.labels.get(k).is_some_and(|x| x == v))
        })
        .flat_map(|s| &s.metrics)
        .find(|m| m.name == name)
        .map(|m| m.value)
}

/// Renders metrics as one EMF line in the `nodesmith` namespace, with
/// `level` for Lambda's log-level filter.
pub fn emf(timestamp_ms: i64, level: &str, dimensions: &BTreeMap<&str, String>, metrics: &[Metric]) -> String {
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
    root.insert("level".into(), Value::String(level.to_string()));
    for (k, v) in dimensions {
        root.insert((*k).to_string(), Value::String(v.clone()));
    }
    for m in metrics {
        let value = if m.samples.is_empty() {
            json!(m.value)
        } else {
            json!(m.samples)
        };
        root.insert(m.name.to_string(), value);
    }
    Value::Object(root).to_string()
}

/// Writes `function`'s series to stdout, where Lambda ships them to
/// CloudWatch: one EMF line each, dimensioned by `Function` and its labels.
pub fn publish(function: &str, series: &[Series]) {
    let now = jiff::Timestamp::now().as_millisecond();
    for s in series.iter().filter(|s| !s.metrics.is_empty()) {
        let mut dimensions: BTreeMap<&str, String> = s.labels.iter().map(|(k, v)| (*k, v.clone())).collect();
        dimensions.insert("Function", function.to_string());
        let line = emf(now, metric_level(), &dimensions, &s.metrics);
        crate::usage::logged(line.len() + 1);
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_has_the_documented_shape() -> Result<(), serde_json::Error> {
        let dims = BTreeMap::from([("Function", "provision".to_string())]);
        let line = emf(
            1_700_000_000_000,
            "INFO",
            &dims,
            &[
                Metric {
                    name: "NodeClaimsCreated",
                    value: 3.0,
                    unit: "Count",
                    samples: Vec::new(),
                },
                Metric {
                    name: "karpenter_pods_startup_duration_seconds",
                    value: 12.5,
                    unit: "Seconds",
                    samples: vec![4.0, 8.5],
                },
            ],
        );
        let v: Value = serde_json::from_str(&line)?;
        assert_eq!(v["_aws"]["Timestamp"], 1_700_000_000_000i64);
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], "nodesmith");
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0][0], "Function");
        assert_eq!(
            v["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"],
            "NodeClaimsCreated"
        );
        assert_eq!(v["Function"], "provision");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["NodeClaimsCreated"], 3.0);
        // A distribution: EMF's array of values.
        assert_eq!(
            v["karpenter_pods_startup_duration_seconds"],
            serde_json::json!([4.0, 8.5])
        );
        Ok(())
    }

    #[test]
    fn logs_follow_lambdas_logging_config_unless_rust_log_says_otherwise() {
        let read = |vars: &[(&str, &str)]| {
            let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            LogSettings::read(&crate::settings::Settings::new(|n: &str| vars.get(n).cloned()))
        };
        let lambda = ("AWS_LAMBDA_FUNCTION_NAME", "nodesmith-sweep");
        for (vars, filter, json, metric_level) in [
            (vec![], "info", false, "INFO"),
            (vec![lambda], "info", true, "INFO"),
            (vec![lambda, ("AWS_LAMBDA_LOG_FORMAT", "Text")], "info", false, "INFO"),
            (vec![("AWS_LAMBDA_LOG_FORMAT", "JSON")], "info", true, "INFO"),
            (vec![lambda, ("AWS_LAMBDA_LOG_LEVEL", "DEBUG")], "debug", true, "INFO"),
            (vec![lambda, ("AWS_LAMBDA_LOG_LEVEL", "trace")], "trace", true, "INFO"),
            (vec![lambda, ("AWS_LAMBDA_LOG_LEVEL", "WARN")], "warn", true, "WARN"),
            (vec![lambda, ("AWS_LAMBDA_LOG_LEVEL", "FATAL")], "error", true, "FATAL"),
            (
                vec![
                    lambda,
                    ("AWS_LAMBDA_LOG_LEVEL", "WARN"),
                    ("RUST_LOG", "nodesmith=debug"),
                ],
                "nodesmith=debug",
                true,
                "WARN",
            ),
        ] {
            let got = read(&vars);
            assert_eq!(
                got,
                LogSettings {
                    filter: filter.to_string(),
                    json,
                    metric_level
                },
                "{vars:?}"
            );
        }
    }
}
