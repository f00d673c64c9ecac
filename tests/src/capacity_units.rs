//! The read and write units DynamoDB would bill for a call, computed from the
//! items in its request and answer by DynamoDB's documented sizing rules:
//! moto answers `ReturnConsumedCapacity` with a fixed figure whatever the
//! items weigh, so the fault proxy counts them instead (for the scale harness).
//!
//! Exact for reads without a filter (nodesmith's are: key conditions only) and
//! for puts of new items. Where the item's size is not in the call (UpdateItem,
//! DeleteItem, a transaction's Update, Delete or ConditionCheck), one unit is
//! counted: a lower bound, exact for the small items nodesmith updates that way
//! (leases, markers, costs). A put that replaces a larger item is counted at
//! the new item's size, also a lower bound.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

/// Bytes a read unit covers (strongly consistent; eventually consistent reads cost half).
const READ_UNIT_BYTES: usize = 4096;
/// Bytes a write unit covers.
const WRITE_UNIT_BYTES: usize = 1024;

/// What a set of calls consumed, and the items they carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Consumed {
    /// Calls counted.
    pub calls: usize,
    /// Read units.
    pub read_units: f64,
    /// Write units.
    pub write_units: f64,
    /// Items read or written (those the calls carry).
    pub items: usize,
    /// Their summed size as DynamoDB counts it.
    pub item_bytes: usize,
    /// The largest of them.
    pub largest_item_bytes: usize,
}

impl Consumed {
    /// Adds another set of calls.
    pub fn add(&mut self, other: &Consumed) {
        self.calls += other.calls;
        self.read_units += other.read_units;
        self.write_units += other.write_units;
        self.items += other.items;
        self.item_bytes += other.item_bytes;
        self.largest_item_bytes = self.largest_item_bytes.max(other.largest_item_bytes);
    }

    /// What `self` holds beyond `before` (the largest item is `self`'s).
    pub fn since(&self, before: &Consumed) -> Consumed {
        Consumed {
            calls: self.calls - before.calls,
            read_units: self.read_units - before.read_units,
            write_units: self.write_units - before.write_units,
            items: self.items - before.items,
            item_bytes: self.item_bytes - before.item_bytes,
            largest_item_bytes: self.largest_item_bytes,
        }
    }

    fn item(&mut self, bytes: usize) {
        self.items += 1;
        self.item_bytes += bytes;
        self.largest_item_bytes = self.largest_item_bytes.max(bytes);
    }
}

/// The size DynamoDB counts for an item in its wire form (`{"name": {"S": "…"}}`):
/// each attribute's name plus its value.
pub fn item_bytes(item: &Map<String, Value>) -> usize {
    item.iter().map(|(name, v)| name.len() + value_bytes(v)).sum()
}

/// A typed value's size without its name: lists and maps cost 3 bytes and
/// 1 byte per element beyond their elements.
fn value_bytes(v: &Value) -> usize {
    let Some((ty, inner)) = v.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    match ty.as_str() {
        "S" => inner.as_str().map_or(0, str::len),
        "N" => inner.as_str().map_or(0, number_bytes),
        "B" => inner.as_str().map_or(0, base64_bytes),
        "BOOL" | "NULL" => 1,
        "SS" => strings(inner).map(str::len).sum(),
        "NS" => strings(inner).map(number_bytes).sum(),
        "BS" => strings(inner).map(base64_bytes).sum(),
        "L" => {
            3 + inner
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| 1 + value_bytes(e))
                .sum::<usize>()
        }
        "M" => {
            3 + inner
                .as_object()
                .map_or(0, |m| m.iter().map(|(k, e)| 1 + k.len() + value_bytes(e)).sum())
        }
        _ => 0,
    }
}

/// The members of a set.
fn strings(set: &Value) -> impl Iterator<Item = &str> {
    set.as_array().into_iter().flatten().filter_map(Value::as_str)
}

/// A number's size: one byte per two significant digits (leading and
/// trailing zeroes trimmed) plus one.
fn number_bytes(n: &str) -> usize {
    let mantissa = n.split(['e', 'E']).next().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len().max(1);
    significant.div_ceil(2) + 1
}

/// A binary value's raw length (it travels base64-encoded).
fn base64_bytes(b: &str) -> usize {
    b.trim_end_matches('=').len() * 3 / 4
}

fn read_units(bytes: usize, consistent: bool) -> f64 {
    let units = bytes.div_ceil(READ_UNIT_BYTES).max(1) as f64;
    if consistent { units } else { units / 2.0 }
}

fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(WRITE_UNIT_BYTES).max(1) as f64
}

