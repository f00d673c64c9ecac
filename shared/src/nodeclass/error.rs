//! What can go wrong resolving an EC2NodeClass or mapping it to a launch template.

use aws_smithy_types::error::display::DisplayErrorContext;

use super::userdata::UserDataError;

/// A class that could not be resolved, or mapped to a launch template.
#[derive(Debug, thiserror::Error)]
pub enum NodeClassError {
    /// The class selects nothing usable (an unsupported alias, no AMI family, ...):
    /// a fact about the class, which every retry would find again.
    #[error("{what}")]
    Unusable {
        /// What is missing and why, e.g. `SubnetsNotFound: subnetSelectorTerms select no subnets`.
        what: String,
    },
    /// An AWS call failed (after the SDK's own retries for throttling and 5xx).
    #[error("{op}: {message}")]
    Aws {
        /// The operation.
        op: &'static str,
        /// The SDK's error with its causes, as the crate's other AWS errors carry it.
        message: String,
    },
    /// `eks:DescribeCluster` answered without what nodes need to join.
    #[error("configuration: {0}")]
    Cluster(String),
    /// User data could not be built.
    #[error("user data could not be built")]
    UserData(#[from] UserDataError),
}

impl NodeClassError {
    /// An AWS SDK error with its causes.
    pub fn aws<E: std::error::Error + 'static>(op: &'static str, err: E) -> Self {
        NodeClassError::Aws {
            op,
            message: DisplayErrorContext(&err).to_string(),
        }
    }

    /// A class that cannot be used, for this reason.
    pub fn unusable(what: impl Into<String>) -> Self {
        NodeClassError::Unusable { what: what.into() }
    }
}
