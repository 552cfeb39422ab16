//! Layered configuration for Hasten's binaries: built-in defaults, then a TOML file, then
//! environment variables, then command-line flags, each overriding the one before.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use hasten_proto::tls::{MutualTls, TlsError, TlsPaths};
use schemars::generate::SchemaSettings;
use schemars::transform::RecursiveTransform;
use schemars::{JsonSchema, Schema};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
    #[error("configuration: `{key}` {message}")]
    Invalid { key: &'static str, message: String },
    #[error("printing the configuration")]
    Print(#[source] serde_json::Error),
}

impl ConfigError {
    pub fn invalid(key: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key,
            message: message.into(),
        }
    }

    /// The key that the file, the environment or a flag named and the configuration does
    /// not have, when that is why loading failed. (A struct that flattens another, as every
    /// configuration flattens [`TlsConfig`], reports it as serde's message, not as the kind.)
    pub fn unknown_key(&self) -> Option<&str> {
        let Self::Load(error) = self else {
            return None;
        };
        match &error.kind {
            figment::error::Kind::UnknownField(key, _) => Some(key),
            figment::error::Kind::Message(message) => {
                message.strip_prefix("unknown field `")?.split('`').next()
            }
            _ => None,
        }
    }
}

/// The flags every binary takes about its configuration itself (flatten into its command).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConfigSource {
    /// TOML configuration file; flags and the binary's HASTEN_* variables override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print the JSON Schema of the configuration file's keys and exit (editors and the
    /// Helm chart's values schema check a file against it).
    #[arg(long, conflicts_with = "print_config")]
    pub print_config_schema: bool,
    /// Set one key for this run, `TABLE.KEY=VALUE` (`retrieval.tau=0.2`), over the file, the
    /// environment and the other flags; repeat it for more keys.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    pub set: Vec<Setting>,
}

/// One `--set` of a key: its dotted path from the top of the configuration and its value,
/// read as the environment's values are (`0.2` a number, `true` a boolean, `[a, b]` a
/// list, anything else a string).
#[derive(Clone, Debug)]
pub struct Setting {
    pub key: String,
    pub value: figment::value::Value,
}

fn parse_setting(text: &str) -> Result<Setting, String> {
    let expected = "expected TABLE.KEY=VALUE or KEY=VALUE (`retrieval.tau=0.2`)";
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: {expected}"))?;
    let key = key.trim();
    let well_formed = key.split('.').all(|part| {
        !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    });
    if !well_formed {
        return Err(format!("`{key}` is not a key: {expected}"));
    }
    let Ok(value) = value.parse::<figment::value::Value>();
    Ok(Setting {
        key: key.to_string(),
        value,
    })
}

