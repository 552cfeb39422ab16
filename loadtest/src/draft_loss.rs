//! Where HaS's accepted drafts lose the gold passage (issue 50): for every accepted first
//! occurrence whose draft holds no gold passage, whether the cloud's exact answer to the
//! same query held one and, if it did, which stage lost it (a channel found it and the
//! exact re-rank cut it, or no channel found it), whether the validating cached query's
//! own result held it, and what that query was about (the same subject and relation, the
//! same subject only, another subject). Rejected drafts that held the cloud's gold passage
//! count the acceptances the rules left behind.
//!
//! It reads the edges' draft traces (`expose_draft_trace`) and pairs each query with the
//! cloud-only run's answer by sequence number, as the paired hit-rate drop does.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::scoring::{DraftTrace, QueryRecord, WorkloadIndex};

/// What the validating cached query was about, against the query it validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Validation {
    /// The same subject under the same relation: a paraphrase of one question.
    SameQuestion,
    /// The same subject under another relation: a homologous question.
    SameSubject,
    OtherSubject,
    /// The edge did not show the cached query's text.
    Unknown,
}

impl Validation {
    pub fn label(self) -> &'static str {
        match self {
            Self::SameQuestion => "same subject and relation",
            Self::SameSubject => "same subject, another or no relation",
            Self::OtherSubject => "another subject",
            Self::Unknown => "not shown",
        }
    }
}

/// One answered first occurrence, as the breakdown needs it.
#[derive(Clone, Debug)]
pub struct TracedQuery {
    pub accepted: bool,
    /// The served documents held a gold passage.
    pub has_gold: bool,
    /// Ids of the served documents that are gold passages.
    pub gold_ids: Vec<u64>,
    pub validated_by: Validation,
    pub trace: Option<DraftTrace>,
}

/// Each answered first occurrence of a run, by sequence number.
pub type TracedQueries = BTreeMap<usize, TracedQuery>;

/// The answered first occurrences of `records`.
pub fn traced_queries(records: &[QueryRecord], index: &WorkloadIndex) -> TracedQueries {
    records
        .iter()
        .filter(|r| index.first_occurrences.contains(&r.question.seq))
        .filter_map(|record| {
            let reply = record.result.as_ref().ok()?;
            let question = &record.question;
            let gold_ids: Vec<u64> = reply
                .documents
                .iter()
                .filter(|d| d.is_gold_for(question))
                .map(|d| d.id)
                .collect();
            let matched = reply.matched_query.as_ref().and_then(|m| m.text.as_ref());
            let validated_by = match matched {
                None => Validation::Unknown,
                Some(text) if index.entity_of_question.get(text) != Some(&question.entity) => {
                    Validation::OtherSubject
                }
                Some(text) => {
                    let relation = index.relation_of_question.get(text);
                    if relation.is_some() && relation == question.relation.as_ref() {
                        Validation::SameQuestion
                    } else {
                        Validation::SameSubject
                    }
                }
            };
            let traced = TracedQuery {
                accepted: reply.outcome == "accepted",
                has_gold: !gold_ids.is_empty(),
                gold_ids,
                validated_by,
                trace: reply.draft_trace.clone(),
            };
            Some((question.seq, traced))
        })
        .collect()
}

/// Accepted drafts validated one way, and where those without a gold passage lost it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LossRow {
    pub validated_by: Option<Validation>,
    pub accepted: usize,
    pub without_gold: usize,
    /// Of those: the cloud's exact answer held no gold passage either.
    pub cloud_has_none: usize,
    /// The cloud's gold passage was among the cache channel's candidates; the re-rank cut it.
    pub cut_from_cache_channel: usize,
    /// Among the fuzzy channel's candidates only; the re-rank cut it.
    pub cut_from_fuzzy_channel: usize,
    /// In neither channel's candidates.
    pub in_no_channel: usize,
    /// Of the drafts the cloud had a gold passage for: the validating query's cached
    /// result held it.
    pub in_validating_result: usize,
}

/// The breakdown of one HaS run against cloud-only, over first occurrences.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DraftLosses {
    /// One row per kind of validating query, then the total (`validated_by` null).
    pub rows: Vec<LossRow>,
    /// Rejected drafts paired with a cloud answer.
    pub rejected: usize,
    /// Of them, drafts whose best k held the cloud's gold passage.
    pub rejected_with_gold: usize,
}

