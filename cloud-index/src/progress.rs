//! Progress of `cloud-index build`'s encoding: a bar with rate and time left on a terminal,
//! a log line with the same figures every few seconds otherwise (CI, containers).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;

const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct EncodeProgress {
    bar: ProgressBar,
    terminal: bool,
    started: Instant,
    last_log: Mutex<Option<Instant>>,
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
            started: Instant::now(),
            last_log: Mutex::new(None),
        }
    }

    pub fn update(&self, encoded: usize, total: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(encoded as u64);
        if self.terminal || encoded == 0 {
            return;
        }
        let now = Instant::now();
        let mut last = self.last_log.lock();
        let due = last.is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        if !(due || encoded == total) {
            return;
        }
        *last = Some(now);
        let elapsed = self.started.elapsed().as_secs_f64();
        let rate = encoded as f64 / elapsed.max(1e-9);
        let left = (total - encoded.min(total)) as f64 / rate.max(1e-9);
        tracing::info!(
            encoded,
            total,
            passages_per_s = format!("{rate:.1}"),
            left_s = format!("{left:.0}"),
            "encoding"
        );
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
