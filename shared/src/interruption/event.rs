//! EventBridge envelopes → typed interruption events (pure, total: every input
//! becomes an [`Event`], unusable ones [`Kind::Unknown`] with the reason).
//!
//! Only what is acted on is required: `source`, `detail-type` and the fields
//! that name the instance. `version`, `account`, `region` and `resources` are
//! never read, so their absence or odd shape (AWS documents `resources` as a
//! string for some events) changes nothing; nor is `time` required (AWS's
//! documented EC2 samples carry a `yyyy-mm-ddThh:mm:ssZ` placeholder): without
//! it a deadline counted from it is left to the handler's clock. Dates are
//! read in whatever format AWS sent them ([`parse_time`]).

use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value};

/// The notice EC2 gives before it reclaims a spot or interruptible-reservation instance.
pub const NOTICE: SignedDuration = SignedDuration::from_secs(120);

/// `detail-type` of a spot interruption warning.
pub const SPOT_INTERRUPTION: &str = "EC2 Spot Instance Interruption Warning";
/// `detail-type` of a rebalance recommendation.
pub const REBALANCE_RECOMMENDATION: &str = "EC2 Instance Rebalance Recommendation";
/// `detail-type` of an instance state change.
pub const STATE_CHANGE: &str = "EC2 Instance State-change Notification";
/// `detail-type` of an AWS Health event.
pub const HEALTH_EVENT: &str = "AWS Health Event";
/// The `detail-type`s AWS documents for the interruptible capacity reservation warning.
pub const CAPACITY_RESERVATION_INTERRUPTION: [&str; 2] = [
    "EC2 Capacity Reservation Instance Interruption Warning",
    "EC2 Capacity Reservation Interruption Warning",
];
/// Every `(source, detail-type)` the interruption queue subscribes to (the template's rules).
pub const SUBSCRIBED: [(&str, &str); 6] = [
    ("aws.ec2", SPOT_INTERRUPTION),
    ("aws.ec2", REBALANCE_RECOMMENDATION),
    ("aws.ec2", STATE_CHANGE),
    ("aws.health", HEALTH_EVENT),
    ("aws.ec2", CAPACITY_RESERVATION_INTERRUPTION[0]),
    ("aws.ec2", CAPACITY_RESERVATION_INTERRUPTION[1]),
];

/// What an event says is happening to its instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// EC2 reclaims a spot instance in two minutes.
    SpotInterruption,
    /// EC2 says a spot instance is at elevated risk of interruption.
    RebalanceRecommendation,
    /// AWS Health: EC2 scheduled maintenance (retirement, stop, reboot) on the instances.
    ScheduledChange,
    /// The instance changed state.
    StateChange {
        /// The new state (`stopping`, `stopped`, `shutting-down`, `terminated`, `pending`, `running`, …).
        state: String,
    },
    /// An interruptible capacity reservation is reclaiming the instance.
    CapacityReservationInterruption,
    /// Not something nodesmith acts on, or not readable.
    Unknown {
        /// Why, naming the field at fault.
        error: String,
    },
}

impl Kind {
    /// The contract's name for the kind.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::SpotInterruption => "SpotInterruption",
            Kind::RebalanceRecommendation => "RebalanceRecommendation",
            Kind::ScheduledChange => "ScheduledChange",
            Kind::StateChange { .. } => "StateChange",
            Kind::CapacityReservationInterruption => "CapacityReservationInterruption",
            Kind::Unknown { .. } => "Unknown",
        }
    }

    /// The kind as Karpenter's `message_type` label names it
    /// (`spot_interrupted`, …; a state change as `instance_<state>`, and
    /// what nodesmith does not act on as `no_op`).
    pub fn message_type(&self) -> String {
        match self {
            Kind::SpotInterruption => "spot_interrupted".to_string(),
            Kind::RebalanceRecommendation => "rebalance_recommendation".to_string(),
            Kind::ScheduledChange => "scheduled_change".to_string(),
            Kind::StateChange { state } => format!("instance_{}", state.replace('-', "_")),
            Kind::CapacityReservationInterruption => "capacity_reservation_interrupted".to_string(),
            Kind::Unknown { .. } => "no_op".to_string(),
        }
    }

    /// True for a state change that means the capacity is gone or going.
    pub fn capacity_gone(&self) -> bool {
        matches!(self, Kind::StateChange { state } if is_gone_state(state))
    }
}

