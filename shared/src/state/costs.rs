//! The autoscaler's own cost: one counter item per UTC day, which every
//! metered invocation adds to with an atomic `ADD`.
//!
//! A retried invocation (SQS redelivery, a Lambda retry) is metered again:
//! Lambda bills it again too, so the counter follows the bill, not the work.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;
use jiff::civil::Date;

use super::item::{self, Item, get_s, n};
use super::{PK_COST, StateError, StateStore, TTL_ATTRIBUTE};

/// How long a day's counter is kept: a little over a year, so a month and
/// the same month last year can be compared.
pub const COST_TTL_DAYS: i64 = 400;

/// One function's totals for one day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionCost {
    /// The invocations' price, in nano-dollars.
    pub nano_usd: i64,
    /// Invocations metered.
    pub invocations: i64,
    /// The sum of the fleet $/h changes the invocations reported, in nano-dollars per hour.
    pub fleet_delta_nano_usd_per_hour: i64,
}

/// One UTC day's counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayCost {
    /// The UTC day.
    pub day: Date,
    /// Totals by function name.
    pub functions: BTreeMap<String, FunctionCost>,
}

impl DayCost {
    /// The day's price across functions, in nano-dollars.
    pub fn nano_usd(&self) -> i64 {
        self.functions.values().map(|f| f.nano_usd).sum()
    }
}

/// What one invocation adds to its day's counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostEntry {
    /// The function (`provision`, `launch`, `interrupt`, `sweep`): lowercase letters only.
    pub function: String,
    /// The UTC day the invocation ended on.
    pub day: Date,
    /// Its price, in nano-dollars.
    pub nano_usd: i64,
    /// The fleet $/h it added (negative: removed), in nano-dollars per hour.
    pub fleet_delta_nano_usd_per_hour: i64,
}

/// The sort key of a day's counter: `DAY#2026-11-24`.
pub fn day_key(day: Date) -> String {
    format!("DAY#{day}")
}

const NANO_USD: &str = "NanoUsd";
const INVOCATIONS: &str = "Invocations";
const FLEET: &str = "FleetNanoUsdPerHour";

/// The UpdateItem expression and its names and values for `entry` (pure).
/// Attributes are `<function>NanoUsd`, `<function>Invocations` and
/// `<function>FleetNanoUsdPerHour`; the TTL is the day's start plus
/// [`COST_TTL_DAYS`].
pub fn add_expression(entry: &CostEntry) -> Result<(String, HashMap<String, String>, Item), StateError> {
    if entry.function.is_empty() || !entry.function.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(StateError::Corrupt {
            what: "cost",
            key: day_key(entry.day),
            reason: format!("function name {:?} is not lowercase letters", entry.function),
        });
    }
    let expires = entry
        .day
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map(|z| z.timestamp().as_second() + COST_TTL_DAYS * 86_400)
        .map_err(|e| StateError::Corrupt {
            what: "cost",
            key: day_key(entry.day),
            reason: format!("day has no UTC start: {e}"),
        })?;
    let f = &entry.function;
    let names = HashMap::from([
        ("#c".to_string(), format!("{f}{NANO_USD}")),
        ("#i".to_string(), format!("{f}{INVOCATIONS}")),
        ("#f".to_string(), format!("{f}{FLEET}")),
        ("#t".to_string(), TTL_ATTRIBUTE.to_string()),
    ]);
    let values = Item::from([
        (":c".to_string(), n(entry.nano_usd)),
        (":one".to_string(), n(1)),
        (":f".to_string(), n(entry.fleet_delta_nano_usd_per_hour)),
        (":t".to_string(), n(expires)),
    ]);
    Ok(("ADD #c :c, #i :one, #f :f SET #t = :t".to_string(), names, values))
}

