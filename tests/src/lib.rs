//! Harness for the integration tests: locate the built binaries, start them as real
//! processes on loopback ports, wait until they report ready, stop them on drop.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hasten_core::corpus::Document;

/// The workspace root (this crate lives in `tests/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Directory of the built binaries: the test executable runs from `<target>/<profile>/deps`.
fn binary_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("test executable has no grandparent directory")
}

/// Path of a workspace binary, which must have been built (`make test` builds them first).
pub fn binary(name: &str) -> Result<PathBuf> {
    let path = binary_dir()?.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` first (make test does)",
            path.display()
        );
    }
    Ok(path)
}

/// A scratch directory under the target directory that survives between runs, so corpus
/// bundles are encoded once and reused (the bundle build's own reuse path).
pub fn persistent_work_dir(name: &str) -> Result<PathBuf> {
    let dir = binary_dir()?.join("..").join("hasten-tests").join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub fn model_dir() -> PathBuf {
    std::env::var_os("HASTEN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(hasten_core::encoder::DEFAULT_MODEL_DIR))
}

/// `../shared/data` next to the workspace, or `HASTEN_DATA_DIR`.
pub fn data_dir() -> PathBuf {
    std::env::var_os("HASTEN_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("..").join("shared").join("data"))
}

/// A running service; killed when dropped.
pub struct Service {
    pub name: String,
    child: Child,
    /// The JSON the service wrote to its ready file (bound addresses).
    pub ready: serde_json::Value,
    pub log: PathBuf,
}

impl Service {
    /// Starts `bin` with `args` plus `--ready-file`, and waits for the ready file.
    pub fn start<I, S>(
        name: &str,
        bin: &Path,
        args: I,
        work: &Path,
        timeout: Duration,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let ready_file = work.join(format!("{name}.ready.json"));
        let log = work.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&ready_file);
        let log_file = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(args)
            .arg("--ready-file")
            .arg(&ready_file)
            .env("HASTEN_MODEL_DIR", model_dir())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut service = Self {
            name: name.to_string(),
            child,
            ready: serde_json::Value::Null,
            log,
        };
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready_file) {
                service.ready = serde_json::from_str(&text)?;
                return Ok(service);
            }
            if let Some(status) = service.child.try_wait()? {
                bail!(
                    "{name} exited with {status} during start-up:\n{}",
                    service.log_tail()
                );
            }
            if started.elapsed() > timeout {
                bail!(
                    "{name} not ready after {timeout:?}:\n{}",
                    service.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A bound address from the ready file (`quic_addr`, `grpc_addr`, `http_addr`).
    pub fn addr(&self, key: &str) -> String {
        self.ready[key].as_str().unwrap_or_default().to_string()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Kills the process and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes a SQuAD-format file holding the first `articles` articles of `source`.
pub fn squad_subset(source: &Path, articles: usize, out: &Path) -> Result<()> {
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(source)?)?;
    let data = json["data"]
        .as_array_mut()
        .context("SQuAD file without data")?;
    data.truncate(articles);
    std::fs::write(out, serde_json::to_string(&json)?)?;
    Ok(())
}

/// Exact top-k by brute force (plain Rust, no faiss): `(id, score)` best first.
pub fn brute_force_top_k(
    documents: &[Document],
    vectors: &[f32],
    query: &[f32],
    k: usize,
) -> Vec<(u64, f32)> {
    let d = query.len();
    let mut scored: Vec<(u64, f32)> = documents
        .iter()
        .zip(vectors.chunks(d))
        .map(|(doc, v)| (doc.id, v.iter().zip(query).map(|(a, b)| a * b).sum()))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.truncate(k);
    scored
}
