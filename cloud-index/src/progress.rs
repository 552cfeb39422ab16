//! Progress of `cloud-index build`'s encoding: a bar with rate and time left on a terminal,
//! a log line with the same figures every few seconds otherwise (CI, containers).

use std::io::IsTerminal;
use std::time::Duration;

use hasten_core::progress::ProgressPace;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;

const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct EncodeProgress {
    bar: ProgressBar,
    terminal: bool,
    pace: Mutex<ProgressPace>,
}

impl EncodeProgress {
    pub fn new() -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "encoding [{bar:30}] {pos}/{len} passages  {per_sec}  {elapsed} elapsed, {eta} left",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Self {
            bar,
            terminal,
            pace: Mutex::new(ProgressPace::new(LOG_EVERY)),
        }
    }

    pub fn update(&self, encoded: usize, total: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(encoded as u64);
        if self.terminal || encoded == 0 {
            return;
        }
        let Some(pace) = self.pace.lock().due(encoded, total) else {
            return;
        };
        tracing::info!(
            encoded,
            total,
            passages_per_s = format!("{:.1}", pace.per_s),
            left_s = format!("{:.0}", pace.left_s),
            "encoding"
        );
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