/// States in which an instance no longer runs pods.
pub fn is_gone_state(state: &str) -> bool {
    matches!(state, "stopping" | "stopped" | "shutting-down" | "terminated")
}

/// One classified event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// What it means.
    pub kind: Kind,
    /// `source`, when it was a string.
    pub source: Option<String>,
    /// `detail-type`, when it was a string.
    pub detail_type: Option<String>,
    /// EventBridge's event id, when present (the idempotency key).
    pub id: Option<String>,
    /// When EventBridge emitted it.
    pub time: Option<Timestamp>,
    /// Every EC2 instance it names, in the event's order, without repeats.
    pub instance_ids: Vec<String>,
    /// When the instances go away, if the event says.
    pub deadline: Option<Timestamp>,
}

impl Event {
    fn unknown(error: impl Into<String>) -> Self {
        Event {
            kind: Kind::Unknown { error: error.into() },
            source: None,
            detail_type: None,
            id: None,
            time: None,
            instance_ids: Vec::new(),
            deadline: None,
        }
    }

    /// True when nodesmith does something about it (given the instances are its own).
    pub fn is_known(&self) -> bool {
        !matches!(self.kind, Kind::Unknown { .. })
    }
}

/// Parses one EventBridge event from its JSON text.
pub fn parse(text: &str) -> Event {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => classify(&v),
        Err(e) => Event::unknown(format!("not JSON: {e}")),
    }
}

/// Classifies one EventBridge event.
pub fn classify(value: &Value) -> Event {
    let Some(obj) = value.as_object() else {
        return Event::unknown(format!("the event is {}, not a JSON object", type_name(value)));
    };
    let source = obj.get("source").and_then(Value::as_str).map(str::to_string);
    let detail_type = obj.get("detail-type").and_then(Value::as_str).map(str::to_string);
    let id = obj.get("id").and_then(Value::as_str).map(str::to_string);
    let mut event = Event {
        source: source.clone(),
        detail_type: detail_type.clone(),
        id,
        ..Event::unknown("")
    };
    match read(obj, source.as_deref(), detail_type.as_deref()) {
        Ok(parsed) => {
            event.kind = parsed.kind;
            event.time = parsed.time;
            event.instance_ids = parsed.instance_ids;
            event.deadline = parsed.deadline;
        }
        Err(error) => {
            event.kind = Kind::Unknown { error };
            event.time = time(obj);
        }
    }
    event
}

struct Parsed {
    kind: Kind,
    time: Option<Timestamp>,
    instance_ids: Vec<String>,
    deadline: Option<Timestamp>,
}

fn read(obj: &Map<String, Value>, source: Option<&str>, detail_type: Option<&str>) -> Result<Parsed, String> {
    let source = source.ok_or_else(|| missing_or_wrong(obj, "source", "a string"))?;
    let detail_type = detail_type.ok_or_else(|| missing_or_wrong(obj, "detail-type", "a string"))?;
    // Never required: an unreadable `time` (AWS's own samples carry a placeholder)
    // only leaves a spot or reservation deadline to the handler's clock.
    let time = time(obj);
    let detail = || -> Result<&Map<String, Value>, String> {
        obj.get("detail")
            .and_then(Value::as_object)
            .ok_or_else(|| missing_or_wrong(obj, "detail", "an object"))
    };
    let after_notice = time.and_then(|t| t.checked_add(NOTICE).ok());
    match (source, detail_type) {
        ("aws.ec2", SPOT_INTERRUPTION) => Ok(Parsed {
            kind: Kind::SpotInterruption,
            time,
            instance_ids: vec![instance_id(detail()?)?],
            deadline: after_notice,
        }),
        ("aws.ec2", REBALANCE_RECOMMENDATION) => Ok(Parsed {
            kind: Kind::RebalanceRecommendation,
            time,
            instance_ids: vec![instance_id(detail()?)?],
            deadline: None,
        }),
        ("aws.ec2", STATE_CHANGE) => {
            let d = detail()?;
            let state = d
                .get("state")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| in_detail(missing_or_wrong(d, "state", "a non-empty string")))?;
            Ok(Parsed {
                kind: Kind::StateChange { state: state.into() },
                time,
                instance_ids: vec![instance_id(d)?],
                deadline: None,
            })
        }
        ("aws.ec2", dt) if CAPACITY_RESERVATION_INTERRUPTION.contains(&dt) => {
            let d = detail()?;
            let ids = vec![instance_id(d)?];
            let termination = match d.get("instance-termination-time") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_str()
                        .and_then(parse_time)
                        .ok_or("detail.instance-termination-time: not a date")?,
                ),
            };
            Ok(Parsed {
                kind: Kind::CapacityReservationInterruption,
                time,
                instance_ids: ids,
                deadline: termination.or(after_notice),
            })
        }
        ("aws.health", HEALTH_EVENT) => health(detail()?, time),
        ("aws.ec2" | "aws.health", dt) => Err(format!("detail-type {dt:?} of {source} is not an interruption")),
        (s, _) => Err(format!("source {s:?} is not aws.ec2 or aws.health")),
    }
}

