//! EKS authentication without a kubeconfig: the cluster's endpoint and CA from
//! `eks:DescribeCluster`, and a bearer token minted the way
//! aws-iam-authenticator does it.
//!
//! The token is `k8s-aws-v1.` followed by the unpadded base64url encoding of a
//! presigned STS `GetCallerIdentity` URL whose signature covers the
//! `x-k8s-aws-id: <cluster name>` header. The API server replays the URL to
//! STS to learn who is calling. The presigned URL is good for 60 seconds of
//! clock skew; EKS accepts the token for 15 minutes, so it is refreshed after 14.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign};
use aws_sigv4::sign::v4;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

/// Prefix of every EKS bearer token.
pub const TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// The header whose signed value binds a token to one cluster.
pub const CLUSTER_ID_HEADER: &str = "x-k8s-aws-id";
/// How long the presigned URL itself is valid (`X-Amz-Expires`).
pub const PRESIGN_EXPIRY: Duration = Duration::from_secs(60);
/// How long EKS accepts a token.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// When a token is replaced: a minute before EKS stops accepting it.
pub const REFRESH_AFTER: Duration = Duration::from_secs(14 * 60);

/// Why a token or the cluster's connection details could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The SDK configuration lacks something needed.
    #[error("AWS configuration: {0}")]
    Config(String),
    /// Credentials could not be loaded.
    #[error("loading AWS credentials: {0}")]
    Credentials(String),
    /// Signing the STS request failed.
    #[error("presigning sts:GetCallerIdentity for cluster {cluster:?}: {message}")]
    Signing {
        /// The cluster the token was for.
        cluster: String,
        /// What went wrong.
        message: String,
    },
    /// `eks:DescribeCluster` failed or returned too little.
    #[error("eks:DescribeCluster {cluster:?}: {message}")]
    DescribeCluster {
        /// The cluster.
        cluster: String,
        /// What went wrong.
        message: String,
    },
    /// The cluster's CA bundle is not usable PEM.
    #[error("cluster CA certificate: {0}")]
    Certificate(String),
}

/// A bearer token and when to stop using it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// `k8s-aws-v1.<base64url presigned URL>`.
    pub value: String,
    /// When it was minted.
    pub minted_at: SystemTime,
    /// When to replace it: [`REFRESH_AFTER`] after minting, or a minute before
    /// the credentials that signed it expire, whichever is first.
    pub refresh_at: SystemTime,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: never log it.
        f.debug_struct("Token")
            .field("minted_at", &self.minted_at)
            .field("refresh_at", &self.refresh_at)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// Whether the token should still be used at `now`.
    pub fn is_fresh(&self, now: SystemTime) -> bool {
        now >= self.minted_at && now < self.refresh_at
    }
}

/// Percent-encodes a query component as SigV4 canonicalises it (RFC 3986 unreserved kept).
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The regional STS endpoint host for a region.
pub fn sts_host(region: &str) -> String {
    if region.starts_with("cn-") {
        format!("sts.{region}.amazonaws.com.cn")
    } else {
        format!("sts.{region}.amazonaws.com")
    }
}

/// Mints a token for `cluster` with `creds`, signed for `region` at `now`.
/// Pure apart from the clock value passed in, so tests can decode and check it.
pub fn mint_token(creds: &Credentials, region: &str, cluster: &str, now: SystemTime) -> Result<Token, AuthError> {
    let signing_err = |message: String| AuthError::Signing {
        cluster: cluster.to_string(),
        message,
    };
    if cluster.is_empty() {
        return Err(signing_err("the cluster name is empty".into()));
    }
    if region.is_empty() {
        return Err(AuthError::Config("no AWS region configured for STS".into()));
    }
    let host = sts_host(region);
    let url = format!("https://{host}/?Action=GetCallerIdentity&Version=2011-06-15");
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(PRESIGN_EXPIRY);
    let identity = creds.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| signing_err(e.to_string()))?
        .into();
    let headers = [("host", host.as_str()), (CLUSTER_ID_HEADER, cluster)];
    let request = SignableRequest::new("GET", url.as_str(), headers.into_iter(), SignableBody::Bytes(&[]))
        .map_err(|e| signing_err(e.to_string()))?;
    let (instructions, _signature) = sign(request, &params)
        .map_err(|e| signing_err(e.to_string()))?
        .into_parts();
    let mut presigned = url;
    for (name, value) in instructions.params() {
        presigned.push('&');
        presigned.push_str(&uri_encode(name));
        presigned.push('=');
        presigned.push_str(&uri_encode(value));
    }
    let mut refresh_at = now + REFRESH_AFTER;
    if let Some(exp) = creds.expiry() {
        refresh_at = refresh_at.min(exp.checked_sub(Duration::from_secs(60)).unwrap_or(exp));
    }
    Ok(Token {
        value: format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(presigned)),
        minted_at: now,
        refresh_at,
    })
}

