//! Wire types of the `Generation` service to and from hasten-rag's, at the boundary.

use std::time::Duration;

use hasten_proto::v1 as pb;
use hasten_rag::{
    Answer, AnswerMode, AnswerRequest, AnswerTimings, BackendInfo, ChatTurn, Decoding, Document,
    DraftReport, DraftSelection, DraftingTokens, Finish, Role, SpeculativeSettings,
};

/// A field of a request that cannot be read, by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {message}")]
pub struct WireError {
    pub field: &'static str,
    pub message: String,
}

pub fn mode_proto(mode: AnswerMode) -> pb::AnswerMode {
    match mode {
        AnswerMode::Standard => pb::AnswerMode::Standard,
        AnswerMode::Speculative => pb::AnswerMode::Speculative,
    }
}

/// An `AnswerMode` as sent on the wire (unspecified reads as standard).
pub fn mode_from_proto(value: i32) -> Result<AnswerMode, WireError> {
    match pb::AnswerMode::try_from(value) {
        Ok(pb::AnswerMode::Unspecified | pb::AnswerMode::Standard) => Ok(AnswerMode::Standard),
        Ok(pb::AnswerMode::Speculative) => Ok(AnswerMode::Speculative),
        Err(_) => Err(WireError {
            field: "mode",
            message: format!("{value} is not an answer mode (1 standard, 2 speculative)"),
        }),
    }
}

pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

pub fn request_proto(request: &AnswerRequest) -> pb::GenerateRequest {
    let s = &request.speculative;
    pb::GenerateRequest {
        question: request.question.clone(),
        documents: request
            .documents
            .iter()
            .map(|d| pb::ContextDocument {
                title: d.title.clone(),
                text: d.text.clone(),
                vector: d.vector.clone().unwrap_or_default(),
            })
            .collect(),
        mode: mode_proto(request.mode) as i32,
        max_new_tokens: index(request.max_new_tokens),
        speculative: Some(pb::SpeculativeSettings {
            drafts: index(s.drafts),
            clusters: index(s.clusters),
            no_clustering: !s.clustering,
            random_selection_seed: match s.selection {
                DraftSelection::Verifier => None,
                DraftSelection::Random { seed } => Some(seed),
            },
            draft_tokens: index(s.draft_tokens),
            seed: s.seed,
        }),
        conversation: request
            .conversation
            .iter()
            .map(|turn| pb::ChatTurn {
                role: role_proto(turn.role) as i32,
                content: turn.content.clone(),
            })
            .collect(),
        decoding: Some(pb::Decoding {
            temperature: request.decoding.temperature,
            top_p: request.decoding.top_p,
            seed: request.decoding.seed,
            stop: request.decoding.stop.clone(),
        }),
    }
}

fn role_proto(role: Role) -> pb::ChatRole {
    match role {
        Role::System => pb::ChatRole::System,
        Role::User => pb::ChatRole::User,
        Role::Assistant => pb::ChatRole::Assistant,
    }
}

fn role_from_proto(value: i32) -> Result<Role, WireError> {
    match pb::ChatRole::try_from(value) {
        Ok(pb::ChatRole::System) => Ok(Role::System),
        Ok(pb::ChatRole::User) => Ok(Role::User),
        Ok(pb::ChatRole::Assistant) => Ok(Role::Assistant),
        Ok(pb::ChatRole::Unspecified) | Err(_) => Err(WireError {
            field: "conversation.role",
            message: format!("{value} is not a role (1 system, 2 user, 3 assistant)"),
        }),
    }
}

