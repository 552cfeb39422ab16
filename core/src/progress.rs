//! When a long job that is not on a terminal (a container, CI) reports its progress, and the
//! rate and time left it reports: at its first update, then at most every `every`, and at its
//! end. Terminals get progress bars instead; the two binaries with long offline work
//! (`cloud-index build`'s encoding, `kv-worker preprocess`) share this pace.

use std::time::{Duration, Instant};

/// Rate since the job (or step) started, and the time left at that rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    pub per_s: f64,
    pub left_s: f64,
}

#[derive(Debug, Clone)]
pub struct ProgressPace {
    every: Duration,
    started: Instant,
    last: Option<Instant>,
}

impl ProgressPace {
    /// Starts the clock now.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            started: Instant::now(),
            last: None,
        }
    }

    /// `done` of `total` are done: the pace when a report is due (the first update, `every`
    /// after the last report, or the end), `None` otherwise.
    pub fn due(&mut self, done: usize, total: usize) -> Option<Pace> {
        let now = Instant::now();
        let due = self
            .last
            .is_none_or(|at| now.duration_since(at) >= self.every);
        if !(due || done >= total) {
            return None;
        }
        self.last = Some(now);
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let per_s = if elapsed > 0.0 {
            done as f64 / elapsed
        } else {
            0.0
        };
        let left_s = if per_s > 0.0 {
            total.saturating_sub(done) as f64 / per_s
        } else {
            0.0
        };
        Some(Pace { per_s, left_s })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_first_then_at_the_end_and_not_between_within_the_interval() {
        let mut pace = ProgressPace::new(Duration::from_secs(3600));
        let reported: Vec<usize> = (1..=5).filter(|&d| pace.due(d, 5).is_some()).collect();
        assert_eq!(reported, vec![1, 5]);
        let mut often = ProgressPace::new(Duration::ZERO);
        assert!((1..=3).all(|d| often.due(d, 5).is_some()));
        let end = often.due(5, 5).expect("the end is always reported");
        assert_eq!(end.left_s, 0.0);
    }
}
