//! What one invocation used of the services nodesmith pays for besides
//! Lambda: DynamoDB request units, SQS requests and the log bytes it wrote.
//! Counted where every call passes (the AWS SDK's HTTP client from
//! [`crate::transport::https_client`], through [`crate::crash::observe`], and
//! the log writer of [`crate::telemetry`]),
//! so no call site needs marking; [`crate::metering`] prices it.
//!
//! DynamoDB's units are estimated from the HTTP bodies (a write: one unit a
//! KB of request; a read: one unit per 4 KB of response, at least half a
//! unit a request), as asking every call for its consumed capacity would
//! change every call.

use std::sync::atomic::{AtomicU64, Ordering};

/// What an invocation used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// DynamoDB read request units.
    pub dynamodb_read_units: f64,
    /// DynamoDB write request units.
    pub dynamodb_write_units: f64,
    /// SQS requests (each 64 KB of payload counts as one, as SQS bills).
    pub sqs_requests: u64,
    /// Bytes written to the log (CloudWatch Logs ingests them).
    pub log_bytes: u64,
}

// Counters in thousandths of a unit, so atomics hold them.
static READ_MILLI: AtomicU64 = AtomicU64::new(0);
static WRITE_MILLI: AtomicU64 = AtomicU64::new(0);
static SQS_REQUESTS: AtomicU64 = AtomicU64::new(0);
static LOG_BYTES: AtomicU64 = AtomicU64::new(0);

/// What the process used since the last [`take`], and starts counting anew
/// (a Lambda process runs one invocation at a time).
pub fn take() -> Usage {
    Usage {
        dynamodb_read_units: READ_MILLI.swap(0, Ordering::Relaxed) as f64 / 1000.0,
        dynamodb_write_units: WRITE_MILLI.swap(0, Ordering::Relaxed) as f64 / 1000.0,
        sqs_requests: SQS_REQUESTS.swap(0, Ordering::Relaxed),
        log_bytes: LOG_BYTES.swap(0, Ordering::Relaxed),
    }
}

/// Counts `n` bytes written to the log.
pub fn logged(n: usize) {
    LOG_BYTES.fetch_add(n as u64, Ordering::Relaxed);
}

/// One AWS call's cost units (pure).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallUnits {
    /// DynamoDB read units.
    pub read: f64,
    /// DynamoDB write units.
    pub write: f64,
    /// SQS requests.
    pub sqs: u64,
}

/// DynamoDB operations that write (their units come from the request);
/// transactions cost two units a KB.
fn dynamodb_write_factor(operation: &str) -> Option<f64> {
    match operation {
        "PutItem" | "UpdateItem" | "DeleteItem" | "BatchWriteItem" => Some(1.0),
        "TransactWriteItems" => Some(2.0),
        _ => None,
    }
}

/// The units of a call to `service`'s `operation` with these body sizes (pure).
pub fn units(service: &str, operation: &str, request_bytes: u64, response_bytes: u64) -> CallUnits {
    match service {
        "dynamodb" => match dynamodb_write_factor(operation) {
            Some(factor) => CallUnits {
                write: factor * request_bytes.div_ceil(1024).max(1) as f64,
                ..CallUnits::default()
            },
            None if operation.starts_with("Describe") || operation.starts_with("List") => CallUnits::default(),
            None => {
                let factor = if operation == "TransactGetItems" { 2.0 } else { 1.0 };
                CallUnits {
                    read: factor * (response_bytes.div_ceil(4096) as f64).max(0.5),
                    ..CallUnits::default()
                }
            }
        },
        "sqs" => CallUnits {
            sqs: request_bytes.max(response_bytes).div_ceil(64 * 1024).max(1),
            ..CallUnits::default()
        },
        _ => CallUnits::default(),
    }
}

/// Adds one call's units to the process's counters.
fn count(u: CallUnits) {
    READ_MILLI.fetch_add((u.read * 1000.0).round() as u64, Ordering::Relaxed);
    WRITE_MILLI.fetch_add((u.write * 1000.0).round() as u64, Ordering::Relaxed);
    SQS_REQUESTS.fetch_add(u.sqs, Ordering::Relaxed);
}

/// The AWS SDK's HTTP client with every call counted.
pub mod aws {
    use aws_smithy_runtime_api::client::http::SharedHttpClient;

    /// `inner` with every call counted.
    pub fn wrap(inner: SharedHttpClient) -> SharedHttpClient {
        crate::crash::observe::observe(inner, |o| {
            if let (Some(response_bytes), Some((service, operation))) = (o.response_bytes, o.call.name.split_once(':'))
            {
                super::count(super::units(service, operation, o.request_bytes, response_bytes));
            }
        })
    }
}

/// Stdout for the log, counting what goes through it.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = std::io::stdout().write(buf)?;
        logged(n);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_each_services_billing() {
        let u = |s, o, req, resp| units(s, o, req, resp);
        let w = |write| CallUnits {
            write,
            ..CallUnits::default()
        };
        let r = |read| CallUnits {
            read,
            ..CallUnits::default()
        };
        for (what, got, want) in [
            ("a small put", u("dynamodb", "PutItem", 300, 2), w(1.0)),
            ("a 2.5 KB put", u("dynamodb", "PutItem", 2560, 2), w(3.0)),
            ("a transaction", u("dynamodb", "TransactWriteItems", 900, 2), w(2.0)),
            ("an empty query", u("dynamodb", "Query", 200, 40), r(1.0)),
            ("a 9 KB query", u("dynamodb", "Query", 200, 9000), r(3.0)),
            (
                "a transactional get",
                u("dynamodb", "TransactGetItems", 200, 100),
                r(2.0),
            ),
            (
                "a describe is free",
                u("dynamodb", "DescribeTable", 50, 900),
                CallUnits::default(),
            ),
            (
                "a send",
                u("sqs", "SendMessage", 800, 200),
                CallUnits {
                    sqs: 1,
                    ..CallUnits::default()
                },
            ),
            (
                "a 200 KB batch",
                u("sqs", "SendMessageBatch", 200 * 1024, 300),
                CallUnits {
                    sqs: 4,
                    ..CallUnits::default()
                },
            ),
            (
                "ec2 is billed by capacity",
                u("ec2", "CreateFleet", 4000, 4000),
                CallUnits::default(),
            ),
        ] {
            assert_eq!(got, want, "{what}");
        }
    }
}
