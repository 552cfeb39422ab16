//! `hasten-loadtest answers` as a user runs it: a synthetic bundle, the real small model,
//! real cloud, KV worker and edge processes on loopback, the standard stack against Hasten
//! on a handful of streamed questions. The report must account for every question (an
//! answer or a counted error), pair Hasten's answers with the standard stack's, say where the
//! chunks' KV came from and where the time went, and draw its plots. And `hasten-loadtest
//! run --target answers` against an answering edge that runs already: first tokens timed,
//! thresholds on them judged (a missed one exits 99). Skipped, saying so, when HASTEN_LM_DIR
//! is unset.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::binary;
use hasten_loadtest::workload::{WorkloadQuery, write_jsonl};
use hasten_tests::answering::{ONE_AT_A_TIME, small_model, start_answering, with_model};
use hasten_tests::{model_dir, persistent_work_dir};
use serde_json::Value;

const QUESTIONS: u64 = 6;

#[test]
fn an_answer_load_accounts_for_every_question_of_both_systems() {
    let Some(model) = small_model() else { return };
    // The two tests of this file each load the model on both cores.
    let _alone = ONE_AT_A_TIME.blocking_lock();
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

#[test]
fn a_deployments_answers_are_timed_to_their_first_token_and_judged() {
    let Some(model) = small_model() else { return };
    let _alone = ONE_AT_A_TIME.blocking_lock();
    let answering = start_answering("answer-load-run", "edge", &with_model(&model));
    let bundle = CorpusBundle::load(&answering.bundle_dir).unwrap();
    let workload: Vec<WorkloadQuery> = bundle
        .questions
        .iter()
        .take(3)
        .enumerate()
        .map(|(seq, q)| WorkloadQuery {
            seq,
            question: q.question.clone(),
            answers: q.answers.clone(),
            ..Default::default()
        })
        .collect();
    let file = answering.work.join("questions.jsonl");
    write_jsonl(&file, &workload).unwrap();
    let out = answering.work.join("run");
    let edge = format!("http://{}", answering.edge.addr("http_addr"));
    let run = Command::new(binary("hasten-loadtest").unwrap())
        .args(["run", "--target", "answers", "--edge", &edge, "--workload"])
        .arg(&file)
        .args([
            "--concurrency",
            "1",
            "--duration",
            "6s",
            "--max-tokens",
            "4",
            "--k",
            "3",
        ])
        // The first holds; no answer's first token comes within a millisecond.
        .args([
            "--threshold",
            "ttft_p99<120s",
            "--threshold",
            "ttft_p50<1ms",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(99),
        "a missed threshold exits 99: {stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("first token"), "{stdout}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let answered = summary["summary"]["requests"].as_u64().unwrap()
        - summary["summary"]["errors"].as_u64().unwrap();
    assert!(answered > 0, "{summary}");
    assert_eq!(summary["summary"]["ttft"]["samples"], answered);
    let ttft_p50 = summary["summary"]["ttft"]["percentiles"][0][1]
        .as_f64()
        .unwrap();
    let latency_p50 = summary["summary"]["percentiles"][0][1].as_f64().unwrap();
    assert!(
        ttft_p50 > 0.0 && ttft_p50 <= latency_p50,
        "first token {ttft_p50} s, whole answer {latency_p50} s"
    );
    let verdicts: Vec<bool> = summary["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["passed"].as_bool().unwrap())
        .collect();
    assert_eq!(verdicts, [true, false]);
}