/// The breakdown of `system` against `cloud` (cloud-only's run of the same workload);
/// `None` when the system's replies carry no draft traces.
pub fn draft_losses(system: &TracedQueries, cloud: &TracedQueries) -> Option<DraftLosses> {
    if !system.values().any(|q| q.trace.is_some()) {
        return None;
    }
    let mut rows: BTreeMap<Validation, LossRow> = BTreeMap::new();
    let mut losses = DraftLosses::default();
    for (seq, query) in system {
        let (Some(trace), Some(exact)) = (&query.trace, cloud.get(seq)) else {
            continue;
        };
        let cloud_gold: HashSet<u64> = exact.gold_ids.iter().copied().collect();
        let holds_gold = |ids: &[u64]| ids.iter().any(|id| cloud_gold.contains(id));
        if !query.accepted {
            losses.rejected += 1;
            losses.rejected_with_gold += usize::from(holds_gold(&trace.draft));
            continue;
        }
        let row = rows.entry(query.validated_by).or_default();
        row.accepted += 1;
        if query.has_gold {
            continue;
        }
        row.without_gold += 1;
        if cloud_gold.is_empty() {
            row.cloud_has_none += 1;
            continue;
        }
        if holds_gold(&trace.cache_channel) {
            row.cut_from_cache_channel += 1;
        } else if holds_gold(&trace.fuzzy_channel) {
            row.cut_from_fuzzy_channel += 1;
        } else {
            row.in_no_channel += 1;
        }
        let validating = trace.best_match.as_ref().map(|m| m.documents.as_slice());
        row.in_validating_result += usize::from(validating.is_some_and(holds_gold));
    }
    let mut total = LossRow::default();
    for (validated_by, mut row) in rows {
        total.accepted += row.accepted;
        total.without_gold += row.without_gold;
        total.cloud_has_none += row.cloud_has_none;
        total.cut_from_cache_channel += row.cut_from_cache_channel;
        total.cut_from_fuzzy_channel += row.cut_from_fuzzy_channel;
        total.in_no_channel += row.in_no_channel;
        total.in_validating_result += row.in_validating_result;
        row.validated_by = Some(validated_by);
        losses.rows.push(row);
    }
    losses.rows.push(total);
    Some(losses)
}

