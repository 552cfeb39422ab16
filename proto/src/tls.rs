//! TLS material shared by every link between Hasten's components: a certificate chain and
//! key ([`Identity`]), the certificates a peer is trusted by ([`TrustRoots`]), the mutual
//! TLS of a component that both serves and calls ([`MutualTls`]), and a development
//! certificate authority ([`DevAuthority`], behind `hasten-loadtest dev-certs`).
//!
//! Under mutual TLS each side proves itself to the other with a certificate issued by the
//! deployment's CA: a peer without one is refused during the handshake, before any request.

use display_full_error::DisplayFullErrorExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path} holds no {what}")]
    Empty { path: String, what: &'static str },
    #[error("certificate generation failed")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration refused")]
    Rustls(#[from] rustls::Error),
    #[error("QUIC crypto configuration refused: {0}")]
    Quic(String),
    #[error("cannot write {path}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the key does not belong to the certificate")]
    KeyMismatch(#[source] rustls::Error),
    #[error("`{0}` is neither a DNS name nor an IP address")]
    BadName(String),
    #[error("no certificate verifier for the certificate")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
    #[error("{path}: cannot read a certificate's validity: {reason}")]
    Validity { path: String, reason: String },
    #[error("the certificate is not valid for `{name}`")]
    NotValidFor {
        name: String,
        #[source]
        source: rustls::Error,
    },
}

fn read_error(path: &Path) -> impl FnOnce(rustls_pki_types::pem::Error) -> TlsError + '_ {
    move |source| TlsError::Read {
        path: path.display().to_string(),
        source,
    }
}

/// A certificate chain and its private key: what a server shows its clients, and what a
/// client shows a server under mutual TLS.
#[derive(Debug)]
pub struct Identity {
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// Loads a PEM certificate chain and PEM private key.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Self::from_pem(&read_pem(cert)?, cert, &read_pem(key)?, key)
    }

    /// Parses PEM already read from `cert_path` and `key_path` (named in errors).
    fn from_pem(
        cert: &[u8],
        cert_path: &Path,
        key: &[u8],
        key_path: &Path,
    ) -> Result<Self, TlsError> {
        Ok(Self {
            cert_chain: certificates_in(cert, cert_path)?,
            key: PrivateKeyDer::from_pem_slice(key).map_err(read_error(key_path))?,
        })
    }

    /// When the first certificate of the chain expires (Unix seconds).
    pub fn expires_at(&self) -> Result<i64, TlsError> {
        earliest_expiry(&self.cert_chain, Path::new("the identity"))
    }

    /// Generates a self-signed certificate for `names` (DNS names or IP addresses).
    pub fn generate_self_signed(names: &[String]) -> Result<SelfSigned, TlsError> {
        let certified = rcgen::generate_simple_self_signed(names.to_vec())?;
        let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der())
            .map_err(|e| TlsError::Quic(e.to_string()))?;
        Ok(SelfSigned {
            identity: Self {
                cert_chain: vec![certified.cert.der().clone()],
                key,
            },
            cert_pem: certified.cert.pem(),
            key_pem: certified.signing_key.serialize_pem(),
        })
    }

    /// Checks a self-signed identity as its clients will: the key belongs to the
    /// certificate, and a client that trusts the certificate accepts it now for each of
    /// `names`.
    pub fn check_self_signed_for(&self, names: &[String]) -> Result<(), TlsError> {
        let provider = crypto_provider();
        rustls::sign::CertifiedKey::from_der(
            self.cert_chain.clone(),
            self.key.clone_key(),
            &provider,
        )
        .map_err(TlsError::KeyMismatch)?;
        let Some((leaf, intermediates)) = self.cert_chain.split_first() else {
            return Err(TlsError::Empty {
                path: "the identity".into(),
                what: "certificate",
            });
        };
        let mut roots = RootCertStore::empty();
        roots.add(leaf.clone())?;
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()?;
        let now = rustls_pki_types::UnixTime::now();
        for name in names {
            let server_name = rustls_pki_types::ServerName::try_from(name.clone())
                .map_err(|_| TlsError::BadName(name.clone()))?;
            verifier
                .verify_server_cert(leaf, intermediates, &server_name, &[], now)
                .map_err(|source| TlsError::NotValidFor {
                    name: name.clone(),
                    source,
                })?;
        }
        Ok(())
    }
}

/// A generated self-signed identity and its PEM files' contents: the certificate, which
/// clients must trust, and the key, which only its server may read.
pub struct SelfSigned {
    pub identity: Identity,
    pub cert_pem: String,
    pub key_pem: String,
}

