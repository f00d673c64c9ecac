//! Instance profiles. An EC2NodeClass names either `instanceProfile` (used as
//! is) or `role`, for which nodesmith makes and keeps an instance profile, as
//! Karpenter does: one per (cluster, class, role), named by a hash of the
//! three under the path [`PROFILE_PATH`], tagged with the cluster and the
//! class, created on first use (CreateInstanceProfile + AddRoleToInstanceProfile),
//! reused after. A changed role gives a new profile. The sweep deletes a
//! profile only when no class names it, no live instance runs with it, and
//! [`PROFILE_GRACE`] has passed since it was made and since the sweep last
//! saw it named or in use ([`collectable_profiles`]; the I/O is in
//! `launch::gc`): a node keeps its credentials while it runs, whatever
//! happens to its class. IAM is eventually consistent: EC2 may refuse a
//! profile made seconds ago ([`is_profile_refusal`]), which launch retries.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_iam::error::ProvideErrorMetadata;
use aws_sdk_iam::types::Tag;
use jiff::Timestamp;
use sha2::{Digest, Sha256};

use super::error::NodeClassError;
use crate::apis::EC2NodeClass;
use crate::labels;

/// The IAM path of every profile nodesmith makes (the IAM policy is scoped to it).
pub const PROFILE_PATH: &str = "/nodesmith/";

/// How long a profile outlives its last user (a class naming it, an instance
/// running with it) and its creation: a launch that read the class before it
/// changed, or an instance EC2 does not list yet, is covered by far.
pub const PROFILE_GRACE: Duration = Duration::from_secs(60 * 60);

/// A profile nodesmith made for the cluster, as IAM lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedProfile {
    /// Its name.
    pub name: String,
    /// The roles it holds (removed before it is deleted, as IAM requires).
    pub roles: Vec<String>,
    /// When IAM made it.
    pub created: Option<Timestamp>,
}

/// The profile a class's instances get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileChoice {
    /// `instanceProfile`: used as is, never created nor deleted.
    Named(String),
    /// `role`: a profile nodesmith manages for that role.
    Managed {
        /// The profile's name ([`profile_name`]).
        name: String,
        /// The role it holds (a name; an ARN's last segment).
        role: String,
    },
}

impl ProfileChoice {
    /// The profile's name.
    pub fn name(&self) -> &str {
        match self {
            ProfileChoice::Named(n) | ProfileChoice::Managed { name: n, .. } => n,
        }
    }
}

/// The role's name in a `role` field that may be an ARN (pure).
pub fn role_name(role: &str) -> &str {
    role.rsplit('/').next().unwrap_or(role)
}

/// The managed profile's name: `<cluster>_<16 hex of sha256(cluster, class, role)>` (pure).
/// IAM allows 128 characters; EKS cluster names have at most 100.
pub fn profile_name(cluster: &str, class: &str, role: &str) -> String {
    let mut h = Sha256::new();
    for part in [cluster, class, role] {
        h.update(part.as_bytes());
        h.update(b"\n");
    }
    format!("{cluster}_{}", &hex::encode(h.finalize())[..16])
}

/// What a class asks for: `instanceProfile` wins, else a managed profile for
/// `role`, else none (pure).
pub fn choose(cluster: &str, class: &EC2NodeClass) -> Option<ProfileChoice> {
    let non_empty = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
    if let Some(p) = non_empty(&class.spec.instance_profile) {
        return Some(ProfileChoice::Named(p));
    }
    non_empty(&class.spec.role).map(|r| {
        let role = role_name(&r).to_string();
        ProfileChoice::Managed {
            name: profile_name(cluster, class.name(), &role),
            role,
        }
    })
}

/// Tags of a managed profile (pure).
pub fn profile_tags(cluster: &str, class: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (crate::ec2::instances::owned_tag_key(cluster), "owned".to_string()),
        (crate::ec2::instances::CLUSTER_NAME_TAG.to_string(), cluster.to_string()),
        (labels::EC2NODECLASS.to_string(), class.to_string()),
    ])
}

