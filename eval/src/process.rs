//! Hasten's binaries as managed child processes: started with `--ready-file`, awaited until
//! they report their bound addresses, killed when dropped. The evaluation and the
//! integration tests both run the system this way, as real processes on real sockets.

use display_full_error::DisplayFullErrorExt;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hasten_proto::tls::TlsPaths;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(
        "{0} is missing: build the workspace binaries first (`cargo build --workspace --bins`)"
    )]
    MissingBinary(String),
    #[error("cannot start {name}")]
    Spawn {
        name: String,
        source: std::io::Error,
    },
    #[error("{name} exited with {status} during start-up; last log lines:\n{log}")]
    Exited {
        name: String,
        status: String,
        log: String,
    },
    #[error("{name} not ready after {timeout:?}; last log lines:\n{log}")]
    Timeout {
        name: String,
        timeout: Duration,
        log: String,
    },
    #[error("{name} wrote an unreadable ready file: {message}")]
    ReadyFile { name: String, message: String },
}

/// Where the workspace binaries are: beside the running executable (`target/<profile>/`),
/// or its parent when the executable is a test in `target/<profile>/deps/`.
pub fn binary(name: &str) -> Result<PathBuf, ProcessError> {
    let exe = std::env::current_exe()
        .map_err(|e| ProcessError::MissingBinary(format!("{name} ({})", e.display_full())))?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(ProcessError::MissingBinary(path.display().to_string()))
    }
}

/// Resident memory of process `pid` from `/proc/<pid>/status` (Linux), in bytes.
pub fn resident_bytes_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Lines of a process's log quoted in an error.
const LOG_LINES: usize = 20;

/// A running Hasten process; killed when dropped.
#[derive(Debug)]
pub struct ManagedProcess {
    pub name: String,
    child: Child,
    /// The JSON the process wrote to its ready file (its bound addresses).
    pub ready: serde_json::Value,
    pub log: PathBuf,
}

impl ManagedProcess {
    /// Starts `bin` with `args` plus `--ready-file`, stderr to `<work>/<name>.log`, and waits
    /// until the ready file appears.
    pub fn start<I, S>(
        name: &str,
        bin: &Path,
        args: I,
        work: &Path,
        timeout: Duration,
    ) -> Result<Self, ProcessError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let ready_file = work.join(format!("{name}.ready.json"));
        let log = work.join(format!("{name}.log"));
        let spawn_error = |source| ProcessError::Spawn {
            name: name.to_string(),
            source,
        };
        let _ = std::fs::remove_file(&ready_file);
        let log_file = std::fs::File::create(&log).map_err(spawn_error)?;
        let child = Command::new(bin)
            .args(args)
            .arg("--ready-file")
            .arg(&ready_file)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(spawn_error)?;
        let mut process = Self {
            name: name.to_string(),
            child,
            ready: serde_json::Value::Null,
            log,
        };
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready_file) {
                process.ready =
                    serde_json::from_str(&text).map_err(|e| ProcessError::ReadyFile {
                        name: name.to_string(),
                        message: e.to_string_full(),
                    })?;
                return Ok(process);
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                return Err(ProcessError::Exited {
                    name: name.to_string(),
                    status: status.to_string(),
                    log: process.exit_report(),
                });
            }
            if started.elapsed() > timeout {
                return Err(ProcessError::Timeout {
                    name: name.to_string(),
                    timeout,
                    log: process.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A bound address from the ready file (`quic_addr`, `grpc_addr`, `http_addr`).
    pub fn addr(&self, key: &str) -> String {
        self.ready[key].as_str().unwrap_or_default().to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory from `/proc/<pid>/status` (Linux), in bytes.
    pub fn resident_bytes(&self) -> Option<u64> {
        resident_bytes_of(self.pid())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_LINES)..].join("\n")
    }

    /// What a process that exited said: its log from the last error report on (`Error:`
    /// from a binary's `main`, or a panic), since with `RUST_BACKTRACE` set the log's last
    /// lines are only the backtrace; the log's tail when it reported none.
    fn exit_report(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        match lines
            .iter()
            .rposition(|line| line.starts_with("Error:") || line.contains("panicked at"))
        {
            Some(report) => lines[report..]
                .iter()
                .take(LOG_LINES)
                .copied()
                .collect::<Vec<_>>()
                .join("\n"),
            None => self.log_tail(),
        }
    }

    /// Kills the process and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (`TERM`, `STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, signal: &str) -> std::io::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "kill -{signal} {} failed: {status}",
                self.pid()
            )))
        }
    }

    /// Asks the process to stop (SIGTERM) and waits up to `limit` for it to exit; returns
    /// its exit status, or `None` if it was still running (it is then killed).
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        if self.signal("TERM").is_err() {
            return self.child.try_wait().ok().flatten();
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        None
    }

    /// Waits up to `limit` for the process to exit by itself; returns its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The flags that turn mutual TLS on for any Hasten binary.
