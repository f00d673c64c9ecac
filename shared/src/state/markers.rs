//! Markers: when something last happened (the last solve, for the sweep's
//! pending-pod safety net; the last launch EC2 refused, per EC2NodeClass,
//! for the class's `LaunchSucceeded` condition).

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
        let out = self.read_item(PK_MARKER, marker).await?;
        out.as_ref().map(|it| get_i64(it, "marker", "at")).transpose()
    }

    /// Records that EC2 refused a launch from `class` for good at `at_ms`,
    /// with its error `code` and `message`; an older refusal never
    /// overwrites a newer one.
    pub async fn record_launch_refusal(
        &self,
        class: &str,
        at_ms: i64,
        code: &str,
        message: &str,
    ) -> Result<(), StateError> {
        let res = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_MARKER, &refusal_marker(class))))
            .update_expression("SET #at = :at, #code = :code, #message = :message")
            .condition_expression("attribute_not_exists(#at) OR #at < :at")
            .expression_attribute_names("#at", "at")
            .expression_attribute_names("#code", "code")
            .expression_attribute_names("#message", "message")
            .expression_attribute_values(":at", n(at_ms))
            .expression_attribute_values(":code", s(code))
            .expression_attribute_values(":message", s(message))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Ok(()),
            Err(e) => Err(self.dynamo("UpdateItem", e)),
        }
    }

    /// The last refusal EC2 gave a launch from `class`, if any.
    pub async fn launch_refusal(&self, class: &str) -> Result<Option<Refusal>, StateError> {
        let out = self.read_item(PK_MARKER, &refusal_marker(class)).await?;
        out.as_ref()
            .map(|it| {
                Ok(Refusal {
                    at_ms: get_i64(it, "launch refusal", "at")?,
                    code: get_s(it, "launch refusal", "code")?.to_string(),
                    message: get_s(it, "launch refusal", "message")?.to_string(),
                })
            })
            .transpose()
    }
}

fn refusal_marker(class: &str) -> String {
    format!("launch-refused/{class}")
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

impl Refusal {
    /// Whether the refusal still stands when the class's latest launch
    /// (epoch ms, from its claims) was at `latest_launch_ms`: no launch since (pure).
    pub fn stands(&self, latest_launch_ms: Option<i64>) -> bool {
        latest_launch_ms.is_none_or(|t| t < self.at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_stands_until_a_later_launch() {
        let r = Refusal {
            at_ms: 10,
            code: "InvalidAMIID.NotFound".into(),
            message: "gone".into(),
        };
        assert!(r.stands(None));
        assert!(r.stands(Some(5)));
        assert!(!r.stands(Some(11)));
    }
}
