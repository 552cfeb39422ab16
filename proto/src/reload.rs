//! TLS material read again from its files when they change, so that a renewed certificate
//! or a rotated CA (cert-manager rewriting a mounted Secret, an operator replacing the files)
//! is used from the next handshake without a restart: a server's certificate
//! ([`ReloadingCertificate`]), and a client's whole configuration, the certificate it shows
//! and the CAs it trusts ([`crate::quic::reloading_client_config`]).
//!
//! The files are looked at, at most once a second, by the handshake that needs them: no
//! watcher thread, and a Secret volume's atomic symlink swap is seen as it lands. Files that
//! cannot be read or do not fit together (a key written before its certificate, say) are
//! reported and the material in use stays.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::tls::{Identity, TlsError, crypto_provider};

/// How often a handshake may look at the files.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What a look at the files found, for the caller's metrics and logs.
#[derive(Debug)]
pub enum ReloadOutcome<'a> {
    /// The files changed and are now used; the new certificate expires then (Unix seconds).
    Reloaded { expires_at: i64 },
    /// The files changed but cannot be used; the previous material stays.
    Failed(&'a TlsError),
}

impl<'a> ReloadOutcome<'a> {
    /// The outcome as metrics and logs take it: the new certificate's expiry, or why the
    /// files cannot be used.
    pub fn result(&self) -> Result<i64, &'a (dyn std::error::Error + 'static)> {
        match *self {
            Self::Reloaded { expires_at } => Ok(expires_at),
            Self::Failed(err) => Err(err),
        }
    }
}

type OnReload = Box<dyn Fn(ReloadOutcome<'_>) + Send + Sync>;
type Read<T> = Box<dyn Fn() -> Result<(T, i64), TlsError> + Send + Sync>;

/// A value made from files, as they are now: made again when one of their modification
/// times changes.
pub struct Reloading<T> {
    paths: Vec<PathBuf>,
    read: Read<T>,
    on_reload: OnReload,
    state: Mutex<State<T>>,
}

struct State<T> {
    current: Arc<T>,
    /// The files' modification times when `current` was read (or last refused).
    stamps: Vec<Option<SystemTime>>,
    checked: Instant,
}

/// A server's (or client's) certificate and key, read again when they change.
pub type ReloadingCertificate = Reloading<CertifiedKey>;

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl<T> Reloading<T> {
    /// Makes the value from `paths` now with `read` (an error if it cannot), which returns
    /// it with the expiry to report; `on_reload` hears of every later change.
    pub fn from_files(
        paths: Vec<PathBuf>,
        read: impl Fn() -> Result<(T, i64), TlsError> + Send + Sync + 'static,
        on_reload: impl Fn(ReloadOutcome<'_>) + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let stamps = paths.iter().map(|p| modified(p)).collect();
        let (current, _) = read()?;
        Ok(Self {
            paths,
            read: Box::new(read),
            on_reload: Box::new(on_reload),
            state: Mutex::new(State {
                current: Arc::new(current),
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The value to use now, made again first when the files changed.
    pub fn current(&self) -> Arc<T> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.checked.elapsed() >= CHECK_INTERVAL {
            state.checked = Instant::now();
            let stamps: Vec<_> = self.paths.iter().map(|p| modified(p)).collect();
            if stamps != state.stamps {
                state.stamps = stamps;
                match (self.read)() {
                    Ok((fresh, expires_at)) => {
                        state.current = Arc::new(fresh);
                        (self.on_reload)(ReloadOutcome::Reloaded { expires_at });
                    }
                    Err(err) => (self.on_reload)(ReloadOutcome::Failed(&err)),
                }
            }
        }
        Arc::clone(&state.current)
    }
}

/// The pair as rustls uses it, and when its certificate expires.
fn certified(identity: Identity) -> Result<(CertifiedKey, i64), TlsError> {
    let expires_at = identity.expires_at()?;
    let certified = CertifiedKey::from_der(identity.cert_chain, identity.key, &crypto_provider())
        .map_err(TlsError::KeyMismatch)?;
    Ok((certified, expires_at))
}

impl ReloadingCertificate {
    /// Reads the pair now (an error if it cannot be used); `on_reload` hears of every
    /// later change.
    pub fn load(
        cert: &Path,
        key: &Path,
        on_reload: impl Fn(ReloadOutcome<'_>) + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let (cert, key) = (cert.to_path_buf(), key.to_path_buf());
        Self::from_files(
            vec![cert.clone(), key.clone()],
            move || Identity::from_pem_files(&cert, &key).and_then(certified),
            on_reload,
        )
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn write(dir: &Path, names: &[&str]) -> Vec<u8> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let generated = Identity::generate_self_signed(&names).unwrap();
        std::fs::write(dir.join("tls.crt"), &generated.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &generated.key_pem).unwrap();
        generated.identity.cert_chain[0].to_vec()
    }

    #[test]
    fn a_changed_pair_serves_after_the_interval_and_a_broken_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let first = write(dir.path(), &["localhost"]);
        let (reloads, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (r, f) = (Arc::clone(&reloads), Arc::clone(&failures));
        let served = ReloadingCertificate::load(
            &dir.path().join("tls.crt"),
            &dir.path().join("tls.key"),
            move |outcome| {
                let count = match outcome {
                    ReloadOutcome::Reloaded { .. } => &r,
                    ReloadOutcome::Failed(_) => &f,
                };
                count.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        let leaf = |c: &ReloadingCertificate| c.current().cert[0].to_vec();
        assert_eq!(leaf(&served), first);

        std::thread::sleep(Duration::from_millis(20));
        let second = write(dir.path(), &["localhost"]);
        assert_eq!(leaf(&served), first, "looked at before the interval");
        std::thread::sleep(CHECK_INTERVAL);
        assert_eq!(leaf(&served), second);
        assert_eq!(reloads.load(Ordering::SeqCst), 1);

        // A key that is not the certificate's: refused, the second pair stays.
        std::thread::sleep(CHECK_INTERVAL);
        let other = Identity::generate_self_signed(&["localhost".into()]).unwrap();
        std::fs::write(dir.path().join("tls.key"), other.key_pem).unwrap();
        assert_eq!(leaf(&served), second);
        assert_eq!(failures.load(Ordering::SeqCst), 1);
    }
}
