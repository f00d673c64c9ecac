//! What the autoscaler itself costs: the price of one Lambda invocation and
//! of what it used of DynamoDB, SQS and CloudWatch Logs ([`crate::usage`])
//! (pure), and the meter the shared Lambda shell runs around every handler.
//!
//! Amounts are kept as integer nano-dollars: one warm invocation of a 512 MB
//! function costs about a micro-dollar, so micro-dollars would round most of
//! the bill away.

use std::time::Duration;

/// Lambda's arm64 price per GB-second (us-east-1, first pricing tier).
pub const ARM64_USD_PER_GB_SECOND: f64 = 0.000_013_333_4;
/// Lambda's price per request ($0.20 per million).
pub const USD_PER_REQUEST: f64 = 0.20 / 1_000_000.0;
/// DynamoDB on-demand, per write request unit ($0.625 per million, us-east-1).
pub const USD_PER_DYNAMODB_WRITE_UNIT: f64 = 0.625 / 1_000_000.0;
/// DynamoDB on-demand, per read request unit ($0.125 per million, us-east-1).
pub const USD_PER_DYNAMODB_READ_UNIT: f64 = 0.125 / 1_000_000.0;
/// SQS standard queues, per request ($0.40 per million).
pub const USD_PER_SQS_REQUEST: f64 = 0.40 / 1_000_000.0;
/// CloudWatch Logs ingestion of Lambda's logs, per byte ($0.50 per GB, the first tier).
pub const USD_PER_LOG_BYTE: f64 = 0.50 / 1_073_741_824.0;
/// Nano-dollars per dollar.
pub const NANO_PER_USD: f64 = 1e9;

/// One invocation as Lambda bills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invocation {
    /// From the handler's start to its response.
    pub duration: Duration,
    /// The init phase, on a cold start only (a custom runtime's init is billed).
    pub init: Option<Duration>,
    /// The function's configured memory (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`).
    pub memory_mb: u32,
}

/// Milliseconds Lambda bills for `d`: rounded up to the next whole millisecond.
pub fn billed_ms(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    nanos.div_ceil(1_000_000) as u64
}

/// The price of one invocation in dollars: billed duration (init included on
/// a cold start) × memory in GB × the GB-second price, plus the request price.
pub fn invocation_cost_usd(inv: &Invocation) -> f64 {
    let ms = billed_ms(inv.duration) + inv.init.map_or(0, billed_ms);
    let gb = f64::from(inv.memory_mb) / 1024.0;
    ms as f64 / 1000.0 * gb * ARM64_USD_PER_GB_SECOND + USD_PER_REQUEST
}

/// What one invocation cost, by service.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServiceCosts {
    /// Lambda: duration, memory and the request.
    pub lambda: f64,
    /// DynamoDB request units.
    pub dynamodb: f64,
    /// SQS requests.
    pub sqs: f64,
    /// CloudWatch Logs ingestion.
    pub logs: f64,
}

impl ServiceCosts {
    /// Prices one invocation and what it used (pure).
    pub fn of(inv: &Invocation, used: &crate::usage::Usage) -> Self {
        ServiceCosts {
            lambda: invocation_cost_usd(inv),
            dynamodb: used.dynamodb_read_units * USD_PER_DYNAMODB_READ_UNIT
                + used.dynamodb_write_units * USD_PER_DYNAMODB_WRITE_UNIT,
            sqs: used.sqs_requests as f64 * USD_PER_SQS_REQUEST,
            logs: used.log_bytes as f64 * USD_PER_LOG_BYTE,
        }
    }

    /// The sum.
    pub fn total(&self) -> f64 {
        self.lambda + self.dynamodb + self.sqs + self.logs
    }
}

/// Dollars as whole nano-dollars, rounded to the nearest.
pub fn to_nano_usd(usd: f64) -> i64 {
    (usd * NANO_PER_USD).round() as i64
}

/// Whole nano-dollars as dollars.
pub fn from_nano_usd(nano: i64) -> f64 {
    nano as f64 / NANO_PER_USD
}

/// What one invocation cost and what it did to the fleet's running price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metered {
    /// The invocation's own price in dollars: Lambda, DynamoDB, SQS and logs.
    pub cost_usd: f64,
    /// That price by service.
    pub services: ServiceCosts,
    /// $/h of capacity this invocation launched (positive) or terminated (negative).
    pub fleet_delta_usd_per_hour: f64,
    /// Whether it paid for the init phase.
    pub cold_start: bool,
    /// The billed milliseconds, init included.
    pub billed_ms: u64,
}

impl Metered {
    /// Prices `inv` and what it `used`, with the fleet change the handler reported.
    pub fn new(inv: &Invocation, used: &crate::usage::Usage, fleet_delta_usd_per_hour: f64) -> Self {
        let services = ServiceCosts::of(inv, used);
        Metered {
            cost_usd: services.total(),
            services,
            fleet_delta_usd_per_hour,
            cold_start: inv.init.is_some(),
            billed_ms: billed_ms(inv.duration) + inv.init.map_or(0, billed_ms),
        }
    }

    /// As EMF: [`Self::metrics`], then `OwnCostUsd` by service.
    pub fn series(&self) -> Vec<crate::telemetry::Series> {
        let s = &self.services;
        let mut out = vec![crate::telemetry::Series::plain(self.metrics())];
        for (service, usd) in [
            ("lambda", s.lambda),
            ("dynamodb", s.dynamodb),
            ("sqs", s.sqs),
            ("logs", s.logs),
        ] {
            out.push(crate::telemetry::Series {
                labels: [("service", service.to_string())].into(),
                metrics: vec![crate::telemetry::Metric {
                    name: "OwnCostUsd",
                    value: usd,
                    unit: "None",
                    samples: Vec::new(),
                }],
            });
        }
        out
    }

