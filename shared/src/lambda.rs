//! The one Lambda shell the function binaries share: logging, configuration
//! from the environment, and the AWS SDK configuration with retries.

/// A required environment variable is missing or empty.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {0} is not set")]
pub struct MissingEnv(pub String);

// A binary's `main` that fails prints its error with `Debug`: say it in words.
impl std::fmt::Debug for MissingEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// Reads a required environment variable, naming it when missing or empty.
pub fn required_env(name: &str) -> Result<String, MissingEnv> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| MissingEnv(name.to_string()))
}

/// Structured logs (JSON in Lambda), then the SDK configuration from the
/// environment: throttling and 5xx are retried by the SDK with exponential
/// backoff and jitter, up to 5 attempts.
pub async fn start() -> aws_config::SdkConfig {
    crate::telemetry::init();
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(5))
        .load()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_variable_is_named() {
        let e = required_env("NODESMITH_TEST_SURELY_UNSET_VARIABLE").unwrap_err();
        assert_eq!(
            e.to_string(),
            "environment variable NODESMITH_TEST_SURELY_UNSET_VARIABLE is not set"
        );
    }
}
