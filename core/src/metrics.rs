//! Prometheus metrics every binary shares: a registry carrying the process collector (CPU,
//! resident memory, open file descriptors), the text exposition, the latency buckets, and
//! the routes that serve them with the health probes, and the listener that serves them.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

pub use prometheus;

/// Latency buckets in seconds, shared so that dashboards compare tiers on one scale: from
/// a cache hit (sub-millisecond) through a loopback fallback (a few ms) and a WAN fallback
/// (tens of ms) to a 1M-vector batched scan under load (hundreds of ms) and the default
/// request deadline (2 s), with room above it for stalls.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Seconds of LLM generation (an answer, a time to first token): from a cached short
/// answer to two minutes of CPU decoding.
pub const GENERATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
];

/// Seconds between an answer's output tokens (its decode time over its tokens after the
/// first): from a small model on a GPU to a large one on two cores.
pub const INTER_TOKEN_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];

/// Tokens per second of decoding: from a large model on two cores to a small one on a GPU.
pub const TOKEN_RATE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 400.0, 1000.0,
];

/// Registers `metric` with `registry` and hands it back, so that a metrics struct is built
/// field by field.
pub fn register<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: T,
) -> Result<T, prometheus::Error> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// A registry with the process collector registered.
pub fn registry() -> Result<Registry, prometheus::Error> {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    Ok(registry)
}

/// `hasten_tls_certificate_expiry_timestamp_seconds{certificate}`: when each certificate
/// file this process loaded at start expires (its earliest certificate), in Unix seconds.
/// A certificate renewed in its Secret reaches a process only when it restarts, so the
/// process, not the Secret, says what it still serves.
pub fn register_certificate_expiry(
    registry: &Registry,
    certificates: &[(&str, i64)],
) -> Result<prometheus::IntGaugeVec, prometheus::Error> {
    let gauge = register(
        registry,
        prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "hasten_tls_certificate_expiry_timestamp_seconds",
                "When each certificate file this process loaded expires (its earliest certificate), Unix seconds",
            ),
            &["certificate"],
        )?,
    )?;
    for (certificate, expires_at) in certificates {
        gauge.with_label_values(&[*certificate]).set(*expires_at);
    }
    Ok(gauge)
}

/// What reading a changed certificate's files did: the new certificate's expiry (Unix
/// seconds) when it now serves, or why it cannot (the previous one stays).
pub type ReloadResult<'a> = Result<i64, &'a (dyn std::error::Error + 'static)>;

/// Reports the reloads of the certificate at `path`: counted in
/// `hasten_tls_reloads_total{outcome}` (`served` or `refused`), a served one's expiry set on
/// `expiry`'s `series` (from [`register_certificate_expiry`]), and logged.
pub fn tls_reload_reporter(
    registry: &Registry,
    expiry: prometheus::IntGaugeVec,
    series: &'static str,
    path: String,
) -> Result<impl Fn(ReloadResult<'_>) + Send + Sync + 'static, prometheus::Error> {
    let reloads = register(
        registry,
        prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "hasten_tls_reloads_total",
                "Certificate files read again after they changed: served, or refused (the previous certificate stays)",
            ),
            &["outcome"],
        )?,
    )?;
    for outcome in ["served", "refused"] {
        reloads.with_label_values(&[outcome]);
    }
    Ok(move |result: ReloadResult<'_>| match result {
        Ok(expires_at) => {
            reloads.with_label_values(&["served"]).inc();
            expiry.with_label_values(&[series]).set(expires_at);
            tracing::info!(%path, "serving the renewed TLS certificate");
        }
        Err(err) => {
            reloads.with_label_values(&["refused"]).inc();
            tracing::warn!(%path, error = %err.display_full(), "the changed TLS certificate cannot serve; keeping the previous one");
        }
    })
}

/// Why a gRPC server's reloading TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum GrpcTlsError {
    #[error("registering the TLS metrics")]
    Metrics(#[from] prometheus::Error),
    #[error("configuring gRPC TLS")]
    Tls(#[from] hasten_proto::tls::TlsError),
}

/// A gRPC server's mutual TLS, its certificate read again when its files change, with the
/// certificates' expiry and the reloads on `registry`; `None` without mutual TLS.
pub fn reloading_grpc_tls(
    registry: &Registry,
    mutual: Option<&hasten_proto::tls::MutualTls>,
) -> Result<Option<Arc<rustls::ServerConfig>>, GrpcTlsError> {
    let expiry = register_certificate_expiry(registry, &hasten_proto::tls::expiries(mutual)?)?;
    let Some(mutual) = mutual else {
        return Ok(None);
    };
    let report = tls_reload_reporter(
        registry,
        expiry,
        "certificate",
        mutual.paths().cert.display().to_string(),
    )?;
    let config = hasten_proto::grpc_tls::reloading_server_config(mutual, move |outcome| {
        report(outcome.result())
    })?;
    Ok(Some(config))
}

/// The registry's metrics in Prometheus's text format.
pub fn exposition(registry: &Registry) -> String {
    let mut out = Vec::new();
    // Encoding into a Vec fails only on metrics that break the format's rules, which the
    // registry refuses at registration.
    if let Err(err) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::error!(error = %err.display_full(), "metrics encoding failed");
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a server is ready for traffic, and why not when it is not.
pub type ReadinessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// `GET /metrics` (refreshing scrape-time values with `refresh` first), `GET /readyz` (200,
/// or 503 with the reason) and `GET /healthz` (200 while the process serves at all).
pub fn routes(
    registry: Registry,
    refresh: Arc<dyn Fn() + Send + Sync>,
    ready: ReadinessCheck,
) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || async move {
                refresh();
                (
                    [(CONTENT_TYPE, prometheus::TEXT_FORMAT)],
                    exposition(&registry),
                )
            }),
        )
        .route(
            "/readyz",
            get(move || async move {
                match ready() {
                    Ok(()) => (StatusCode::OK, "ready".to_string()).into_response(),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
}

/// Binds `addr` and serves [`routes`] on it in the background until the process ends;
/// returns the bound address.
pub async fn serve(
    addr: std::net::SocketAddr,
    registry: Registry,
    refresh: Arc<dyn Fn() + Send + Sync>,
    ready: ReadinessCheck,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let routes = routes(registry, refresh, ready);
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, routes).await {
            tracing::error!(error = %err.display_full(), "metrics server stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_carries_registered_metrics_and_the_process_collector() {
        let registry = registry().unwrap();
        let counter = prometheus::IntCounter::new("hasten_test_total", "a test counter").unwrap();
        registry.register(Box::new(counter.clone())).unwrap();
        counter.inc_by(3);
        let text = exposition(&registry);
        assert!(text.contains("hasten_test_total 3"), "{text}");
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
    }
}