/// The breakdown as a markdown table under `label`'s heading.
pub fn markdown(label: &str, losses: &DraftLosses) -> String {
    let mut text = format!(
        "\n### {label}\n\n\
         | validated by | accepted | no gold passage | cloud had none | cut by the re-rank, cache channel | cut by the re-rank, fuzzy channel | in no channel | in the validating query's result |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for row in &losses.rows {
        let name = row.validated_by.map_or("all", Validation::label);
        text.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |\n",
            row.accepted,
            row.without_gold,
            row.cloud_has_none,
            row.cut_from_cache_channel,
            row.cut_from_fuzzy_channel,
            row.in_no_channel,
            row.in_validating_result,
        ));
    }
    text.push_str(&format!(
        "\nRejected drafts: {}, of which {} held the cloud's gold passage in their best k.\n",
        losses.rejected, losses.rejected_with_gold
    ));
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scoring::{EdgeReply, ReplyDocument, ReplyMatch, TracedMatch};
    use crate::workload::WorkloadQuery;

    fn question(seq: usize, text: &str, entity: &str, relation: &str) -> WorkloadQuery {
        WorkloadQuery {
            seq,
            day: 0,
            question: text.into(),
            answers: vec!["Lisbon".into()],
            entity: entity.into(),
            source: "test".into(),
            relation: Some(relation.into()),
            gold_passage: None,
            popularity: Default::default(),
        }
    }

    /// A passage of `title`'s article; gold for questions about `title` when it holds
    /// the answer.
    fn passage(id: u64, title: &str, gold: bool) -> ReplyDocument {
        ReplyDocument {
            id,
            title: title.into(),
            text: if gold { "born in Lisbon" } else { "a painter" }.into(),
        }
    }

    fn record(
        q: &WorkloadQuery,
        outcome: &str,
        documents: Vec<ReplyDocument>,
        matched: Option<&str>,
        trace: Option<DraftTrace>,
    ) -> QueryRecord {
        QueryRecord {
            edge: 0,
            question: q.clone(),
            latency: Duration::from_millis(5),
            sent: Duration::ZERO,
            result: Ok(EdgeReply {
                documents,
                outcome: outcome.into(),
                matched_query: matched.map(|text| ReplyMatch {
                    text: Some(text.into()),
                }),
                timings_us: None,
                draft_trace: trace,
            }),
        }
    }

    fn trace(draft: &[u64], cache: &[u64], fuzzy: &[u64], validating: &[u64]) -> DraftTrace {
        DraftTrace {
            draft: draft.to_vec(),
            cache_channel: cache.to_vec(),
            fuzzy_channel: fuzzy.to_vec(),
            best_match: Some(TracedMatch {
                documents: validating.to_vec(),
            }),
        }
    }

    #[test]
    fn each_lost_gold_passage_is_put_on_the_stage_that_lost_it() {
        // Questions 0-2 cache the subjects A and B; 3-7 are the first occurrences scored.
        let workload = [
            question(0, "where was A born", "A", "P19"),
            question(1, "what does A do", "A", "P106"),
            question(2, "where was B born", "B", "P19"),
            question(3, "A's birthplace?", "A", "P19"),
            question(4, "A's work?", "A", "P106"),
            question(5, "B's birthplace?", "B", "P19"),
            question(6, "C's birthplace?", "C", "P19"),
            question(7, "D's birthplace?", "D", "P19"),
            question(8, "E's birthplace?", "E", "P19"),
        ];
        let index = WorkloadIndex::new(&workload);
        let q = |seq: usize| &workload[seq];
        // Cloud-only: the gold passage of each question (ids 30+seq), none for D.
        let cloud: Vec<QueryRecord> = (3..9)
            .map(|seq| {
                let gold = seq != 7;
                let title = q(seq).entity.clone();
                record(
                    q(seq),
                    "fallback",
                    vec![passage(30 + seq as u64, &title, gold)],
                    None,
                    None,
                )
            })
            .collect();
        let system = vec![
            // 3: accepted through a paraphrase, gold served.
            record(
                q(3),
                "accepted",
                vec![passage(33, "A", true)],
                Some("where was A born"),
                Some(trace(&[33], &[33], &[], &[33])),
            ),
            // 4: accepted through the same subject's other question; the cache channel
            // had the gold passage and the re-rank cut it; the validating result held it.
            record(
                q(4),
                "accepted",
                vec![passage(1, "A", false)],
                Some("where was A born"),
                Some(trace(&[1], &[1, 34], &[2], &[1, 34])),
            ),
            // 5: accepted through another subject; only the fuzzy channel had it.
            record(
                q(5),
                "accepted",
                vec![passage(2, "A", false)],
                Some("what does A do"),
                Some(trace(&[2], &[2], &[35], &[2])),
            ),
            // 6: accepted through another subject; no channel had it.
            record(
                q(6),
                "accepted",
                vec![passage(2, "A", false)],
                Some("what does A do"),
                Some(trace(&[2], &[2], &[9], &[2])),
            ),
            // 7: accepted, no gold, and the cloud had none either.
            record(
                q(7),
                "accepted",
                vec![passage(2, "A", false)],
                Some("where was B born"),
                Some(trace(&[2], &[2], &[], &[2])),
            ),
            // 8: rejected although its draft held the cloud's gold passage.
            record(
                q(8),
                "fallback",
                vec![passage(38, "E", true)],
                None,
                Some(trace(&[38], &[38], &[], &[])),
            ),
        ];
        let losses = draft_losses(
            &traced_queries(&system, &index),
            &traced_queries(&cloud, &index),
        )
        .unwrap();
        let row = |v: Option<Validation>| losses.rows.iter().find(|r| r.validated_by == v).unwrap();
        let same_question = row(Some(Validation::SameQuestion));
        assert_eq!((same_question.accepted, same_question.without_gold), (1, 0));
        let same_subject = row(Some(Validation::SameSubject));
        assert_eq!(
            (
                same_subject.accepted,
                same_subject.cut_from_cache_channel,
                same_subject.in_validating_result
            ),
            (1, 1, 1)
        );
        let other = row(Some(Validation::OtherSubject));
        assert_eq!(
            (
                other.accepted,
                other.without_gold,
                other.cut_from_fuzzy_channel,
                other.in_no_channel,
                other.cloud_has_none
            ),
            (3, 3, 1, 1, 1)
        );
        let total = row(None);
        assert_eq!(
            (
                total.accepted,
                total.without_gold,
                total.in_validating_result
            ),
            (5, 4, 1)
        );
        assert_eq!((losses.rejected, losses.rejected_with_gold), (1, 1));
        assert!(markdown("has tau=0.4", &losses).contains("| all | 5 | 4 | 1 | 1 | 1 | 1 | 1 |"));
    }

    #[test]
    fn no_breakdown_without_traces() {
        let workload = [question(0, "where was A born", "A", "P19")];
        let index = WorkloadIndex::new(&workload);
        let records = vec![record(
            &workload[0],
            "fallback",
            vec![passage(1, "A", true)],
            None,
            None,
        )];
        let traced = traced_queries(&records, &index);
        assert_eq!(draft_losses(&traced, &traced), None);
    }
}