/// Mints a token with the credentials and region of an SDK configuration.
pub async fn mint_token_from_config(config: &aws_config::SdkConfig, cluster: &str) -> Result<Token, AuthError> {
    use aws_credential_types::provider::ProvideCredentials;
    let provider = config
        .credentials_provider()
        .ok_or_else(|| AuthError::Config("no credentials provider configured".into()))?;
    let creds = provider
        .provide_credentials()
        .await
        .map_err(|e| AuthError::Credentials(e.to_string()))?;
    let region = config
        .region()
        .map(|r| r.to_string())
        .ok_or_else(|| AuthError::Config("no AWS region configured".into()))?;
    mint_token(&creds, &region, cluster, SystemTime::now())
}

/// Where a cluster's API server is and which CA signs its certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterEndpoint {
    /// The cluster name (also the token's `x-k8s-aws-id`).
    pub name: String,
    /// The API server URL (`https://...eks.amazonaws.com`).
    pub endpoint: String,
    /// The CA certificates, DER-encoded.
    pub ca_der: Vec<Vec<u8>>,
}

/// Reads a cluster's endpoint and CA with `eks:DescribeCluster`.
pub async fn describe_cluster(eks: &aws_sdk_eks::Client, cluster: &str) -> Result<ClusterEndpoint, AuthError> {
    let err = |message: String| AuthError::DescribeCluster {
        cluster: cluster.to_string(),
        message,
    };
    let out = eks
        .describe_cluster()
        .name(cluster)
        .send()
        .await
        .map_err(|e| err(aws_sdk_eks::error::DisplayErrorContext(&e).to_string()))?;
    let c = out.cluster().ok_or_else(|| err("the response has no cluster".into()))?;
    let endpoint = c
        .endpoint()
        .filter(|e| !e.is_empty())
        .ok_or_else(|| err("the cluster has no endpoint yet (is it still creating?)".into()))?;
    let ca_b64 = c
        .certificate_authority()
        .and_then(|ca| ca.data())
        .ok_or_else(|| err("the cluster has no certificateAuthority.data".into()))?;
    let pem = STANDARD
        .decode(ca_b64.trim())
        .map_err(|e| AuthError::Certificate(format!("certificateAuthority.data is not base64: {e}")))?;
    Ok(ClusterEndpoint {
        name: cluster.to_string(),
        endpoint: endpoint.to_string(),
        ca_der: pem_to_der(&pem)?,
    })
}

