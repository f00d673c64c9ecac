//! The forwarder binary: settings from the environment, clients from the pod's
//! service account and EKS Pod Identity / IRSA, stop on SIGTERM or Ctrl-C.

use nodesmith_forwarder::{Config, Health, SqsSink, run};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    nodesmith::telemetry::init();
    let config = Config::from_lookup(|k| std::env::var(k).ok())?;
    nodesmith::transport::install_crypto_provider();
    let kube = kube::Client::try_default().await?;
    let aws = nodesmith::transport::sdk_defaults().load().await;
    let sink = SqsSink::new(aws_sdk_sqs::Client::new(&aws), &config.queue_url);
    let health = Health::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listener = tokio::net::TcpListener::bind(&config.health_addr).await?;
    let mut health_stop = stop_rx.clone();
    let server = tokio::spawn({
        let health = health.clone();
        async move {
            health
                .serve(listener, async move {
                    let _ = health_stop.changed().await;
                })
                .await
        }
    });
    let stats = run(kube, sink, &config, health, shutdown_signal()).await;
    let _ = stop_tx.send(true);
    server.await??;
    tracing::info!(?stats, "bye");
    Ok(())
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: sending what is pending and stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: sending what is pending and stopping"),
    }
}
