//! Log setup shared by the binaries: `tracing` to stderr, filtered by `RUST_LOG` (default
//! `info`), as text for people or as one JSON object per line for a cluster's log
//! pipeline (`log_format`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::trace_export::{OtlpExport, TraceExport, TraceExportError};

/// How log lines are written.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: the event's fields at the top level, and the fields of
    /// every span it happened in (a request's `request_id` among them) under `spans`.
    Json,
}

impl LogFormat {
    /// The name the configuration files use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

/// Installs the process's log subscriber. A second call (tests that start services
/// in-process) keeps the first.
pub fn init(format: LogFormat) {
    // Without an export nothing can fail.
    let _ = init_with_traces(format, None, "");
}

/// [`init`], and with `otlp_endpoint` every span also exported to that collector as
/// `service` (needs a Tokio runtime); keep the returned export alive for as long as the
/// process serves.
pub fn init_with_traces(
    format: LogFormat,
    otlp_endpoint: Option<&str>,
    service: &'static str,
) -> Result<Option<TraceExport>, TraceExportError> {
    let otlp = otlp_endpoint.map(|endpoint| OtlpExport {
        endpoint: endpoint.to_string(),
        service,
    });
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .boxed(),
    };
    let (export, spans) = match &otlp {
        Some(otlp) => {
            let (export, tracer) = TraceExport::start(otlp)?;
            let layer = tracing_opentelemetry::layer().with_tracer(tracer);
            (Some(export), Some(layer))
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(spans)
        .try_init();
    Ok(export)
}

/// The `--log-format` and `--otlp-endpoint` flags every serving binary takes (flatten into
/// its command, and into its serialised flags with `#[serde(flatten)]`); they set the
/// `log_format` and `otlp_endpoint` keys.
#[derive(clap::Args, Clone, Debug, Default, Serialize)]
pub struct LogArgs {
    /// text or json.
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// OTLP/gRPC collector to export spans to (`http://otel-collector:4317`).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
}
