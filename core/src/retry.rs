//! Waits between the attempts of a loop that retries for a process's lifetime (joining a
//! group, re-proposing, reconnecting, re-fetching). Each wait doubles from a first to a
//! largest one and carries random jitter (backon's: up to the wait again), so that the many
//! processes that lost the same peer at once (a DaemonSet's edges after a cloud or
//! control-plane outage) do not come back in lockstep.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The waits of one retry loop, endless.
pub struct RetryDelays {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
}

impl RetryDelays {
    /// Waits from `first`, doubling up to `max`, each with up to as much again at random.
    pub fn new(first: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times();
        Self {
            delays: builder.build(),
            builder,
            max,
        }
    }

    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        // The builder has no limit on attempts; `max` is only a guard.
        self.delays.next().unwrap_or(self.max)
    }

    /// Starts over from the first wait (after a success).
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

/// `delay` plus up to as much again at random, for a loop whose waits are computed from a
/// count rather than kept (a controller's requeue after its n-th failure).
pub fn jittered(delay: Duration) -> Duration {
    delay + delay.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_largest_with_jitter_and_start_over_on_reset() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(1));
        let mut delays = RetryDelays::new(first, max);
        let waits: Vec<Duration> = (0..12).map(|_| delays.next_delay()).collect();
        for (i, wait) in waits.iter().enumerate() {
            let base = (first * 2u32.pow(i.min(4) as u32)).min(max);
            assert!(
                *wait >= base && *wait < base * 2,
                "wait {i}: {wait:?} against {base:?}"
            );
        }
        // Jitter: twelve waits are not all the bare doubling.
        assert!(
            waits
                .iter()
                .enumerate()
                .any(|(i, wait)| { *wait != (first * 2u32.pow(i.min(4) as u32)).min(max) })
        );
        delays.reset();
        assert!(delays.next_delay() < first * 2);
    }

    #[test]
    fn a_jittered_delay_lies_between_the_delay_and_twice_it() {
        let delay = Duration::from_secs(5);
        let spread: Vec<Duration> = (0..50).map(|_| jittered(delay)).collect();
        assert!(spread.iter().all(|d| *d >= delay && *d < delay * 2));
        assert!(spread.iter().any(|d| *d != spread[0]), "not all the same");
    }
}
