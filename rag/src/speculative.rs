//! Speculative RAG (Wang et al., 2024): cluster the documents, draft an answer from each
//! multi-perspective subset with the small model, let the large model score the drafts in
//! one pass, and answer with the best.

use std::time::{Duration, Instant};

use hasten_lm::LanguageModel;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::answer::{Answer, AnswerTimings, DraftReport, DraftingTokens, Finish};
use crate::cluster::kmeans;
use crate::draft::{Draft, write_drafts};
use crate::error::{RagError, Result};
use crate::prompt::{drafter_prompt, verifier_context};
use crate::request::{AnswerRequest, Document, DraftSelection, SpeculativeSettings};
use crate::sink::AnswerSink;
use crate::stop::cut_at_stop;
use crate::subsets::{one_per_cluster, without_clustering};
use crate::verify::{Verdict, verify};

pub fn answer_speculative(
    drafter: &LanguageModel,
    verifier: &LanguageModel,
    request: &AnswerRequest,
    sink: &mut dyn AnswerSink,
) -> Result<Answer> {
    let started = Instant::now();
    let settings = &request.speculative;
    let _span = tracing::info_span!(
        "rag_speculative",
        documents = request.documents.len(),
        drafts = settings.drafts,
        clusters = settings.clusters,
        clustering = settings.clustering
    )
    .entered();
    let subsets = document_subsets(request)?;
    let drafting = write_drafts(
        drafter,
        &request.question,
        &request.documents,
        &subsets,
        settings.draft_tokens,
        &|| sink.cancelled(),
    )?;
    if sink.cancelled() {
        return Err(RagError::Cancelled);
    }

    let verifying = Instant::now();
    let (verdicts, verifier_tokens) = judge(verifier, request, &drafting.drafts)?;
    let verify_time = if verifier_tokens > 0 {
        verifying.elapsed()
    } else {
        Duration::ZERO
    };

    let (reports, chosen) = reported(&drafting.drafts, &verdicts, settings)?;
    let best = &reports[chosen];
    tracing::debug!(chosen, score = best.score, "draft chosen");
    let (text, answer_tokens, finish) = bounded_answer(drafter, &best.answer, request)?;
    if !text.is_empty() {
        sink.text(&text);
    }
    let total = started.elapsed();
    Ok(Answer {
        text,
        rationale: Some(best.rationale.clone()),
        documents_used: best.documents.clone(),
        timings: AnswerTimings {
            prefill: drafting.generation.prefill,
            first_token: total,
            decode: drafting.generation.decode,
            verify: verify_time,
            total,
            kv: None,
        },
        prompt_tokens: verifier_tokens,
        generated_tokens: answer_tokens,
        finish,
        drafting: DraftingTokens {
            prompt_tokens: drafting.generation.prompt_tokens,
            generated_tokens: drafting.generation.generated_tokens,
        },
        dropped_turns: 0,
        drafts: reports,
    })
}

/// The chosen draft's answer as the request bounds it: cut before the first stop string,
/// then to `max_new_tokens` of the drafter's tokens. Returns the text, its tokens and why
/// it ended.
fn bounded_answer(
    drafter: &LanguageModel,
    answer: &str,
    request: &AnswerRequest,
) -> Result<(String, usize, Finish)> {
    let (answer, _) = cut_at_stop(answer, &request.decoding.stop);
    let tokens = drafter.tokenizer.encode(answer.trim())?;
    if tokens.len() <= request.max_new_tokens {
        return Ok((answer.trim().to_string(), tokens.len(), Finish::Stop));
    }
    let kept = &tokens[..request.max_new_tokens];
    let text = drafter.tokenizer.decode(kept)?;
    let text = text.trim_end_matches('\u{FFFD}').trim().to_string();
    Ok((text, kept.len(), Finish::Length))
}

/// Refuses what [`answer_speculative`] would refuse before any forward pass: the settings,
/// and a question that leaves no room in the drafter's or the verifier's context.
pub fn check_speculative(
    drafter: &LanguageModel,
    verifier: &LanguageModel,
    request: &AnswerRequest,
) -> Result<()> {
    let widest: Vec<&Document> = request
        .documents
        .iter()
        .take(request.speculative.clusters)
        .collect();
    drafter_prompt(
        drafter,
        &request.question,
        &widest,
        request.speculative.draft_tokens,
    )?;
    verifier_context(verifier, &request.question)?;
    Ok(())
}

