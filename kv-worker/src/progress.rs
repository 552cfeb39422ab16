//! How `kv-worker preprocess` reports its progress: a bar per step on a terminal, and
//! otherwise (a Job's pod, CI) one JSON line on stderr per step start, every few seconds and
//! at each step's end. The operator reads the last such line from the preprocessing pod's
//! log into the pool's status while the Job runs, so the line is a contract:
//! `{"preprocessing":{"step":"similarity","done":120,"total":200},"chunks_per_s":1.1,"left_s":73}`.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use hasten_core::progress::ProgressPace;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::preprocess::Phase;

/// Seconds between two progress lines within a step.
const LINE_EVERY: Duration = Duration::from_secs(10);

/// One step's progress, as a progress line carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepProgress {
    /// `full-reuse` or `similarity`.
    pub step: String,
    pub done: u64,
    pub total: u64,
}

/// A progress line: the step's progress, its rate and the time it has left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressLine {
    pub preprocessing: StepProgress,
    pub chunks_per_s: f64,
    pub left_s: f64,
}

impl Phase {
    /// The step's name in progress lines.
    pub fn step(self) -> &'static str {
        match self {
            Self::FullReuse => "full-reuse",
            Self::Similarity => "similarity",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::FullReuse => "Full Reuse KV",
            Self::Similarity => "similarity-guided KV",
        }
    }
}

/// A progress bar titled `what` over `len` items.
pub fn bar(what: &str, len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what:>22} [{{bar:30}}] {{pos}}/{{len}} {{per_sec}} eta {{eta}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

struct Step {
    phase: Phase,
    pace: ProgressPace,
    bar: Option<ProgressBar>,
}

/// Reports preprocessing's progress: bars when stderr is a terminal, lines otherwise.
pub struct PreprocessProgress<W: Write> {
    lines: Option<W>,
    step: Option<Step>,
}

impl PreprocessProgress<std::io::Stderr> {
    pub fn for_stderr() -> Self {
        let stderr = std::io::stderr();
        Self {
            lines: (!stderr.is_terminal()).then_some(stderr),
            step: None,
        }
    }
}

impl<W: Write> PreprocessProgress<W> {
    /// Lines into `out`, no bars.
    pub fn lines(out: W) -> Self {
        Self {
            lines: Some(out),
            step: None,
        }
    }

    /// `done` of `total` entries of `phase`'s step are stored.
    pub fn update(&mut self, phase: Phase, done: usize, total: usize) {
        if self.step.as_ref().is_none_or(|s| s.phase != phase) {
            self.finish();
            self.step = Some(Step {
                phase,
                pace: ProgressPace::new(LINE_EVERY),
                bar: self.lines.is_none().then(|| bar(phase.title(), total)),
            });
        }
        let Some(step) = self.step.as_mut() else {
            return;
        };
        if let Some(bar) = &step.bar {
            bar.set_position(done as u64);
        }
        let Some(out) = self.lines.as_mut() else {
            return;
        };
        let Some(pace) = step.pace.due(done, total) else {
            return;
        };
        let line = ProgressLine {
            preprocessing: StepProgress {
                step: phase.step().into(),
                done: done as u64,
                total: total as u64,
            },
            chunks_per_s: (pace.per_s * 1000.0).round() / 1000.0,
            left_s: pace.left_s.round(),
        };
        // Progress is advisory: a closed stderr must not stop the preprocessing.
        if let Ok(text) = serde_json::to_string(&line) {
            let _ = writeln!(out, "{text}");
        }
    }

    /// Ends the current step's bar.
    pub fn finish(&mut self) {
        if let Some(bar) = self.step.take().and_then(|s| s.bar) {
            bar.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(out: &[u8]) -> Vec<ProgressLine> {
        String::from_utf8_lossy(out)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
            .collect()
    }

    #[test]
    fn each_step_logs_its_start_and_its_end_and_nothing_between_within_the_interval() {
        let mut out = Vec::new();
        let mut progress = PreprocessProgress::lines(&mut out);
        for done in 0..=5 {
            progress.update(Phase::FullReuse, done, 5);
        }
        for done in 1..=3 {
            progress.update(Phase::Similarity, done, 3);
        }
        progress.finish();
        let steps: Vec<(String, u64, u64)> = parsed(&out)
            .into_iter()
            .map(|l| {
                (
                    l.preprocessing.step,
                    l.preprocessing.done,
                    l.preprocessing.total,
                )
            })
            .collect();
        assert_eq!(
            steps,
            vec![
                ("full-reuse".into(), 0, 5),
                ("full-reuse".into(), 5, 5),
                ("similarity".into(), 1, 3),
                ("similarity".into(), 3, 3),
            ]
        );
    }
}
