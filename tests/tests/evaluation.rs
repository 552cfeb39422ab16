//! The evaluation end to end on a small corpus: `hasten-loadtest eval` starts a real cloud
//! index and, per system, real edges behind the delay relays, drives a few hundred queries
//! through each, and writes the report. The test checks facts the report must agree with:
//! counts add up and rates follow from them, latencies respect the emulated network's
//! floor, each baseline behaves as its definition says, and cloud-only's document hit rate
//! equals an exact search's, computed here by brute force.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use edge_node::lookup::normalized_text;
use hasten_core::answers::contains_answer;
use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_tests::{brute_force_top_k, build_small_bundle, model_dir, persistent_work_dir};
use loadtest::process::binary;
use loadtest::workload::read_jsonl;

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
            "has-no-fuzzy"
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
}

/// A fresh output folder under the persistent work directory.
fn fresh_output_dir(work: &std::path::Path) -> std::path::PathBuf {
    let out = work.join("report");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    out
}
