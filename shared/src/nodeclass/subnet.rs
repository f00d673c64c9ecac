//! Subnets from selector terms; per zone, the one with the most free IPs.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::Filter;

use super::ami::tag_filter;
use super::error::NodeClassError;
use crate::apis::ec2nodeclass::SelectorTerm;

/// A subnet the node may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// Subnet id.
    pub id: String,
    /// Availability zone name.
    pub zone: String,
    /// Free IPv4 addresses.
    pub available_ips: i64,
    /// Availability zone id (`use1-az1`), when EC2 says.
    pub zone_id: Option<String>,
}

/// DescribeSubnets filters for one term: terms are ORed, a term's fields ANDed (pure).
pub fn filters(term: &SelectorTerm) -> Vec<Filter> {
    let mut f = Vec::new();
    if let Some(id) = &term.id {
        f.push(Filter::builder().name("subnet-id").values(id).build());
    }
    for (k, v) in &term.tags {
        f.push(tag_filter(k, v));
    }
    f
}

/// Per zone, the subnet with the most free IPs (ties: the lower id) (pure).
pub fn per_zone(subnets: &[Subnet]) -> BTreeMap<String, Subnet> {
    let mut best: BTreeMap<String, Subnet> = BTreeMap::new();
    for s in subnets {
        let better = best
            .get(&s.zone)
            .is_none_or(|b| s.available_ips > b.available_ips || (s.available_ips == b.available_ips && s.id < b.id));
        if better {
            best.insert(s.zone.clone(), s.clone());
        }
    }
    best
}

/// All subnets the terms select (deduplicated).
pub async fn resolve(ec2: &aws_sdk_ec2::Client, terms: &[SelectorTerm]) -> Result<Vec<Subnet>, NodeClassError> {
    let mut found: BTreeMap<String, Subnet> = BTreeMap::new();
    for term in terms {
        let f = filters(term);
        if f.is_empty() {
            continue;
        }
        let mut pages = ec2.describe_subnets().set_filters(Some(f)).into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| NodeClassError::aws("ec2:DescribeSubnets", e))?;
            for s in page.subnets() {
                if let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone()) {
                    found.insert(
                        id.to_string(),
                        Subnet {
                            id: id.into(),
                            zone: zone.into(),
                            available_ips: s.available_ip_address_count().unwrap_or(0).into(),
                            zone_id: s.availability_zone_id().map(str::to_string),
                        },
                    );
                }
            }
        }
    }
    Ok(found.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_free_ips_wins_per_zone() {
        let s = |id: &str, zone: &str, ips: i64| Subnet {
            id: id.into(),
            zone: zone.into(),
            available_ips: ips,
            zone_id: None,
        };
        let got = per_zone(&[
            s("subnet-b", "a", 10),
            s("subnet-a", "a", 10),
            s("subnet-c", "a", 5),
            s("subnet-d", "b", 1),
            s("subnet-e", "b", 300),
        ]);
        let ids: Vec<(&str, &str)> = got.iter().map(|(z, s)| (z.as_str(), s.id.as_str())).collect();
        assert_eq!(ids, vec![("a", "subnet-a"), ("b", "subnet-e")]);
    }

    #[test]
    fn filters_for_ids_and_wildcard_tags() {
        let t = SelectorTerm {
            tags: [("karpenter.sh/discovery".to_string(), "*".to_string())].into(),
            ..Default::default()
        };
        let f = filters(&t);
        assert_eq!(
            (f[0].name(), f[0].values()),
            (Some("tag-key"), &["karpenter.sh/discovery".to_string()][..])
        );
        let t = SelectorTerm {
            id: Some("subnet-123".into()),
            ..Default::default()
        };
        assert_eq!(filters(&t)[0].name(), Some("subnet-id"));
    }
}