/// The m document subsets: one document per k-means cluster, or (the ablation) k documents
/// drawn from all of them.
pub fn document_subsets(request: &AnswerRequest) -> Result<Vec<Vec<usize>>> {
    let settings = &request.speculative;
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let n = request.documents.len();
    if !settings.clustering {
        return Ok(without_clustering(
            n,
            settings.clusters,
            settings.drafts,
            &mut rng,
        ));
    }
    let vectors = request
        .documents
        .iter()
        .enumerate()
        .map(|(i, d)| {
            d.vector.clone().ok_or_else(|| {
                RagError::invalid(
                    "documents",
                    format!("document {i} has no vector; clustering needs one per document"),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let clustering = kmeans(&vectors, settings.clusters, settings.seed)?;
    Ok(one_per_cluster(
        &clustering.clusters,
        settings.drafts,
        &mut rng,
    ))
}

/// A draft left unjudged scores 0 on both counts.
pub const UNJUDGED: Verdict = Verdict {
    consistency: 0.0,
    reflection: 0.0,
};

/// Whether `drafts` drafts go to the verifier: a lone draft needs no verdict, and the
/// random-selection ablation skips verification as in the paper; both score
/// [`UNJUDGED`] there.
pub fn verdicts_needed(drafts: usize, settings: &SpeculativeSettings) -> bool {
    drafts >= 2 && !matches!(settings.selection, DraftSelection::Random { .. })
}

/// The verifier's verdicts and the tokens it read.
fn judge(
    verifier: &LanguageModel,
    request: &AnswerRequest,
    drafts: &[Draft],
) -> Result<(Vec<Verdict>, usize)> {
    if !verdicts_needed(drafts.len(), &request.speculative) {
        return Ok((vec![UNJUDGED; drafts.len()], 0));
    }
    let pairs: Vec<(&str, &str)> = drafts
        .iter()
        .map(|d| (d.rationale.as_str(), d.answer.as_str()))
        .collect();
    let verification = verify(verifier, &request.question, &pairs)?;
    Ok((verification.verdicts, verification.tokens))
}

/// The drafts as reported with their verdicts, and the index of the one answered with.
pub fn reported(
    drafts: &[Draft],
    verdicts: &[Verdict],
    settings: &SpeculativeSettings,
) -> Result<(Vec<DraftReport>, usize)> {
    let reports: Vec<DraftReport> = drafts
        .iter()
        .zip(verdicts)
        .map(|(draft, verdict)| report(draft, *verdict))
        .collect();
    let chosen = choose(&reports, settings)?;
    Ok((reports, chosen))
}

/// A draft as reported, with the verifier's verdict and the score it is chosen by.
fn report(draft: &Draft, verdict: Verdict) -> DraftReport {
    DraftReport {
        documents: draft.documents.clone(),
        rationale: draft.rationale.clone(),
        answer: draft.answer.clone(),
        draft_logprob: draft.logprob,
        consistency_logprob: verdict.consistency,
        reflection_logprob: verdict.reflection,
        score: draft.logprob + verdict.consistency + verdict.reflection,
    }
}

/// The index of the final draft: the best score (the first of equals), or a seeded random
/// one for the ablation. A draft with an empty answer (the drafter stopped at once, which
/// also makes its log-probability 0, the highest possible) is only chosen when all are empty.
fn choose(reports: &[DraftReport], settings: &SpeculativeSettings) -> Result<usize> {
    let answered: Vec<usize> = (0..reports.len())
        .filter(|&i| !reports[i].answer.is_empty())
        .collect();
    let candidates: Vec<usize> = if answered.is_empty() {
        (0..reports.len()).collect()
    } else {
        answered
    };
    if candidates.is_empty() {
        return Err(RagError::invalid(
            "speculative.drafts",
            "no document subset could be formed",
        ));
    }
    Ok(match settings.selection {
        DraftSelection::Random { seed } => {
            candidates[StdRng::seed_from_u64(seed).random_range(0..candidates.len())]
        }
        DraftSelection::Verifier => {
            let mut best = candidates[0];
            for &i in &candidates {
                if reports[i].score.total_cmp(&reports[best].score).is_gt() {
                    best = i;
                }
            }
            best
        }
    })
}
