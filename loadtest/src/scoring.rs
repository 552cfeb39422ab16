//! Scoring a run from its per-query records: draft acceptance rate (DAR), correct
//! acceptance rate (CAR), document hit rate (DHR) overall and over accepted drafts, and
//! latency by outcome, as the HaS paper defines them; gold recall (a returned passage is
//! the question's own); every figure over all queries and over first occurrences.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use hasten_core::corpus::passage_fingerprint;
use hasten_eval::answers::contains_answer;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::driver::Sent;
use crate::workload::{WorkloadQuery, first_occurrences};

/// The part of an edge's `/v1/retrieve` reply the evaluation reads.
#[derive(Clone, Debug, Deserialize)]
pub struct EdgeReply {
    pub documents: Vec<ReplyDocument>,
    pub outcome: String,
    pub matched_query: Option<ReplyMatch>,
    /// The edge's own account of where its time went.
    #[serde(default)]
    pub timings_us: Option<ReplyTimings>,
    /// Where an HaS draft came from (edges started with `--expose-draft-trace`).
    #[serde(default)]
    pub draft_trace: Option<DraftTrace>,
}

/// Document ids of an HaS draft and of what it was drawn and validated from, as an edge
/// reports them.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DraftTrace {
    pub draft: Vec<u64>,
    pub cache_channel: Vec<u64>,
    pub fuzzy_channel: Vec<u64>,
    pub best_match: Option<TracedMatch>,
}

/// The cached query with the most votes for a draft, and the documents it cached.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TracedMatch {
    pub documents: Vec<u64>,
}

/// Stage times an edge reports with each reply, in microseconds.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct ReplyTimings {
    /// The cloud call, as the edge waited for it (network to the cloud included).
    #[serde(default)]
    pub cloud_us: Option<u64>,
    #[serde(default)]
    pub cache_update_us: Option<u64>,
    /// The edge's whole handling, from request to reply.
    pub total_us: u64,
}

/// Where a system's fallbacks spent their time, as means over the fallbacks whose replies
/// carry timings: the client's latency less the edge's total is the client-edge network
/// and any queueing before the edge's handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FallbackBreakdown {
    pub fallbacks: usize,
    /// The edge's whole handling.
    pub edge_s: f64,
    /// Of which the cloud call.
    pub cloud_s: f64,
    /// Of which the cache update after it.
    pub cache_update_s: f64,
    /// The client's latency less the edge's handling.
    pub outside_edge_s: f64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ReplyDocument {
    /// The corpus document id (absent from replies that do not carry one).
    #[serde(default)]
    pub id: u64,
    #[serde(default)]
    pub title: String,
    pub text: String,
}