pub fn request_from_proto(request: pb::GenerateRequest) -> Result<AnswerRequest, WireError> {
    let speculative = match request.speculative {
        None => SpeculativeSettings::default(),
        Some(s) => SpeculativeSettings {
            drafts: s.drafts as usize,
            clusters: s.clusters as usize,
            clustering: !s.no_clustering,
            selection: match s.random_selection_seed {
                None => DraftSelection::Verifier,
                Some(seed) => DraftSelection::Random { seed },
            },
            draft_tokens: s.draft_tokens as usize,
            seed: s.seed,
        },
    };
    Ok(AnswerRequest {
        question: request.question,
        documents: request
            .documents
            .into_iter()
            .map(|d| Document {
                title: d.title,
                text: d.text,
                vector: (!d.vector.is_empty()).then_some(d.vector),
                id: None,
            })
            .collect(),
        mode: mode_from_proto(request.mode)?,
        max_new_tokens: request.max_new_tokens as usize,
        speculative,
        conversation: request
            .conversation
            .into_iter()
            .map(|turn| Ok(ChatTurn::new(role_from_proto(turn.role)?, turn.content)))
            .collect::<Result<_, WireError>>()?,
        decoding: request
            .decoding
            .map_or_else(Decoding::default, |d| Decoding {
                temperature: d.temperature,
                top_p: d.top_p,
                seed: d.seed,
                stop: d.stop,
            }),
    })
}

pub fn draft_proto(draft: DraftReport) -> pb::Draft {
    pb::Draft {
        documents: draft.documents.into_iter().map(index).collect(),
        rationale: draft.rationale,
        answer: draft.answer,
        draft_logprob: draft.draft_logprob,
        consistency_logprob: draft.consistency_logprob,
        reflection_logprob: draft.reflection_logprob,
        score: draft.score,
    }
}

fn draft_from_proto(draft: pb::Draft) -> DraftReport {
    DraftReport {
        documents: draft.documents.into_iter().map(|i| i as usize).collect(),
        rationale: draft.rationale,
        answer: draft.answer,
        draft_logprob: draft.draft_logprob,
        consistency_logprob: draft.consistency_logprob,
        reflection_logprob: draft.reflection_logprob,
        score: draft.score,
    }
}

pub fn answer_proto(answer: Answer) -> pb::GeneratedAnswer {
    let t = answer.timings;
    pb::GeneratedAnswer {
        text: answer.text,
        rationale: answer.rationale,
        documents_used: answer.documents_used.into_iter().map(index).collect(),
        drafts: answer.drafts.into_iter().map(draft_proto).collect(),
        timings: Some(pb::GenerationTimings {
            prefill_us: micros(t.prefill),
            first_token_us: micros(t.first_token),
            decode_us: micros(t.decode),
            verify_us: micros(t.verify),
            total_us: micros(t.total),
        }),
        prompt_tokens: answer.prompt_tokens as u64,
        generated_tokens: answer.generated_tokens as u64,
        finished_by_length: answer.finish == Finish::Length,
        draft_prompt_tokens: answer.drafting.prompt_tokens as u64,
        draft_generated_tokens: answer.drafting.generated_tokens as u64,
        dropped_turns: index(answer.dropped_turns),
    }
}

/// A worker's answer; `documents` is how many the request sent, so that an index beyond
/// them (a worker answering another request, or a broken one) is refused, not passed on.
pub fn answer_from_proto(
    answer: pb::GeneratedAnswer,
    documents: usize,
) -> Result<Answer, WireError> {
    let out_of_range = |i: &u32| *i as usize >= documents;
    if answer.documents_used.iter().any(out_of_range)
        || answer
            .drafts
            .iter()
            .any(|d| d.documents.iter().any(out_of_range))
    {
        return Err(WireError {
            field: "documents_used",
            message: format!("names a document beyond the {documents} sent"),
        });
    }
    let t = answer.timings.unwrap_or_default();
    Ok(Answer {
        text: answer.text,
        rationale: answer.rationale,
        documents_used: answer
            .documents_used
            .into_iter()
            .map(|i| i as usize)
            .collect(),
        drafts: answer.drafts.into_iter().map(draft_from_proto).collect(),
        timings: AnswerTimings {
            prefill: Duration::from_micros(t.prefill_us),
            first_token: Duration::from_micros(t.first_token_us),
            decode: Duration::from_micros(t.decode_us),
            verify: Duration::from_micros(t.verify_us),
            total: Duration::from_micros(t.total_us),
            kv: None,
        },
        prompt_tokens: answer.prompt_tokens as usize,
        generated_tokens: answer.generated_tokens as usize,
        finish: if answer.finished_by_length {
            Finish::Length
        } else {
            Finish::Stop
        },
        drafting: DraftingTokens {
            prompt_tokens: answer.draft_prompt_tokens as usize,
            generated_tokens: answer.draft_generated_tokens as usize,
        },
        dropped_turns: answer.dropped_turns as usize,
    })
}

