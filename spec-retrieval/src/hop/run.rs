//! The sequential agent and SpecHop's pipeline of up to `k` speculated hops.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};

use super::verify::token_set_jaccard;
use super::{Action, Hop, HopAgent, HopOutcome, HopSettings, HopSpeculator, HopStats, Verifier};
use crate::error::{RetrieverError, SpecError, StepError, StepResult};
use crate::retriever::{ExactRetriever, QueryEncoder, RetrievedDocument, exact_search};

fn ids(documents: &[RetrievedDocument]) -> Vec<u64> {
    documents.iter().map(|d| d.id).collect()
}

/// The agent's next action, refused when it searches past its hop budget.
fn next_action(
    agent: &dyn HopAgent,
    question: &str,
    hops: &[Hop],
    settings: &HopSettings,
) -> StepResult<Action> {
    let must_answer = hops.len() >= settings.max_hops;
    let action = agent.act(question, hops, must_answer)?;
    if must_answer && matches!(action, Action::Search(_)) {
        return Err(StepError::InvalidRequest(format!(
            "the agent searched again after {} hops, its budget",
            settings.max_hops
        )));
    }
    Ok(action)
}

fn encode<R: RetrieverError>(
    encoder: &dyn QueryEncoder,
    query: &str,
) -> Result<Vec<f32>, SpecError<R>> {
    encoder.encode(query).map_err(SpecError::Encode)
}

fn exact_one<R: RetrieverError>(
    exact: &dyn ExactRetriever<Error = R>,
    query: Vec<f32>,
    k: usize,
) -> Result<Vec<RetrievedDocument>, SpecError<R>> {
    exact_search(exact, &[query], k)?
        .pop()
        .ok_or(SpecError::NoDocument)
}

/// The agent waiting for every exact retrieval before it reads.
pub fn run_sequential_agent<R: RetrieverError>(
    agent: &dyn HopAgent,
    question: &str,
    encoder: &dyn QueryEncoder,
    exact: &dyn ExactRetriever<Error = R>,
    settings: &HopSettings,
) -> Result<HopOutcome, SpecError<R>> {
    let _span = tracing::info_span!("hop_seq").entered();
    let mut hops = Vec::new();
    loop {
        match next_action(agent, question, &hops, settings)? {
            Action::Answer(answer) => {
                return Ok(HopOutcome {
                    answer,
                    hops,
                    speculation: None,
                });
            }
            Action::Search(query) => {
                let documents = exact_one(exact, encode(encoder, &query)?, settings.k_documents)?;
                let sub_answer = agent.read(question, &hops, &query, &documents)?;
                hops.push(Hop {
                    query,
                    documents: ids(&documents),
                    sub_answer,
                });
            }
        }
    }
}

/// A hop continued from speculated documents, its exact retrieval in flight.
struct Pending<R> {
    hop: Hop,
    /// `None` when the speculator had no guess: the hop waits for its exact documents and
    /// nothing runs past it.
    speculated: Option<Vec<RetrievedDocument>>,
    exact: Receiver<Result<Vec<RetrievedDocument>, SpecError<R>>>,
}

/// Issues an exact retrieval on its own thread. A discarded hop's retrieval finishes
/// unheard; nothing waits for it.
fn launch<R: RetrieverError>(
    exact: &Arc<dyn ExactRetriever<Error = R>>,
    query: Vec<f32>,
    k: usize,
) -> Receiver<Result<Vec<RetrievedDocument>, SpecError<R>>> {
    let (answer, answered) = sync_channel(1);
    let exact = Arc::clone(exact);
    std::thread::spawn(move || {
        let _ = answer.send(exact_one(exact.as_ref(), query, k));
    });
    answered
}