fn health(d: &Map<String, Value>, time: Option<Timestamp>) -> Result<Parsed, String> {
    let service = d
        .get("service")
        .and_then(Value::as_str)
        .ok_or_else(|| in_detail(missing_or_wrong(d, "service", "a string")))?;
    if service != "EC2" {
        return Err(format!(
            "detail.service {service:?}: only EC2 health events are acted on"
        ));
    }
    let category = d
        .get("eventTypeCategory")
        .and_then(Value::as_str)
        .ok_or_else(|| in_detail(missing_or_wrong(d, "eventTypeCategory", "a string")))?;
    if category != "scheduledChange" {
        return Err(format!(
            "detail.eventTypeCategory {category:?}: only scheduledChange is acted on"
        ));
    }
    let entities = d
        .get("affectedEntities")
        .and_then(Value::as_array)
        .ok_or_else(|| in_detail(missing_or_wrong(d, "affectedEntities", "a list")))?;
    let mut ids: Vec<String> = Vec::new();
    for e in entities {
        if let Some(v) = e.get("entityValue").and_then(Value::as_str)
            && is_instance_id(v)
            && !ids.iter().any(|i| i == v)
        {
            ids.push(v.to_string());
        }
    }
    if ids.is_empty() {
        return Err("detail.affectedEntities: no entityValue is an EC2 instance id".into());
    }
    let deadline = match d.get("startTime") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_str().and_then(parse_time).ok_or("detail.startTime: not a date")?),
    };
    Ok(Parsed {
        kind: Kind::ScheduledChange,
        time,
        instance_ids: ids,
        deadline,
    })
}

fn time(obj: &Map<String, Value>) -> Option<Timestamp> {
    obj.get("time").and_then(Value::as_str).and_then(parse_time)
}

fn instance_id(d: &Map<String, Value>) -> Result<String, String> {
    match d.get("instance-id") {
        None | Some(Value::Null) => Err("detail.instance-id is missing".into()),
        Some(Value::String(s)) if is_instance_id(s) => Ok(s.clone()),
        Some(Value::String(s)) => Err(format!("detail.instance-id {s:?} is not an EC2 instance id")),
        Some(v) => Err(format!("detail.instance-id is {}, not a string", type_name(v))),
    }
}

/// True for `i-` followed by 8 or 17 lowercase hex digits (EC2's two formats).
pub fn is_instance_id(s: &str) -> bool {
    s.strip_prefix("i-").is_some_and(|h| {
        (h.len() == 8 || h.len() == 17) && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Reads a date as AWS writes them: RFC 3339, or RFC 1123 / RFC 2822 as
/// Health events carry `startTime` and `endTime` (`Wed, 31 Jan 2024 21:00:00 GMT`).
/// The day of the week is redundant and not checked: AWS's own documented
/// Health sample says `Sat, 05 Jun 2016`, a Sunday.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    let s = s.trim();
    if let Ok(t) = s.parse::<Timestamp>() {
        return Some(t);
    }
    // RFC 2822 allows "GMT" and "UT"; some producers write "UTC".
    let zone_fixed = s.strip_suffix(" UTC").map(|head| format!("{head} GMT"));
    let s = zone_fixed.as_deref().unwrap_or(s);
    let without_weekday = s.split_once(", ").map(|(_, rest)| rest);
    [Some(s), without_weekday]
        .into_iter()
        .flatten()
        .find_map(|text| jiff::fmt::rfc2822::parse(text).ok())
        .map(|z| z.timestamp())
}

fn missing_or_wrong(obj: &Map<String, Value>, field: &str, want: &str) -> String {
    match obj.get(field) {
        None => format!("{field} is missing"),
        Some(v) => format!("{field} is {}, not {want}", type_name(v)),
    }
}

fn in_detail(error: String) -> String {
    format!("detail.{error}")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
