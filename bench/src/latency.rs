//! Latency models for emulated remote calls: a retriever behind a wide-area link, or a slow
//! one, paid once per call whatever its batch.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use rand::Rng;
use rand::rngs::StdRng;

/// Seconds one call to the exact retriever takes on top of its search.
#[derive(Clone, Debug, PartialEq)]
pub enum Latency {
    Fixed(f64),
    Uniform(f64, f64),
}

impl Latency {
    /// `fixed:S` or `uniform:LO,HI` (seconds).
    pub fn parse(spec: &str) -> Result<Self> {
        let number = |s: &str| -> Result<f64> {
            let value: f64 = s
                .trim()
                .parse()
                .with_context(|| format!("{s:?} is not a number of seconds"))?;
            if !(0.0..=60.0).contains(&value) {
                bail!("{value} s is outside 0-60 s");
            }
            Ok(value)
        };
        match spec.split_once(':') {
            Some(("fixed", s)) => Ok(Self::Fixed(number(s)?)),
            Some(("uniform", range)) => {
                let (lo, hi) = range
                    .split_once(',')
                    .with_context(|| format!("{spec:?}: expected uniform:LO,HI"))?;
                let (lo, hi) = (number(lo)?, number(hi)?);
                if lo > hi {
                    bail!("{spec:?}: the low end is above the high end");
                }
                Ok(Self::Uniform(lo, hi))
            }
            _ => bail!("{spec:?}: expected fixed:SECONDS or uniform:LO,HI"),
        }
    }

    /// One call's latency.
    pub fn sample(&self, rng: &mut StdRng) -> Duration {
        Duration::from_secs_f64(match *self {
            Self::Fixed(s) => s,
            Self::Uniform(lo, hi) if hi > lo => rng.random_range(lo..hi),
            Self::Uniform(lo, _) => lo,
        })
    }
}

/// A [`Latency`] drawn from its own seeded generator, shareable between threads.
pub struct LatencySampler {
    latency: Latency,
    rng: std::sync::Mutex<StdRng>,
}

impl LatencySampler {
    pub fn new(latency: Latency, seed: u64) -> Self {
        Self {
            latency,
            rng: std::sync::Mutex::new(rand::SeedableRng::seed_from_u64(seed)),
        }
    }

    /// The next call's latency (the fixed or lower one if the generator was poisoned).
    pub fn next(&self) -> Duration {
        match self.rng.lock() {
            Ok(mut rng) => self.latency.sample(&mut rng),
            Err(_) => self
                .latency
                .sample(&mut rand::SeedableRng::seed_from_u64(0)),
        }
    }
}