/// Checks `otlp_endpoint`: an `http://` or `https://` URL of a collector's OTLP/gRPC port.
pub fn check_otlp_endpoint(endpoint: Option<&str>) -> Result<(), ConfigError> {
    match endpoint {
        Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
            Err(ConfigError::invalid(
                "otlp_endpoint",
                format!(
                    "`{url}` is not an http:// or https:// URL (an OTLP/gRPC collector, port 4317)"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// The checks of a configuration beyond its types: ranges, and keys that need each other.
pub trait Validate {
    fn validate(&self) -> Result<(), ConfigError>;
}

/// The JSON Schema (draft-07) of a configuration file's keys, with every definition inlined
/// so that it can be embedded as it is (the chart's values schema holds it under each
/// binary's `config` table). No key is required: [`load_config`] lays the defaults under the
/// file, so a file may name any subset of a table's keys.
pub fn config_schema<T: JsonSchema>() -> serde_json::Value {
    let schema = SchemaSettings::draft07()
        .with(|settings| settings.inline_subschemas = true)
        .with_transform(RecursiveTransform(|schema: &mut Schema| {
            schema.remove("required");
        }))
        .into_generator()
        .into_root_schema_for::<T>();
    schema.to_value()
}

/// Loads a configuration with [`load_config`] and validates it, or answers
/// `--print-config-schema` (before loading: the schema does not depend on the values) and
/// `--print-config` (after validating: printing answers whether a configuration works) on
/// stdout. `None`: it printed what the flags asked for, and the binary has nothing to serve.
pub fn resolve_config<T, F>(
    source: &ConfigSource,
    env_prefix: &str,
    flags: &F,
) -> Result<Option<T>, ConfigError>
where
    T: Default + Serialize + DeserializeOwned + JsonSchema + Validate,
    F: Serialize,
{
    if source.print_config_schema {
        let text =
            serde_json::to_string_pretty(&config_schema::<T>()).map_err(ConfigError::Print)?;
        println!("{text}");
        return Ok(None);
    }
    let config: T = load_config(source.config.as_deref(), env_prefix, flags, &source.set)?;
    config.validate()?;
    if source.print_config {
        let text = serde_json::to_string_pretty(&config).map_err(ConfigError::Print)?;
        println!("{text}");
        return Ok(None);
    }
    Ok(Some(config))
}

// The four TLS keys every binary has, flattened into its configuration (the keys stay at
// the top level: `tls_ca`, ...) and into its command line (`--tls-ca`, ...), where each
// overrides the file and the environment only when given. A plain comment: a doc comment
// would become the description of every configuration that flattens this one.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA certificate of the deployment. With `tls_cert` and `tls_key` it turns mutual
    /// TLS on: peers must show a certificate it issued, and this component shows its own to
    /// the servers it calls.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate chain of this component, with `tls_key`: shown to its clients, and
    /// under mutual TLS to the servers it calls. (cloud-index without it serves a generated
    /// dev certificate, and with it but without `tls_ca` serves server-only TLS.)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates trusted besides `tls_ca` (mutual TLS only): during a CA rotation
    /// the other CA, so that peers with certificates from either are accepted.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_extra_ca: Option<PathBuf>,
}

impl TlsConfig {
    /// The mutual-TLS files: all of `tls_ca`, `tls_cert` and `tls_key` (on) or none (off),
    /// `tls_extra_ca` only with them.
    pub fn mutual_tls(&self) -> Result<Option<TlsPaths>, ConfigError> {
        TlsPaths::all_or_none(
            &self.tls_ca,
            &self.tls_extra_ca,
            &self.tls_cert,
            &self.tls_key,
        )
        .map_err(|message| ConfigError::invalid("tls_ca", message))
    }

    /// The mutual-TLS files, read and checked; `None` when mutual TLS is off.
    pub fn load_mutual(&self) -> Result<Option<MutualTls>, MutualTlsError> {
        self.mutual_tls()?
            .map(|paths| MutualTls::load(&paths))
            .transpose()
            .map_err(MutualTlsError::Load)
    }
}

/// Why a binary's mutual TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MutualTlsError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("loading the mutual-TLS files (`tls_ca`, `tls_cert`, `tls_key`)")]
    Load(#[source] TlsError),
}

/// `command` with the help of each flag that sets a key of `T` ending in `[default: ...]`,
/// the key's value in `T::default()`: a default is written once, in the type, and the help
/// and the configuration reference are generated from it. A flag sets the key of its own
/// name (`--semantic-threshold`: `semantic_threshold`), at the top of the configuration or
/// in exactly one of its tables. Keys without a value by default (`None`, a table) keep
/// the help as written, which then says what their absence means.
pub fn help_with_defaults<T: Default + Serialize>(command: clap::Command) -> clap::Command {
    // Through JSON text: an f32 such as 0.9 turned into a Value directly would print as
    // 0.8999999761581421.
    let defaults = serde_json::to_string(&T::default())
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .unwrap_or_default();
    let ids: Vec<String> = command
        .get_arguments()
        .map(|arg| arg.get_id().to_string())
        .collect();
    ids.iter().fold(command, |command, id| {
        let Some(text) = default_of_key(&defaults, id) else {
            return command;
        };
        command.mut_arg(id, |arg| {
            let suffix = format!("[default: {text}]");
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let long_help = arg.get_long_help().map(ToString::to_string);
            let arg = arg.help(format!("{help} {suffix}"));
            match long_help {
                Some(long) => arg.long_help(format!("{long} {suffix}")),
                None => arg,
            }
        })
    })
}

/// Parses the command line with `command` (a `C::command()` that
/// [`help_with_defaults`] has annotated), exiting with clap's message on a bad one.
pub fn parse_command<C: clap::FromArgMatches>(command: clap::Command) -> C {
    let mut matches = command.get_matches();
    C::from_arg_matches_mut(&mut matches).unwrap_or_else(|error| error.exit())
}

/// The default of `key` as a flag's help shows it: found at the top level or in exactly
/// one table; `None` when absent, ambiguous, null or itself a table.
fn default_of_key(defaults: &serde_json::Value, key: &str) -> Option<String> {
    use serde_json::Value;
    let object = defaults.as_object()?;
    let value = match key.split_once('.') {
        Some((table, rest)) => return default_of_key(object.get(table)?, rest),
        None => object.get(key),
    };
    let value = match value {
        Some(value) => value,
        None => {
            let mut found = object
                .values()
                .filter_map(|table| table.as_object()?.get(key));
            let value = found.next()?;
            if found.next().is_some() {
                return None;
            }
            value
        }
    };
    match value {
        Value::Null | Value::Object(_) => None,
        Value::Array(items) if items.is_empty() => None,
        Value::String(text) => Some(text.clone()),
        Value::Array(items) => Some(
            items
                .iter()
                .map(|item| match item {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
        ),
        other => Some(other.to_string()),
    }
}

/// Resolves a configuration of type `T`.
///
/// `env_prefix` (e.g. `HASTEN_EDGE_`) selects environment variables: `HASTEN_EDGE_TAU=0.3`
/// sets `tau`, and a double underscore descends into a table: `HASTEN_CLOUD_SERVER__QUIC_ADDR`
/// sets `quic_addr` of `[server]` (keys themselves hold single underscores only). `flags` is
/// the command line as a serialisable struct whose unset options are skipped
/// (`#[serde(skip_serializing_if = "Option::is_none")]`), nested as the tables are.
/// `settings` (`--set`) come last: a key set for one run wins over everything else.
pub fn load_config<T, F>(
    file: Option<&Path>,
    env_prefix: &str,
    flags: &F,
    settings: &[Setting],
) -> Result<T, ConfigError>
where
    T: Default + Serialize + DeserializeOwned,
    F: Serialize,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError::MissingFile(path.display().to_string()));
        }
        figment = figment.merge(Toml::file(path));
    }
    figment = figment
        .merge(Env::prefixed(env_prefix).split("__"))
        .merge(Serialized::defaults(flags));
    for setting in settings {
        figment = figment.merge(Serialized::default(&setting.key, &setting.value));
    }
    figment
        .extract()
        .map_err(|e| ConfigError::Load(Box::new(e)))
}

#[cfg(test)]
mod tests;