/// Extracts the DER bytes of every `CERTIFICATE` block in a PEM bundle.
pub fn pem_to_der(pem: &[u8]) -> Result<Vec<Vec<u8>>, AuthError> {
    let text = std::str::from_utf8(pem).map_err(|_| AuthError::Certificate("the PEM bundle is not UTF-8".into()))?;
    let mut certs = Vec::new();
    let mut body: Option<String> = None;
    for line in text.lines().map(str::trim) {
        match (line, body.as_mut()) {
            ("-----BEGIN CERTIFICATE-----", None) => body = Some(String::new()),
            ("-----END CERTIFICATE-----", Some(b)) => {
                let der = STANDARD.decode(b.as_bytes()).map_err(|e| {
                    AuthError::Certificate(format!("certificate {} is not base64: {e}", certs.len() + 1))
                })?;
                certs.push(der);
                body = None;
            }
            (l, Some(b)) => b.push_str(l),
            _ => {}
        }
    }
    if body.is_some() {
        return Err(AuthError::Certificate("unterminated CERTIFICATE block".into()));
    }
    if certs.is_empty() {
        return Err(AuthError::Certificate("no CERTIFICATE block found".into()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn decode(token: &str) -> (String, BTreeMap<String, String>) {
        let b64 = token.strip_prefix(TOKEN_PREFIX).expect("prefix");
        assert!(!b64.contains('='), "no padding");
        assert!(!b64.contains('+') && !b64.contains('/'), "url-safe alphabet");
        let url = String::from_utf8(URL_SAFE_NO_PAD.decode(b64).expect("base64url")).expect("utf8");
        let (base, query) = url.split_once('?').expect("query");
        let params = query
            .split('&')
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect("k=v");
                (k.to_string(), percent_decode(v))
            })
            .collect();
        (base.to_string(), params)
    }

    fn percent_decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).expect("hex"));
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).expect("utf8")
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn token_is_a_presigned_get_caller_identity_url_bound_to_the_cluster() {
        let creds = Credentials::new("AKIDEXAMPLE", "secret", Some("session/token+x=".into()), None, "test");
        // 2026-01-02T03:04:05Z
        let t = mint_token(&creds, "eu-west-1", "prod", at(1_767_323_045)).unwrap();
        let (base, p) = decode(&t.value);
        assert_eq!(base, "https://sts.eu-west-1.amazonaws.com/");
        assert_eq!(p["Action"], "GetCallerIdentity");
        assert_eq!(p["Version"], "2011-06-15");
        assert_eq!(p["X-Amz-Algorithm"], "AWS4-HMAC-SHA256");
        assert_eq!(p["X-Amz-Credential"], "AKIDEXAMPLE/20260102/eu-west-1/sts/aws4_request");
        assert_eq!(p["X-Amz-Date"], "20260102T030405Z");
        assert_eq!(p["X-Amz-Expires"], "60");
        assert_eq!(p["X-Amz-SignedHeaders"], "host;x-k8s-aws-id");
        assert_eq!(p["X-Amz-Security-Token"], "session/token+x=");
        assert_eq!(p["X-Amz-Signature"].len(), 64);
        assert!(p["X-Amz-Signature"].bytes().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn the_signature_depends_on_the_cluster_and_the_time() {
        let creds = Credentials::new("AKID", "secret", None, None, "test");
        let sig = |cluster: &str, t: u64| {
            decode(&mint_token(&creds, "us-east-1", cluster, at(t)).unwrap().value).1["X-Amz-Signature"].clone()
        };
        assert_eq!(sig("a", 1_700_000_000), sig("a", 1_700_000_000));
        assert_ne!(sig("a", 1_700_000_000), sig("b", 1_700_000_000));
        assert_ne!(sig("a", 1_700_000_000), sig("a", 1_700_000_001));
        let (_, p) = decode(&mint_token(&creds, "us-east-1", "a", at(1_700_000_000)).unwrap().value);
        assert!(!p.contains_key("X-Amz-Security-Token"));
    }

    #[test]
    fn tokens_are_refreshed_after_fourteen_minutes_or_before_credentials_expire() {
        let creds = Credentials::new("AKID", "secret", None, None, "test");
        let t = mint_token(&creds, "us-east-1", "c", at(1_000_000)).unwrap();
        assert!(t.is_fresh(at(1_000_000)));
        assert!(t.is_fresh(at(1_000_000 + 14 * 60 - 1)));
        assert!(!t.is_fresh(at(1_000_000 + 14 * 60)));
        let short = Credentials::new("AKID", "secret", None, Some(at(1_000_000 + 300)), "test");
        let t = mint_token(&short, "us-east-1", "c", at(1_000_000)).unwrap();
        assert_eq!(t.refresh_at, at(1_000_000 + 240));
        assert!(
            !format!("{t:?}").contains(TOKEN_PREFIX),
            "Debug must not print the token"
        );
    }

    #[test]
    fn bad_input_is_named() {
        let creds = Credentials::new("AKID", "secret", None, None, "test");
        assert!(matches!(
            mint_token(&creds, "us-east-1", "", at(0)),
            Err(AuthError::Signing { .. })
        ));
        assert!(matches!(mint_token(&creds, "", "c", at(0)), Err(AuthError::Config(_))));
    }

    #[test]
    fn pem_bundles_become_der_certificates() {
        let der1 = vec![0x30, 0x82, 0x01, 0x0a];
        let der2 = vec![0x30, 0x03, 0x02, 0x01, 0x01];
        let pem = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            STANDARD.encode(&der1),
            STANDARD.encode(&der2)
        );
        assert_eq!(pem_to_der(pem.as_bytes()).unwrap(), vec![der1, der2]);
        assert!(pem_to_der(b"nothing here").is_err());
        assert!(pem_to_der(b"-----BEGIN CERTIFICATE-----\nAAAA\n").is_err());
        assert!(pem_to_der(b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").is_err());
    }
}
