//! Connection settings shared by every client and server of the control plane.

use std::time::Duration;

use tonic::transport::Endpoint;

use crate::tls::MutualTls;

/// Largest gRPC message to or from a control-plane node: a snapshot of a full cache (5,000
/// entries with their documents and vectors) is tens of megabytes.
pub const MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;

/// How long connecting to a node may take before the caller tries another.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The gRPC endpoint of the control-plane node at `address` (host:port), over mutual TLS
/// when `tls` is given.
pub fn endpoint(
    address: &str,
    tls: Option<&MutualTls>,
) -> Result<Endpoint, tonic::transport::Error> {
    grpc_endpoint(address, tls)
        .map(|endpoint| endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true))
}

/// A gRPC endpoint for `address` (`host:port` or a URI): `https` with `tls`'s client
/// certificate when given, else `http`.
pub fn grpc_endpoint(
    address: &str,
    tls: Option<&MutualTls>,
) -> Result<Endpoint, tonic::transport::Error> {
    let authority = address.split_once("://").map_or(address, |(_, rest)| rest);
    match tls {
        Some(tls) => {
            Endpoint::from_shared(format!("https://{authority}"))?.tls_config(tls.grpc_client())
        }
        None => Endpoint::from_shared(format!("http://{authority}")),
    }
}
