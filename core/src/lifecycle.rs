//! What every Hasten server does as a process: announce readiness through a ready file and
//! stop cleanly on Ctrl-C or SIGTERM.

use display_full_error::DisplayFullErrorExt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Writes `contents` to `path` through a staging file and a rename, so a reader (a test, a
/// script, a probe) never sees a half-written ready file.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    write_through_staging(path, contents, None)
}

/// [`write_atomically`] for a secret (a private key): readable and writable by its owner
/// only, from the moment the file exists.
pub fn write_owner_only_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    write_through_staging(path, contents, Some(0o600))
}

fn write_through_staging(path: &Path, contents: &[u8], mode: Option<u32>) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let staging = path.with_extension("partial");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if let Some(mode) = mode {
        options.mode(mode);
    }
    let mut file = options.open(&staging)?;
    // A staging file left by a crash keeps the mode it was created with.
    if let Some(mode) = mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    file.write_all(contents)?;
    drop(file);
    std::fs::rename(&staging, path)
}

/// Resolves on Ctrl-C or SIGTERM (what Kubernetes sends before killing a pod).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err.display_full(), "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err.display_full(), "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_creates_parents_and_leaves_no_staging_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/ready.json");
        write_atomically(&path, b"{\"a\":1}").unwrap();
        write_atomically(&path, b"{\"a\":2}").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":2}");
        assert!(!path.with_extension("partial").exists());
    }

    #[test]
    fn a_secret_is_owner_only_even_over_a_file_others_could_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.key");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(path.with_extension("partial"), "left by a crash").unwrap();
        write_owner_only_atomically(&path, b"secret").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "secret");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
