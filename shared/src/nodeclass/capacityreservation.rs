//! Capacity reservations (ODCRs and capacity blocks) from an EC2NodeClass's
//! `capacityReservationSelectorTerms`: terms are ORed, a term's fields ANDed,
//! and only active reservations are selected, as Karpenter does. A capacity
//! block within [`crate::reservation_end::BLOCK_DRAIN_AHEAD`] of its end is
//! listed as `expiring` (Karpenter's state): no claim is planned or launched
//! into it, and its nodes are drained.

use std::collections::BTreeMap;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;

use super::ami::tag_filter;
use super::error::NodeClassError;
use crate::apis::ec2nodeclass::{CapacityReservationStatus, RESERVATION_DEFAULT, SelectorTerm};
use crate::nodeclaim::ReservationRef;

/// The only state whose reservations take instances.
const ACTIVE: &str = "active";
/// An active capacity block about to end (Karpenter's status state).
pub const EXPIRING: &str = "expiring";

/// What EC2 answers for a reservation id it does not know (a term that selects nothing).
const NOT_FOUND: &str = "InvalidCapacityReservationId.NotFound";

/// The launch template target for instances in a selected reservation.
pub fn target(r: &CapacityReservationStatus) -> ReservationRef {
    ReservationRef {
        id: r.id.clone(),
        reservation_type: r
            .reservation_type
            .clone()
            .unwrap_or_else(|| RESERVATION_DEFAULT.to_string()),
    }
}

/// DescribeCapacityReservations filters for one term (the id goes as a
/// parameter), always narrowed to active reservations (pure).
pub fn filters(term: &SelectorTerm) -> Vec<Filter> {
    let mut f = vec![Filter::builder().name("state").values(ACTIVE).build()];
    if let Some(owner) = &term.owner_id {
        f.push(Filter::builder().name("owner-id").values(owner).build());
    }
    for (k, v) in &term.tags {
        f.push(tag_filter(k, v));
    }
    f
}

/// A reservation's end, when EC2 gives one.
fn end_of(r: &aws_sdk_ec2::types::CapacityReservation) -> Option<jiff::Timestamp> {
    r.end_date().and_then(|d| jiff::Timestamp::new(d.secs(), 0).ok())
}

/// From the SDK's description, as the EC2NodeClass status lists it at `now`;
/// None when it is not active or a field nodesmith needs is missing (pure).
fn from_sdk(r: &aws_sdk_ec2::types::CapacityReservation, now: jiff::Timestamp) -> Option<CapacityReservationStatus> {
    if r.state().map(|s| s.as_str()) != Some(ACTIVE) {
        return None;
    }
    let block = r.reservation_type().map(|t| t.as_str()) == Some(crate::apis::ec2nodeclass::RESERVATION_CAPACITY_BLOCK);
    let expiring = block && end_of(r).is_some_and(|end| crate::reservation_end::block_expiring(end, now));
    Some(CapacityReservationStatus {
        id: r.capacity_reservation_id()?.to_string(),
        instance_type: r.instance_type()?.to_string(),
        availability_zone: r.availability_zone()?.to_string(),
        owner_id: r.owner_id().map(str::to_string),
        instance_match_criteria: r.instance_match_criteria().map(|m| m.as_str().to_string()),
        reservation_type: Some(
            r.reservation_type()
                .map_or(RESERVATION_DEFAULT, |t| t.as_str())
                .to_string(),
        ),
        end_time: end_of(r).map(|t| t.to_string()),
        state: Some(if expiring { EXPIRING } else { ACTIVE }.to_string()),
        available_instance_count: Some(r.available_instance_count().unwrap_or(0).max(0) as u32),
    })
}

