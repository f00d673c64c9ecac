//! Collecting what launch leaves behind: launch templates and instance
//! profiles (`super::profile`) no EC2NodeClass uses any more, and nothing
//! a live resource still references ([`templates_in_flight`],
//! [`profiles_in_use`]). Templates are shared (one per class hash, AMI,
//! user data and capacity type, and per capacity reservation) and tagged with
//! the class's name and drift hash, their AMI and their reservation, so a
//! template is orphaned once its class is gone or has changed, its AMI is no
//! longer one the class resolves to (`@latest` moved on), or its reservation is
//! no longer one the class selects (expired, cancelled); but never while a
//! claim's CreateFleet request naming it waits for its answer (a redelivery
//! sends it again as it was). A profile goes only once no class names it, no
//! live instance runs with it, and a grace has passed since its last user
//! ([`crate::nodeclass::profile::collectable_profiles`]). The sweep calls
//! [`sweep`] once a run; the decisions are pure ([`orphaned_templates`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;
use jiff::Timestamp;

use super::errors::LaunchError;
use crate::apis::EC2NodeClass;
use crate::kubernetes::Cluster;
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::nodeclass::launchtemplate::{IMAGE_TAG, RESERVATION_TAG};
use crate::nodeclass::profile::{self, PROFILE_GRACE};
use crate::state::StateStore;

/// A template younger than this is never collected: a launch may have made it
/// for a class the sweep has not seen yet (far longer than any launch runs).
pub const TEMPLATE_GRACE: Duration = Duration::from_secs(10 * 60);

/// EC2's largest DescribeLaunchTemplates page.
const PAGE: i32 = 200;

/// A launch template the cluster owns, as the sweep sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedTemplate {
    /// Its name.
    pub name: String,
    /// The `karpenter.k8s.aws/ec2nodeclass` tag.
    pub node_class: Option<String>,
    /// The `karpenter.k8s.aws/ec2nodeclass-hash` tag (absent on templates made per claim by older releases).
    pub class_hash: Option<String>,
    /// Its AMI ([`IMAGE_TAG`]; absent on templates of older releases).
    pub image_id: Option<String>,
    /// The capacity reservation it targets ([`RESERVATION_TAG`]).
    pub reservation: Option<String>,
    /// When EC2 created it.
    pub created: Option<Timestamp>,
}

/// Instance states in which an instance still needs its profile's credentials
/// (a stopped one may be started again).
const PROFILE_STATES: [&str; 4] = ["pending", "running", "stopping", "stopped"];

/// Templates named by the launch requests of claims not launched yet (pure):
/// a request sent and not answered is sent again as it was.
pub fn templates_in_flight(claims: &[NodeClaim]) -> BTreeSet<String> {
    claims
        .iter()
        .filter(|c| c.phase == Phase::Pending)
        .filter_map(|c| c.launch_attempt.as_ref())
        .flat_map(|a| a.overrides.iter().map(|o| o.template.clone()))
        .collect()
}

/// Instance profiles of the cluster's instances that are pending, running,
/// stopping or stopped: none of them is collected.
pub async fn profiles_in_use(ec2: &aws_sdk_ec2::Client, cluster: &str) -> Result<BTreeSet<String>, LaunchError> {
    let mut pages = ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name(format!("tag:{}", crate::ec2::instances::owned_tag_key(cluster)))
                .values("owned")
                .build(),
        )
        .filters(
            Filter::builder()
                .name("instance-state-name")
                .set_values(Some(PROFILE_STATES.iter().map(|s| s.to_string()).collect()))
                .build(),
        )
        .into_paginator()
        .send();
    let mut profiles = BTreeSet::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| LaunchError::aws("ec2:DescribeInstances", e))?;
        for i in page.reservations().iter().flat_map(|r| r.instances()) {
            if let Some(arn) = i.iam_instance_profile().and_then(|p| p.arn()) {
                profiles.insert(profile::name_of_arn(arn).to_string());
            }
        }
    }
    Ok(profiles)
}

