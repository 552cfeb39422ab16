//! Speculative RAG on engines: the drafter engine writes one draft per document subset (all
//! subsets at once; the engine batches them), the verifier engine scores each draft from
//! the question alone, never reading the documents, as in the paper, and the best draft's
//! answer is the reply. The verifier's scores are prompt log-probabilities, which
//! llama.cpp's and vLLM's servers give ([`crate::routes`]).

use std::time::{Duration, Instant};

use futures::future::try_join_all;
use hasten_rag::draft::{Draft, draft_ended, parse_draft};
use hasten_rag::prompt::{REFLECTION_YES, draft_text, drafter_messages, verifier_messages};
use hasten_rag::speculative::{UNJUDGED, document_subsets, reported, verdicts_needed};
use hasten_rag::stop::cut_at_stop;
use hasten_rag::verify::{Verdict, Verification};
use hasten_rag::{
    Answer, AnswerRequest, AnswerTimings, Document, DraftingTokens, Finish, RagError,
};

use crate::endpoint::Endpoint;
use crate::error::EngineError;
use crate::routes::EngineRoutes;
use crate::scoring::Scoring;
use crate::wire::{self, ChatRequest, StreamOptions};

/// One draft and what writing it cost.
struct Written {
    draft: Draft,
    prompt_tokens: usize,
    generated_tokens: usize,
}

/// Writes the draft of one subset through the drafter engine's streamed chat completion,
/// closing it once the rationale's line has ended (nothing after it is read).
async fn write_draft(
    drafter: &Endpoint,
    question: &str,
    documents: &[Document],
    subset: &[usize],
    draft_tokens: usize,
) -> Result<Written, EngineError> {
    let chosen: Vec<&Document> = subset.iter().filter_map(|&i| documents.get(i)).collect();
    let messages = drafter_messages(question, &chosen);
    let body = ChatRequest {
        model: &drafter.model,
        messages: wire::messages(&messages),
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        max_tokens: draft_tokens,
        // The paper drafts greedily: the subsets supply the diversity.
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
        stop: &[],
        logprobs: true,
        top_logprobs: Some(1),
    };
    let mut events = drafter.chat_stream(&body).await?;
    let mut text = String::new();
    let mut logprobs: Vec<f32> = Vec::new();
    let mut prompt_tokens = 0;
    while let Some(chunk) = events.next().await? {
        if let Some(usage) = chunk.usage {
            prompt_tokens = usage.prompt_tokens;
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            continue;
        };
        if let Some(scored) = choice.logprobs {
            logprobs.extend(scored.content.iter().map(|t| t.logprob));
        }
        if let Some(delta) = choice.delta.content {
            text.push_str(&delta);
        }
        if draft_ended(&text) {
            break;
        }
    }
    let parsed = parse_draft(&text);
    Ok(Written {
        draft: Draft {
            documents: subset.to_vec(),
            rationale: parsed.rationale,
            answer: parsed.answer,
            labelled: parsed.labelled,
            tokens: Vec::new(),
            logprob: logprobs.iter().sum(),
        },
        prompt_tokens,
        generated_tokens: logprobs.len(),
    })
}

/// The verifier engine's verdicts on `(rationale, answer)` drafts, laid out as the local
/// verifier lays them out (`hasten_rag::verify`): the question prompt, the draft as the
/// assistant's turn, the reflection statement as the user's next, and "Yes" as the reply.
pub async fn verify(
    verifier: &Endpoint,
    scoring: &Scoring,
    question: &str,
    drafts: &[(&str, &str)],
) -> Result<Verification, EngineError> {
    let Some(&(first_rationale, first_answer)) = drafts.first() else {
        return Ok(Verification {
            verdicts: Vec::new(),
            tokens: 0,
        });
    };
    let routes = EngineRoutes::new(verifier, scoring)?;
    let messages = verifier_messages(question);
    // What the template puts between a draft and the reply is the same for every draft.
    let layout = routes
        .layout(&messages, &draft_text(first_rationale, first_answer))
        .await?;
    let yes = routes.text_tokens(REFLECTION_YES).await?;
    let rows = drafts.iter().map(|&(rationale, answer)| {
        let (routes, layout, yes) = (&routes, &layout, &yes);
        async move {
            let draft = routes.text_tokens(&draft_text(rationale, answer)).await?;
            let (consistency, reflection) = routes.score(layout, &draft, yes).await?;
            Ok::<_, EngineError>((
                Verdict {
                    consistency,
                    reflection,
                },
                draft.len() + layout.between.len() + yes.len(),
            ))
        }
    });
    let scored = try_join_all(rows).await?;
    Ok(Verification {
        // Counted as the local verifier counts them: the shared question prompt once (the
        // engine's prompt cache holds it across the rows), then each row's own tokens.
        tokens: layout.context.len() + scored.iter().map(|(_, tokens)| tokens).sum::<usize>(),
        verdicts: scored.into_iter().map(|(verdict, _)| verdict).collect(),
    })
}

