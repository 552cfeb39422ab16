//! Channels to Hasten's generation workers (`lm-worker`, `kv-worker`), as their clients open
//! them: lazily (a worker that starts after its client is found on first use), with a bounded
//! connect time, over TLS when the deployment has it.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::grpc_client_tls::GrpcClientTls;

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
    tls: Option<&GrpcClientTls>,
) -> Result<Channel, tonic::transport::Error> {
    let settings = |endpoint: Endpoint| endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true);
    Ok(match tls {
        // The connector makes the TLS stream, and tonic refuses an `https` URI without TLS
        // settings of its own.
        Some(tls) => {
            let plain = uri.replacen("https://", "http://", 1);
            tls.lazy_channel(settings(Endpoint::from_shared(plain)?))
        }
        None => settings(Endpoint::from_shared(uri.to_string())?).connect_lazy(),
    })
}
