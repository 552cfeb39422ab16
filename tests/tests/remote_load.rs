//! `hasten-loadtest run` against a deployment it did not start: a cloud index and an edge
//! with tenants (a bearer token required) started here as separate processes, loaded
//! open-loop and closed-loop from a saved workload. A run within its thresholds exits 0 and
//! leaves its summary, HDR spectrum, time series and plot; a missed threshold, or requests
//! without the tenant's token, exits 99 (k6's convention). (The edges serve plain HTTP, so
//! `--ca-cert` for https edges is not exercised here.)

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::binary;
use hasten_loadtest::workload::{WorkloadQuery, write_jsonl};
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::Value;

const TOKEN: &str = "loadtest-token-0123456789abcdef";

fn loadtest(edge: &str, workload: &Path, out: &Path, extra: &[&str]) -> Output {
    let _ = std::fs::remove_dir_all(out);
    std::process::Command::new(binary("hasten-loadtest").unwrap())
        .args(["run", "--edge", &format!("http://{edge}"), "--k", "5"])
        .arg("--workload")
        .arg(workload)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn summary(out: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_is_loaded_measured_and_judged() {
    let work = persistent_work_dir("remote-load").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let tenants = work.join("tenants.toml");
    std::fs::write(&tenants, format!("[tenants]\nacme = [\"{TOKEN}\"]\n")).unwrap();
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &cloud.addr("quic_addr"),
        &dev_cert(&work, "cloud"),
        &[
            "--tenants-file",
            tenants.to_str().unwrap(),
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    )
    .unwrap();
    let edge = edge.addr("http_addr");
    let token = work.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let workload = work.join("workload.jsonl");
    let queries: Vec<WorkloadQuery> = bundle
        .questions
        .iter()
        .take(20)
        .enumerate()
        .map(|(seq, q)| WorkloadQuery {
            seq,
            question: q.question.clone(),
            ..WorkloadQuery::default()
        })
        .collect();
    write_jsonl(&workload, &queries).unwrap();
    let token = token.to_str().unwrap();

    // Open loop at 40/s for 3 s: the 20 questions go round about six times.
    let out = work.join("open");
    let run = loadtest(
        &edge,
        &workload,
        &out,
        &[
            "--rate",
            "40",
            "--duration",
            "3s",
            "--token-file",
            token,
            "--threshold",
            "p99<5s",
            "--threshold",
            "errors<1%",
        ],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("p99.99") && stdout.contains("ok   p99<5s"),
        "{stdout}"
    );
    let figures = summary(&out);
    let requests = figures["summary"]["requests"].as_u64().unwrap();
    assert!((80..=170).contains(&requests), "{figures}");
    assert_eq!(figures["summary"]["errors"], 0, "{figures}");
    assert!(
        figures["thresholds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["passed"] == true)
    );
    let spectrum = std::fs::read_to_string(out.join("latency.hgrm")).unwrap();
    assert!(
        spectrum.contains(&format!("Total count    = {requests:>12}")),
        "{spectrum}"
    );
    let series = std::fs::read_to_string(out.join("timeseries.csv")).unwrap();
    let seconds: u64 = series
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(seconds, requests, "{series}");
    assert!(series.lines().count() >= 4, "{series}");
    assert!(
        std::fs::read_to_string(out.join("percentiles.svg"))
            .unwrap()
            .contains("<svg")
    );

    // A threshold no real run can meet fails the run with k6's exit status.
    let out = work.join("strict");
    let run = loadtest(
        &edge,
        &workload,
        &out,
        &[
            "--concurrency",
            "2",
            "--duration",
            "2s",
            "--token-file",
            token,
            "--threshold",
            "p50<0.001ms",
        ],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(99), "{stdout}");
    assert!(stdout.contains("FAIL p50<0.001ms"), "{stdout}");
    assert!(summary(&out)["summary"]["requests"].as_u64().unwrap() > 0);

    // Without the tenant's token every request is refused: an error budget fails the run.
    let out = work.join("no-token");
    let run = loadtest(
        &edge,
        &workload,
        &out,
        &[
            "--rate",
            "20",
            "--duration",
            "1s",
            "--threshold",
            "errors<1%",
        ],
    );
    assert_eq!(run.status.code(), Some(99));
    let figures = summary(&out);
    assert_eq!(figures["summary"]["error_rate"], 1.0, "{figures}");
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("HTTP 401"),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
}
