//! OS3, RaLMSpec's optimal speculation stride scheduler (section 4 and appendix A.2).
//!
//! With a speculation step taking `a`, a verification `b` and each speculation right with
//! probability `gamma`, a stride `s` verifies `(1 - gamma^s) / (1 - gamma)` documents in
//! expectation, in `s·a + b` (synchronous) or, when all match and the next step overlapped
//! the verification, `(s - 1)·a + max(a, b)`. OS3 picks the `s` with the most documents
//! verified per second, from `a`, `b` and `gamma` measured over the last few verifications.

use std::collections::VecDeque;

/// The scheduler's parameters; defaults are the paper's.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Os3Settings {
    /// Verifications the estimates look back over (paper: 5).
    pub window: usize,
    /// Cap on the estimated speculation accuracy, against over-optimism and a division by
    /// zero at 1 (paper: 0.6).
    pub gamma_max: f64,
    /// Largest stride considered.
    pub max_stride: usize,
}

impl Default for Os3Settings {
    fn default() -> Self {
        Self {
            window: 5,
            gamma_max: 0.6,
            max_stride: 16,
        }
    }
}

/// One verification as the scheduler saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verified {
    pub stride: usize,
    /// Speculations confirmed before the first mismatch (`stride` when all were).
    pub matched: usize,
    /// Mean seconds of the round's speculation steps (retrieval from the cache + generation).
    pub step_seconds: f64,
    /// Seconds from issuing the verification to its answer.
    pub verify_seconds: f64,
}

/// Expected documents verified per second at stride `s` (the paper's objective).
pub fn objective(s: usize, a: f64, b: f64, gamma: f64, asynchronous: bool) -> f64 {
    let s_f = s as f64;
    let all_match = gamma.powi(s as i32);
    let verified = (1.0 - all_match) / (1.0 - gamma);
    let synchronous_latency = s_f * a + b;
    let latency = if asynchronous {
        all_match * ((s_f - 1.0) * a + a.max(b)) + (1.0 - all_match) * synchronous_latency
    } else {
        synchronous_latency
    };
    verified / latency
}

/// Chooses each verification's stride from the recent ones.
#[derive(Clone, Debug)]
pub struct StrideScheduler {
    settings: Os3Settings,
    asynchronous: bool,
    recent: VecDeque<Verified>,
}

impl StrideScheduler {
    pub fn new(settings: Os3Settings, asynchronous: bool) -> Self {
        Self {
            settings,
            asynchronous,
            recent: VecDeque::with_capacity(settings.window),
        }
    }

    pub fn record(&mut self, verified: Verified) {
        if self.recent.len() == self.settings.window.max(1) {
            self.recent.pop_front();
        }
        self.recent.push_back(verified);
    }

    /// The maximum-likelihood accuracy over the window, capped at `gamma_max`:
    /// matched / (matched + verifications that stopped at a mismatch).
    pub fn gamma(&self) -> f64 {
        let matched: usize = self.recent.iter().map(|v| v.matched).sum();
        let mismatches = self.recent.iter().filter(|v| v.matched < v.stride).count();
        if matched + mismatches == 0 {
            return 0.0;
        }
        (matched as f64 / (matched + mismatches) as f64).min(self.settings.gamma_max)
    }

    /// Mean step and verification seconds over the window; `None` before any verification.
    pub fn latencies(&self) -> Option<(f64, f64)> {
        let n = self.recent.len();
        if n == 0 {
            return None;
        }
        let a = self.recent.iter().map(|v| v.step_seconds).sum::<f64>() / n as f64;
        let b = self.recent.iter().map(|v| v.verify_seconds).sum::<f64>() / n as f64;
        Some((a, b))
    }

    /// The stride for the next verification: 1 until something was measured (the paper's
    /// warm-up), then the objective's argmax over `1..=max_stride` (the smallest on ties).
    pub fn next_stride(&self) -> usize {
        let Some((a, b)) = self.latencies() else {
            return 1;
        };
        let gamma = self.gamma();
        let mut best = (1, f64::NEG_INFINITY);
        for s in 1..=self.settings.max_stride.max(1) {
            let value = objective(s, a, b, gamma, self.asynchronous);
            if value > best.1 {
                best = (s, value);
            }
        }
        best.0
    }
}