pub fn info_proto(info: BackendInfo) -> pb::GenerationInfo {
    pb::GenerationInfo {
        drafter: info.drafter,
        verifier: info.verifier,
        device: info.device,
    }
}

pub fn info_from_proto(info: pb::GenerationInfo) -> BackendInfo {
    BackendInfo {
        drafter: info.drafter,
        verifier: info.verifier,
        device: info.device,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_request_survives_the_wire_in_both_modes() {
        let mut request = AnswerRequest::new(
            "Who wrote it?",
            vec![
                Document::new("A", "first").with_vector(vec![0.5, -0.25]),
                Document::new("B", "second"),
            ],
        );
        request.max_new_tokens = 33;
        assert_eq!(
            request_from_proto(request_proto(&request)).unwrap(),
            request
        );
        request.mode = AnswerMode::Speculative;
        request.speculative = SpeculativeSettings {
            drafts: 3,
            clusters: 1,
            clustering: false,
            selection: DraftSelection::Random { seed: 9 },
            draft_tokens: 17,
            seed: 4,
        };
        request.conversation = vec![
            ChatTurn::new(Role::System, "Be brief."),
            ChatTurn::new(Role::User, "Who won?"),
            ChatTurn::new(Role::Assistant, "Denver."),
        ];
        request.decoding = Decoding {
            temperature: 0.7,
            top_p: 0.9,
            seed: 11,
            stop: vec!["\n".into(), "END".into()],
        };
        assert_eq!(
            request_from_proto(request_proto(&request)).unwrap(),
            request
        );
    }

    #[test]
    fn an_unknown_mode_names_the_field() {
        let mut wire = request_proto(&AnswerRequest::new("q", vec![Document::new("t", "x")]));
        wire.mode = 7;
        assert_eq!(request_from_proto(wire).unwrap_err().field, "mode");
    }

    #[test]
    fn an_answer_survives_the_wire_and_foreign_indices_are_refused() {
        let answer = Answer {
            text: "Paris".into(),
            rationale: Some("It says so.".into()),
            documents_used: vec![1],
            drafts: vec![DraftReport {
                documents: vec![0, 1],
                rationale: "It says so.".into(),
                answer: "Paris".into(),
                draft_logprob: -1.5,
                consistency_logprob: -2.0,
                reflection_logprob: -0.25,
                score: -3.75,
            }],
            timings: AnswerTimings {
                prefill: Duration::from_micros(1200),
                first_token: Duration::from_micros(1500),
                decode: Duration::from_micros(800),
                verify: Duration::from_micros(300),
                total: Duration::from_micros(2600),
                kv: None,
            },
            prompt_tokens: 120,
            generated_tokens: 7,
            finish: Finish::Length,
            drafting: DraftingTokens {
                prompt_tokens: 300,
                generated_tokens: 40,
            },
            dropped_turns: 2,
        };
        let wire = answer_proto(answer.clone());
        assert_eq!(answer_from_proto(wire.clone(), 2).unwrap(), answer);
        assert_eq!(
            answer_from_proto(wire, 1).unwrap_err().field,
            "documents_used"
        );
    }
}
