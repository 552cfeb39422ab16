//! Paired comparisons of two systems on the same questions: the mean of the per-question
//! differences and its percentile-bootstrap interval, the test behind "no lower F1".

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Resamples drawn for an interval: enough that the 2.5th and 97.5th percentiles move by
/// well under a point of F1 between seeds.
pub const RESAMPLES: usize = 2000;

/// The mean paired difference and its 95% bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedDifference {
    pub mean: f64,
    pub low: f64,
    pub high: f64,
    pub pairs: usize,
}

/// `differences[i]` is one system's score minus the other's on question i. Questions are
/// resampled with replacement `resamples` times from `seed`, so a report is reproducible;
/// the interval is the 2.5th to 97.5th percentile of the resampled means. `None` for no
/// questions.
pub fn paired_difference(
    differences: &[f64],
    resamples: usize,
    seed: u64,
) -> Option<PairedDifference> {
    let n = differences.len();
    if n == 0 {
        return None;
    }
    let mean = differences.iter().sum::<f64>() / n as f64;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            (0..n)
                .map(|_| differences[rng.random_range(0..n)])
                .sum::<f64>()
                / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * means.len() as f64) as usize).min(means.len() - 1)];
    Some(PairedDifference {
        mean,
        low: at(0.025),
        high: at(0.975),
        pairs: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_differences_have_no_spread() {
        let d = paired_difference(&[0.25; 40], RESAMPLES, 1).expect("some");
        assert!((d.mean - 0.25).abs() < 1e-12);
        assert!((d.low - 0.25).abs() < 1e-12 && (d.high - 0.25).abs() < 1e-12);
        assert_eq!(d.pairs, 40);
        assert_eq!(paired_difference(&[], RESAMPLES, 1), None);
    }

    #[test]
    fn the_interval_brackets_the_mean_and_excludes_zero_only_for_a_clear_gain() {
        // Half the questions gain a point, half lose one: no difference.
        let even: Vec<f64> = (0..100)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let d = paired_difference(&even, RESAMPLES, 7).expect("some");
        assert!(d.low < 0.0 && d.high > 0.0, "{d:?}");
        // Three in four gain: a clear gain, and the interval says so.
        let gain: Vec<f64> = (0..100)
            .map(|i| if i % 4 == 0 { -1.0 } else { 1.0 })
            .collect();
        let d = paired_difference(&gain, RESAMPLES, 7).expect("some");
        assert!((d.mean - 0.5).abs() < 1e-12);
        assert!(d.low > 0.0 && d.low < d.mean && d.mean < d.high, "{d:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_interval() {
        let mixed: Vec<f64> = (0..60).map(|i| f64::from(i % 7) / 7.0 - 0.4).collect();
        assert_eq!(
            paired_difference(&mixed, RESAMPLES, 3),
            paired_difference(&mixed, RESAMPLES, 3)
        );
    }
}