/// The two engines of Speculative RAG (one engine may play both).
pub struct Engines<'a> {
    pub drafter: &'a Endpoint,
    pub verifier: &'a Endpoint,
    /// How the verifier engine gives scores.
    pub scoring: &'a Scoring,
}

/// The parts of a speculative answer computed on engines, before it is reported.
pub struct Drafted {
    pub drafts: Vec<Draft>,
    pub drafting: DraftingTokens,
    pub draft_time: Duration,
}

/// Writes every subset's draft on the drafter engine, all at once.
pub async fn draft_all(
    engines: &Engines<'_>,
    request: &AnswerRequest,
) -> Result<Drafted, RagError> {
    let started = Instant::now();
    let subsets = document_subsets(request)?;
    let written = try_join_all(subsets.iter().map(|subset| {
        write_draft(
            engines.drafter,
            &request.question,
            &request.documents,
            subset,
            request.speculative.draft_tokens,
        )
    }))
    .await
    .map_err(|error| error.into_answer_error(&engines.drafter.base))?;
    Ok(Drafted {
        drafting: DraftingTokens {
            prompt_tokens: written.iter().map(|w| w.prompt_tokens).sum(),
            generated_tokens: written.iter().map(|w| w.generated_tokens).sum(),
        },
        drafts: written.into_iter().map(|w| w.draft).collect(),
        draft_time: started.elapsed(),
    })
}

/// Judges the drafts on the verifier engine (when they need it) and answers with the best,
/// cut at the request's stop strings and to `max_new_tokens` of the verifier's tokens.
pub async fn judge_and_answer(
    engines: &Engines<'_>,
    request: &AnswerRequest,
    drafted: Drafted,
    started: Instant,
) -> Result<Answer, RagError> {
    let verifying = Instant::now();
    let (verdicts, verifier_tokens) = if verdicts_needed(drafted.drafts.len(), &request.speculative)
    {
        let pairs: Vec<(&str, &str)> = drafted
            .drafts
            .iter()
            .map(|d| (d.rationale.as_str(), d.answer.as_str()))
            .collect();
        let verification = verify(engines.verifier, engines.scoring, &request.question, &pairs)
            .await
            .map_err(|error| error.into_answer_error(&engines.verifier.base))?;
        (verification.verdicts, verification.tokens)
    } else {
        (vec![UNJUDGED; drafted.drafts.len()], 0)
    };
    let verify_time = if verifier_tokens > 0 {
        verifying.elapsed()
    } else {
        Duration::ZERO
    };
    let (reports, chosen) = reported(&drafted.drafts, &verdicts, &request.speculative)?;
    let best = &reports[chosen];
    let (text, answer_tokens, finish) = bounded_answer(engines, &best.answer, request)
        .await
        .map_err(|error| error.into_answer_error(&engines.verifier.base))?;
    let total = started.elapsed();
    Ok(Answer {
        text,
        rationale: Some(best.rationale.clone()),
        documents_used: best.documents.clone(),
        timings: AnswerTimings {
            // The drafter engine reads and writes in one wait.
            prefill: Duration::ZERO,
            first_token: total,
            decode: drafted.draft_time,
            verify: verify_time,
            total,
            kv: None,
        },
        prompt_tokens: verifier_tokens,
        generated_tokens: answer_tokens,
        finish,
        drafting: drafted.drafting,
        dropped_turns: 0,
        drafts: reports,
    })
}

/// The chosen answer cut before the first stop string, then to `max_new_tokens` of the
/// verifier's tokens.
async fn bounded_answer(
    engines: &Engines<'_>,
    answer: &str,
    request: &AnswerRequest,
) -> Result<(String, usize, Finish), EngineError> {
    let (answer, _) = cut_at_stop(answer, &request.decoding.stop);
    let answer = answer.trim();
    let api = EngineRoutes::new(engines.verifier, engines.scoring)?;
    let tokens = api.text_tokens(answer).await?;
    if tokens.len() <= request.max_new_tokens {
        return Ok((answer.to_string(), tokens.len(), Finish::Stop));
    }
    let kept = &tokens[..request.max_new_tokens];
    let text = api.detokenize(kept).await?;
    Ok((
        text.trim_end_matches('\u{FFFD}').trim().to_string(),
        kept.len(),
        Finish::Length,
    ))
}
