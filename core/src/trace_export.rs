//! Spans exported to an OpenTelemetry collector over OTLP (gRPC), off unless a binary's
//! `otlp_endpoint` is set, and the W3C trace context carried between processes, so that an
//! edge -> router -> shard request is one trace: the caller puts [`current_traceparent`]
//! into its request (a QUIC request's field, a gRPC metadata entry) and the server makes
//! its request span a child of it with [`set_remote_parent`].

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C header and field name of a span's context.
pub const TRACEPARENT: &str = "traceparent";

#[derive(Debug, thiserror::Error)]
pub enum TraceExportError {
    #[error("the OTLP exporter for {endpoint} cannot be built")]
    Build {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Where spans go: an OTLP/gRPC collector (`http://otel-collector:4317`), as `service`.
#[derive(Clone, Debug)]
pub struct OtlpExport {
    pub endpoint: String,
    pub service: &'static str,
}

/// The running export; flushes what is batched when dropped (the process ending).
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// Starts batching spans to `otlp` (needs a Tokio runtime); the tracer feeds the
    /// `tracing` layer that [`crate::logging::init_with_traces`] installs.
    pub(crate) fn start(otlp: &OtlpExport) -> Result<(Self, SdkTracer), TraceExportError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(otlp.endpoint.clone())
            .build()
            .map_err(|source| TraceExportError::Build {
                endpoint: otlp.endpoint.clone(),
                source,
            })?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(otlp.service).build())
            .build();
        let tracer = provider.tracer(otlp.service);
        Ok((Self { provider }, tracer))
    }
}

impl Drop for TraceExport {
    fn drop(&mut self) {
        if let Err(err) = self.provider.shutdown() {
            tracing::warn!(error = %err.display_full(), "flushing the last spans to the OTLP collector failed");
        }
    }
}

/// The W3C `traceparent` of the current span, or `None` when no trace is being exported.
pub fn current_traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    // Every fallback and shard call asks: without an export, answer before allocating.
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` a child of the remote span `traceparent` names (a malformed or empty one
/// leaves it a root).
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() {
        return;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    // Fails only when the span is disabled or no OpenTelemetry layer runs: nothing to join.
    let _ = span.set_parent(parent);
}
