//! Building kube clients: for an EKS cluster (DescribeCluster + minted token,
//! rebuilt before the token goes stale) or for a plain URL (tests, kubeconfig).

use std::time::SystemTime;

use tokio::sync::Mutex;

use super::auth::{self, AuthError, ClusterEndpoint, Token};

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Authentication or cluster discovery failed.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The endpoint is not a valid URL.
    #[error("cluster endpoint {endpoint:?} is not a valid URL: {message}")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// The environment names no cluster.
    #[error(transparent)]
    Config(#[from] crate::settings::SettingError),
    /// kube refused the configuration.
    #[error("building the kube client")]
    Kube(#[source] kube::Error),
}

/// A kube client for an API server URL with an optional CA bundle and bearer token.
/// Transport retries are off: the adapter retries with knowledge of what failed.
pub fn client_for(
    endpoint: &str,
    ca_der: Option<Vec<Vec<u8>>>,
    token: Option<&str>,
) -> Result<kube::Client, ClientError> {
    crate::transport::install_crypto_provider();
    let uri = endpoint.parse::<http::Uri>().map_err(|e| ClientError::Endpoint {
        endpoint: endpoint.to_string(),
        message: e.to_string(),
    })?;
    let mut config = kube::Config::new(uri);
    config.root_cert = ca_der;
    config.default_retry = false;
    config.read_timeout = Some(std::time::Duration::from_secs(30));
    if let Some(t) = token {
        config.auth_info.token = Some(t.to_string().into());
    }
    let builder = kube::client::ClientBuilder::try_from(config).map_err(ClientError::Kube)?;
    // Crash tests: every Kubernetes call passes the crash hook (debug builds only).
    #[cfg(debug_assertions)]
    if crate::crash::enabled() {
        return Ok(builder.with_layer(&crate::crash::kube::Layer).build());
    }
    Ok(builder.build())
}

/// Where clients come from.
pub enum ClientSource {
    /// One fixed client (tests, kubeconfig, in-cluster).
    Fixed(kube::Client),
    /// An EKS cluster reached with minted IAM tokens.
    Eks(Box<EksClients>),
}

impl ClientSource {
    /// A client that is good to use now.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        match self {
            ClientSource::Fixed(c) => Ok(c.clone()),
            ClientSource::Eks(e) => e.client().await,
        }
    }

    /// Drops the cached client after the server rejected its credentials
    /// (401), so the next call mints a new token. Fixed clients are kept.
    pub async fn invalidate(&self) {
        if let ClientSource::Eks(e) = self {
            e.state.lock().await.1 = None;
        }
    }
}

/// Clients for one EKS cluster: the endpoint is looked up once per container,
/// the client is rebuilt with a new token before the old one goes stale.
pub struct EksClients {
    config: aws_config::SdkConfig,
    cluster: String,
    state: Mutex<Cached>,
}

/// The endpoint once described, and the current client with its token.
type Cached = (Option<ClusterEndpoint>, Option<(kube::Client, Token)>);

impl EksClients {
    /// Clients for `cluster` with the credentials and region of `config`.
    /// Nothing is called until the first [`EksClients::client`].
    pub fn new(config: aws_config::SdkConfig, cluster: &str) -> Self {
        EksClients {
            config,
            cluster: cluster.to_string(),
            state: Mutex::new((None, None)),
        }
    }

    /// Clients for a cluster whose endpoint and CA are already known
    /// (no `eks:DescribeCluster` call; e.g. from configuration, or in tests).
    pub fn with_endpoint(config: aws_config::SdkConfig, endpoint: ClusterEndpoint) -> Self {
        EksClients {
            config,
            cluster: endpoint.name.clone(),
            state: Mutex::new((Some(endpoint), None)),
        }
    }

    /// A client whose token is fresh.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        let mut state = self.state.lock().await;
        if let Some((c, t)) = &state.1
            && t.is_fresh(SystemTime::now())
        {
            return Ok(c.clone());
        }
        if state.0.is_none() {
            let eks = aws_sdk_eks::Client::new(&self.config);
            state.0 = Some(auth::describe_cluster(&eks, &self.cluster).await?);
        }
        let Some(ep) = state.0.clone() else {
            return Err(AuthError::DescribeCluster {
                cluster: self.cluster.clone(),
                message: "no endpoint cached".into(),
            }
            .into());
        };
        let token = auth::mint_token_from_config(&self.config, &self.cluster).await?;
        tracing::debug!(cluster = %self.cluster, refresh_at = ?token.refresh_at, "minted EKS token");
        let ca = if ep.ca_der.is_empty() {
            None
        } else {
            Some(ep.ca_der.clone())
        };
        let client = client_for(&ep.endpoint, ca, Some(&token.value))?;
        state.1 = Some((client.clone(), token));
        Ok(client)
    }
}