/// The certificates a peer's chain must lead to.
#[derive(Clone, Debug)]
pub struct TrustRoots {
    store: Arc<RootCertStore>,
    /// When the first of them expires (Unix seconds).
    expires_at: i64,
    /// The files they were read from: a server that requires client certificates reads
    /// them again when they change (a rotated CA; `crate::client_auth`).
    pub(crate) files: Vec<PathBuf>,
}

impl TrustRoots {
    /// Trusts every certificate in the PEM file `path`.
    pub fn from_pem_file(path: &Path) -> Result<Self, TlsError> {
        Self::from_pem(&read_pem(path)?, path)
    }

    /// Trusts every certificate in the PEM files `paths` (at least one).
    pub fn from_pem_files(paths: &[PathBuf]) -> Result<Self, TlsError> {
        let (first, rest) = paths.split_first().ok_or(TlsError::Empty {
            path: "(no file)".into(),
            what: "trusted certificate file",
        })?;
        rest.iter()
            .try_fold(Self::from_pem_file(first)?, |trust, path| {
                Ok(trust.and(&Self::from_pem_file(path)?))
            })
    }

    /// Parses PEM already read from `path` (named in errors).
    fn from_pem(pem: &[u8], path: &Path) -> Result<Self, TlsError> {
        let certificates = certificates_in(pem, path)?;
        let expires_at = earliest_expiry(&certificates, path)?;
        let mut roots = RootCertStore::empty();
        for cert in certificates {
            roots.add(cert)?;
        }
        Ok(Self {
            store: Arc::new(roots),
            expires_at,
            files: vec![path.to_path_buf()],
        })
    }

    /// Trusts what `self` or `other` trusts; expires when the first of them does.
    fn and(&self, other: &TrustRoots) -> Self {
        let mut roots = RootCertStore::empty();
        roots.roots.extend(self.store.roots.iter().cloned());
        roots.roots.extend(other.store.roots.iter().cloned());
        Self {
            store: Arc::new(roots),
            expires_at: self.expires_at.min(other.expires_at),
            files: self.files.iter().chain(&other.files).cloned().collect(),
        }
    }

    pub(crate) fn store(&self) -> Arc<RootCertStore> {
        self.store.clone()
    }

    /// When the first trusted certificate expires (Unix seconds).
    pub fn expires_at(&self) -> i64 {
        self.expires_at
    }
}

/// The earliest `notAfter` of `certificates` (read from `path`), in Unix seconds.
fn earliest_expiry(certificates: &[CertificateDer<'_>], path: &Path) -> Result<i64, TlsError> {
    let invalid = |reason: String| TlsError::Validity {
        path: path.display().to_string(),
        reason,
    };
    certificates
        .iter()
        .map(|der| {
            let (_, certificate) = x509_parser::parse_x509_certificate(der.as_ref())
                .map_err(|e| invalid(e.to_string_full()))?;
            Ok(certificate.validity().not_after.timestamp())
        })
        .try_fold(i64::MAX, |earliest, expiry: Result<i64, TlsError>| {
            Ok(earliest.min(expiry?))
        })
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source: rustls_pki_types::pem::Error::Io(source),
    })
}

/// The certificates in PEM read from `path`; at least one.
fn certificates_in(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_error(path))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.display().to_string(),
            what: "certificate",
        });
    }
    Ok(certs)
}

pub(crate) fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where a component's mutual-TLS material lies: the deployment's CA certificate and this
/// component's certificate and key (the `ca.crt`, `tls.crt` and `tls.key` of a Kubernetes
/// TLS Secret), and optionally more CA certificates to trust beside the deployment's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPaths {
    pub ca: PathBuf,
    /// PEM CA certificates trusted besides `ca`: during a CA rotation the other CA (the new
    /// one before certificates are reissued, the old one after), so that peers holding
    /// certificates from either keep talking.
    pub extra_ca: Option<PathBuf>,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsPaths {
    /// A configuration's `tls_ca`, `tls_cert` and `tls_key`: all three (mutual TLS on) or
    /// none (off); `tls_extra_ca` only with them.
    pub fn all_or_none(
        ca: &Option<PathBuf>,
        extra_ca: &Option<PathBuf>,
        cert: &Option<PathBuf>,
        key: &Option<PathBuf>,
    ) -> Result<Option<Self>, &'static str> {
        match (ca, cert, key) {
            (Some(ca), Some(cert), Some(key)) => Ok(Some(Self {
                ca: ca.clone(),
                extra_ca: extra_ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            })),
            (None, None, None) if extra_ca.is_some() => Err(
                "`tls_extra_ca` adds to the trust of mutual TLS: it needs `tls_cert` and `tls_key`",
            ),
            (None, None, None) => Ok(None),
            _ => {
                Err("`tls_cert` and `tls_key` must be given together: all three turn mutual TLS on")
            }
        }
    }
}