/// Reads a day's counter item (pure).
pub fn day_cost_from_item(it: &Item) -> Result<DayCost, StateError> {
    const WHAT: &str = "cost";
    let sk = get_s(it, WHAT, "sk")?;
    let day: Date = sk
        .strip_prefix("DAY#")
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| item::corrupt(it, WHAT, "sort key is not DAY#<yyyy-mm-dd>".into()))?;
    let mut functions: BTreeMap<String, FunctionCost> = BTreeMap::new();
    for (attr, v) in it {
        let Some((function, field)) = [NANO_USD, INVOCATIONS, FLEET]
            .iter()
            .find_map(|suffix| attr.strip_suffix(suffix).map(|f| (f, *suffix)))
        else {
            continue;
        };
        let value = match v {
            AttributeValue::N(x) => x
                .parse::<i64>()
                .map_err(|e| item::corrupt(it, WHAT, format!("attribute {attr}={x:?} is not an integer: {e}")))?,
            _ => return Err(item::corrupt(it, WHAT, format!("attribute {attr} is not a number"))),
        };
        let entry = functions.entry(function.to_string()).or_default();
        match field {
            NANO_USD => entry.nano_usd = value,
            INVOCATIONS => entry.invocations = value,
            _ => entry.fleet_delta_nano_usd_per_hour = value,
        }
    }
    Ok(DayCost { day, functions })
}

impl StateStore {
    /// Adds one invocation to its day's counter (an atomic `ADD`; the item
    /// is created by the first invocation of the day).
    pub async fn add_cost(&self, entry: &CostEntry) -> Result<(), StateError> {
        let (expression, names, values) = add_expression(entry)?;
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_COST, &day_key(entry.day))))
            .update_expression(expression)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .send()
            .await
            .map_err(|e| self.dynamo("UpdateItem", e))?;
        Ok(())
    }

    /// The counters of the days from `from` to `to`, both included, by day
    /// (days nothing ran on are absent).
    pub async fn costs(&self, from: Date, to: Date) -> Result<Vec<DayCost>, StateError> {
        self.query_range(PK_COST, &day_key(from), &day_key(to))
            .await?
            .iter()
            .map(day_cost_from_item)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn entry(function: &str) -> CostEntry {
        CostEntry {
            function: function.into(),
            day: date(2026, 11, 24),
            nano_usd: 867,
            fleet_delta_nano_usd_per_hour: -96_000_000,
        }
    }

    #[test]
    fn the_expression_adds_to_the_functions_attributes_and_sets_the_ttl() {
        let (expr, names, values) = add_expression(&entry("sweep")).unwrap();
        assert_eq!(expr, "ADD #c :c, #i :one, #f :f SET #t = :t");
        assert_eq!(names["#c"], "sweepNanoUsd");
        assert_eq!(names["#i"], "sweepInvocations");
        assert_eq!(names["#f"], "sweepFleetNanoUsdPerHour");
        assert_eq!(names["#t"], "expiresAt");
        assert_eq!(values[":c"], n(867));
        assert_eq!(values[":f"], n(-96_000_000));
        // 2026-11-24T00:00Z + 400 days.
        assert_eq!(values[":t"], n(1_795_478_400 + 400 * 86_400));
        assert_eq!(day_key(date(2026, 1, 2)), "DAY#2026-01-02");
    }

    #[test]
    fn function_names_that_would_make_odd_attributes_are_refused() {
        for bad in ["", "Sweep", "sweep-2", "a b"] {
            let e = add_expression(&entry(bad)).unwrap_err().to_string();
            assert!(e.contains("is not lowercase letters"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_counter_item_reads_back_by_function() {
        let mut it = item::key(PK_COST, "DAY#2026-11-24");
        it.insert("sweepNanoUsd".into(), n(1000));
        it.insert("sweepInvocations".into(), n(3));
        it.insert("launchNanoUsd".into(), n(50));
        it.insert("launchInvocations".into(), n(1));
        it.insert("launchFleetNanoUsdPerHour".into(), n(96_000_000));
        it.insert("expiresAt".into(), n(1));
        let d = day_cost_from_item(&it).unwrap();
        assert_eq!(d.day, date(2026, 11, 24));
        assert_eq!(d.nano_usd(), 1050);
        assert_eq!(
            d.functions["launch"],
            FunctionCost {
                nano_usd: 50,
                invocations: 1,
                fleet_delta_nano_usd_per_hour: 96_000_000
            }
        );
        assert_eq!(d.functions["sweep"].invocations, 3);
        assert_eq!(d.functions.len(), 2);

        let mut bad = it.clone();
        bad.insert("sk".into(), item::s("DAY#yesterday"));
        assert!(
            day_cost_from_item(&bad)
                .unwrap_err()
                .to_string()
                .contains("DAY#<yyyy-mm-dd>")
        );
        let mut bad = it;
        bad.insert("sweepNanoUsd".into(), item::s("x"));
        assert!(
            day_cost_from_item(&bad)
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
    }
}
