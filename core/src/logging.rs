//! Log setup shared by the binaries: `tracing` to stderr, filtered by `RUST_LOG` (default
//! `info`), as text for people or as one JSON object per line for a cluster's log
//! pipeline (`log_format`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

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
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    };
}

/// The `--log-format` flag every serving binary takes (flatten into its command, and into
/// its serialised flags with `#[serde(flatten)]`); it sets the `log_format` key.
#[derive(clap::Args, Clone, Debug, Default, Serialize)]
pub struct LogArgs {
    /// text or json [default: text].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}
