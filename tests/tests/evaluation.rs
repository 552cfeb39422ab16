//! The evaluation end to end on a small corpus: `hasten-loadtest eval` starts a real cloud
//! index and, per system, real edges behind the delay relays, drives a few hundred queries
//! through each, and writes the report. The test checks the report's shape and that
//! cloud-only's document hit rate equals an exact search's, computed here by brute force.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

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
    for s in systems {
        assert_eq!(s["queries"], QUERIES, "{s}");
        assert_eq!(s["errors"], 0, "{s}");
        for key in [
            "avg_latency_s",
            "p50_s",
            "p95_s",
            "p99_s",
            "max_s",
            "throughput_qps",
            "dar",
            "doc_hit_rate",
        ] {
            assert!(s[key].as_f64().is_some_and(f64::is_finite), "{key} of {s}");
        }
        for key in [
            "car",
            "doc_hit_rate_at_da",
            "latency_at_da_s",
            "latency_at_dr_s",
            "cache_bytes_per_1000_entries",
        ] {
            assert!(s.get(key).is_some(), "{key} missing from {s}");
        }
        assert!(
            s["p50_s"].as_f64() <= s["p99_s"].as_f64()
                && s["p99_s"].as_f64() <= s["max_s"].as_f64()
        );
    }
    let by_name = |name: &str| systems.iter().find(|s| s["name"] == name).unwrap();
    assert_eq!(by_name("cloud-only")["dar"], 0.0);
    assert_eq!(by_name("edge-ivf")["dar"], 1.0);
    assert!(
        by_name("has")["dar"].as_f64().unwrap() > 0.0,
        "HaS never accepted on a homologous workload"
    );
    assert!(
        by_name("has")["cache_bytes_per_1000_entries"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    for plot in ["pareto.svg", "latency-cdf.svg", "report.md"] {
        assert!(out.join(plot).exists(), "{plot} missing");
    }

    // Exact search's hit rate on the same workload, independently: encode each question,
    // brute-force the top k over the bundle, match answers.
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let encoder = TextEncoder::load(&model_dir()).unwrap();
    let workload = read_jsonl(&workload_file).unwrap();
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