/// Templates no class uses: the class they name is gone, its hash moved on,
/// or they carry no hash; or the class's status no longer lists their AMI or
/// reservation (judged only when it lists some); and they are older than
/// `grace` and not named by a waiting request (`in_flight`) (pure).
pub fn orphaned_templates(
    templates: &[OwnedTemplate],
    classes: &[EC2NodeClass],
    in_flight: &BTreeSet<String>,
    now: Timestamp,
    grace: Duration,
) -> Vec<String> {
    let by_name: BTreeMap<&str, (&EC2NodeClass, String)> = classes.iter().map(|c| (c.name(), (c, c.hash()))).collect();
    let grace = jiff::SignedDuration::try_from(grace).unwrap_or(jiff::SignedDuration::MAX);
    templates
        .iter()
        .filter(|t| t.created.is_some_and(|c| now.duration_since(c) >= grace))
        .filter(|t| !in_flight.contains(&t.name))
        .filter(|t| {
            let current = t.node_class.as_deref().and_then(|c| by_name.get(c));
            match (current, &t.class_hash) {
                (Some((class, h)), Some(th)) => h != th || superseded(t, class),
                _ => true,
            }
        })
        .map(|t| t.name.clone())
        .collect()
}

/// True when the class's status no longer lists the template's AMI or
/// reservation (a status without AMIs says nothing: not read yet, or failing).
fn superseded(t: &OwnedTemplate, class: &EC2NodeClass) -> bool {
    let Some(status) = &class.status else { return false };
    let image_gone = t
        .image_id
        .as_ref()
        .is_some_and(|i| !status.amis.is_empty() && !status.amis.iter().any(|a| &a.id == i));
    let reservation_gone = t
        .reservation
        .as_ref()
        .is_some_and(|r| !status.capacity_reservations.iter().any(|c| &c.id == r));
    image_gone || reservation_gone
}

/// Every launch template tagged `kubernetes.io/cluster/<cluster>=owned`, all pages.
pub async fn owned_templates(ec2: &aws_sdk_ec2::Client, cluster: &str) -> Result<Vec<OwnedTemplate>, LaunchError> {
    let mut pages = ec2
        .describe_launch_templates()
        .filters(
            Filter::builder()
                .name(format!("tag:{}", crate::ec2::instances::owned_tag_key(cluster)))
                .values("owned")
                .build(),
        )
        .max_results(PAGE)
        .into_paginator()
        .send();
    let mut out = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| LaunchError::aws("ec2:DescribeLaunchTemplates", e))?;
        for lt in page.launch_templates() {
            let Some(name) = lt.launch_template_name() else {
                continue;
            };
            let tag = |k: &str| {
                lt.tags()
                    .iter()
                    .find(|t| t.key() == Some(k))
                    .and_then(|t| t.value())
                    .map(str::to_string)
            };
            out.push(OwnedTemplate {
                name: name.to_string(),
                node_class: tag(labels::EC2NODECLASS),
                class_hash: tag(labels::EC2NODECLASS_HASH_ANNOTATION),
                image_id: tag(IMAGE_TAG),
                reservation: tag(RESERVATION_TAG),
                created: lt
                    .create_time()
                    .and_then(|t| Timestamp::new(t.secs(), t.subsec_nanos() as i32).ok()),
            });
        }
    }
    Ok(out)
}

/// Deletes the cluster's orphaned templates as of `now` (`classes` listed
/// before this call), except those a waiting launch request names; returns
/// the names deleted (one already gone counts as deleted). The claims are
/// read only when some template is orphaned, which in most runs none is: a
/// sweep need not list them a third time to find nothing to delete.
pub async fn collect_templates(
    ec2: &aws_sdk_ec2::Client,
    store: &StateStore,
    cluster: &str,
    classes: &[EC2NodeClass],
    now: Timestamp,
    grace: Duration,
) -> Result<Vec<String>, LaunchError> {
    let owned = owned_templates(ec2, cluster).await?;
    let mut orphans = orphaned_templates(&owned, classes, &BTreeSet::new(), now, grace);
    if !orphans.is_empty() {
        // Read after the classes: a launch writes its request before CreateFleet.
        let in_flight = templates_in_flight(&store.list_node_claims().await?);
        orphans.retain(|t| !in_flight.contains(t));
    }
    let mut deleted = Vec::new();
    for name in orphans {
        match ec2.delete_launch_template().launch_template_name(&name).send().await {
            Ok(_) => {}
            Err(e)
                if e.code()
                    .is_some_and(|c| c.starts_with("InvalidLaunchTemplateName.NotFound")) => {}
            Err(e) => return Err(LaunchError::aws("ec2:DeleteLaunchTemplate", e)),
        }
        tracing::info!(template = %name, "deleted a launch template no EC2NodeClass uses");
        deleted.push(name);
    }
    Ok(deleted)
}

