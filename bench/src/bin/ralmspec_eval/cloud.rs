//! The exact retriever RaLM waits on: faiss exact search over a corpus bundle (a cloud
//! shard's search) behind a latency model for the wide-area round trip or a slow retriever,
//! paid once per call whatever the batch (batched exact search costs nearly the same for
//! the few queries a verification sends: RaLMSpec, appendix A.1).

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use hasten_bench::retrieval::PassageRetriever;
use hasten_core::vector::dot;
use hasten_spec_retrieval::{ExactRetriever, RetrievalError, RetrievedDocument};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

    fn sample(&self, rng: &mut StdRng) -> Duration {
        Duration::from_secs_f64(match *self {
            Self::Fixed(s) => s,
            Self::Uniform(lo, hi) if hi > lo => rng.random_range(lo..hi),
            Self::Uniform(lo, _) => lo,
        })
    }
}

/// A cloud shard reached over an emulated link.
pub struct EmulatedCloud<'a> {
    pub passages: &'a PassageRetriever,
    pub latency: Latency,
    pub rng: Mutex<StdRng>,
}

impl<'a> EmulatedCloud<'a> {
    pub fn new(passages: &'a PassageRetriever, latency: Latency, seed: u64) -> Self {
        Self {
            passages,
            latency,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }
}

impl ExactRetriever for EmulatedCloud<'_> {
    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> std::result::Result<Vec<Vec<RetrievedDocument>>, RetrievalError> {
        let delay = {
            let mut rng = self
                .rng
                .lock()
                .map_err(|_| RetrievalError::new("latency sampler poisoned"))?;
            self.latency.sample(&mut rng)
        };
        let found = self
            .passages
            .search(queries, k)
            .map_err(|e| RetrievalError::new(format!("{e:#}")))?;
        let results = queries
            .iter()
            .zip(found)
            .map(|(query, documents)| {
                documents
                    .into_iter()
                    .map(|document| {
                        let vector = document.vector.unwrap_or_default();
                        RetrievedDocument {
                            id: document.id.unwrap_or_default(),
                            score: dot(query, &vector),
                            title: document.title.into(),
                            text: document.text.into(),
                            vector: vector.into(),
                        }
                    })
                    .collect()
            })
            .collect();
        // The link's time is on top of the search, as a remote call's would be.
        std::thread::sleep(delay);
        Ok(results)
    }
}
