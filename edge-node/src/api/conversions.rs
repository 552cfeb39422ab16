//! Wire types to domain types and back, for both front ends: the only place that knows
//! both the serde/protobuf shapes and the engine's.

use std::collections::BTreeMap;
use std::time::Duration;

use hasten_proto::v1 as pb;
use hasten_rag::{AnswerMode, BackendInfo};

use super::json::{
    CloudLinkJson, DocumentJson, DraftTraceJson, ErrorDetail, ErrorJson, GenerationJson, LinkJson,
    MatchedQueryJson, OutcomeJson, RetrieveBody, RetrieveReply, StatusJson, TimingsJson,
    TracedMatchJson,
};
use super::{EdgeError, ReplyOptions, RetrieveInput};
use crate::fallback::quic::CloudLink;
use crate::retrieval::{
    DraftTrace, MatchedQuery, Outcome, Retrieval, RetrievedDocument, StageTimings,
};
use crate::service::retrieve::EdgeStatus;

impl From<RetrieveBody> for RetrieveInput {
    fn from(body: RetrieveBody) -> Self {
        Self {
            query: body.query,
            vector: body.vector,
            k: body.k,
        }
    }
}

impl From<pb::RetrieveRequest> for RetrieveInput {
    fn from(request: pb::RetrieveRequest) -> Self {
        let (query, vector) = match request.input {
            Some(pb::retrieve_request::Input::Query(q)) => (Some(q), None),
            Some(pb::retrieve_request::Input::Vector(v)) => (None, Some(v.values)),
            None => (None, None),
        };
        Self {
            query,
            vector,
            k: request.k.map(i64::from),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl From<StageTimings> for TimingsJson {
    fn from(t: StageTimings) -> Self {
        Self {
            encode_us: t.encode.map(micros),
            cache_channel_us: t.cache_channel.map(micros),
            fuzzy_channel_us: t.fuzzy_channel.map(micros),
            merge_us: t.merge.map(micros),
            validation_us: t.validation.map(micros),
            cloud_us: t.cloud.map(micros),
            cache_update_us: t.cache_update.map(micros),
            total_us: micros(t.total),
        }
    }
}

impl From<TimingsJson> for pb::StageTimings {
    fn from(json: TimingsJson) -> Self {
        Self {
            encode_us: json.encode_us,
            cache_channel_us: json.cache_channel_us,
            fuzzy_channel_us: json.fuzzy_channel_us,
            merge_us: json.merge_us,
            validation_us: json.validation_us,
            cloud_us: json.cloud_us,
            cache_update_us: json.cache_update_us,
            total_us: json.total_us,
        }
    }
}

impl From<RetrievedDocument> for DocumentJson {
    fn from(d: RetrievedDocument) -> Self {
        let RetrievedDocument {
            id,
            title,
            text,
            score,
        } = d;
        Self {
            id,
            title,
            text,
            score,
        }
    }
}

fn matched_text(matched: &MatchedQuery, options: ReplyOptions) -> Option<String> {
    matched.text.clone().filter(|_| options.matched_query_text)
}

fn draft_trace_json(trace: DraftTrace, options: ReplyOptions) -> Option<DraftTraceJson> {
    options.draft_trace.then(|| DraftTraceJson {
        draft: trace.draft,
        cache_channel: trace.cache_channel,
        fuzzy_channel: trace.fuzzy_channel,
        best_match: trace.best_match.map(|m| TracedMatchJson {
            id: m.id,
            text: m.text.filter(|_| options.matched_query_text),
            shared_documents: m.shared_documents,
            documents: m.documents,
        }),
    })
}

/// A retrieval as the JSON API answers it.
pub fn reply_json(r: Retrieval, options: ReplyOptions) -> RetrieveReply {
    RetrieveReply {
        documents: r.documents.into_iter().map(DocumentJson::from).collect(),
        outcome: match r.outcome {
            Outcome::Accepted => OutcomeJson::Accepted,
            Outcome::Fallback => OutcomeJson::Fallback,
        },
        homology_score: r.homology_score,
        matched_query: r.matched_query.map(|m| MatchedQueryJson {
            id: m.id,
            text: matched_text(&m, options),
            shared_documents: m.shared_documents,
        }),
        timings_us: r.timings.into(),
        draft_trace: r.draft_trace.and_then(|t| draft_trace_json(t, options)),
    }
}

impl From<DocumentJson> for pb::Document {
    fn from(d: DocumentJson) -> Self {
        Self {
            id: d.id,
            title: d.title,
            text: d.text,
            score: d.score,
        }
    }
}

impl From<OutcomeJson> for pb::Outcome {
    fn from(outcome: OutcomeJson) -> Self {
        match outcome {
            OutcomeJson::Accepted => Self::Accepted,
            OutcomeJson::Fallback => Self::Fallback,
        }
    }
}

/// A retrieval as the gRPC API answers it: the JSON reply's content in protobuf.
pub fn reply_proto(r: Retrieval, options: ReplyOptions) -> pb::RetrieveResponse {
    let reply = reply_json(r, options);
    pb::RetrieveResponse {
        documents: reply
            .documents
            .into_iter()
            .map(pb::Document::from)
            .collect(),
        outcome: pb::Outcome::from(reply.outcome) as i32,
        homology_score: reply.homology_score as f32,
        matched_query: reply.matched_query.map(|m| pb::MatchedQuery {
            id: m.id,
            text: m.text,
            shared_documents: u32::try_from(m.shared_documents).unwrap_or(u32::MAX),
        }),
        timings: Some(reply.timings_us.into()),
        draft_trace: reply.draft_trace.map(|t| pb::DraftTrace {
            draft: t.draft,
            cache_channel: t.cache_channel,
            fuzzy_channel: t.fuzzy_channel,
            best_match: t.best_match.map(|m| pb::TracedMatch {
                id: m.id,
                text: m.text,
                shared_documents: u32::try_from(m.shared_documents).unwrap_or(u32::MAX),
                documents: m.documents,
            }),
        }),
    }
}

impl From<&CloudLink> for CloudLinkJson {
    fn from(link: &CloudLink) -> Self {
        let detail = match link {
            CloudLink::Unknown | CloudLink::Verified => None,
            CloudLink::Unreachable(reason) => Some(reason.clone()),
            CloudLink::VersionMismatch { cloud } => {
                Some(format!("the cloud serves corpus version {cloud}"))
            }
        };
        Self {
            state: link.label(),
            detail,
        }
    }
}

/// The edge's state as `GET /v1/status` shows it.
/// The status of an edge's retrieval and of its generation backend (`generation`, from
/// `AnswerService::generation`).
pub fn status_json(
    status: EdgeStatus,
    generation: Option<(BackendInfo, Vec<AnswerMode>)>,
) -> StatusJson {
    StatusJson {
        policy: format!("{:?}", status.policy),
        tau: status.tau,
        semantic_threshold: status.semantic_threshold,
        corpus_version: status.corpus_version,
        cached_queries: status.cache.queries,
        cached_documents: status.cache.documents,
        cache_bytes: status.cache.bytes,
        cache_capacity: status.cache_capacity,
        default_k: status.default_k,
        validation_depth: status.validation_depth,
        cloud: CloudLinkJson::from(&status.cloud),
        control_plane: status.link.map(|link| LinkJson {
            applied_index: link.applied_index,
            subscribed: link.subscribed,
            proposed: link.proposed,
            dropped: link.dropped,
        }),
        skipped_entries: status
            .skipped
            .into_iter()
            .map(|(reason, count)| (reason.label(), count))
            .collect::<BTreeMap<_, _>>(),
        held_documents: status.documents.held,
        fetched_documents: status.documents.fetched,
        pending_documents: status.documents.pending,
        generation: generation.map(|(info, modes)| GenerationJson {
            verifier: info.verifier,
            drafter: info.drafter,
            device: info.device,
            modes: modes.into_iter().map(|mode| mode.name().into()).collect(),
        }),
    }
}

/// The JSON body of a failed request.
pub fn error_json(err: &EdgeError) -> ErrorJson {
    let field = match err {
        EdgeError::InvalidArgument(invalid) => Some(invalid.field.clone()),
        _ => None,
    };
    let message = match err {
        EdgeError::InvalidArgument(invalid) => invalid.message.clone(),
        other => other.to_string(),
    };
    ErrorJson {
        error: ErrorDetail {
            code: err.kind(),
            field,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted_through(text: Option<&str>) -> Retrieval {
        Retrieval {
            documents: vec![],
            outcome: Outcome::Accepted,
            homology_score: 0.3,
            matched_query: Some(MatchedQuery {
                id: 7,
                text: text.map(str::to_string),
                shared_documents: 3,
            }),
            timings: StageTimings::default(),
            draft_trace: Some(DraftTrace {
                draft: vec![4, 2],
                cache_channel: vec![2, 9],
                fuzzy_channel: vec![4, 2],
                best_match: Some(crate::retrieval::TracedMatch {
                    id: 7,
                    text: text.map(str::to_string),
                    shared_documents: 3,
                    documents: vec![2, 9, 11],
                }),
            }),
        }
    }

    #[test]
    fn another_users_question_is_shown_only_when_the_operator_allows() {
        let hidden = ReplyOptions::default();
        let shown = ReplyOptions {
            matched_query_text: true,
            draft_trace: true,
        };
        let asked = Some("who founded acme?");
        let json = reply_json(accepted_through(asked), hidden);
        let matched = json.matched_query.unwrap();
        assert_eq!((matched.id, matched.text), (7, None));
        let body = serde_json::to_string(&reply_json(accepted_through(asked), hidden)).unwrap();
        assert!(!body.contains("acme"), "{body}");
        assert_eq!(
            reply_json(accepted_through(asked), shown)
                .matched_query
                .and_then(|m| m.text)
                .as_deref(),
            asked
        );
        let proto = reply_proto(accepted_through(asked), hidden);
        assert_eq!(proto.matched_query.unwrap().text, None);
        let proto = reply_proto(accepted_through(asked), shown);
        assert_eq!(proto.matched_query.unwrap().text.as_deref(), asked);
    }

    #[test]
    fn a_draft_trace_is_shown_only_when_the_operator_allows_and_hides_texts_as_matches_do() {
        let asked = Some("who founded acme?");
        let hidden = reply_json(accepted_through(asked), ReplyOptions::default());
        assert_eq!(hidden.draft_trace, None);
        let body = serde_json::to_value(&hidden).unwrap();
        assert!(body.get("draft_trace").is_none(), "{body}");
        assert_eq!(
            reply_proto(accepted_through(asked), ReplyOptions::default()).draft_trace,
            None
        );

        let ids_only = ReplyOptions {
            draft_trace: true,
            ..ReplyOptions::default()
        };
        let trace = reply_json(accepted_through(asked), ids_only)
            .draft_trace
            .unwrap();
        assert_eq!(
            (trace.draft, trace.cache_channel, trace.fuzzy_channel),
            (vec![4, 2], vec![2, 9], vec![4, 2])
        );
        let best = trace.best_match.unwrap();
        assert_eq!(
            (best.id, best.text, best.documents),
            (7, None, vec![2, 9, 11])
        );

        let proto = reply_proto(
            accepted_through(asked),
            ReplyOptions {
                draft_trace: true,
                matched_query_text: true,
            },
        )
        .draft_trace
        .unwrap();
        let best = proto.best_match.unwrap();
        assert_eq!(
            (proto.draft, best.text.as_deref(), best.documents),
            (vec![4, 2], asked, vec![2, 9, 11])
        );
    }

    #[test]
    fn stages_that_did_not_run_are_absent_on_the_wire() {
        let timings = StageTimings {
            encode: Some(Duration::from_micros(1500)),
            total: Duration::from_micros(2000),
            ..StageTimings::default()
        };
        let json = serde_json::to_value(TimingsJson::from(timings)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"encode_us": 1500, "total_us": 2000})
        );
        let proto = pb::StageTimings::from(TimingsJson::from(timings));
        assert_eq!((proto.encode_us, proto.cloud_us), (Some(1500), None));
    }
}