/// Every active reservation the terms select, by id (capacity blocks about
/// to end as `expiring`, by the clock).
pub async fn resolve(
    ec2: &aws_sdk_ec2::Client,
    terms: &[SelectorTerm],
) -> Result<Vec<CapacityReservationStatus>, NodeClassError> {
    let now = jiff::Timestamp::now();
    let mut found: BTreeMap<String, CapacityReservationStatus> = BTreeMap::new();
    for term in terms {
        if term.id.is_none() && term.tags.is_empty() {
            continue;
        }
        let mut pages = ec2
            .describe_capacity_reservations()
            .set_capacity_reservation_ids(term.id.clone().map(|id| vec![id]))
            .set_filters(Some(filters(term)))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = match page {
                Ok(p) => p,
                Err(e) if e.code() == Some(NOT_FOUND) => break,
                Err(e) => return Err(NodeClassError::aws("ec2:DescribeCapacityReservations", e)),
            };
            for r in page.capacity_reservations().iter().filter_map(|r| from_sdk(r, now)) {
                found.insert(r.id.clone(), r);
            }
        }
    }
    Ok(found.into_values().collect())
}

/// When each of these reservations ends, for those EC2 still reports active
/// with an end date; one it does not know (gone since) is left out.
pub async fn end_times(
    ec2: &aws_sdk_ec2::Client,
    ids: &std::collections::BTreeSet<String>,
) -> Result<BTreeMap<String, jiff::Timestamp>, NodeClassError> {
    let mut out = BTreeMap::new();
    // One id a call: EC2 fails a whole call naming an unknown id.
    for id in ids {
        let answer = match ec2
            .describe_capacity_reservations()
            .capacity_reservation_ids(id)
            .send()
            .await
        {
            Ok(a) => a,
            Err(e) if e.code() == Some(NOT_FOUND) => continue,
            Err(e) => return Err(NodeClassError::aws("ec2:DescribeCapacityReservations", e)),
        };
        for r in answer.capacity_reservations() {
            if r.state().map(|s| s.as_str()) != Some(ACTIVE) {
                continue;
            }
            if let (Some(id), Some(end)) = (r.capacity_reservation_id(), end_of(r)) {
                out.insert(id.to_string(), end);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_active_only_with_owner_and_tags() {
        let t = SelectorTerm {
            tags: [("team".to_string(), "ml".to_string())].into(),
            owner_id: Some("123456789012".into()),
            ..Default::default()
        };
        let f = filters(&t);
        let names: Vec<(Option<&str>, &[String])> = f.iter().map(|f| (f.name(), f.values())).collect();
        assert_eq!(
            names,
            vec![
                (Some("state"), &["active".to_string()][..]),
                (Some("owner-id"), &["123456789012".to_string()][..]),
                (Some("tag:team"), &["ml".to_string()][..]),
            ]
        );
    }

    #[test]
    fn reservations_read_from_the_sdk_and_listed_as_status() {
        use aws_sdk_ec2::types::{CapacityReservationState, CapacityReservationType};
        let sdk = aws_sdk_ec2::types::CapacityReservation::builder()
            .capacity_reservation_id("cr-1")
            .instance_type("p5.48xlarge")
            .availability_zone("us-east-1a")
            .state(CapacityReservationState::Active)
            .reservation_type(CapacityReservationType::CapacityBlock)
            .available_instance_count(2)
            .end_date(aws_sdk_ec2::primitives::DateTime::from_secs(1_800_000_000))
            .build();
        let before: jiff::Timestamp = "2027-01-15T07:19:59Z".parse().unwrap();
        let s = from_sdk(&sdk, before).unwrap();
        assert!(target(&s).capacity_block());
        assert_eq!(s.reservation_type.as_deref(), Some("capacity-block"));
        assert_eq!(s.state.as_deref(), Some("active"));
        // 40 minutes before its end a capacity block is expiring: never planned into again.
        let expiring = from_sdk(&sdk, "2027-01-15T07:20:00Z".parse().unwrap()).unwrap();
        assert_eq!(expiring.state.as_deref(), Some("expiring"));
        assert_eq!(s.end_time.as_deref(), Some("2027-01-15T08:00:00Z"));
        assert_eq!(s.available_instance_count, Some(2));
        let expired = aws_sdk_ec2::types::CapacityReservation::builder()
            .capacity_reservation_id("cr-2")
            .instance_type("p5.48xlarge")
            .availability_zone("us-east-1a")
            .state(CapacityReservationState::Expired)
            .build();
        assert!(
            from_sdk(&expired, before).is_none(),
            "only active reservations are selected"
        );
    }
}
