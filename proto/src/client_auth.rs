//! Servers that require client certificates (mutual TLS): the rustls configuration both
//! QUIC and gRPC servers start from, whose trust in client certificates is read again from
//! its CA files when they change, so that a rotated CA is trusted from the next handshake
//! without a restart.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::reload::{ReloadOutcome, Reloading};
use crate::tls::{TlsError, TrustRoots, crypto_provider};

/// A rustls server configuration under `versions`, asking for no client certificate, or
/// (with `clients`) for one leading to those roots; the caller adds its certificate.
pub(crate) fn server_builder(
    versions: &[&'static rustls::SupportedProtocolVersion],
    clients: Option<&TrustRoots>,
) -> Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>, TlsError>
{
    let builder = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(versions)?;
    Ok(match clients {
        Some(roots) => builder.with_client_cert_verifier(client_verifier(roots)?),
        None => builder.with_no_client_auth(),
    })
}

/// Requires a client certificate leading to `roots`, read again from their files when they
/// change (the trust of roots made in memory stays fixed).
fn client_verifier(roots: &TrustRoots) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let verifier = |roots: &TrustRoots| -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        Ok(
            WebPkiClientVerifier::builder_with_provider(roots.store(), crypto_provider())
                .build()?,
        )
    };
    if roots.files.is_empty() {
        return verifier(roots);
    }
    let files = roots.files.clone();
    let reloading = Reloading::from_files(
        roots.files.clone(),
        move || {
            let roots = TrustRoots::from_pem_files(&files)?;
            Ok((verifier(&roots)?, roots.expires_at()))
        },
        |outcome| match outcome {
            ReloadOutcome::Reloaded { .. } => {
                tracing::info!("trusting the changed CA files for client certificates")
            }
            ReloadOutcome::Failed(err) => tracing::warn!(
                error = %err.display_full(),
                "the changed CA files cannot be used; client certificates are checked as before"
            ),
        },
    )?;
    Ok(Arc::new(ReloadingClientVerifier(reloading)))
}

/// A client-certificate verifier made again when its CA files change.
#[derive(Debug)]
struct ReloadingClientVerifier(Reloading<Arc<dyn ClientCertVerifier>>);

impl ClientCertVerifier for ReloadingClientVerifier {
    /// No hints: they would borrow from a verifier that a reload may replace, and a client
    /// with one certificate does not need them.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().supported_verify_schemes()
    }
}