/// Deletes the cluster's managed profiles that may go at `now`
/// ([`profile::collectable_profiles`]), given the profiles live instances
/// use; returns the names deleted. Records in the state table, as of `now`,
/// that every profile a class names or an instance uses was seen in use, so
/// the grace runs from the last user, not from the profile's creation.
pub async fn collect_profiles(
    iam: &aws_sdk_iam::Client,
    store: &StateStore,
    cluster: &str,
    classes: &[EC2NodeClass],
    in_use: &BTreeSet<String>,
    now: Timestamp,
    grace: Duration,
) -> Result<Vec<String>, LaunchError> {
    let owned = profile::managed_profiles(iam, cluster).await?;
    let wanted = profile::wanted_profiles(cluster, classes);
    let mut last_seen = BTreeMap::new();
    for p in &owned {
        let marker = profile::in_use_marker(&p.name);
        if wanted.contains(&p.name) || in_use.contains(&p.name) {
            store.mark(&marker, now.as_millisecond()).await?;
        } else if let Some(at) = store
            .marked_at(&marker)
            .await?
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        {
            last_seen.insert(p.name.clone(), at);
        }
    }
    let mut deleted = Vec::new();
    for name in profile::collectable_profiles(&owned, &wanted, in_use, &last_seen, now, grace) {
        let Some(p) = owned.iter().find(|p| p.name == name) else {
            continue;
        };
        profile::delete(iam, p).await?;
        tracing::info!(profile = %name, "deleted an instance profile no EC2NodeClass names and no instance uses");
        deleted.push(name);
    }
    Ok(deleted)
}