/// Whether an EC2 error is its refusal of an instance profile it cannot see
/// (yet): `InvalidParameterValue` naming the instance profile (pure).
pub fn is_profile_refusal(code: &str, message: &str) -> bool {
    code == "InvalidParameterValue" && message.to_ascii_lowercase().contains("instance profile")
}

fn iam_err<E>(op: &'static str, e: aws_sdk_iam::error::SdkError<E>) -> NodeClassError
where
    E: std::error::Error + Send + Sync + 'static,
{
    NodeClassError::aws(op, e)
}

/// Whether IAM has an instance profile of this name (a class's named
/// `instanceProfile`, which nodesmith uses as is and never makes).
pub async fn exists(iam: &aws_sdk_iam::Client, name: &str) -> Result<bool, NodeClassError> {
    match iam.get_instance_profile().instance_profile_name(name).send().await {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some("NoSuchEntity") => Ok(false),
        Err(e) => Err(iam_err("iam:GetInstanceProfile", e)),
    }
}

/// Makes sure the class's profile exists and holds its role; returns the
/// profile's name, and whether it was created or given its role just now
/// (EC2 may not see it for a few seconds).
pub async fn ensure(
    iam: &aws_sdk_iam::Client,
    cluster: &str,
    class: &EC2NodeClass,
) -> Result<Option<(String, bool)>, NodeClassError> {
    let Some(choice) = choose(cluster, class) else {
        return Ok(None);
    };
    let ProfileChoice::Managed { name, role } = &choice else {
        return Ok(Some((choice.name().to_string(), false)));
    };
    let existing = match iam.get_instance_profile().instance_profile_name(name).send().await {
        Ok(out) => out.instance_profile().cloned(),
        Err(e) if e.code() == Some("NoSuchEntity") => None,
        Err(e) => return Err(iam_err("iam:GetInstanceProfile", e)),
    };
    let roles: Vec<String> = existing
        .as_ref()
        .map(|p| p.roles().iter().map(|r| r.role_name().to_string()).collect())
        .unwrap_or_default();
    if roles.iter().any(|r| r == role) {
        return Ok(Some((name.clone(), false)));
    }
    if existing.is_none() {
        let tags: Vec<Tag> = profile_tags(cluster, class.name())
            .into_iter()
            .filter_map(|(k, v)| Tag::builder().key(k).value(v).build().ok())
            .collect();
        match iam
            .create_instance_profile()
            .instance_profile_name(name)
            .path(PROFILE_PATH)
            .set_tags(Some(tags))
            .send()
            .await
        {
            Ok(_) => tracing::info!(profile = %name, role = %role, class = class.name(), "created an instance profile"),
            // A concurrent launch made it first.
            Err(e) if e.code() == Some("EntityAlreadyExists") => {}
            Err(e) => return Err(iam_err("iam:CreateInstanceProfile", e)),
        }
    }
    // The name hashes the role, so a profile holds no other role unless someone put it there.
    for other in roles.iter().filter(|r| *r != role) {
        iam.remove_role_from_instance_profile()
            .instance_profile_name(name)
            .role_name(other)
            .send()
            .await
            .map_err(|e| iam_err("iam:RemoveRoleFromInstanceProfile", e))?;
    }
    match iam
        .add_role_to_instance_profile()
        .instance_profile_name(name)
        .role_name(role)
        .send()
        .await
    {
        Ok(_) => {}
        // A profile holds one role: a concurrent launch added it first.
        Err(e) if e.code() == Some("LimitExceeded") => {}
        Err(e) => return Err(iam_err("iam:AddRoleToInstanceProfile", e)),
    }
    Ok(Some((name.clone(), true)))
}

/// The managed profiles the cluster's classes name now (pure).
pub fn wanted_profiles(cluster: &str, classes: &[EC2NodeClass]) -> BTreeSet<String> {
    classes
        .iter()
        .filter_map(|c| match choose(cluster, c) {
            Some(ProfileChoice::Managed { name, .. }) => Some(name),
            _ => None,
        })
        .collect()
}

/// The state-table marker recording when the sweep last saw the profile
/// named by a class or used by an instance.
pub fn in_use_marker(profile: &str) -> String {
    format!("profile-in-use/{profile}")
}

/// The profile's name in an instance profile ARN (`...:instance-profile/<path>/<name>`) (pure).
pub fn name_of_arn(arn: &str) -> &str {
    arn.rsplit('/').next().unwrap_or(arn)
}

/// The managed profiles that may be deleted at `now` (pure): no class names
/// them, no live instance uses them, and both their creation and the last
/// time they were seen wanted or in use are at least `grace` ago. A profile
/// whose creation time is unknown and that was never seen is kept.
pub fn collectable_profiles(
    owned: &[ManagedProfile],
    wanted: &BTreeSet<String>,
    in_use: &BTreeSet<String>,
    last_seen: &BTreeMap<String, Timestamp>,
    now: Timestamp,
    grace: Duration,
) -> Vec<String> {
    let grace = jiff::SignedDuration::try_from(grace).unwrap_or(jiff::SignedDuration::MAX);
    owned
        .iter()
        .filter(|p| !wanted.contains(&p.name) && !in_use.contains(&p.name))
        .filter(|p| {
            let last = p.created.into_iter().chain(last_seen.get(&p.name).copied()).max();
            last.is_some_and(|t| now.duration_since(t) >= grace)
        })
        .map(|p| p.name.clone())
        .collect()
}

/// The cluster's managed profiles: under [`PROFILE_PATH`], named for the
/// cluster and tagged as its own.
pub async fn managed_profiles(iam: &aws_sdk_iam::Client, cluster: &str) -> Result<Vec<ManagedProfile>, NodeClassError> {
    let mut pages = iam
        .list_instance_profiles()
        .path_prefix(PROFILE_PATH)
        .into_paginator()
        .send();
    let prefix = format!("{cluster}_");
    let key = crate::ec2::instances::owned_tag_key(cluster);
    let mut out = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| iam_err("iam:ListInstanceProfiles", e))?;
        for p in page.instance_profiles() {
            let name = p.instance_profile_name();
            if !name.starts_with(&prefix) || p.path() != PROFILE_PATH {
                continue;
            }
            // The list does not carry tags: the cluster's ownership tag is read per profile.
            let full = iam
                .get_instance_profile()
                .instance_profile_name(name)
                .send()
                .await
                .map_err(|e| iam_err("iam:GetInstanceProfile", e))?;
            let owned_by_us = full
                .instance_profile()
                .is_some_and(|f| f.tags().iter().any(|t| t.key() == key && t.value() == "owned"));
            if owned_by_us {
                let created = p.create_date();
                out.push(ManagedProfile {
                    name: name.to_string(),
                    roles: p.roles().iter().map(|r| r.role_name().to_string()).collect(),
                    created: Timestamp::new(created.secs(), created.subsec_nanos() as i32).ok(),
                });
            }
        }
    }
    Ok(out)
}

