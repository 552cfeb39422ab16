//! The soak's processes: restartable and freezable, with the pids of frozen ones on disk.

use display_full_error::DisplayFullErrorExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use hasten_eval::process::ManagedProcess;
use hasten_loadtest::control_plane::free_loopback_port;

const START_TIMEOUT: Duration = Duration::from_secs(300);
/// Where the pids of frozen processes are kept while they are frozen.
pub(crate) const STOPPED_PIDS: &str = "stopped.pids";

/// A process that can be stopped and started again with the same arguments (and so the same
/// ports and data directory), or frozen and resumed. Dropping it resumes it if frozen, then
/// kills it.
pub(crate) struct Restartable {
    pub(crate) name: String,
    binary: PathBuf,
    args: Vec<String>,
    work: PathBuf,
    pub(crate) process: Option<ManagedProcess>,
    /// Frozen with SIGSTOP and not yet resumed.
    frozen: bool,
}

impl Restartable {
    pub(crate) fn start(
        name: &str,
        binary: PathBuf,
        args: Vec<String>,
        work: &Path,
    ) -> Result<Self> {
        let mut restartable = Self {
            name: name.to_string(),
            binary,
            args,
            work: work.to_path_buf(),
            process: None,
            frozen: false,
        };
        restartable.restart()?;
        Ok(restartable)
    }

    pub(crate) fn restart(&mut self) -> Result<()> {
        self.kill();
        // Start-up blocks until the process is ready; keep the load's worker threads free.
        let process = tokio::task::block_in_place(|| {
            ManagedProcess::start(
                &self.name,
                &self.binary,
                &self.args,
                &self.work,
                START_TIMEOUT,
            )
        })
        .with_context(|| format!("starting {}", self.name))?;
        self.process = Some(process);
        Ok(())
    }

    pub(crate) fn kill(&mut self) {
        self.resume_quietly();
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }

    /// Freezes the process (SIGSTOP): it keeps its sockets open and answers nothing, as a
    /// hung process does.
    pub(crate) fn freeze(&mut self) -> Result<()> {
        let process = self
            .process
            .as_ref()
            .with_context(|| format!("{} is not running; it cannot be frozen", self.name))?;
        // Recorded first, so that a wrapper can resume it whatever happens next.
        note_stopped(&self.work, process.pid(), &self.name, true);
        if let Err(err) = process.signal("STOP") {
            note_stopped(&self.work, process.pid(), &self.name, false);
            return Err(err).with_context(|| format!("freezing {}", self.name));
        }
        self.frozen = true;
        Ok(())
    }

    /// Lets a frozen process run again (SIGCONT).
    pub(crate) fn resume(&mut self) -> Result<()> {
        if !self.frozen {
            return Ok(());
        }
        if let Some(process) = &self.process {
            process
                .signal("CONT")
                .with_context(|| format!("resuming {}", self.name))?;
            note_stopped(&self.work, process.pid(), &self.name, false);
        }
        self.frozen = false;
        Ok(())
    }

    fn resume_quietly(&mut self) {
        if let Err(err) = self.resume() {
            tracing::warn!(error = %err.display_full(), "a frozen process could not be resumed; it is killed");
            self.frozen = false;
        }
    }

    pub(crate) fn addr(&self, key: &str) -> String {
        self.process
            .as_ref()
            .map(|p| p.addr(key))
            .unwrap_or_default()
    }

    pub(crate) fn log(&self) -> Option<PathBuf> {
        self.process.as_ref().map(|p| p.log.clone())
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        // Resumed before it is killed (dropping the `ManagedProcess`), so that no stopped
        // process outlives the soak.
        self.resume_quietly();
    }
}

/// Adds (`stopped`) or removes the line of `pid` in `<work>/stopped.pids`.
fn note_stopped(work: &Path, pid: u32, name: &str, stopped: bool) {
    let path = work.join(STOPPED_PIDS);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|line| line.split_whitespace().next() != Some(pid.to_string().as_str()))
        .map(str::to_string)
        .collect();
    if stopped {
        lines.push(format!("{pid} {name}"));
    }
    let result = if lines.is_empty() {
        std::fs::remove_file(&path).or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        })
    } else {
        std::fs::write(&path, lines.join("\n") + "\n")
    };
    if let Err(err) = result {
        tracing::warn!(error = %err.display_full(), path = %path.display(), "cannot record a frozen process");
    }
}

pub(crate) fn fixed_address() -> Result<String> {
    Ok(format!("127.0.0.1:{}", free_loopback_port()?))
}

/// Resolves on the first SIGINT, SIGTERM or SIGHUP.
pub(crate) async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}
