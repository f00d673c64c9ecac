//! Interruptions: EC2 and AWS Health events that take capacity away, read
//! from the EventBridge → SQS queue by the `interrupt` function.
//!
//! [`event`] turns an envelope into a typed [`Event`] (pure, total);
//! [`decide`] turns an event and what nodesmith knows about the instance into
//! the steps to take (pure); the handler carries them out. `nodesmith event`
//! prints the classification (`docs/interruption-format.md`).

pub mod batch;
pub mod decide;
pub mod event;
pub mod handler;

use serde_json::{Value, json};

pub use decide::{Reaction, RebalanceMode};
pub use event::{Event, Kind, classify, parse};

/// The events in one input: a single event, a JSON array of events, an SQS
/// message (`Body`/`body` holding an event), or an SQS `receive-message`
/// answer (`Messages`). Unreadable input is one `Unknown` event.
pub fn read_input(text: &str) -> Vec<Event> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => unwrap(&v, 0),
        Err(_) => vec![parse(text)],
    }
}

fn unwrap(v: &Value, depth: u8) -> Vec<Event> {
    if depth > 3 {
        return vec![classify(v)];
    }
    match v {
        Value::Array(items) => items.iter().flat_map(|i| unwrap(i, depth + 1)).collect(),
        Value::Object(o) if !o.contains_key("detail-type") => {
            if let Some(Value::Array(msgs)) = o.get("Messages") {
                return msgs.iter().flat_map(|m| unwrap(m, depth + 1)).collect();
            }
            match o.get("Body").or_else(|| o.get("body")) {
                Some(Value::String(body)) => match serde_json::from_str::<Value>(body) {
                    Ok(inner) => unwrap(&inner, depth + 1),
                    Err(_) => vec![parse(body)],
                },
                _ => vec![classify(v)],
            }
        }
        _ => vec![classify(v)],
    }
}

/// A short sentence saying what the `interrupt` function does about an event.
pub fn action(event: &Event, rebalance: RebalanceMode) -> String {
    match &event.kind {
        Kind::SpotInterruption => {
            "taint, drain until the deadline, launch a replacement now, mark the offering unavailable".into()
        }
        Kind::CapacityReservationInterruption => {
            "taint, drain until the deadline, launch a replacement now, mark the reservation's offering unavailable"
                .into()
        }
        Kind::RebalanceRecommendation => match rebalance {
            RebalanceMode::Ignore => "none: rebalance recommendations are ignored (NODESMITH_REBALANCE=ignore)".into(),
            RebalanceMode::Replace => "taint and launch a replacement; no drain".into(),
            RebalanceMode::Drain => "taint, launch a replacement, drain gracefully".into(),
        },
        Kind::ScheduledChange => "taint, launch a replacement, drain gracefully before the start time".into(),
        Kind::StateChange { state } if event::is_gone_state(state) => {
            "drain what can be drained, delete the Node, remove the NodeClaim, solve its pods again".into()
        }
        Kind::StateChange { state } => format!("none: the instance is {state}"),
        Kind::Unknown { .. } => "none: acknowledged and logged".into(),
    }
}

/// The contract's JSON object for one event (`docs/interruption-format.md`).
pub fn to_json(event: &Event, rebalance: RebalanceMode) -> Value {
    let mut o = json!({
        "kind": event.kind.name(),
        "source": event.source,
        "detailType": event.detail_type,
        "id": event.id,
        "time": event.time.map(|t| rfc3339(&t)),
        "instanceIds": event.instance_ids,
        "deadline": event.deadline.map(|t| rfc3339(&t)),
        "action": action(event, rebalance),
    });
    match &event.kind {
        Kind::StateChange { state } => o["state"] = json!(state),
        Kind::Unknown { error } => o["error"] = json!(error),
        _ => {}
    }
    o
}

/// RFC 3339 in UTC, whole seconds when the time has no fraction.
pub fn rfc3339(t: &jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.fZ").to_string()
}

#[cfg(test)]
mod tests;