/// The elements of an array.
fn elements(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

/// The items of an array of items.
fn items(v: Option<&Value>) -> impl Iterator<Item = &Map<String, Value>> {
    elements(v).filter_map(Value::as_object)
}

/// What one call consumed, from its request and its answer (`Value::Null`
/// when the call was refused: a refused conditional write still consumes
/// its units, anything else refused consumes none here).
pub fn consumed(action: &str, request: &Value, answer: &Value) -> Consumed {
    let mut c = Consumed {
        calls: 1,
        ..Consumed::default()
    };
    let consistent = request.get("ConsistentRead").and_then(Value::as_bool).unwrap_or(false);
    match action {
        "GetItem" => {
            let bytes = answer.get("Item").and_then(Value::as_object).map_or(0, item_bytes);
            if bytes > 0 {
                c.item(bytes);
            }
            c.read_units = read_units(bytes, consistent);
        }
        // A page is billed on the sum of its items, rounded up once.
        "Query" | "Scan" => {
            let mut page = 0;
            for it in items(answer.get("Items")) {
                let bytes = item_bytes(it);
                c.item(bytes);
                page += bytes;
            }
            c.read_units = read_units(page, consistent);
        }
        "BatchGetItem" => {
            let tables = answer.get("Responses").and_then(Value::as_object);
            for (table, found) in tables.into_iter().flatten() {
                let consistent = request
                    .pointer(&format!("/RequestItems/{table}/ConsistentRead"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                for it in items(Some(found)) {
                    let bytes = item_bytes(it);
                    c.item(bytes);
                    c.read_units += read_units(bytes, consistent);
                }
            }
        }
        // Transactions read and write every item twice.
        "TransactGetItems" => {
            for it in elements(answer.get("Responses")).filter_map(|r| r.get("Item").and_then(Value::as_object)) {
                let bytes = item_bytes(it);
                c.item(bytes);
                c.read_units += 2.0 * read_units(bytes, true);
            }
        }
        "PutItem" => {
            let bytes = request.get("Item").and_then(Value::as_object).map_or(0, item_bytes);
            c.item(bytes);
            c.write_units = write_units(bytes);
        }
        "UpdateItem" | "DeleteItem" => c.write_units = write_units(0),
        "BatchWriteItem" => {
            let tables = request.get("RequestItems").and_then(Value::as_object);
            for request in tables.into_iter().flatten().flat_map(|(_, r)| elements(Some(r))) {
                match request.pointer("/PutRequest/Item").and_then(Value::as_object) {
                    Some(it) => {
                        let bytes = item_bytes(it);
                        c.item(bytes);
                        c.write_units += write_units(bytes);
                    }
                    None => c.write_units += write_units(0),
                }
            }
        }
        "TransactWriteItems" => {
            for action in elements(request.get("TransactItems")) {
                let bytes = action
                    .pointer("/Put/Item")
                    .and_then(Value::as_object)
                    .map_or(0, item_bytes);
                if bytes > 0 {
                    c.item(bytes);
                }
                c.write_units += 2.0 * write_units(bytes);
            }
        }
        _ => {}
    }
    c
}

/// Whether a refused call still consumed units: a single write whose condition failed.
pub fn refusal_consumes(action: &str, answer: &Value) -> bool {
    matches!(action, "PutItem" | "UpdateItem" | "DeleteItem")
        && answer
            .get("__type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("ConditionalCheckFailedException"))
}

/// The name a call's units are counted under: the action, and for reads and
/// single writes the partition (or index) it touches, e.g. `Query NODECLAIM`.
pub fn label(action: &str, request: &Value) -> String {
    let partition = request
        .get("IndexName")
        .and_then(Value::as_str)
        .or_else(|| {
            request
                .pointer("/ExpressionAttributeValues/:pk/S")
                .and_then(Value::as_str)
        })
        .or_else(|| request.pointer("/Key/pk/S").and_then(Value::as_str))
        .or_else(|| request.pointer("/Item/pk/S").and_then(Value::as_str));
    match partition {
        Some(p) => format!("{action} {p}"),
        None => action.to_string(),
    }
}

/// Sums per label.
pub fn total(by_label: &BTreeMap<String, Consumed>) -> Consumed {
    let mut t = Consumed::default();
    for c in by_label.values() {
        t.add(c);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn sizes_follow_dynamodbs_rules_for_each_type() {
        let cases: Vec<(Value, usize)> = vec![
            // name + UTF-8 bytes
            (json!({"pk": {"S": "NODECLAIM"}}), 2 + 9),
            (json!({"é": {"S": "ü"}}), 2 + 2),
            // name + one byte per two significant digits + 1
            (json!({"v": {"N": "12345"}}), 1 + 3 + 1),
            (json!({"v": {"N": "1000"}}), 1 + 1 + 1),
            (json!({"v": {"N": "-0.0125"}}), 1 + 2 + 1),
            (json!({"v": {"N": "0"}}), 1 + 1 + 1),
            // raw bytes, not base64 characters
            (json!({"b": {"B": "aGVsbG8="}}), 1 + 5),
            (json!({"t": {"BOOL": true}, "n": {"NULL": true}}), 2 + 2),
            (json!({"s": {"SS": ["ab", "cde"]}}), 1 + 5),
            // 3 bytes per list or map, 1 per element
            (json!({"l": {"L": []}}), 1 + 3),
            (
                json!({"l": {"L": [{"S": "ab"}, {"N": "7"}]}}),
                1 + 3 + (1 + 2) + (1 + 2),
            ),
            (json!({"m": {"M": {"k": {"S": "v"}}}}), 1 + 3 + (1 + 1 + 1)),
        ];
        for (it, want) in cases {
            assert_eq!(item_bytes(&item(it.clone())), want, "{it}");
        }
    }

    fn sized(bytes: usize) -> Value {
        // "pk" + a string of the rest
        json!({"pk": {"S": "x".repeat(bytes - 2)}})
    }

    #[test]
    fn reads_round_up_per_page_or_item_and_cost_half_when_eventually_consistent() {
        let page = json!({"Items": [sized(3000), sized(3000), sized(3000)]});
        let strong = consumed("Query", &json!({"ConsistentRead": true}), &page);
        assert_eq!((strong.read_units, strong.items, strong.item_bytes), (3.0, 3, 9000));
        assert_eq!(consumed("Query", &json!({}), &page).read_units, 1.5);
        // An empty page or a missing item still costs the minimum.
        assert_eq!(
            consumed("Query", &json!({"ConsistentRead": true}), &json!({"Items": []})).read_units,
            1.0
        );
        assert_eq!(consumed("GetItem", &json!({}), &json!({})).read_units, 0.5);
        assert_eq!(
            consumed(
                "GetItem",
                &json!({"ConsistentRead": true}),
                &json!({"Item": sized(4097)})
            )
            .read_units,
            2.0
        );
        // A batch rounds each item on its own.
        let batch = consumed(
            "BatchGetItem",
            &json!({"RequestItems": {"t": {"ConsistentRead": true}}}),
            &json!({"Responses": {"t": [sized(100), sized(100)]}}),
        );
        assert_eq!(batch.read_units, 2.0);
    }

    #[test]
    fn writes_round_up_per_kilobyte_and_transactions_count_twice() {
        assert_eq!(
            consumed("PutItem", &json!({"Item": sized(1025)}), &json!({})).write_units,
            2.0
        );
        assert_eq!(consumed("UpdateItem", &json!({}), &json!({})).write_units, 1.0);
        let tx = json!({"TransactItems": [
            {"ConditionCheck": {"Key": {"pk": {"S": "LEASE"}}}},
            {"Put": {"Item": sized(2000)}},
            {"Put": {"Item": sized(900)}}
        ]});
        let c = consumed("TransactWriteItems", &tx, &json!({}));
        assert_eq!(
            (c.write_units, c.items, c.largest_item_bytes),
            (2.0 + 4.0 + 2.0, 2, 2000)
        );
        let batch = json!({"RequestItems": {"t": [
            {"PutRequest": {"Item": sized(3000)}},
            {"DeleteRequest": {"Key": {"pk": {"S": "x"}}}}
        ]}});
        assert_eq!(consumed("BatchWriteItem", &batch, &json!({})).write_units, 3.0 + 1.0);
    }

    #[test]
    fn a_failed_condition_consumes_and_other_refusals_do_not() {
        let failed = json!({"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"});
        assert!(refusal_consumes("PutItem", &failed));
        assert!(!refusal_consumes("Query", &failed));
        assert!(!refusal_consumes("PutItem", &json!({"__type": "ThrottlingException"})));
    }

    #[test]
    fn calls_are_labelled_by_the_partition_or_index_they_touch() {
        let q = json!({"ExpressionAttributeValues": {":pk": {"S": "NODECLAIM"}}});
        assert_eq!(label("Query", &q), "Query NODECLAIM");
        assert_eq!(label("Query", &json!({"IndexName": "instanceId"})), "Query instanceId");
        assert_eq!(
            label("UpdateItem", &json!({"Key": {"pk": {"S": "LEASE"}}})),
            "UpdateItem LEASE"
        );
        assert_eq!(
            label("PutItem", &json!({"Item": {"pk": {"S": "DRAIN"}}})),
            "PutItem DRAIN"
        );
        assert_eq!(label("TransactWriteItems", &json!({})), "TransactWriteItems");
    }
}
