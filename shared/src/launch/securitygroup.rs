//! Security groups from selector terms (ids, names, tags).

use std::collections::BTreeSet;

use aws_sdk_ec2::types::Filter;

use super::ami::tag_filter;
use super::errors::LaunchError;
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

/// The ids of every security group the terms select, sorted.
pub async fn resolve(ec2: &aws_sdk_ec2::Client, terms: &[SelectorTerm]) -> Result<Vec<String>, LaunchError> {
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
            let page = page.map_err(|e| LaunchError::aws("ec2:DescribeSecurityGroups", e))?;
            found.extend(
                page.security_groups()
                    .iter()
                    .filter_map(|g| g.group_id())
                    .map(str::to_string),
            );
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