/// A component's mutual TLS: it serves only peers with a certificate from the CA, and
/// shows its own certificate to the peers it calls (over gRPC through
/// [`crate::grpc_client_tls::GrpcClientTls`], over QUIC through
/// [`crate::quic::reloading_client_config`], both made from [`MutualTls::paths`]).
#[derive(Clone)]
pub struct MutualTls {
    paths: TlsPaths,
    identity: Identity,
    trust: TrustRoots,
}

impl std::fmt::Debug for MutualTls {
    /// The key stays out of logs and panics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MutualTls")
            .field("certificates", &self.identity.cert_chain.len())
            .finish_non_exhaustive()
    }
}

impl MutualTls {
    /// Loads and checks the PEM files.
    pub fn load(paths: &TlsPaths) -> Result<Self, TlsError> {
        let mut trust = TrustRoots::from_pem_file(&paths.ca)?;
        if let Some(extra) = &paths.extra_ca {
            trust = trust.and(&TrustRoots::from_pem_file(extra)?);
        }
        Ok(Self {
            paths: paths.clone(),
            identity: Identity::from_pem_files(&paths.cert, &paths.key)?,
            trust,
        })
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The files it was loaded from.
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    pub fn trust(&self) -> &TrustRoots {
        &self.trust
    }

    /// When this component's certificate and the CA's expire (Unix seconds), labelled for
    /// the `hasten_tls_certificate_expiry_timestamp_seconds` gauge.
    pub fn expiries(&self) -> Result<Vec<(&'static str, i64)>, TlsError> {
        Ok(vec![
            ("certificate", self.identity.expires_at()?),
            ("ca", self.trust.expires_at()),
        ])
    }
}

/// [`MutualTls::expiries`] of a component whose mutual TLS may be off (then none).
pub fn expiries(tls: Option<&MutualTls>) -> Result<Vec<(&'static str, i64)>, TlsError> {
    Ok(tls
        .map(MutualTls::expiries)
        .transpose()?
        .unwrap_or_default())
}

/// A throwaway certificate authority for local runs and tests: issues certificates good for
/// both serving and calling (every Hasten component does both). The CA is valid for ten
/// years and what it issues for one, from a day before their making (clocks drift).
pub struct DevAuthority {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

/// A certificate and key issued by a [`DevAuthority`], as PEM.
pub struct IssuedCertificate {
    pub cert_pem: String,
    pub key_pem: String,
}

impl DevAuthority {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<Self, TlsError> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        set_validity(&mut params, CA_VALIDITY_DAYS);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate()?;
        let pem = params.self_signed(&key)?.pem();
        Ok(Self {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        })
    }

    /// The CA certificate, which every component trusts.
    pub fn ca_pem(&self) -> &str {
        &self.pem
    }

    /// A certificate for `names` (DNS names or IP addresses) with `common_name` as subject.
    pub fn issue(
        &self,
        common_name: &str,
        names: &[String],
    ) -> Result<IssuedCertificate, TlsError> {
        let mut params = rcgen::CertificateParams::new(names.to_vec())?;
        set_validity(&mut params, ISSUED_VALIDITY_DAYS);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes `ca.crt` and, for each component, `<component>.crt` and `<component>.key`
    /// (owner-only) into `dir`; returns each component's [`TlsPaths`].
    pub fn write_bundle(
        &self,
        dir: &Path,
        components: &[&str],
        names: &[String],
    ) -> Result<Vec<TlsPaths>, TlsError> {
        let write = |path: PathBuf, contents: &str, private: bool| -> Result<PathBuf, TlsError> {
            write_file(&path, contents, private).map_err(|source| TlsError::Write {
                path: path.display().to_string(),
                source,
            })?;
            Ok(path)
        };
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
            path: dir.display().to_string(),
            source,
        })?;
        let ca = write(dir.join("ca.crt"), &self.pem, false)?;
        components
            .iter()
            .map(|component| {
                let issued = self.issue(component, names)?;
                Ok(TlsPaths {
                    ca: ca.clone(),
                    extra_ca: None,
                    cert: write(
                        dir.join(format!("{component}.crt")),
                        &issued.cert_pem,
                        false,
                    )?,
                    key: write(dir.join(format!("{component}.key")), &issued.key_pem, true)?,
                })
            })
            .collect()
    }
}

