//! Markers: when something last happened (the last solve, for the sweep's
//! pending-pod safety net; the last launch EC2 took or refused, per
//! EC2NodeClass, for the class's `LaunchSucceeded` condition).

use super::item::{self, get_i64, get_s, n, s};
use super::{PK_MARKER, StateError, StateStore};

/// The marker `provision` writes after every solve.
pub const LAST_SOLVE: &str = "last-solve";

impl StateStore {
    /// Records that `marker` happened at `at_ms` (epoch ms); an older time never
    /// overwrites a newer one.
    pub async fn mark(&self, marker: &str, at_ms: i64) -> Result<(), StateError> {
        let mut it = item::key(PK_MARKER, marker);
        it.insert("at".into(), n(at_ms));
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(it))
            .condition_expression("attribute_not_exists(pk) OR #at < :at")
            .expression_attribute_names("#at", "at")
            .expression_attribute_values(":at", n(at_ms))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Ok(()),
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// When `marker` last happened (epoch ms), if ever.
    pub async fn marked_at(&self, marker: &str) -> Result<Option<i64>, StateError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_MARKER, marker)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.dynamo("GetItem", e))?;
        out.item().map(|it| get_i64(it, "marker", "at")).transpose()
    }

    /// Records that a launch from `class` succeeded at `at_ms` (epoch ms); an
    /// older time never overwrites a newer one.
    pub async fn record_launch_success(&self, class: &str, at_ms: i64) -> Result<(), StateError> {
        self.record_launch(class, at_ms, "succeededAt", &[]).await
    }

    /// Records that EC2 refused a launch from `class` for good at `at_ms`,
    /// with its error `code` and `message`.
    pub async fn record_launch_refusal(
        &self,
        class: &str,
        at_ms: i64,
        code: &str,
        message: &str,
    ) -> Result<(), StateError> {
        self.record_launch(class, at_ms, "refusedAt", &[("code", code), ("message", message)])
            .await
    }

    async fn record_launch(
        &self,
        class: &str,
        at_ms: i64,
        when: &str,
        also: &[(&str, &str)],
    ) -> Result<(), StateError> {
        let mut update = "SET #when = :at".to_string();
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_MARKER, &launches_marker(class))))
            .condition_expression("attribute_not_exists(#when) OR #when < :at")
            .expression_attribute_names("#when", when)
            .expression_attribute_values(":at", n(at_ms));
        for (k, v) in also {
            update.push_str(&format!(", #{k} = :{k}"));
            req = req
                .expression_attribute_names(format!("#{k}"), *k)
                .expression_attribute_values(format!(":{k}"), s(*v));
        }
        match req.update_expression(update).send().await {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Ok(()),
            Err(e) => Err(self.dynamo("UpdateItem", e)),
        }
    }

    /// What EC2 last said to launches from `class`, if it said anything yet.
    pub async fn launch_record(&self, class: &str) -> Result<Option<LaunchRecord>, StateError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_MARKER, &launches_marker(class))))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.dynamo("GetItem", e))?;
        let Some(it) = out.item() else {
            return Ok(None);
        };
        let refused = match it.get("refusedAt") {
            None => None,
            Some(_) => Some(Refusal {
                at_ms: get_i64(it, "launch record", "refusedAt")?,
                code: get_s(it, "launch record", "code")?.to_string(),
                message: get_s(it, "launch record", "message")?.to_string(),
            }),
        };
        let succeeded_ms = it
            .get("succeededAt")
            .map(|_| get_i64(it, "launch record", "succeededAt"))
            .transpose()?;
        Ok(Some(LaunchRecord { succeeded_ms, refused }))
    }
}

fn launches_marker(class: &str) -> String {
    format!("launches/{class}")
}

/// A refusal EC2 gave a launch that no retry fixes (a bad AMI, an IAM denial).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// When (epoch ms).
    pub at_ms: i64,
    /// EC2's error code.
    pub code: String,
    /// EC2's message.
    pub message: String,
}

/// What EC2 last said to launches from one EC2NodeClass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchRecord {
    /// When a launch last succeeded (epoch ms).
    pub succeeded_ms: Option<i64>,
    /// The last refusal.
    pub refused: Option<Refusal>,
}

impl LaunchRecord {
    /// The refusal that no launch has succeeded since, if any (pure).
    pub fn standing_refusal(&self) -> Option<&Refusal> {
        self.refused
            .as_ref()
            .filter(|r| self.succeeded_ms.is_none_or(|ok| ok < r.at_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(at_ms: i64) -> Refusal {
        Refusal {
            at_ms,
            code: "InvalidAMIID.NotFound".into(),
            message: "gone".into(),
        }
    }

    #[test]
    fn a_refusal_stands_until_a_later_launch_succeeds() {
        let fresh = LaunchRecord::default();
        assert_eq!(fresh.standing_refusal(), None);
        let refused = LaunchRecord {
            succeeded_ms: Some(5),
            refused: Some(refusal(10)),
        };
        assert_eq!(refused.standing_refusal(), Some(&refusal(10)));
        let never_launched = LaunchRecord {
            succeeded_ms: None,
            refused: Some(refusal(10)),
        };
        assert!(never_launched.standing_refusal().is_some());
        let recovered = LaunchRecord {
            succeeded_ms: Some(11),
            refused: Some(refusal(10)),
        };
        assert_eq!(recovered.standing_refusal(), None);
    }
}
