//! The self-signed certificate a cloud server (shard or router) generates for local runs
//! when it is given none, kept across restarts. Clients read the certificate file once, at
//! start (an edge's `cloud_ca`): a server that made a new pair on every start failed every
//! client's handshake (`BadSignature`) until the client was restarted too. The key is kept
//! beside the certificate (`<dev_cert_out>.key`, owner-only), and the pair is reused while
//! both parse, belong together and the certificate is valid for every configured name.

use std::path::{Path, PathBuf};

use hasten_core::lifecycle::{write_atomically, write_owner_only_atomically};
use hasten_proto::tls::{Identity, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum DevCertError {
    #[error("generating the dev certificate")]
    Generate(#[source] TlsError),
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where a server's dev certificate came from.
#[derive(Debug)]
pub enum DevCertOrigin {
    /// The pair on disk, from an earlier start.
    Reused,
    /// Generated: there was none.
    Created,
    /// Generated in place of a pair that could not be reused, for the reason given.
    Replaced(TlsError),
}

/// A server's dev certificate and key.
#[derive(Debug)]
pub struct DevCertificate {
    pub identity: Identity,
    pub origin: DevCertOrigin,
}

/// Where the key of the dev certificate at `cert` is kept.
pub fn key_path(cert: &Path) -> PathBuf {
    let mut path = cert.as_os_str().to_owned();
    path.push(".key");
    PathBuf::from(path)
}

impl DevCertificate {
    /// The pair at `cert` and [`key_path`]`(cert)` when it can serve `names`; otherwise a
    /// new self-signed pair for `names`, written there (the key owner-only, and before the
    /// certificate: a client must never be handed a certificate whose key was not kept).
    pub fn load_or_generate(cert: &Path, names: &[String]) -> Result<Self, DevCertError> {
        let key = key_path(cert);
        let origin = if cert.exists() || key.exists() {
            match reusable(cert, &key, names) {
                Ok(identity) => {
                    return Ok(Self {
                        identity,
                        origin: DevCertOrigin::Reused,
                    });
                }
                Err(why) => DevCertOrigin::Replaced(why),
            }
        } else {
            DevCertOrigin::Created
        };
        let fresh = Identity::generate_self_signed(names).map_err(DevCertError::Generate)?;
        let write = |path: &Path, result: std::io::Result<()>| {
            result.map_err(|source| DevCertError::Write {
                path: path.to_path_buf(),
                source,
            })
        };
        write(
            &key,
            write_owner_only_atomically(&key, fresh.key_pem.as_bytes()),
        )?;
        write(cert, write_atomically(cert, fresh.cert_pem.as_bytes()))?;
        Ok(Self {
            identity: fresh.identity,
            origin,
        })
    }
}

/// The pair on disk, if it parses, its key is the certificate's, and a client trusting the
/// certificate accepts it for every one of `names`.
fn reusable(cert: &Path, key: &Path, names: &[String]) -> Result<Identity, TlsError> {
    let identity = Identity::from_pem_files(cert, key)?;
    identity.check_self_signed_for(names)?;
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn names(extra: &[&str]) -> Vec<String> {
        ["localhost", "127.0.0.1"]
            .iter()
            .chain(extra)
            .map(|n| n.to_string())
            .collect()
    }

    #[test]
    fn a_generated_pair_is_kept_owner_only_and_reused_on_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("run/cloud-dev-cert.pem");
        let first = DevCertificate::load_or_generate(&cert, &names(&[])).unwrap();
        assert!(matches!(first.origin, DevCertOrigin::Created), "{first:?}");
        let mode = std::fs::metadata(key_path(&cert))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let again = DevCertificate::load_or_generate(&cert, &names(&[])).unwrap();
        assert!(matches!(again.origin, DevCertOrigin::Reused), "{again:?}");
        assert_eq!(again.identity.cert_chain, first.identity.cert_chain);
    }

    #[test]
    fn a_pair_that_cannot_serve_is_replaced_and_the_reason_given() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cloud-dev-cert.pem");
        let first = DevCertificate::load_or_generate(&cert, &names(&[])).unwrap();

        // A name the certificate does not cover.
        let renamed = DevCertificate::load_or_generate(&cert, &names(&["cloud.test"])).unwrap();
        assert!(
            matches!(&renamed.origin, DevCertOrigin::Replaced(TlsError::NotValidFor { name, .. }) if name == "cloud.test"),
            "{renamed:?}"
        );
        assert_ne!(renamed.identity.cert_chain, first.identity.cert_chain);
        let kept = DevCertificate::load_or_generate(&cert, &names(&["cloud.test"])).unwrap();
        assert!(matches!(kept.origin, DevCertOrigin::Reused), "{kept:?}");

        // Another pair's key.
        let stranger = dir.path().join("stranger.pem");
        DevCertificate::load_or_generate(&stranger, &names(&[])).unwrap();
        std::fs::copy(key_path(&stranger), key_path(&cert)).unwrap();
        let rekeyed = DevCertificate::load_or_generate(&cert, &names(&[])).unwrap();
        assert!(
            matches!(
                rekeyed.origin,
                DevCertOrigin::Replaced(TlsError::KeyMismatch(_))
            ),
            "{rekeyed:?}"
        );

        // A certificate without its key (written by a version that did not keep it).
        std::fs::remove_file(key_path(&cert)).unwrap();
        let keyless = DevCertificate::load_or_generate(&cert, &names(&[])).unwrap();
        assert!(
            matches!(
                keyless.origin,
                DevCertOrigin::Replaced(TlsError::Read { .. })
            ),
            "{keyless:?}"
        );
        assert!(key_path(&cert).exists());
    }
}