const CA_VALIDITY_DAYS: i64 = 3650;
const ISSUED_VALIDITY_DAYS: i64 = 365;

fn set_validity(params: &mut rcgen::CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(days);
}

fn write_file(path: &Path, contents: &str, private: bool) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    options.open(path)?.write_all(contents.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed_until(year: i32, month: u8, day: u8) -> String {
        let mut params = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem()
    }

    #[test]
    fn the_earliest_certificate_of_a_file_sets_its_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bundle.pem");
        let pem = format!(
            "{}{}",
            self_signed_until(2031, 5, 17),
            self_signed_until(2029, 1, 2)
        );
        std::fs::write(&path, pem).unwrap();
        // 2029-01-02T00:00:00Z.
        assert_eq!(
            TrustRoots::from_pem_file(&path).unwrap().expires_at(),
            1_862_006_400
        );
        let key = dir.path().join("key.pem");
        std::fs::write(&key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let identity = Identity::from_pem_files(&path, &key).unwrap();
        assert_eq!(identity.expires_at().unwrap(), 1_862_006_400);
    }

    #[test]
    fn issued_certificates_lead_to_their_authority_only() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["localhost".to_string()];
        let ours = DevAuthority::new("ours").unwrap();
        let paths = ours.write_bundle(dir.path(), &["edge"], &names).unwrap();
        let tls = MutualTls::load(&paths[0]).unwrap();

        let verify = |roots: &TrustRoots| {
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.store(),
                crypto_provider(),
            )
            .build()
            .unwrap()
            .verify_client_cert(
                &tls.identity().cert_chain[0],
                &[],
                rustls_pki_types::UnixTime::now(),
            )
            .map(|_| ())
        };
        assert!(verify(tls.trust()).is_ok());

        let other_dir = tempfile::tempdir().unwrap();
        let theirs = DevAuthority::new("theirs").unwrap();
        let other = theirs
            .write_bundle(other_dir.path(), &["edge"], &names)
            .unwrap();
        let their_roots = TrustRoots::from_pem_file(&other[0].ca).unwrap();
        assert!(verify(&their_roots).is_err());
    }

    #[test]
    fn extra_cas_are_trusted_beside_the_deployments_ca() {
        let names = vec!["localhost".to_string()];
        let (old_dir, new_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let old = DevAuthority::new("old").unwrap();
        let new = DevAuthority::new("new").unwrap();
        let ours = old
            .write_bundle(old_dir.path(), &["edge"], &names)
            .unwrap()
            .remove(0);
        let reissued = new
            .write_bundle(new_dir.path(), &["edge"], &names)
            .unwrap()
            .remove(0);
        let reissued_tls = MutualTls::load(&reissued).unwrap();
        let accepts = |paths: &TlsPaths| {
            let tls = MutualTls::load(paths).unwrap();
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                tls.trust().store(),
                crypto_provider(),
            )
            .build()
            .unwrap()
            .verify_client_cert(
                &reissued_tls.identity().cert_chain[0],
                &[],
                rustls_pki_types::UnixTime::now(),
            )
            .is_ok()
        };
        assert!(
            !accepts(&ours),
            "another CA's certificate without the extra CA"
        );
        let rotating = TlsPaths {
            extra_ca: Some(reissued.ca.clone()),
            ..ours.clone()
        };
        assert!(accepts(&rotating));
        // The trust of the rotating component holds both CAs.
        let both = MutualTls::load(&rotating).unwrap();
        assert_eq!(both.trust().store().roots.len(), 2);
        assert!(
            TlsPaths::all_or_none(&None, &Some(reissued.ca.clone()), &None, &None)
                .unwrap_err()
                .contains("tls_extra_ca")
        );
    }

    #[test]
    fn a_missing_or_empty_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = TrustRoots::from_pem_file(&empty)
            .unwrap_err()
            .to_string_full();
        assert!(err.contains("empty.pem"), "{err}");
        let missing = dir.path().join("missing.pem");
        let err = TrustRoots::from_pem_file(&missing)
            .unwrap_err()
            .to_string_full();
        assert!(err.contains("missing.pem"), "{err}");
    }
}