    /// The two EMF metrics: `InvocationCostUsd` and `FleetDeltaUsdPerHour`.
    pub fn metrics(&self) -> Vec<crate::telemetry::Metric> {
        vec![
            crate::telemetry::Metric {
                name: "InvocationCostUsd",
                value: self.cost_usd,
                unit: "None",
                samples: Vec::new(),
            },
            crate::telemetry::Metric {
                name: "FleetDeltaUsdPerHour",
                value: self.fleet_delta_usd_per_hour,
                unit: "None",
                samples: Vec::new(),
            },
        ]
    }
}

/// The memory size Lambda states in `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` (MB);
/// 128 MB, Lambda's minimum, when it is missing or not a number (local runs).
pub fn memory_mb(value: Option<&str>) -> u32 {
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(128)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn billed_duration_rounds_up_to_the_millisecond() {
        for (d, want) in [
            (Duration::ZERO, 0),
            (Duration::from_nanos(1), 1),
            (Duration::from_micros(999), 1),
            (ms(1), 1),
            (Duration::from_micros(1001), 2),
            (Duration::from_micros(149_400), 150),
            (Duration::from_secs(900), 900_000),
        ] {
            assert_eq!(billed_ms(d), want, "{d:?}");
        }
    }

    #[test]
    fn invocations_are_priced_as_lambda_bills_them() {
        // (duration, init, memory MB, expected nano-dollars)
        let cases = [
            // The request price alone.
            (Duration::ZERO, None, 512, 200),
            // 1 s at 1 GB: one GB-second (13 333.4 n$) + the request (200 n$).
            (ms(1000), None, 1024, 13_533),
            // 100 ms at 512 MB: 0.05 GB-s = 666.67 n$, + 200.
            (ms(100), None, 512, 867),
            // 99.1 ms bills as 100 ms.
            (Duration::from_micros(99_100), None, 512, 867),
            // A cold start adds the init phase: 100 + 300 ms at 512 MB.
            (ms(100), Some(ms(300)), 512, 2_867),
            // 128 MB for 1 ms: 0.000125 GB-s = 1.67 n$, + 200.
            (ms(1), None, 128, 202),
            // 10 GB for 15 minutes: 9000 GB-s.
            (Duration::from_secs(900), None, 10_240, 120_000_800),
        ];
        for (duration, init, memory_mb, want) in cases {
            let inv = Invocation {
                duration,
                init,
                memory_mb,
            };
            assert_eq!(to_nano_usd(invocation_cost_usd(&inv)), want, "{inv:?}");
        }
    }

    #[test]
    fn a_metered_invocation_says_whether_it_was_cold() {
        let inv = Invocation {
            duration: ms(10),
            init: Some(ms(90)),
            memory_mb: 1024,
        };
        let m = Metered::new(&inv, &crate::usage::Usage::default(), -0.096);
        assert!(m.cold_start);
        assert_eq!(m.billed_ms, 100);
        let names: Vec<_> = m.metrics().iter().map(|x| (x.name, x.value)).collect();
        assert_eq!(names[1], ("FleetDeltaUsdPerHour", -0.096));
        assert_eq!(names[0].0, "InvocationCostUsd");
    }

    #[test]
    fn an_invocation_costs_what_it_used_of_every_service() {
        let inv = Invocation {
            duration: ms(1000),
            init: None,
            memory_mb: 1024,
        };
        // A sweep's worth: a claim list, a few writes, one message, 40 KB of logs.
        let used = crate::usage::Usage {
            dynamodb_read_units: 20.0,
            dynamodb_write_units: 8.0,
            sqs_requests: 3,
            log_bytes: 40 * 1024,
        };
        let m = Metered::new(&inv, &used, 0.0);
        let s = m.services;
        assert_eq!(to_nano_usd(s.lambda), 13_533);
        assert_eq!(to_nano_usd(s.dynamodb), 2_500 + 5_000);
        assert_eq!(to_nano_usd(s.sqs), 1_200);
        assert_eq!(to_nano_usd(s.logs), 19_073);
        assert_eq!(m.cost_usd, s.total());
        // Lambda alone was well under half of it.
        assert!(s.lambda < 0.5 * m.cost_usd, "{s:?}");
        let by_service: Vec<(String, f64)> = m
            .series()
            .iter()
            .filter_map(|x| Some((x.labels.get("service")?.clone(), x.metrics[0].value)))
            .collect();
        assert_eq!(by_service.len(), 4);
        assert!(by_service.contains(&("logs".to_string(), s.logs)));
    }

    #[test]
    fn memory_comes_from_lambda_or_defaults_to_the_minimum() {
        assert_eq!(memory_mb(Some("512")), 512);
        assert_eq!(memory_mb(Some(" 1769 ")), 1769);
        assert_eq!(memory_mb(Some("lots")), 128);
        assert_eq!(memory_mb(None), 128);
    }

    #[test]
    fn nano_dollars_round_trip() {
        assert_eq!(to_nano_usd(0.096), 96_000_000);
        assert_eq!(to_nano_usd(-0.0416), -41_600_000);
        assert_eq!(from_nano_usd(96_000_000), 0.096);
    }
}
