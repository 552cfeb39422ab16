//! `hasten-loadtest answers` as a user runs it: a synthetic bundle, the real small model,
//! real cloud, KV worker and edge processes on loopback, the standard stack against Hasten
//! on a handful of streamed questions. The report must account for every question (an
//! answer or a counted error), pair Hasten's answers with the standard stack's, say where the
//! chunks' KV came from and where the time went, and draw its plots. Skipped, saying so,
//! when HASTEN_LM_DIR is unset.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use hasten_tests::answering::small_model;
use hasten_tests::{model_dir, persistent_work_dir};
use loadtest::process::binary;
use serde_json::Value;

const QUESTIONS: u64 = 6;

#[test]
fn an_answer_load_accounts_for_every_question_of_both_systems() {
    let Some(model) = small_model() else { return };
    let work = persistent_work_dir("answer-load").unwrap();
    let bundle = work.join("bundle-synthetic");
    let built = Command::new(binary("cloud-index").unwrap())
        .args(["build", "--synthetic-entities", "40", "--out"])
        .arg(&bundle)
        .env("HASTEN_MODEL_DIR", model_dir())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = work.join("report");
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(binary("hasten-loadtest").unwrap())
        .arg("answers")
        .arg("--bundle")
        .arg(&bundle)
        .arg("--model-dir")
        .arg(model_dir())
        .arg("--lm-model")
        .arg(&model)
        .arg("--kv-store")
        .arg(work.join("kv-store"))
        .args(["--kv-top-n", "2", "--queries", &QUESTIONS.to_string()])
        .args(["--rates", "2", "--systems", "standard,hasten"])
        .args(["--edges", "1", "--workers", "2", "--max-tokens", "8"])
        .args(["--client-delay", "none", "--cloud-delay", "none"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "answers failed: {stderr}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["standard", "hasten"]);
    for (i, run) in runs.iter().enumerate() {
        let all = &run["all"];
        let answered = all["answered"].as_u64().unwrap();
        let errors = all["errors"].as_u64().unwrap();
        assert_eq!(all["questions"], QUESTIONS, "{run}");
        assert_eq!(
            answered + errors,
            QUESTIONS,
            "every question answered or counted"
        );
        assert!(answered > 0, "nothing answered: {}", all["first_error"]);
        assert_eq!(
            all["ttft_s"]["samples"], answered,
            "a first token per answer"
        );
        // Every answer went through KV workers and says how retrieval went.
        let kv = &all["kv"];
        let chunks = kv["memory"].as_u64().unwrap() + kv["disk"].as_u64().unwrap();
        assert!(chunks > 0, "no chunk KV read from the workers: {kv}");
        assert_eq!(
            all["accepted"].as_u64().unwrap() + all["fallback"].as_u64().unwrap(),
            answered
        );
        assert!(all["stages"]["prefill_ms"].as_f64().unwrap() > 0.0);
        assert!(run["paired_vs_baseline"]["pairs"].as_u64().unwrap() > 0);
        // The per-question records hold each answer or its error.
        let records = std::fs::read_to_string(out.join(format!("logs/answers-{i}.jsonl"))).unwrap();
        let lines: Vec<Value> = records
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len() as u64, QUESTIONS);
        assert!(
            lines
                .iter()
                .all(|l| l["answer"].is_string() != l["error"].is_string())
        );
    }
    // Standard never serves from the edge; Hasten's prefill is FusionRAG's (selection ran).
    assert_eq!(runs[0]["all"]["accepted"], 0);
    assert_eq!(runs[0]["all"]["stages"]["select_ms"], 0.0);
    assert!(runs[1]["all"]["stages"]["select_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(report["knees"].as_array().unwrap().len(), 2);
    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(markdown.contains("Where the time went"), "{markdown}");
    for plot in ["ttft-cdf-0.svg", "goodput.svg"] {
        assert!(out.join(plot).is_file(), "{plot} missing");
    }
}
