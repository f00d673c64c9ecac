//! Liveness and readiness: `/healthz` fails while the watch is failing,
//! `/readyz` passes once the first pod list is synced.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// Shared watch health.
#[derive(Clone, Debug, Default)]
pub struct Health {
    synced: Arc<AtomicBool>,
    failing: Arc<AtomicBool>,
}

impl Health {
    /// A pod list completed.
    pub fn synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
        self.failing.store(false, Ordering::Relaxed);
    }

    /// An event arrived: the watch works.
    pub fn observed(&self) {
        self.failing.store(false, Ordering::Relaxed);
    }

    /// The watch failed (it will reconnect).
    pub fn failed(&self) {
        self.failing.store(true, Ordering::Relaxed);
    }

    /// Whether the watch is currently working.
    pub fn is_live(&self) -> bool {
        !self.failing.load(Ordering::Relaxed)
    }

    /// Whether the first list completed.
    pub fn is_ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The HTTP routes.
    pub fn router(&self) -> Router {
        let live = self.clone();
        let ready = self.clone();
        Router::new()
            .route(
                "/healthz",
                get(move || async move {
                    if live.is_live() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "pod watch failing")
                    }
                }),
            )
            .route(
                "/readyz",
                get(move || async move {
                    if ready.is_ready() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "pods not listed yet")
                    }
                }),
            )
    }

    /// Serves the routes on `listener` until `shutdown` resolves.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}