/// The sweep's step: reads the EC2NodeClasses (then, when a template is
/// orphaned, the claims; given IAM, the live instances), and collects
/// orphaned launch templates and (given IAM) instance profiles that nothing
/// references. A failure is logged and left to the next run (it never fails
/// the sweep). Returns what was deleted.
pub async fn sweep<C: Cluster>(
    cluster: &C,
    ec2: &aws_sdk_ec2::Client,
    iam: Option<&aws_sdk_iam::Client>,
    store: &StateStore,
    cluster_name: &str,
) -> Vec<String> {
    let classes = match cluster.node_classes().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::causes(&e), "cannot list EC2NodeClasses; launch templates and profiles are collected next run");
            return Vec::new();
        }
    };
    let now = Timestamp::now();
    let mut deleted = match collect_templates(ec2, store, cluster_name, &classes, now, TEMPLATE_GRACE).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::causes(&e), "cannot collect launch templates; the next sweep tries again");
            Vec::new()
        }
    };
    if let Some(iam) = iam {
        let collected = match profiles_in_use(ec2, cluster_name).await {
            Ok(used) => collect_profiles(iam, store, cluster_name, &classes, &used, now, PROFILE_GRACE).await,
            Err(e) => Err(e),
        };
        match collected {
            Ok(d) => deleted.extend(d),
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "cannot collect instance profiles; the next sweep tries again")
            }
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, tag: &str) -> EC2NodeClass {
        let mut c = EC2NodeClass::new(name, Default::default());
        c.spec.tags.insert("team".into(), tag.into());
        c
    }

    #[test]
    fn templates_of_gone_or_changed_classes_are_orphans_once_old_enough() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let old = Some("2026-01-01T11:00:00Z".parse().unwrap());
        let young = Some("2026-01-01T11:59:00Z".parse().unwrap());
        let a = class("a", "x");
        let t = |name: &str, class: Option<&str>, hash: Option<String>, created| OwnedTemplate {
            name: name.into(),
            node_class: class.map(String::from),
            class_hash: hash,
            created,
            image_id: None,
            reservation: None,
        };
        let templates = vec![
            t("current", Some("a"), Some(a.hash()), old),
            t("changed", Some("a"), Some(class("a", "y").hash()), old),
            t("changed-young", Some("a"), Some(class("a", "y").hash()), young),
            t("class-gone", Some("b"), Some(a.hash()), old),
            t("per-claim", Some("a"), None, old),
            t("untagged", None, None, old),
            t("no-time", Some("b"), None, None),
        ];
        let got = orphaned_templates(&templates, &[a], &BTreeSet::new(), now, Duration::from_secs(600));
        assert_eq!(got, vec!["changed", "class-gone", "per-claim", "untagged"]);
    }

    #[test]
    fn a_template_a_waiting_request_names_is_kept() {
        use crate::nodeclaim::{AttemptOverride, LaunchAttempt};
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let attempt = |template: &str| LaunchAttempt {
            number: 1,
            client_token: "t".into(),
            capacity_type: "on-demand".into(),
            overrides: vec![AttemptOverride {
                instance_type: "m5.large".into(),
                zone: "us-east-1a".into(),
                subnet_id: "subnet-1".into(),
                template: template.into(),
                price: None,
                capacity_reservation: None,
            }],
            tags: BTreeMap::new(),
            concluded: false,
            context: None,
        };
        let claim = |name: &str, phase: Phase, template: &str| NodeClaim {
            phase,
            launch_attempt: Some(attempt(template)),
            ..NodeClaim::pending(name, "default", "default")
        };
        let claims = [
            claim("waiting", Phase::Pending, "lt-waiting"),
            claim("launched", Phase::Launched, "lt-launched"),
        ];
        let in_flight = templates_in_flight(&claims);
        assert_eq!(in_flight, BTreeSet::from(["lt-waiting".to_string()]));
        let t = |name: &str| OwnedTemplate {
            name: name.into(),
            node_class: Some("gone".into()),
            class_hash: None,
            created: Some("2026-01-01T11:00:00Z".parse().unwrap()),
            image_id: None,
            reservation: None,
        };
        let got = orphaned_templates(
            &[t("lt-waiting"), t("lt-launched")],
            &[],
            &in_flight,
            now,
            TEMPLATE_GRACE,
        );
        assert_eq!(got, vec!["lt-launched"]);
    }

    #[test]
    fn templates_of_an_ami_or_reservation_the_status_no_longer_lists_are_orphans() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let old = Some("2026-01-01T11:00:00Z".parse().unwrap());
        let mut a = class("a", "x");
        let t = |name: &str, image: Option<&str>, reservation: Option<&str>| OwnedTemplate {
            name: name.into(),
            node_class: Some("a".into()),
            class_hash: Some(a.hash()),
            created: old,
            image_id: image.map(String::from),
            reservation: reservation.map(String::from),
        };
        let templates = vec![
            t("current-ami", Some("ami-new"), None),
            t("superseded-ami", Some("ami-old"), None),
            t("untagged-ami", None, None),
            t("current-reservation", Some("ami-new"), Some("cr-live")),
            t("ended-reservation", Some("ami-new"), Some("cr-ended")),
        ];
        // No status yet: nothing to judge AMIs or reservations by.
        assert!(
            orphaned_templates(
                &templates,
                std::slice::from_ref(&a),
                &BTreeSet::new(),
                now,
                Duration::from_secs(600)
            )
            .is_empty()
        );
        a.status = Some(crate::apis::ec2nodeclass::EC2NodeClassStatus {
            amis: vec![crate::apis::ec2nodeclass::AmiStatus {
                id: "ami-new".into(),
                ..Default::default()
            }],
            capacity_reservations: vec![crate::apis::ec2nodeclass::CapacityReservationStatus {
                id: "cr-live".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let got = orphaned_templates(&templates, &[a], &BTreeSet::new(), now, Duration::from_secs(600));
        assert_eq!(got, vec!["superseded-ami", "ended-reservation"]);
    }
}