pub fn tls_args(paths: &TlsPaths) -> Vec<String> {
    [
        ("--tls-ca", Some(&paths.ca)),
        ("--tls-extra-ca", paths.extra_ca.as_ref()),
        ("--tls-cert", Some(&paths.cert)),
        ("--tls-key", Some(&paths.key)),
    ]
    .into_iter()
    .filter_map(|(flag, path)| Some([flag.to_string(), path?.display().to_string()]))
    .flatten()
    .collect()
}

/// `cloud-index serve` flags over `bundle` (a whole corpus or a shard): QUIC on any loopback
/// port, gRPC on `grpc_addr` (port 0: any), the dev certificate written to `cert`.
pub fn cloud_index_serve_args(bundle: &Path, grpc_addr: &str, cert: &Path) -> Vec<String> {
    vec![
        "serve".into(),
        "--bundle".into(),
        bundle.display().to_string(),
        "--quic-addr".into(),
        "127.0.0.1:0".into(),
        "--grpc-addr".into(),
        grpc_addr.into(),
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
        "--dev-cert-out".into(),
        cert.display().to_string(),
    ]
}

/// `kv-worker serve` flags over `store` with `model`, gRPC and metrics on any loopback port.
pub fn kv_worker_serve_args(model: &Path, store: &Path) -> Vec<String> {
    vec![
        "serve".into(),
        "--grpc-addr".into(),
        "127.0.0.1:0".into(),
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
        "--model".into(),
        model.display().to_string(),
        "--store".into(),
        store.display().to_string(),
    ]
}

/// `cloud-index route` flags over `shards` (each shard's replica endpoints), writing its dev
/// certificate to `cert`; QUIC, gRPC and metrics on any loopback port.
pub fn cloud_index_route_args(shards: &[Vec<String>], cert: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "route",
        "--quic-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--dev-cert-out",
    ]
    .map(String::from)
    .to_vec();
    args.push(cert.display().to_string());
    for replicas in shards {
        args.extend(["--shard".into(), replicas.join(",")]);
    }
    args
}

/// `edge-node serve` flags over `bundle` with the encoder in `model_dir`, falling back to
/// the cloud at `cloud_addr` (QUIC, trusting `cloud_ca`); HTTP and gRPC on any loopback port.
pub fn edge_serve_args(
    bundle: &Path,
    model_dir: &Path,
    cloud_addr: &str,
    cloud_ca: &Path,
) -> Vec<String> {
    vec![
        "serve".into(),
        "--bundle".into(),
        bundle.display().to_string(),
        "--model-dir".into(),
        model_dir.display().to_string(),
        "--cloud-addr".into(),
        cloud_addr.into(),
        "--cloud-ca".into(),
        cloud_ca.display().to_string(),
        "--http-addr".into(),
        "127.0.0.1:0".into(),
        "--grpc-addr".into(),
        "127.0.0.1:0".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_exits_at_start_is_reported_from_its_error_not_its_backtrace() {
        let work = tempfile::tempdir().unwrap();
        let script = "echo starting >&2; echo 'Error: binding 127.0.0.1:7400' >&2; \
                      for i in $(seq 1 40); do echo \"  $i: frame\" >&2; done; exit 1";
        let err = ManagedProcess::start(
            "failing",
            Path::new("/bin/sh"),
            ["-c", script],
            work.path(),
            Duration::from_secs(10),
        )
        .unwrap_err();
        let ProcessError::Exited { log, .. } = err else {
            panic!("expected an exit, got {err}");
        };
        assert!(log.starts_with("Error: binding 127.0.0.1:7400"), "{log}");
        assert_eq!(log.lines().count(), LOG_LINES);
    }
}