/// Deletes a managed profile, its roles removed first (as IAM requires); one
/// already gone counts as deleted.
pub async fn delete(iam: &aws_sdk_iam::Client, profile: &ManagedProfile) -> Result<(), NodeClassError> {
    let name = &profile.name;
    for role in &profile.roles {
        match iam
            .remove_role_from_instance_profile()
            .instance_profile_name(name)
            .role_name(role)
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some("NoSuchEntity") => {}
            Err(e) => return Err(iam_err("iam:RemoveRoleFromInstanceProfile", e)),
        }
    }
    match iam.delete_instance_profile().instance_profile_name(name).send().await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("NoSuchEntity") => Ok(()),
        Err(e) => Err(iam_err("iam:DeleteInstanceProfile", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, role: Option<&str>, profile: Option<&str>) -> EC2NodeClass {
        let mut c = EC2NodeClass::new(name, Default::default());
        c.spec.role = role.map(String::from);
        c.spec.instance_profile = profile.map(String::from);
        c
    }

    #[test]
    fn a_role_gets_a_managed_profile_per_cluster_class_and_role() {
        let a = choose("demo", &class("default", Some("KarpenterNodeRole-demo"), None)).unwrap();
        let ProfileChoice::Managed { name, role } = &a else {
            panic!("{a:?}")
        };
        assert_eq!(role, "KarpenterNodeRole-demo");
        assert!(name.starts_with("demo_") && name.len() == "demo_".len() + 16, "{name}");
        assert_eq!(
            choose(
                "demo",
                &class("default", Some("arn:aws:iam::1:role/KarpenterNodeRole-demo"), None)
            ),
            Some(a.clone()),
            "an ARN names the same role"
        );
        for other in [
            choose("demo", &class("default", Some("OtherRole"), None)),
            choose("demo", &class("gpu", Some("KarpenterNodeRole-demo"), None)),
            choose("prod", &class("default", Some("KarpenterNodeRole-demo"), None)),
        ] {
            assert_ne!(other.unwrap().name(), a.name());
        }
        assert_eq!(
            choose("demo", &class("default", Some("R"), Some("MyProfile"))),
            Some(ProfileChoice::Named("MyProfile".into())),
            "instanceProfile is used as is"
        );
        assert_eq!(choose("demo", &class("default", None, None)), None);
    }

    #[test]
    fn a_profile_goes_only_unnamed_unused_and_a_grace_after_its_last_user() {
        let classes = [
            class("default", Some("R2"), None),
            class("fixed", None, Some("MyProfile")),
        ];
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let hours_ago = |h: i64| Some(now - jiff::SignedDuration::from_hours(h));
        let p = |name: &str, created| ManagedProfile {
            name: name.into(),
            roles: vec![],
            created,
        };
        let current = profile_name("demo", "default", "R2");
        let old_role = profile_name("demo", "default", "R1");
        let running = profile_name("demo", "default", "R0");
        let young = profile_name("demo", "young", "R2");
        let lately_seen = profile_name("demo", "deleted", "R2");
        let unknown = profile_name("demo", "unknown", "R2");
        let owned = vec![
            p(&current, hours_ago(5)),
            p(&old_role, hours_ago(5)),
            p(&running, hours_ago(5)),
            p(&young, hours_ago(0)),
            p(&lately_seen, hours_ago(5)),
            p(&unknown, None),
        ];
        let wanted = wanted_profiles("demo", &classes);
        assert_eq!(
            wanted,
            BTreeSet::from([current.clone()]),
            "a named instanceProfile is never managed"
        );
        let in_use = BTreeSet::from([running.clone()]);
        let last_seen = BTreeMap::from([(lately_seen.clone(), now - jiff::SignedDuration::from_mins(30))]);
        let got = collectable_profiles(&owned, &wanted, &in_use, &last_seen, now, PROFILE_GRACE);
        assert_eq!(got, vec![old_role]);
        // No class at all (a moment between a delete and a create): only what no one used for the grace.
        let got = collectable_profiles(&owned, &BTreeSet::new(), &in_use, &last_seen, now, PROFILE_GRACE);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(!got.contains(&running) && !got.contains(&lately_seen) && !got.contains(&young));
        assert_eq!(
            name_of_arn("arn:aws:iam::1:instance-profile/nodesmith/demo_ab"),
            "demo_ab"
        );
    }

    #[test]
    fn refusals_of_a_fresh_profile_are_recognised() {
        assert!(is_profile_refusal(
            "InvalidParameterValue",
            "Value (demo_0123) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
        ));
        assert!(!is_profile_refusal("InvalidParameterValue", "Invalid subnet"));
        assert!(!is_profile_refusal("InsufficientInstanceCapacity", "instance profile"));
    }
}
