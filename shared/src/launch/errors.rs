//! What can go wrong launching a NodeClaim.

use aws_smithy_types::error::display::DisplayErrorContext;

use crate::kubernetes::ClusterError;
use crate::messages::RequestError;
use crate::nodeclaim::InvalidTransition;
use crate::nodeclass::NodeClassError;
use crate::nodeclass::userdata::UserDataError;
use crate::state::StateError;

/// A launch that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The message is not a launch request.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The EC2NodeClass selects nothing usable (no subnets, no AMI, ...).
    #[error("nodeclaim {node_claim}: {what}")]
    Resolve {
        /// The claim.
        node_claim: String,
        /// What is missing and why.
        what: String,
    },
    /// User data could not be built.
    #[error("nodeclaim {node_claim}: user data not built")]
    UserData {
        /// The claim.
        node_claim: String,
        /// Why.
        source: UserDataError,
    },
    /// Resolving the claim's EC2NodeClass, or ensuring what it names (launch
    /// template, instance profile), failed.
    #[error(transparent)]
    NodeClass(#[from] NodeClassError),
    /// An AWS call failed (after the SDK's own retries for throttling and 5xx).
    #[error("{op}: {message}")]
    Aws {
        /// The operation.
        op: &'static str,
        /// The SDK's error with its causes.
        message: String,
    },
    /// CreateFleet refused the request for a reason other than capacity.
    #[error("nodeclaim {node_claim}: CreateFleet failed: {code}: {message}")]
    Fleet {
        /// The claim.
        node_claim: String,
        /// EC2 error code.
        code: String,
        /// EC2 error message.
        message: String,
    },
    /// EC2 refused the CreateFleet call itself for a reason a retry cannot
    /// fix (an IAM denial, an invalid parameter): no fleet was made.
    #[error("ec2:CreateFleet refused: {code}: {message}")]
    Refused {
        /// EC2 error code.
        code: String,
        /// EC2 error message.
        message: String,
    },
    /// Looking for the claim's instance failed.
    #[error(transparent)]
    Instances(#[from] crate::ec2::InstancesError),
    /// CreateFleet launched an instance but the claim could not record it: the
    /// claim's lease is kept (not released), so no other invocation launches for it
    /// before the lease runs out; a later delivery finds the instance by its tag, or
    /// repeats the stored request and gets the same instance back.
    #[error("nodeclaim {node_claim}: instance {instance_id} launched but not recorded")]
    Unrecorded {
        /// The claim.
        node_claim: String,
        /// The instance CreateFleet returned.
        instance_id: String,
        /// Why the record failed.
        #[source]
        source: StateError,
    },
    /// EC2 refused the instance profile (IAM has not propagated it yet, or it does not exist).
    #[error("ec2:CreateFleet refused the instance profile: {0}")]
    ProfileNotReady(String),
    /// Another invocation is launching this NodeClaim right now.
    #[error("nodeclaim {0} is being launched by another invocation")]
    Busy(String),
    /// The request was not started: too little of the invocation was left
    /// for a launch, so it goes back to SQS whole.
    #[error("not started: {left_ms} ms left of the invocation, a launch may need {needed_ms} ms")]
    NotStarted {
        /// Time left when the request's turn came.
        left_ms: u64,
        /// The launch's reserve.
        needed_ms: u64,
    },
    /// The invocation's deadline came while the launch was under way: it goes
    /// back to SQS, and the claim's lease is held, as its CreateFleet may have
    /// gone through (the redelivery finds the instance by its tag).
    #[error("nodeclaim {0}: the invocation's deadline came during the launch")]
    OutOfTime(String),
    /// Reading the claim's EC2NodeClass from the cluster failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The NodeClaim's lifecycle does not allow recording the launch.
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
    /// Configuration is missing or wrong.
    #[error("configuration: {0}")]
    Config(String),
}

impl LaunchError {
    /// EC2's error code and message when EC2 refused the launch for good.
    pub fn refusal(&self) -> Option<(&str, &str)> {
        match self {
            LaunchError::Fleet { code, message, .. } | LaunchError::Refused { code, message } => Some((code, message)),
            _ => None,
        }
    }
}

impl LaunchError {
    /// An AWS SDK error with its causes.
    pub fn aws<E: std::error::Error + 'static>(op: &'static str, err: E) -> Self {
        LaunchError::Aws {
            op,
            message: DisplayErrorContext(&err).to_string(),
        }
    }
}