impl ReplyDocument {
    /// Whether this passage is `question`'s gold passage: the one its data set wrote it
    /// from where it names one (SQuAD's paragraph), else a passage of the subject's own
    /// article holding an answer (EntityQuestions).
    pub fn is_gold_for(&self, question: &WorkloadQuery) -> bool {
        match question.gold_passage {
            Some(fingerprint) => passage_fingerprint(&self.text) == fingerprint,
            None => self.title == question.entity && contains_answer(&self.text, &question.answers),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct ReplyMatch {
    pub text: Option<String>,
}

/// What happened to one retrieval.
pub type QueryRecord = Sent<EdgeReply>;

impl Sent<EdgeReply> {
    /// One line of a run's `records-*.jsonl`: the query, its outcome, the client's latency
    /// and the edge's stage times, for analyses the report does not make.
    pub fn to_json(&self) -> serde_json::Value {
        let (outcome, timings, error) = match &self.result {
            Ok(reply) => (
                reply.outcome.as_str(),
                reply.timings_us.map(|t| {
                    serde_json::json!({"total_us": t.total_us, "cloud_us": t.cloud_us, "cache_update_us": t.cache_update_us})
                }),
                None,
            ),
            Err(error) => ("error", None, Some(error.as_str())),
        };
        serde_json::json!({
            "seq": self.question.seq,
            "edge": self.edge,
            "outcome": outcome,
            "latency_s": self.latency.as_secs_f64(),
            "timings_us": timings,
            "error": error,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub queries: usize,
    pub accepted: usize,
    pub fallback: usize,
    pub errors: usize,
    /// Latency percentiles from an HDR histogram (microsecond resolution), every query.
    pub p50_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    pub dar: f64,
    /// Accepted drafts validated by a cached query that fell back on another edge and
    /// never on the answering one: what replication taught this edge.
    pub cross_edge_accepted: usize,
    /// `None` when nothing was accepted.
    pub car: Option<f64>,
    pub doc_hit_rate: f64,
    pub doc_hit_rate_at_da: Option<f64>,
    pub avg_latency_s: f64,
    pub latency_at_da_s: Option<f64>,
    pub latency_at_dr_s: Option<f64>,
    /// Where fallbacks spent their time; `None` without fallbacks that carry timings.
    pub fallback_breakdown: Option<FallbackBreakdown>,
    /// Share of queries with a gold passage among the returned ones.
    pub gold_recall_at_k: f64,
    /// Mean over the queries both answered of (cloud-only's hit - this system's hit), the
    /// unit of `doc_hit_rate` (0.01 = one point); `None` until paired (see
    /// [`pair_with_baseline`]), or without a cloud-only run.
    pub paired_dhr_drop: Option<f64>,
    /// Each query's document hit by sequence number (a failed query is a miss), for pairing.
    #[serde(skip)]
    pub hits: BTreeMap<usize, bool>,
}

/// What scoring needs to know about the workload beyond each record.
#[derive(Clone, Debug, Default)]
pub struct WorkloadIndex {
    /// Question text to entity, to judge whether an accepted draft was validated by a
    /// query about the same entity (CAR).
    pub entity_of_question: HashMap<String, String>,
    /// Question text to relation, where the data set names one (EntityQuestions).
    pub relation_of_question: HashMap<String, String>,
    /// Queries whose text no earlier query asked.
    pub first_occurrences: HashSet<usize>,
}

impl WorkloadIndex {
    pub fn new(workload: &[WorkloadQuery]) -> Self {
        Self {
            entity_of_question: workload
                .iter()
                .map(|q| (q.question.clone(), q.entity.clone()))
                .collect(),
            relation_of_question: workload
                .iter()
                .filter_map(|q| Some((q.question.clone(), q.relation.clone()?)))
                .collect(),
            first_occurrences: first_occurrences(workload),
        }
    }
}

/// Sets `paired_dhr_drop` of `system` against `baseline`: the same queries, hit against hit.
pub fn pair_with_baseline(system: &mut Summary, baseline: &Summary) {
    let pairs: Vec<f64> = system
        .hits
        .iter()
        .filter_map(|(seq, hit)| {
            baseline
                .hits
                .get(seq)
                .map(|base| f64::from(u8::from(*base)) - f64::from(u8::from(*hit)))
        })
        .collect();
    system.paired_dhr_drop =
        (!pairs.is_empty()).then(|| pairs.iter().sum::<f64>() / pairs.len() as f64);
}

fn ratio(num: usize, den: usize) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

fn mean_seconds(latencies: &[Duration]) -> Option<f64> {
    (!latencies.is_empty())
        .then(|| latencies.iter().map(Duration::as_secs_f64).sum::<f64>() / latencies.len() as f64)
}

/// Latency histogram of `records` in microseconds (1 us to 10 min, 3 significant digits).
pub fn latency_histogram(records: &[QueryRecord]) -> Histogram<u64> {
    histogram_of(records.iter().map(|r| r.latency))
}

/// [`latency_histogram`] of bare latencies.
pub fn histogram_of(latencies: impl IntoIterator<Item = Duration>) -> Histogram<u64> {
    #[allow(clippy::expect_used)] // constant bounds, valid by construction
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds");
    for latency in latencies {
        histogram.saturating_record(latency.as_micros().max(1) as u64);
    }
    histogram
}

/// Summaries of `records`: over all of them, and over first occurrences only.
pub fn summarize_all_and_first(
    records: &[QueryRecord],
    index: &WorkloadIndex,
) -> (Summary, Summary) {
    let first: Vec<QueryRecord> = records
        .iter()
        .filter(|r| index.first_occurrences.contains(&r.question.seq))
        .cloned()
        .collect();
    (
        summarize(records, &index.entity_of_question),
        summarize(&first, &index.entity_of_question),
    )
}

/// Summarises `records`. `entity_of_question` maps a question text to its entity, to judge
/// whether an accepted draft was validated by a query about the same entity (CAR).
pub fn summarize(records: &[QueryRecord], entity_of_question: &HashMap<String, String>) -> Summary {
    let mut accepted = 0;
    let mut gold = 0;
    let mut hit_by_seq = BTreeMap::new();
    let mut correct_accepts = 0;
    let mut hits = 0;
    let mut hits_at_da = 0;
    let mut errors = 0;
    let mut all = Vec::new();
    let mut at_da = Vec::new();
    let mut at_dr = Vec::new();
    let mut breakdown = FallbackBreakdown::default();
    let mut fell_back_on: HashMap<&str, Vec<usize>> = HashMap::new();
    for record in records {
        if let Ok(reply) = &record.result
            && reply.outcome != "accepted"
        {
            fell_back_on
                .entry(record.question.question.as_str())
                .or_default()
                .push(record.edge);
        }
    }
    let mut cross_edge_accepted = 0;
    for record in records {
        all.push(record.latency);
        let Ok(reply) = &record.result else {
            errors += 1;
            hit_by_seq.insert(record.question.seq, false);
            continue;
        };
        let hit = reply
            .documents
            .iter()
            .any(|d| contains_answer(&d.text, &record.question.answers));
        hits += usize::from(hit);
        hit_by_seq.insert(record.question.seq, hit);
        gold += usize::from(
            reply
                .documents
                .iter()
                .any(|d| d.is_gold_for(&record.question)),
        );
        if reply.outcome == "accepted" {
            accepted += 1;
            hits_at_da += usize::from(hit);
            at_da.push(record.latency);
            let matched_text = reply.matched_query.as_ref().and_then(|m| m.text.as_ref());
            let matched_entity = matched_text.and_then(|text| entity_of_question.get(text));
            let edges = matched_text.and_then(|text| fell_back_on.get(text.as_str()));
            cross_edge_accepted +=
                usize::from(edges.is_some_and(|edges| !edges.contains(&record.edge)));
            correct_accepts += usize::from(matched_entity == Some(&record.question.entity));
        } else {
            at_dr.push(record.latency);
            if let Some(timings) = reply.timings_us {
                let seconds = |us: Option<u64>| us.unwrap_or(0) as f64 / 1e6;
                let edge = seconds(Some(timings.total_us));
                breakdown.fallbacks += 1;
                breakdown.edge_s += edge;
                breakdown.cloud_s += seconds(timings.cloud_us);
                breakdown.cache_update_s += seconds(timings.cache_update_us);
                breakdown.outside_edge_s += record.latency.as_secs_f64() - edge;
            }
        }
    }
    let fallback_breakdown = (breakdown.fallbacks > 0).then(|| {
        let n = breakdown.fallbacks as f64;
        FallbackBreakdown {
            fallbacks: breakdown.fallbacks,
            edge_s: breakdown.edge_s / n,
            cloud_s: breakdown.cloud_s / n,
            cache_update_s: breakdown.cache_update_s / n,
            outside_edge_s: breakdown.outside_edge_s / n,
        }
    });
    let answered = records.len() - errors;
    let histogram = latency_histogram(records);
    let quantile = |q: f64| histogram.value_at_quantile(q) as f64 / 1e6;
    Summary {
        queries: records.len(),
        accepted,
        fallback: answered - accepted,
        errors,
        p50_s: quantile(0.5),
        p95_s: quantile(0.95),
        p99_s: quantile(0.99),
        max_s: histogram.max() as f64 / 1e6,
        dar: ratio(accepted, records.len()).unwrap_or(0.0),
        cross_edge_accepted,
        car: ratio(correct_accepts, accepted),
        doc_hit_rate: ratio(hits, records.len()).unwrap_or(0.0),
        doc_hit_rate_at_da: ratio(hits_at_da, accepted),
        avg_latency_s: mean_seconds(&all).unwrap_or(0.0),
        latency_at_da_s: mean_seconds(&at_da),
        latency_at_dr_s: mean_seconds(&at_dr),
        fallback_breakdown,
        gold_recall_at_k: ratio(gold, records.len()).unwrap_or(0.0),
        paired_dhr_drop: None,
        hits: hit_by_seq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(text: &str, entity: &str, answer: &str) -> WorkloadQuery {
        WorkloadQuery {
            seq: 0,
            day: 0,
            question: text.into(),
            answers: vec![answer.into()],
            entity: entity.into(),
            source: "test".into(),
            relation: None,
            gold_passage: None,
            popularity: Default::default(),
        }
    }

    fn document(title: &str, text: &str) -> ReplyDocument {
        ReplyDocument {
            id: 0,
            title: title.into(),
            text: text.into(),
        }
    }

    fn reply(outcome: &str, text: &str, matched: Option<&str>) -> EdgeReply {
        EdgeReply {
            documents: vec![document("", text)],
            outcome: outcome.into(),
            matched_query: matched.map(|m| ReplyMatch {
                text: Some(m.into()),
            }),
            timings_us: None,
            draft_trace: None,
        }
    }

    #[test]
    fn fallback_time_splits_into_the_edge_the_cloud_call_and_the_rest() {
        let q = question("q", "E", "x");
        let timed = |outcome: &str, latency_ms: u64, total_us, cloud_us, update_us| QueryRecord {
            edge: 0,
            question: q.clone(),
            latency: Duration::from_millis(latency_ms),
            sent: Duration::ZERO,
            result: Ok(EdgeReply {
                timings_us: Some(ReplyTimings {
                    cloud_us: Some(cloud_us),
                    cache_update_us: Some(update_us),
                    total_us,
                }),
                ..reply(outcome, "x", None)
            }),
        };
        let records = vec![
            timed("fallback", 100, 80_000, 60_000, 1_000),
            timed("fallback", 200, 150_000, 100_000, 3_000),
            // Neither an acceptance nor a reply without timings enters the breakdown.
            timed("accepted", 10, 5_000, 0, 0),
            QueryRecord {
                edge: 0,
                question: q.clone(),
                latency: Duration::from_millis(900),
                sent: Duration::ZERO,
                result: Ok(reply("fallback", "x", None)),
            },
        ];
        let s = summarize(&records, &HashMap::new());
        let b = s.fallback_breakdown.unwrap();
        assert_eq!(b.fallbacks, 2);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(b.edge_s, 0.115) && close(b.cloud_s, 0.08), "{b:?}");
        assert!(
            close(b.cache_update_s, 0.002) && close(b.outside_edge_s, 0.035),
            "{b:?}"
        );
        assert!(
            summarize(&records[2..3], &HashMap::new())
                .fallback_breakdown
                .is_none()
        );
    }

    #[test]
    fn rates_follow_the_papers_definitions() {
        let q1 = question("where born A", "A", "Lisbon");
        let q2 = question("what job A", "A", "baker");
        let q3 = question("what job B", "B", "smith");
        let entities: HashMap<String, String> = [&q1, &q2, &q3]
            .iter()
            .map(|q| (q.question.clone(), q.entity.clone()))
            .collect();
        let ms = Duration::from_millis;
        let records = vec![
            QueryRecord {
                edge: 0,
                question: q1.clone(),
                latency: ms(100),
                sent: Duration::ZERO,
                result: Ok(reply("fallback", "born in Lisbon", None)),
            },
            QueryRecord {
                // Another edge than the one q1 fell back on.
                edge: 1,
                question: q2,
                latency: ms(10),
                sent: Duration::ZERO,
                result: Ok(reply("accepted", "a baker", Some("where born A"))),
            },
            QueryRecord {
                edge: 0,
                question: q3,
                latency: ms(20),
                sent: Duration::ZERO,
                result: Ok(reply("accepted", "no answer", Some("where born A"))),
            },
            QueryRecord {
                edge: 0,
                question: q1,
                latency: ms(30),
                sent: Duration::ZERO,
                result: Err("503".into()),
            },
        ];
        let s = summarize(&records, &entities);
        assert_eq!((s.queries, s.accepted, s.fallback, s.errors), (4, 2, 1, 1));
        assert_eq!(s.dar, 0.5);
        assert_eq!(s.cross_edge_accepted, 1);
        assert_eq!(s.car, Some(0.5));
        assert_eq!(s.doc_hit_rate, 0.5);
        assert_eq!(s.doc_hit_rate_at_da, Some(0.5));
        assert!((s.avg_latency_s - 0.04).abs() < 1e-9);
        assert!((s.latency_at_da_s.unwrap() - 0.015).abs() < 1e-9);
        assert!((s.latency_at_dr_s.unwrap() - 0.1).abs() < 1e-9);
        assert!(
            (s.max_s - 0.1).abs() < 1e-3 && (s.p50_s - 0.02).abs() < 1e-3,
            "{s:?}"
        );
    }

    #[test]
    fn hit_matching_normalises_case_punctuation_and_articles() {
        let q = question("q", "E", "The Denver Broncos");
        let records = vec![
            QueryRecord {
                edge: 0,
                question: q.clone(),
                latency: Duration::from_millis(1),
                sent: Duration::ZERO,
                result: Ok(reply("fallback", "won by denver broncos.", None)),
            },
            QueryRecord {
                edge: 0,
                question: q,
                latency: Duration::from_millis(1),
                sent: Duration::ZERO,
                result: Ok(reply("fallback", "the Denver Broncoses", None)),
            },
        ];
        assert_eq!(summarize(&records, &HashMap::new()).doc_hit_rate, 0.5);
    }

    #[test]
    fn gold_is_the_named_passage_or_an_answering_passage_of_the_subjects_article() {
        let mut squad = question("where", "Warsaw", "Vistula");
        squad.gold_passage = Some(passage_fingerprint("Warsaw lies on the Vistula."));
        assert!(document("Warsaw", "Warsaw lies on the Vistula.").is_gold_for(&squad));
        // Another paragraph of the same article holding the answer is not SQuAD's gold.
        assert!(!document("Warsaw", "The Vistula flows north.").is_gold_for(&squad));
        let eq = question("Where was Ada Lovelace born?", "Ada Lovelace", "London");
        assert!(document("Ada Lovelace", "born in London in 1815").is_gold_for(&eq));
        assert!(!document("Charles Babbage", "born in London").is_gold_for(&eq));
        assert!(!document("Ada Lovelace", "a mathematician").is_gold_for(&eq));
    }

    fn record(seq: usize, q: &WorkloadQuery, text: &str, title: &str) -> QueryRecord {
        let mut question = q.clone();
        question.seq = seq;
        QueryRecord {
            edge: 0,
            question,
            latency: Duration::from_millis(5),
            sent: Duration::ZERO,
            result: Ok(EdgeReply {
                documents: vec![document(title, text)],
                outcome: "fallback".into(),
                matched_query: None,
                timings_us: None,
                draft_trace: None,
            }),
        }
    }

    #[test]
    fn first_occurrences_and_paired_drops_are_scored_apart() {
        let a = question("where born A", "A", "Lisbon");
        let b = question("what job B", "B", "baker");
        let workload: Vec<WorkloadQuery> = [&a, &b, &a]
            .iter()
            .enumerate()
            .map(|(seq, q)| WorkloadQuery {
                seq,
                ..(*q).clone()
            })
            .collect();
        let index = WorkloadIndex::new(&workload);
        assert_eq!(index.first_occurrences, HashSet::from([0, 1]));
        let baseline = vec![
            record(0, &a, "Lisbon", "A"),
            record(1, &b, "a baker", "B"),
            record(2, &a, "Lisbon", "A"),
        ];
        // The system misses the repeat (seq 2) and the first B (seq 1).
        let system = vec![
            record(0, &a, "Lisbon", "A"),
            record(1, &b, "nothing", "B"),
            record(2, &a, "nothing", "A"),
        ];
        let (base_all, base_first) = summarize_all_and_first(&baseline, &index);
        let (mut all, mut first) = summarize_all_and_first(&system, &index);
        assert_eq!((all.queries, first.queries), (3, 2));
        assert!((all.doc_hit_rate - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(first.doc_hit_rate, 0.5);
        assert_eq!(base_all.gold_recall_at_k, 1.0);
        assert!((all.gold_recall_at_k - 1.0 / 3.0).abs() < 1e-12);
        pair_with_baseline(&mut all, &base_all);
        pair_with_baseline(&mut first, &base_first);
        assert!((all.paired_dhr_drop.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(first.paired_dhr_drop, Some(0.5));
    }
}
