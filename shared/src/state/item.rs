//! Reading and building DynamoDB attribute maps (pure).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::StateError;

/// An item as DynamoDB returns it.
pub type Item = HashMap<String, AttributeValue>;

/// A string attribute.
pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// A number attribute.
pub fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// True when DynamoDB refused a write because its condition did not hold
/// (any operation's `ConditionalCheckFailedException`).
pub fn condition_failed<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> bool
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata,
{
    e.as_service_error().and_then(|s| s.code()) == Some("ConditionalCheckFailedException")
}

/// The key of an item.
pub fn key(pk: &str, sk: &str) -> Item {
    HashMap::from([("pk".to_string(), s(pk)), ("sk".to_string(), s(sk))])
}

/// Reads a string attribute.
pub fn get_s<'a>(item: &'a Item, what: &'static str, attr: &str) -> Result<&'a str, StateError> {
    match item.get(attr) {
        Some(AttributeValue::S(v)) => Ok(v),
        Some(_) => Err(corrupt(item, what, format!("attribute {attr} is not a string"))),
        None => Err(corrupt(item, what, format!("attribute {attr} is missing"))),
    }
}

/// Reads a number attribute as an integer.
pub fn get_i64(item: &Item, what: &'static str, attr: &str) -> Result<i64, StateError> {
    match item.get(attr) {
        Some(AttributeValue::N(v)) => v
            .parse::<i64>()
            .map_err(|e| corrupt(item, what, format!("attribute {attr}={v:?} is not an integer: {e}"))),
        Some(_) => Err(corrupt(item, what, format!("attribute {attr} is not a number"))),
        None => Err(corrupt(item, what, format!("attribute {attr} is missing"))),
    }
}

/// A corrupt-item error naming the item's sort key.
pub fn corrupt(item: &Item, what: &'static str, reason: String) -> StateError {
    let key = match item.get("sk") {
        Some(AttributeValue::S(k)) => k.clone(),
        _ => "<no sk>".to_string(),
    };
    StateError::Corrupt { what, key, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_typed_attributes_and_names_what_is_wrong() {
        let mut item = key("NODECLAIM", "a");
        item.insert("version".into(), n(7));
        item.insert("bad".into(), n("x"));
        assert_eq!(get_s(&item, "nodeclaim", "sk").unwrap(), "a");
        assert_eq!(get_i64(&item, "nodeclaim", "version").unwrap(), 7);
        let e = get_i64(&item, "nodeclaim", "bad").unwrap_err().to_string();
        assert!(e.contains("bad=\"x\" is not an integer") && e.contains("item a"), "{e}");
        let e = get_s(&item, "nodeclaim", "body").unwrap_err().to_string();
        assert!(e.contains("body is missing"), "{e}");
        let e = get_s(&item, "nodeclaim", "version").unwrap_err().to_string();
        assert!(e.contains("not a string"), "{e}");
    }
}