/// SpecHop with at most `k` hops awaiting verification. Same agent, same answers as
/// [`run_sequential_agent`] under [`Verifier::Strict`].
#[allow(clippy::too_many_arguments)]
pub fn run_spechop<R: RetrieverError>(
    agent: &dyn HopAgent,
    question: &str,
    encoder: &dyn QueryEncoder,
    exact: &Arc<dyn ExactRetriever<Error = R>>,
    speculator: &mut dyn HopSpeculator<Error = R>,
    settings: &HopSettings,
    k: usize,
    verifier: Verifier,
) -> Result<HopOutcome, SpecError<R>> {
    let _span = tracing::info_span!("spechop", k, ?verifier).entered();
    if k == 0 {
        return Err(SpecError::invalid(
            "SpecHop needs at least one speculative thread (k >= 1)",
        ));
    }
    let mut committed: Vec<Hop> = Vec::new();
    let mut pending: VecDeque<Pending<R>> = VecDeque::new();
    // The answer at the head of the speculated trajectory; stands once every hop before it
    // is committed.
    let mut head_answer: Option<String> = None;
    let mut stats = HopStats::default();
    loop {
        if pending.is_empty()
            && let Some(answer) = head_answer.take()
        {
            return Ok(HopOutcome {
                answer,
                hops: committed,
                speculation: Some(stats),
            });
        }
        let head_can_run = pending.back().is_none_or(|p| p.speculated.is_some());
        if head_answer.is_none() && pending.len() < k && head_can_run {
            let head: Vec<Hop> = committed
                .iter()
                .chain(pending.iter().map(|p| &p.hop))
                .cloned()
                .collect();
            match next_action(agent, question, &head, settings)? {
                Action::Answer(answer) => head_answer = Some(answer),
                Action::Search(query) => {
                    let vector = encode(encoder, &query)?;
                    let exact_answer = launch(exact, vector.clone(), settings.k_documents);
                    stats.exact_calls += 1;
                    let guess = speculator
                        .speculate(&vector, settings.k_documents)
                        .map_err(SpecError::Speculation)?;
                    let (sub_answer, speculated) = if guess.is_empty() {
                        (String::new(), None)
                    } else {
                        stats.speculated += 1;
                        (agent.read(question, &head, &query, &guess)?, Some(guess))
                    };
                    pending.push_back(Pending {
                        hop: Hop {
                            query,
                            documents: speculated.as_deref().map(ids).unwrap_or_default(),
                            sub_answer,
                        },
                        speculated,
                        exact: exact_answer,
                    });
                    stats.max_live = stats.max_live.max(pending.len());
                }
            }
            continue;
        }
        let Some(oldest) = pending.pop_front() else {
            return Err(SpecError::invalid(
                "SpecHop found nothing to verify and nothing to run",
            ));
        };
        let exact_documents = oldest.exact.recv().map_err(|_| {
            SpecError::ThreadLost("the exact retrieval thread ended without an answer")
        })??;
        let (stands, exact_reading) = match &oldest.speculated {
            // Nothing was guessed, so nothing ran past this hop.
            None => (false, None),
            Some(speculated) => {
                let exact_reading = if verifier.needs_exact_reading() {
                    Some(agent.read(question, &committed, &oldest.hop.query, &exact_documents)?)
                } else {
                    None
                };
                let stands = match (verifier, &exact_reading) {
                    (Verifier::Jaccard(threshold), Some(reading)) => {
                        token_set_jaccard(&oldest.hop.sub_answer, reading) >= threshold
                    }
                    _ => Verifier::documents_agree(speculated, &exact_documents),
                };
                (stands, exact_reading)
            }
        };
        if stands {
            stats.committed += 1;
            committed.push(oldest.hop);
            continue;
        }
        if oldest.speculated.is_some() {
            stats.discarded += 1 + pending.len();
        }
        pending.clear();
        head_answer = None;
        let sub_answer = match exact_reading {
            Some(reading) => reading,
            None => agent.read(question, &committed, &oldest.hop.query, &exact_documents)?,
        };
        committed.push(Hop {
            query: oldest.hop.query,
            documents: ids(&exact_documents),
            sub_answer,
        });
    }
}
