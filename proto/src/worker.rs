//! Channels to Hasten's generation workers (`lm-worker`, `kv-worker`), as their clients open
//! them: lazily (a worker that starts after its client is found on first use), with a bounded
//! connect time, over TLS when the deployment has it.

use std::time::Duration;

use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// How long a connection attempt to a worker may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The URI a client dials for the worker at `authority` (`host:port`).
pub fn worker_uri(authority: &str, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{authority}")
}

/// A channel to `uri` ([`worker_uri`]) that connects on first use; call within a tokio
/// runtime.
pub fn lazy_channel(
    uri: &str,
    tls: Option<&ClientTlsConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let mut endpoint = Endpoint::from_shared(uri.to_string())?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    Ok(endpoint.connect_lazy())
}
