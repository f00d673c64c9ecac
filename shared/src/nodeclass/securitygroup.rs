//! Security groups from selector terms (ids, names, tags).

use std::collections::BTreeSet;

use aws_sdk_ec2::types::Filter;

use super::ami::tag_filter;
use super::error::NodeClassError;
use crate::apis::ec2nodeclass::SelectorTerm;

/// DescribeSecurityGroups filters for one term (pure).
pub fn filters(term: &SelectorTerm) -> Vec<Filter> {
    let mut f = Vec::new();
    if let Some(id) = &term.id {
        f.push(Filter::builder().name("group-id").values(id).build());
    }
    if let Some(name) = &term.name {
        f.push(Filter::builder().name("group-name").values(name).build());
    }
    for (k, v) in &term.tags {
        f.push(tag_filter(k, v));
    }
    f
}

/// A selected security group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecurityGroup {
    /// The group id.
    pub id: String,
    /// The group name.
    pub name: String,
}

/// Every security group the terms select, with its name, sorted by id.
pub async fn resolve_groups(
    ec2: &aws_sdk_ec2::Client,
    terms: &[SelectorTerm],
) -> Result<Vec<SecurityGroup>, NodeClassError> {
    let mut found = BTreeSet::new();
    for term in terms {
        let f = filters(term);
        if f.is_empty() {
            continue;
        }
        let mut pages = ec2
            .describe_security_groups()
            .set_filters(Some(f))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| NodeClassError::aws("ec2:DescribeSecurityGroups", e))?;
            found.extend(page.security_groups().iter().filter_map(|g| {
                Some(SecurityGroup {
                    id: g.group_id()?.to_string(),
                    name: g.group_name().unwrap_or_default().to_string(),
                })
            }));
        }
    }
    Ok(found.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_terms_filter_on_group_name() {
        let t = SelectorTerm {
            name: Some("eks-cluster-sg-*".into()),
            ..Default::default()
        };
        let f = filters(&t);
        assert_eq!(
            (f[0].name(), f[0].values()),
            (Some("group-name"), &["eks-cluster-sg-*".to_string()][..])
        );
    }
}
