//! `ralm-seq`: every retrieval goes to the exact retriever before the step that reads it.

use std::time::Instant;

use super::generator::RalmStepper;
use super::{RalmOutput, RalmTimings};
use crate::error::{RetrieverError, SpecError};
use crate::retriever::{ExactRetriever, QueryEncoder, RetrievedDocument, exact_search};

/// Runs one request sequentially: retrieve, generate `interval` tokens, repeat.
pub fn run_sequential<R: RetrieverError>(
    generator: &dyn RalmStepper,
    encoder: &dyn QueryEncoder,
    exact: &dyn ExactRetriever<Error = R>,
) -> Result<RalmOutput, SpecError<R>> {
    let started = Instant::now();
    let _span = tracing::info_span!("ralm_seq").entered();
    let mut timings = RalmTimings::default();
    let mut generated = Vec::new();
    let mut documents = Vec::new();
    loop {
        let query = encode(generator, encoder, &generated, &mut timings)?;
        let waited = Instant::now();
        let found = exact_search(exact, std::slice::from_ref(&query), 1)?;
        timings.retrieval_wait += waited.elapsed();
        let document = top_one(&found, 0)?;
        let stepped = Instant::now();
        let step = generator.step(&document, &generated)?;
        timings.generation += stepped.elapsed();
        generated.extend(step.tokens);
        documents.push(document.id);
        if step.finished {
            break;
        }
    }
    timings.total = started.elapsed();
    Ok(RalmOutput {
        text: generator.text(&generated)?,
        tokens: generated,
        documents,
        timings,
        speculation: None,
    })
}

/// The query vector after `generated`, timed.
pub(super) fn encode<R: RetrieverError>(
    generator: &dyn RalmStepper,
    encoder: &dyn QueryEncoder,
    generated: &[u32],
    timings: &mut RalmTimings,
) -> Result<Vec<f32>, SpecError<R>> {
    let started = Instant::now();
    let text = generator.query_text(generated)?;
    let query = encoder.encode(&text).map_err(SpecError::Encode)?;
    timings.encoding += started.elapsed();
    Ok(query)
}

/// The best document of the `index`-th query's results.
pub(super) fn top_one<R: RetrieverError>(
    results: &[Vec<RetrievedDocument>],
    index: usize,
) -> Result<RetrievedDocument, SpecError<R>> {
    results
        .get(index)
        .and_then(|hits| hits.first())
        .cloned()
        .ok_or(SpecError::NoDocument)
}
