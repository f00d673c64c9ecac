//! Creating the state table (for tests and the demo; production uses the SAM template).

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, TimeToLiveSpecification,
};

use super::{INSTANCE_INDEX, StateError};

/// The TTL attribute.
pub const TTL_ATTRIBUTE: &str = "expiresAt";

fn err(op: &'static str, table: &str, e: impl std::error::Error + Send + Sync + 'static) -> StateError {
    StateError::Dynamo {
        op,
        table: table.to_string(),
        source: Box::new(e),
    }
}

/// Creates the table with its key schema, GSI and TTL (on-demand billing).
pub async fn create_table(client: &Client, table: &str) -> Result<(), StateError> {
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|e| err("CreateTable", table, e))
    };
    let key = |name: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
            .map_err(|e| err("CreateTable", table, e))
    };
    let gsi = GlobalSecondaryIndex::builder()
        .index_name(INSTANCE_INDEX)
        .key_schema(key("instanceId", KeyType::Hash)?)
        .projection(Projection::builder().projection_type(ProjectionType::All).build())
        .build()
        .map_err(|e| err("CreateTable", table, e))?;
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk")?)
        .attribute_definitions(attr("sk")?)
        .attribute_definitions(attr("instanceId")?)
        .key_schema(key("pk", KeyType::Hash)?)
        .key_schema(key("sk", KeyType::Range)?)
        .global_secondary_indexes(gsi)
        .send()
        .await
        .map_err(|e| err("CreateTable", table, e))?;
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name(TTL_ATTRIBUTE)
                .enabled(true)
                .build()
                .map_err(|e| err("UpdateTimeToLive", table, e))?,
        )
        .send()
        .await
        .map_err(|e| err("UpdateTimeToLive", table, e))?;
    Ok(())
}
