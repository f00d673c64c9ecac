//! How every binary reaches AWS and the Kubernetes API: one TLS stack
//! (rustls on ring) for the AWS SDK's client and kube's, and the SDK's
//! configuration loader. The Lambda functions, the CLI and the in-cluster
//! forwarder all connect through here.

use std::sync::Once;

/// Installs ring as rustls' process-wide crypto provider, the one stack both
/// kube and the AWS SDK's client ([`https_client`]) use, so no TLS
/// connection depends on which client happened to start first.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err means another provider was installed first, which is fine too.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The SDK's HTTPS client: hyper with rustls on ring, the crypto the kube
/// client uses (one TLS stack in every binary). Crash tests wrap it in the
/// crash hook (debug builds only).
pub fn https_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls;
    let client = crate::usage::aws::wrap(
        aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .build_https(),
    );
    #[cfg(debug_assertions)]
    if crate::crash::enabled() {
        return crate::crash::aws::wrap(client);
    }
    client
}

/// The SDK's configuration loader from the environment, with [`https_client`]:
/// every binary and test loads its configuration through this.
pub fn sdk_defaults() -> aws_config::ConfigLoader {
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https_client())
}
