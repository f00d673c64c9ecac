//! EC2 status checks (DescribeInstanceStatus): which running instances EC2
//! reports with an impaired system or instance status check, and since when,
//! for node repair. EBS status and scheduled events are left out: events
//! arrive through `interrupt` as AWS Health events.

use aws_sdk_ec2::types::{InstanceStatus, StatusType, SummaryStatus};
use jiff::Timestamp;

use super::{Instances, InstancesError};

/// An instance whose system or instance status check is impaired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Impaired {
    /// The instance.
    pub id: String,
    /// The earliest `ImpairedSince` of its failed checks (None: EC2 did not say).
    pub since: Option<Timestamp>,
}

/// The instance's impairment, if EC2 reports one (pure).
pub fn impaired_of(s: &InstanceStatus) -> Option<Impaired> {
    let id = s.instance_id()?;
    let impaired: Vec<_> = [s.instance_status(), s.system_status()]
        .into_iter()
        .flatten()
        .filter(|x| x.status() == Some(&SummaryStatus::Impaired))
        .collect();
    if impaired.is_empty() {
        return None;
    }
    let since = impaired
        .iter()
        .flat_map(|x| x.details())
        .filter(|d| d.status() == Some(&StatusType::Failed))
        .filter_map(|d| Timestamp::from_second(d.impaired_since()?.secs()).ok())
        .min();
    Some(Impaired { id: id.into(), since })
}

impl Instances {
    /// Every running instance of the account and region whose status check
    /// is impaired, all pages (EC2 has no tag filter for status checks: the
    /// caller keeps its own instances).
    pub async fn impaired(&self) -> Result<Vec<Impaired>, InstancesError> {
        let ec2 = self.ec2();
        let mut pages = ec2
            .describe_instance_status()
            .include_all_instances(false)
            .max_results(self.page_size())
            .into_paginator()
            .send();
        let mut out: Vec<Impaired> = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| InstancesError::aws("ec2:DescribeInstanceStatus", e))?;
            for i in page.instance_statuses().iter().filter_map(impaired_of) {
                if out.iter().all(|o| o.id != i.id) {
                    out.push(i);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{InstanceStatusDetails, InstanceStatusSummary, StatusName};
    use aws_smithy_types::DateTime;

    fn summary(status: SummaryStatus, failed_since: Option<i64>) -> InstanceStatusSummary {
        let mut d = InstanceStatusDetails::builder().name(StatusName::Reachability);
        d = match failed_since {
            Some(s) => d.status(StatusType::Failed).impaired_since(DateTime::from_secs(s)),
            None => d.status(StatusType::Passed),
        };
        InstanceStatusSummary::builder()
            .status(status)
            .details(d.build())
            .build()
    }

    #[test]
    fn system_or_instance_impaired_with_the_earliest_failure() {
        let ok = || summary(SummaryStatus::Ok, None);
        let status = |instance, system| {
            InstanceStatus::builder()
                .instance_id("i-1")
                .instance_status(instance)
                .system_status(system)
                .build()
        };
        assert_eq!(impaired_of(&status(ok(), ok())), None);
        let got = impaired_of(&status(summary(SummaryStatus::Impaired, Some(200)), ok())).unwrap();
        assert_eq!(got.since, Some(Timestamp::from_second(200).unwrap()));
        let got = impaired_of(&status(
            summary(SummaryStatus::Impaired, Some(300)),
            summary(SummaryStatus::Impaired, Some(100)),
        ))
        .unwrap();
        assert_eq!(got.since, Some(Timestamp::from_second(100).unwrap()));
        // Impaired with no failed detail: since when is unknown.
        let got = impaired_of(&status(ok(), summary(SummaryStatus::Impaired, None))).unwrap();
        assert_eq!((got.id.as_str(), got.since), ("i-1", None));
        // Initializing or insufficient data is no impairment.
        assert_eq!(
            impaired_of(&status(summary(SummaryStatus::Initializing, None), ok())),
            None
        );
    }
}
