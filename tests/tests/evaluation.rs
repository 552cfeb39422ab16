//! The evaluation end to end on a small corpus: `hasten-loadtest eval` starts a real cloud
//! index and, per system, real edges behind the delay relays, drives a few hundred queries
//! through each, and writes the report. The test checks facts the report must agree with:
//! counts add up and rates follow from them, latencies respect the emulated network's
//! floor, each baseline behaves as its definition says, and cloud-only's document hit rate
//! equals an exact search's, computed here by brute force.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_edge_node::lookup::normalized_text;
use hasten_eval::answers::contains_answer;
use hasten_eval::process::binary;
use hasten_loadtest::workload::read_jsonl;
use hasten_tests::{brute_force_top_k, build_small_bundle, model_dir, persistent_work_dir};

const QUERIES: usize = 240;
const K: usize = 10;

#[test]
fn every_system_runs_and_cloud_only_is_exact() {
    let work = persistent_work_dir("evaluation").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 4, None).unwrap();
    let out = fresh_output_dir(&work);
    let workload_file = out.join("workload.jsonl");
    let status = Command::new(binary("hasten-loadtest").unwrap())
        .args(["eval", "--bundle"])
        .arg(&bundle_dir)
        .args([
            "--queries",
            &QUERIES.to_string(),
            "--rate",
            "60",
            "--taus",
            "0.2,0.5",
            "--thetas",
            "0.9",
        ])
        .args([
            "--client-delay",
            "uniform:0.001,0.003",
            "--cloud-delay",
            "uniform:0.005,0.01",
        ])
        .arg("--model-dir")
        .arg(model_dir())
        .arg("--save-workload")
        .arg(&workload_file)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "hasten-loadtest eval failed; logs in {}",
        out.display()
    );

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let systems = report["systems"].as_array().unwrap();
    let names: Vec<&str> = systems
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cloud-only",
            "edge-ivf",
            "exact-cache",
            "semantic-cache",
            "has",
            "has",
            "has-no-fuzzy",
            "has-no-fuzzy-validation",
            "has-no-fuzzy-draft"
        ]
    );
    let number = |s: &serde_json::Value, key: &str| s[key].as_f64();
    for s in systems {
        let count = |key: &str| s[key].as_u64().unwrap();
        assert_eq!(count("queries"), QUERIES as u64, "{s}");
        assert_eq!(count("errors"), 0, "{s}");
        // Every query is accepted or falls back, and DAR is the accepted share.
        assert_eq!(count("accepted") + count("fallback"), QUERIES as u64, "{s}");
        let dar = number(s, "dar").unwrap();
        assert!(
            (dar - count("accepted") as f64 / QUERIES as f64).abs() < 1e-9,
            "{s}"
        );
        // The mean latency is the weighted mean of the accepted and rejected means.
        let part = |key: &str, n: &str| number(s, key).unwrap_or(0.0) * count(n) as f64;
        let mean = (part("latency_at_da_s", "accepted") + part("latency_at_dr_s", "fallback"))
            / QUERIES as f64;
        assert!(
            (number(s, "avg_latency_s").unwrap() - mean).abs() < 1e-6,
            "{s}"
        );
        // No answer beats the emulated network: a client round trip is at least 2 x 1 ms,
        // and a fallback adds an edge-cloud round trip of at least 2 x 5 ms.
        if let Some(at_da) = number(s, "latency_at_da_s") {
            assert!(at_da >= 0.002, "{s}");
        }
        if let Some(at_dr) = number(s, "latency_at_dr_s") {
            assert!(at_dr >= 0.012, "{s}");
        }
        let p = |key: &str| number(s, key).unwrap();
        assert!(p("p50_s") <= p("p95_s") && p("p95_s") <= p("p99_s") && p("p99_s") <= p("max_s"));
        assert!(p("throughput_qps") > 0.0);
    }
    // HaS's draft traces reach the report: each accepted first occurrence is counted once in
    // the breakdown, each rejected one as a rejection, and each accepted draft without a
    // gold passage is put on exactly one stage.
    for s in systems {
        let losses = &s["draft_losses"];
        if !s["name"].as_str().unwrap().starts_with("has") {
            assert!(losses.is_null(), "{s}");
            continue;
        }
        let rows = losses["rows"].as_array().unwrap();
        let (total, kinds) = rows.split_last().unwrap();
        assert!(total["validated_by"].is_null(), "{losses}");
        let first = &s["first_occurrence"];
        assert_eq!(total["accepted"], first["accepted"], "{s}");
        assert_eq!(losses["rejected"], first["fallback"], "{s}");
        let n = |key: &str| total[key].as_u64().unwrap();
        let placed = n("cloud_has_none")
            + n("cut_from_cache_channel")
            + n("cut_from_fuzzy_channel")
            + n("in_no_channel");
        assert_eq!(placed, n("without_gold"), "{losses}");
        let by_kind: u64 = kinds.iter().map(|r| r["accepted"].as_u64().unwrap()).sum();
        assert_eq!(by_kind, n("accepted"), "{losses}");
    }
    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        markdown.contains("## Where accepted drafts lose the gold passage"),
        "{markdown}"
    );
    let by_name = |name: &str| systems.iter().find(|s| s["name"] == name).unwrap();
    let cloud_only = by_name("cloud-only");
    assert_eq!(cloud_only["accepted"], 0);
    assert!(cloud_only["car"].is_null() && cloud_only["latency_at_da_s"].is_null());
    // The edge index alone never asks the cloud, so its hit rate is its accepted drafts'.
    let edge_ivf = by_name("edge-ivf");
    assert_eq!(edge_ivf["fallback"], 0);
    assert_eq!(edge_ivf["doc_hit_rate"], edge_ivf["doc_hit_rate_at_da"]);
    assert!(edge_ivf["cache_bytes_per_1000_entries"].is_null());
    // The exact-repeat cache accepts only repeats, each through the same question: its
    // matched query always has the right entity.
    let exact = by_name("exact-cache");
    let workload = read_jsonl(&workload_file).unwrap();
    let mut asked = std::collections::HashSet::new();
    let repeats = workload
        .iter()
        .filter(|q| !asked.insert(normalized_text(&q.question)))
        .count();
    assert!(
        exact["accepted"].as_u64().unwrap() <= repeats as u64,
        "{exact}"
    );
    if exact["accepted"].as_u64() > Some(0) {
        assert_eq!(exact["car"], 1.0, "{exact}");
    }
    let has = by_name("has");
    assert!(
        has["dar"].as_f64().unwrap() > 0.0,
        "HaS never accepted on a homologous workload"
    );
    assert!(has["cache_bytes_per_1000_entries"].as_f64().unwrap() > 0.0);
    // The ablation without the fuzzy channel in validation starts from a cache warmed with
    // random questions, none asking what the workload asks; they are all still cached.
    let prefill = std::fs::read_to_string(out.join("random-prefill.txt")).unwrap();
    let prefill: Vec<&str> = prefill.lines().collect();
    let no_fuzzy_validation = by_name("has-no-fuzzy-validation");
    assert_eq!(
        no_fuzzy_validation["params"]["warm_queries"].as_u64(),
        Some(prefill.len() as u64)
    );
    assert!(!prefill.is_empty());
    assert!(
        prefill
            .iter()
            .all(|text| !asked.contains(&normalized_text(text)))
    );
    assert!(
        no_fuzzy_validation["cached_queries"].as_u64().unwrap() >= prefill.len() as u64,
        "{no_fuzzy_validation}"
    );
    for plot in ["pareto.svg", "latency-cdf.svg", "report.md"] {
        assert!(out.join(plot).exists(), "{plot} missing");
    }

    // Exact search's hit rate on the same workload, independently: encode each question,
    // brute-force the top k over the bundle, match answers.
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    assert_eq!(workload.len(), QUERIES);
    let texts: Vec<&str> = workload.iter().map(|q| q.question.as_str()).collect();
    let vectors = encoder.encode(&texts).unwrap();
    let hits = workload
        .iter()
        .zip(&vectors)
        .filter(|(q, v)| {
            brute_force_top_k(&bundle.documents, bundle.vectors(), v, K)
                .iter()
                .any(|(id, _)| contains_answer(&bundle.documents[*id as usize].text, &q.answers))
        })
        .count();
    let exact_dhr = hits as f64 / QUERIES as f64;
    let cloud_dhr = by_name("cloud-only")["doc_hit_rate"].as_f64().unwrap();
    assert!(
        (cloud_dhr - exact_dhr).abs() <= 1.0 / QUERIES as f64 + 1e-9,
        "cloud-only DHR {cloud_dhr} vs exact {exact_dhr}"
    );

    // First occurrences, found here in sequence order: cloud-only's figures over them are
    // exact search's over them.
    let mut by_seq: Vec<(usize, &str)> = workload
        .iter()
        .enumerate()
        .map(|(i, q)| (q.seq, texts[i]))
        .collect();
    by_seq.sort_unstable();
    let mut seen = std::collections::HashSet::new();
    let first: std::collections::HashSet<usize> = by_seq
        .iter()
        .filter(|(_, text)| seen.insert(*text))
        .map(|(seq, _)| *seq)
        .collect();
    let top_k: Vec<Vec<u64>> = vectors
        .iter()
        .map(|v| {
            brute_force_top_k(&bundle.documents, bundle.vectors(), v, K)
                .iter()
                .map(|(id, _)| *id)
                .collect()
        })
        .collect();
    let first_hits = workload
        .iter()
        .zip(&top_k)
        .filter(|(q, _)| first.contains(&q.seq))
        .filter(|(q, ids)| {
            ids.iter()
                .any(|id| contains_answer(&bundle.documents[*id as usize].text, &q.answers))
        })
        .count();
    let cloud_first = &cloud_only["first_occurrence"];
    assert_eq!(cloud_first["queries"].as_u64(), Some(first.len() as u64));
    assert!(first.len() < QUERIES, "the workload repeats no question");
    let first_dhr = cloud_first["doc_hit_rate"].as_f64().unwrap();
    assert!(
        (first_dhr - first_hits as f64 / first.len() as f64).abs()
            <= 1.0 / first.len() as f64 + 1e-9,
        "first-occurrence DHR {first_dhr} vs exact {first_hits}/{}",
        first.len()
    );
    // Paired against itself, cloud-only loses nothing; every other system's paired drop
    // is its DHR gap (all queries answered, none failed).
    assert_eq!(cloud_only["paired_dhr_drop"], 0.0);
    for s in systems {
        let gap = cloud_dhr - s["doc_hit_rate"].as_f64().unwrap();
        assert!(
            (s["paired_dhr_drop"].as_f64().unwrap() - gap).abs() < 1e-9,
            "{s}"
        );
    }

    // Gold recall: a SQuAD question's own paragraph among exact search's top k, the
    // paragraph found here from the SQuAD file itself.
    let subset = work.join("squad-subset.json");
    if subset.exists() {
        let squad: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&subset).unwrap()).unwrap();
        let mut context_of = std::collections::HashMap::new();
        for article in squad["data"].as_array().unwrap() {
            for paragraph in article["paragraphs"].as_array().unwrap() {
                let context = paragraph["context"].as_str().unwrap().trim();
                for qa in paragraph["qas"].as_array().unwrap() {
                    context_of.insert(qa["question"].as_str().unwrap().trim(), context);
                }
            }
        }
        let gold_hits = workload
            .iter()
            .zip(&top_k)
            .filter(|(q, ids)| {
                let context = context_of[q.question.as_str()];
                ids.iter()
                    .any(|id| bundle.documents[*id as usize].text == context)
            })
            .count();
        let gold = cloud_only["gold_recall_at_k"].as_f64().unwrap();
        assert!(gold > 0.0);
        assert!(
            (gold - gold_hits as f64 / QUERIES as f64).abs() <= 1.0 / QUERIES as f64 + 1e-9,
            "cloud-only gold recall {gold} vs exact {gold_hits}/{QUERIES}"
        );
    }
}

/// A fresh output folder under the persistent work directory.
fn fresh_output_dir(work: &std::path::Path) -> std::path::PathBuf {
    let out = work.join("report");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    out
}
