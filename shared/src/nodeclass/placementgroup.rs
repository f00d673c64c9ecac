//! The placement group of `placementGroupSelector`, as Karpenter's AWS
//! provider finds it: DescribePlacementGroups by id (else by name), available
//! groups only. Its id goes into the launch template's Placement.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;

use super::error::NodeClassError;
use crate::apis::ec2nodeclass::PlacementGroupSelector;

/// The reason of `PlacementGroupReady=False`.
pub const PLACEMENT_GROUP_NOT_FOUND: &str = "PlacementGroupNotFound";

/// The selected group's id, or why there is none (an unknown name or id, or
/// a group not `available`, the only state that takes instances).
pub async fn resolve(
    ec2: &aws_sdk_ec2::Client,
    selector: &PlacementGroupSelector,
) -> Result<Result<String, String>, NodeClassError> {
    let (named, request) = match (&selector.id, &selector.name) {
        (Some(id), _) => (id, ec2.describe_placement_groups().group_ids(id)),
        (None, Some(name)) => (name, ec2.describe_placement_groups().group_names(name)),
        (None, None) => return Ok(Err("placementGroupSelector names neither a name nor an id".into())),
    };
    let not_found = || format!("placement group {named:?} not found (or not available)");
    let out = request
        .filters(Filter::builder().name("state").values("available").build())
        .send()
        .await;
    let out = match out {
        Ok(out) => out,
        // EC2 answers an unknown name or id with an error, not an empty list.
        Err(e) if e.code().is_some_and(|c| c.starts_with("InvalidPlacementGroup")) => return Ok(Err(not_found())),
        Err(e) => return Err(NodeClassError::aws("ec2:DescribePlacementGroups", e)),
    };
    Ok(out
        .placement_groups()
        .first()
        .and_then(|g| g.group_id())
        .map(str::to_string)
        .ok_or_else(not_found))
}
