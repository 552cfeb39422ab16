//! Copying a corpus version from a pool's shared origin store onto a worker's own disk
//! (`kv-worker sync`): what a worker runs before it serves a newly preprocessed version.
//! Each file is written atomically and files already present with the same length are
//! skipped (entries are immutable per key, and every read checks its checksum), so an
//! interrupted sync resumes. Catalogs go last: a version counts as held only once its
//! entries are in.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::StoreError;

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// Models whose directory held the version.
    pub models: usize,
    pub copied: usize,
    pub skipped: usize,
    pub bytes_copied: u64,
}

const CATALOG: &str = "catalog.json";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Copies corpus `version` of every model in `origin` into `store`; `progress(done, total)`
/// after each file. A version that no model in `origin` holds is an error (a worker must not
/// start serving a version it does not have).
pub fn sync_version(
    origin: &Path,
    store: &Path,
    version: &str,
    mut progress: impl FnMut(usize, usize),
) -> Result<SyncReport, StoreError> {
    if version.is_empty() || version.contains(['/', '\\']) || version.starts_with('.') {
        return Err(StoreError::Sync(format!(
            "corpus version {version:?} is not a directory name"
        )));
    }
    let mut files: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut catalogs = Vec::new();
    let mut report = SyncReport::default();
    for model in std::fs::read_dir(origin).map_err(io(origin))? {
        let model = model.map_err(io(origin))?;
        let source_dir = model.path().join(version);
        if !source_dir.is_dir() {
            continue;
        }
        report.models += 1;
        let target_dir = store.join(model.file_name()).join(version);
        for entry in std::fs::read_dir(&source_dir).map_err(io(&source_dir))? {
            let entry = entry.map_err(io(&source_dir))?;
            if !entry.file_type().map_err(io(&source_dir))?.is_file() {
                continue;
            }
            let pair = (entry.path(), target_dir.join(entry.file_name()));
            if entry.file_name() == CATALOG {
                catalogs.push(pair);
            } else {
                files.push(pair);
            }
        }
    }
    if report.models == 0 {
        return Err(StoreError::Sync(format!(
            "the origin store {} holds no corpus version {version}",
            origin.display()
        )));
    }
    files.sort();
    files.extend(catalogs);
    let total = files.len();
    for (done, (source, target)) in files.iter().enumerate() {
        let length = std::fs::metadata(source).map_err(io(source))?.len();
        if std::fs::metadata(target).is_ok_and(|meta| meta.len() == length) {
            report.skipped += 1;
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            let bytes = std::fs::read(source).map_err(io(source))?;
            hasten_core::lifecycle::write_atomically(target, &bytes).map_err(io(target))?;
            report.copied += 1;
            report.bytes_copied += length;
        }
        progress(done + 1, total);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn copies_one_version_resumes_and_refuses_a_missing_one() {
        let origin = tempfile::tempdir().unwrap();
        let store = tempfile::tempdir().unwrap();
        let o = origin.path();
        write(&o.join("m1/v1/1.fr.kv"), b"entry one");
        write(&o.join("m1/v1/catalog.json"), b"{}");
        write(&o.join("m1/v2/1.fr.kv"), b"other version");
        write(&o.join("m2/v1/7.sim.kv"), b"second model");

        let report = sync_version(o, store.path(), "v1", |_, _| {}).unwrap();
        assert_eq!((report.models, report.copied, report.skipped), (2, 3, 0));
        assert_eq!(
            std::fs::read(store.path().join("m1/v1/1.fr.kv")).unwrap(),
            b"entry one"
        );
        assert!(store.path().join("m1/v1/catalog.json").is_file());
        assert!(
            !store.path().join("m1/v2").exists(),
            "only the asked version"
        );

        // A torn copy (another length) is copied again; intact ones are skipped.
        std::fs::write(store.path().join("m2/v1/7.sim.kv"), b"sec").unwrap();
        let mut seen = Vec::new();
        let again = sync_version(o, store.path(), "v1", |done, total| {
            seen.push((done, total))
        })
        .unwrap();
        assert_eq!((again.copied, again.skipped), (1, 2));
        assert_eq!(seen.last(), Some(&(3, 3)));
        assert_eq!(
            std::fs::read(store.path().join("m2/v1/7.sim.kv")).unwrap(),
            b"second model"
        );

        assert!(sync_version(o, store.path(), "v9", |_, _| {}).is_err());
        assert!(sync_version(o, store.path(), "../m1", |_, _| {}).is_err());
    }
}
