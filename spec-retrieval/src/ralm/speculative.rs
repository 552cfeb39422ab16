//! RaLMSpec: speculative retrieval from the request's cache, batched verification against
//! the exact retriever, rollback to the first mismatch; prefetching, OS3 and asynchronous
//! verification as [`SpeculationSettings`] choose.

use std::time::{Duration, Instant};

use super::cache::Speculator;
use super::generator::{RalmStepper, StepTokens};
use super::os3::{StrideScheduler, Verified};
use super::sequential::{encode, top_one};
use super::{RalmOutput, RalmTimings, SpeculationSettings, SpeculationStats, Stride};
use crate::error::{RetrieverError, SpecError, StepResult};
use crate::retriever::{ExactRetriever, QueryEncoder, RetrievedDocument, exact_search};

/// A generation step that read a speculated document, awaiting verification.
#[derive(Debug)]
struct Speculated {
    /// Length of the generated text before the step: where a rollback cuts.
    start: usize,
    query: Vec<f32>,
    document: u64,
}

/// Decides which speculated retrievals stand: the index of the first speculated document
/// that differs from the exact one, `None` when all match.
type Verifier = fn(speculated: &[u64], exact: &[u64]) -> Option<usize>;

fn first_mismatch(speculated: &[u64], exact: &[u64]) -> Option<usize> {
    speculated.iter().zip(exact).position(|(s, e)| s != e)
}

/// Runs one request with RaLMSpec. `speculator` is the request's own (a fresh
/// [`LocalDocumentCache`](super::LocalDocumentCache) in production).
pub fn run_speculative<R: RetrieverError>(
    generator: &dyn RalmStepper,
    encoder: &dyn QueryEncoder,
    exact: &dyn ExactRetriever<Error = R>,
    speculator: &mut dyn Speculator,
    settings: &SpeculationSettings,
) -> Result<RalmOutput, SpecError<R>> {
    run_with_verifier(
        generator,
        encoder,
        exact,
        speculator,
        settings,
        first_mismatch,
    )
}

/// The mutable state of one run.
struct Run<'g> {
    generator: &'g dyn RalmStepper,
    generated: Vec<u32>,
    documents: Vec<u64>,
    finished: bool,
    timings: RalmTimings,
    stats: SpeculationStats,
}

impl Run<'_> {
    fn step(&mut self, document: &RetrievedDocument) -> StepResult<(StepTokens, Duration)> {
        let started = Instant::now();
        let step = self.generator.step(document, &self.generated)?;
        let took = started.elapsed();
        self.timings.generation += took;
        Ok((step, took))
    }

    fn commit(&mut self, step: StepTokens) {
        self.generated.extend(step.tokens);
        self.finished = step.finished;
    }
}

pub(super) fn run_with_verifier<R: RetrieverError>(
    generator: &dyn RalmStepper,
    encoder: &dyn QueryEncoder,
    exact: &dyn ExactRetriever<Error = R>,
    speculator: &mut dyn Speculator,
    settings: &SpeculationSettings,
    verifier: Verifier,
) -> Result<RalmOutput, SpecError<R>> {
    let started = Instant::now();
    let _span = tracing::info_span!("ralm_spec", ?settings.stride, settings.prefetch,
        settings.asynchronous)
    .entered();
    if settings.prefetch == 0 || settings.stride == Stride::Fixed(0) {
        return Err(SpecError::invalid(
            "the stride and the prefetch size must be at least 1",
        ));
    }
    // A fixed stride, or OS3's scheduler choosing one before every verification.
    let (fixed_stride, mut scheduler) = match settings.stride {
        Stride::Os3(os3) => (1, Some(StrideScheduler::new(os3, settings.asynchronous))),
        Stride::Fixed(s) => (s, None),
    };
    let mut run = Run {
        generator,
        generated: Vec::new(),
        documents: Vec::new(),
        finished: false,
        timings: RalmTimings::default(),
        stats: SpeculationStats::default(),
    };
    // A step run while the last verification was in flight; verified with the next round.
    let mut carried: Option<Speculated> = None;
    let mut last_step_seconds = 0.0;
    loop {
        let stride = scheduler
            .as_ref()
            .map_or(fixed_stride, StrideScheduler::next_stride);
        let mut round: Vec<Speculated> = carried.take().into_iter().collect();
        let mut step_time = Duration::ZERO;
        let mut steps = 0usize;
        while round.len() < stride && !run.finished {
            let query = encode(generator, encoder, &run.generated, &mut run.timings)?;
            let Some(document) = speculator.speculate(&query) else {
                if round.is_empty() {
                    cold_step(&mut run, exact, speculator, &query, settings.prefetch)?;
                    continue;
                }
                break;
            };
            let (step, took) = run.step(&document)?;
            step_time += took;
            steps += 1;
            run.stats.speculated += 1;
            round.push(Speculated {
                start: run.generated.len(),
                query,
                document: document.id,
            });
            run.commit(step);
        }
        if round.is_empty() {
            break;
        }
        let queries: Vec<Vec<f32>> = round.iter().map(|r| r.query.clone()).collect();
        let verify_started = Instant::now();
        let (results, ahead, verify_seconds) = if settings.asynchronous && !run.finished {
            std::thread::scope(|scope| -> Result<_, SpecError<R>> {
                let verification = scope.spawn(|| {
                    let started = Instant::now();
                    let results = exact_search(exact, &queries, settings.prefetch);
                    (results, started.elapsed())
                });
                let ahead = step_ahead(&mut run, encoder, speculator)?;
                let waited = Instant::now();
                let (results, took) = verification
                    .join()
                    .map_err(|_| SpecError::ThreadLost("the verification thread panicked"))?;
                run.timings.retrieval_wait += waited.elapsed();
                Ok((results?, ahead, took.as_secs_f64()))
            })?
        } else {
            let results = exact_search(exact, &queries, settings.prefetch)?;
            let took = verify_started.elapsed();
            run.timings.retrieval_wait += took;
            (results, None, took.as_secs_f64())
        };
        if let Some((_, _, took)) = &ahead {
            step_time += *took;
            steps += 1;
        }
        run.stats.exact_calls += 1;
        run.stats.strides.push(round.len());
        for hits in &results {
            speculator.observe(hits);
        }
        let exact_ids: Vec<u64> = (0..results.len())
            .map(|i| top_one(&results, i).map(|d| d.id))
            .collect::<Result<_, SpecError<R>>>()?;
        let speculated_ids: Vec<u64> = round.iter().map(|r| r.document).collect();
        let matched = match verifier(&speculated_ids, &exact_ids) {
            None => {
                run.stats.accepted += round.len();
                run.documents.extend(&speculated_ids);
                if let Some((next, step, _)) = ahead {
                    run.stats.speculated += 1;
                    run.commit(step);
                    carried = Some(next);
                }
                round.len()
            }
            Some(m) => {
                run.stats.accepted += m;
                run.stats.rollbacks += 1;
                run.stats.wasted_steps += round.len() - m + usize::from(ahead.is_some());
                if ahead.is_some() {
                    run.stats.speculated += 1;
                }
                run.documents.extend(&speculated_ids[..m]);
                run.generated.truncate(round[m].start);
                let document = top_one(&results, m)?;
                let (step, _) = run.step(&document)?;
                run.documents.push(document.id);
                run.commit(step);
                m
            }
        };
        if steps > 0 {
            last_step_seconds = step_time.as_secs_f64() / steps as f64;
        }
        if let Some(scheduler) = scheduler.as_mut() {
            scheduler.record(Verified {
                stride: round.len(),
                matched,
                step_seconds: last_step_seconds,
                verify_seconds,
            });
        }
    }
    run.timings.total = started.elapsed();
    Ok(RalmOutput {
        text: generator.text(&run.generated)?,
        tokens: run.generated,
        documents: run.documents,
        timings: run.timings,
        speculation: Some(run.stats),
    })
}

/// A retrieval with nothing to speculate from (the request's first): exact, then its step.
fn cold_step<R: RetrieverError>(
    run: &mut Run<'_>,
    exact: &dyn ExactRetriever<Error = R>,
    speculator: &mut dyn Speculator,
    query: &[f32],
    prefetch: usize,
) -> Result<(), SpecError<R>> {
    let waited = Instant::now();
    let results = exact_search(exact, &[query.to_vec()], prefetch)?;
    run.timings.retrieval_wait += waited.elapsed();
    run.stats.exact_calls += 1;
    speculator.observe(&results[0]);
    let document = top_one(&results, 0)?;
    let (step, _) = run.step(&document)?;
    run.documents.push(document.id);
    run.commit(step);
    Ok(())
}

/// The speculation step run while a verification is in flight, from the text as it stands;
/// its tokens are kept aside until the verification confirms everything before them.
fn step_ahead<R: RetrieverError>(
    run: &mut Run<'_>,
    encoder: &dyn QueryEncoder,
    speculator: &mut dyn Speculator,
) -> Result<Option<(Speculated, StepTokens, Duration)>, SpecError<R>> {
    let query = encode(run.generator, encoder, &run.generated, &mut run.timings)?;
    let Some(document) = speculator.speculate(&query) else {
        return Ok(None);
    };
    let (step, took) = run.step(&document)?;
    Ok(Some((
        Speculated {
            start: run.generated.len(),
            query,
            document: document.id,
        },
        step,
        took,
    )))
}
