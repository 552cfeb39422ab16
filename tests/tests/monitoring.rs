//! Monitoring seen working: a real Prometheus (Debian's package, `make monitoring`) scrapes
//! real Hasten processes on loopback (two replicas of one shard behind a router, a
//! control-plane node and an edge replicating through it) with the chart's rules loaded
//! (`scripts/render-rules.sh`: release `hasten` in namespace `hasten`, the shard-down alert
//! after 5 s). Targets carry the labels prometheus-operator gives them in a cluster
//! (`namespace`, `pod`, `job` = the Service's name), so the chart's queries run unchanged.
//! Under load, every query of the edge, cloud and control-plane dashboards returns data (and
//! of the answers dashboard, with the edge answering on the small model when it is installed),
//! `promtool check metrics` accepts every `/metrics` page, no alert fires, and killing the
//! shard's replicas fires `HastenCloudShardNoLiveReplica`.
//!
//! Skipped, saying so, when HASTEN_PROMETHEUS_DIR or HASTEN_RULES_FILE is unset (`make
//! test` sets both).

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_eval::process::{ManagedProcess, binary, cloud_index_route_args};
use hasten_loadtest::control_plane::free_loopback_port;
use hasten_tests::answering::small_model;
use hasten_tests::cluster::Cluster;
use hasten_tests::edge::{retrieve, retrieve_body};
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index, start_edge,
    workspace_root,
};
use serde_json::{Value, json};

const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The rate window the dashboards' `$__rate_interval` stands for here: four scrapes.
const RATE_INTERVAL: &str = "4s";

struct Tools {
    prometheus: PathBuf,
    promtool: PathBuf,
    rules: PathBuf,
}

fn tools() -> Option<Tools> {
    let (Some(dir), Some(rules)) = (
        std::env::var_os("HASTEN_PROMETHEUS_DIR"),
        std::env::var_os("HASTEN_RULES_FILE"),
    ) else {
        eprintln!(
            "HASTEN_PROMETHEUS_DIR or HASTEN_RULES_FILE is unset: skipping the monitoring test \
             (`make monitoring` installs Prometheus and renders the rules)"
        );
        return None;
    };
    let dir = PathBuf::from(dir);
    let tools = Tools {
        prometheus: dir.join("prometheus"),
        promtool: dir.join("promtool"),
        rules: PathBuf::from(rules),
    };
    for path in [&tools.prometheus, &tools.promtool, &tools.rules] {
        assert!(path.is_file(), "{} is missing", path.display());
    }
    Some(tools)
}

/// A scrape target: where its metrics are and the labels a cluster would give it.
struct Target {
    metrics: String,
    job: &'static str,
    pod: &'static str,
}

fn prometheus_config(targets: &[Target], rules: &Path) -> String {
    let mut jobs: Vec<&str> = targets.iter().map(|t| t.job).collect();
    jobs.dedup();
    let mut config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
        rules.display()
    );
    for job in jobs {
        config.push_str(&format!("  - job_name: {job}\n    static_configs:\n"));
        for target in targets.iter().filter(|t| t.job == job) {
            config.push_str(&format!(
                "      - targets: ['{}']\n        labels: {{namespace: hasten, pod: {}}}\n",
                target.metrics, target.pod
            ));
        }
    }
    config
}

struct Prometheus {
    process: std::process::Child,
    url: String,
    http: reqwest::Client,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Prometheus {
    async fn start(binary: &Path, config: &str, work: &Path) -> Self {
        let config_path = work.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let data = work.join("prometheus-data");
        let _ = std::fs::remove_dir_all(&data);
        let port = free_loopback_port().unwrap();
        let log = std::fs::File::create(work.join("prometheus.log")).unwrap();
        let process = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let prometheus = Self {
            process,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = prometheus
                .http
                .get(format!("{}/-/ready", prometheus.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return prometheus;
            }
            assert!(Instant::now() < deadline, "Prometheus never got ready");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let reply: Value = self
            .http
            .get(format!("{}/api/v1/{path}", self.url))
            .query(query)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(reply["status"], "success", "{path} {query:?}: {reply}");
        reply["data"].clone()
    }

    /// Whether `expr` returns at least one sample that is a number.
    async fn has_data(&self, expr: &str) -> bool {
        let data = self.api("query", &[("query", expr)]).await;
        data["result"].as_array().is_some_and(|series| {
            series.iter().any(|s| {
                s["value"][1]
                    .as_str()
                    .is_some_and(|v| v != "NaN" && v.parse::<f64>().is_ok())
            })
        })
    }

    async fn firing(&self) -> BTreeSet<String> {
        let data = self.api("alerts", &[]).await;
        data["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| a["labels"]["alertname"].as_str().unwrap().to_string())
            .collect()
    }
}

/// Every query of the dashboard file, with its variables bound as a user viewing this
/// release would bind them.
fn dashboard_queries(file: &Path) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for panel in panels {
            walk(panel["panels"].as_array().map_or(&[], Vec::as_slice), out);
            for target in panel["targets"].as_array().map_or(&[][..], Vec::as_slice) {
                let expr = target["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", RATE_INTERVAL)
                    .replace("$namespace", "hasten")
                    .replace("$pod", ".*")
                    .replace("$tenant", ".*");
                out.push((panel["title"].as_str().unwrap().to_string(), expr));
            }
        }
    }
    let dashboard: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().unwrap(), &mut out);
    out
}

/// Requests of every kind the dashboards count, until the task is aborted: questions
/// never asked before (fallbacks, so the cloud and the control plane keep working),
/// repeats (accepted), and bad requests (errors).
async fn load(edge: String, questions: Vec<String>) {
    let http = reqwest::Client::new();
    for i in 0.. {
        let question = &questions[i % questions.len()];
        retrieve(&http, &edge, question, 5).await;
        let fresh = format!("{question} (asked at {:?})", Instant::now());
        retrieve(&http, &edge, &fresh, 5).await;
        if i % 4 == 0 {
            retrieve_body(&http, &edge, &json!({"query": "", "k": 5})).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Streamed chat completions of a few tokens until the task is aborted, and now and then
/// one asking for more tokens than the edge allows (a refusal the answers dashboard counts).
async fn answer_load(edge: String, questions: Vec<String>) {
    let http = reqwest::Client::new();
    for i in 0.. {
        let max_tokens = if i % 4 == 3 { 1_000_000 } else { 4 };
        let body = json!({
            "model": "hasten-rag", "stream": true, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": questions[i % questions.len()]}],
        });
        let sent = http
            .post(format!("http://{edge}/v1/chat/completions"))
            .json(&body)
            .send()
            .await;
        if let Ok(response) = sent {
            let _ = response.text().await;
        }
    }
}

/// Polls `expr` until it returns data or `deadline` passes. A ratio or a quantile is
/// NaN over a rate window in which a scrape was late (a loaded CI machine), so one
/// empty answer is not yet a failure; an expression that names a missing series never
/// returns data and still fails.
async fn has_data_by(prometheus: &Prometheus, expr: &str, deadline: Instant) -> bool {
    loop {
        if prometheus.has_data(expr).await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_every_dashboard_query_and_fires_the_shard_alert() {
    let Some(tools) = tools() else { return };
    let work = persistent_work_dir("monitoring").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();
    let questions: Vec<String> = bundle
        .questions
        .iter()
        .take(12)
        .map(|q| q.question.clone())
        .collect();

    let mut replicas = vec![
        start_cloud_index(&work, "shard-a", &bundle_dir, "127.0.0.1:0").unwrap(),
        start_cloud_index(&work, "shard-b", &bundle_dir, "127.0.0.1:0").unwrap(),
    ];
    let shards = [replicas.iter().map(|r| r.addr("grpc_addr")).collect()];
    let router_cert = dev_cert(&work, "router");
    let router = ManagedProcess::start(
        "router",
        &binary("cloud-index").unwrap(),
        cloud_index_route_args(&shards, &router_cert),
        &work,
        START_TIMEOUT,
    )
    .unwrap();
    let control_plane = Cluster::start("monitoring-cp", 1, 10_000);
    control_plane.leader().await;
    let cp_address = control_plane.addresses[&1].clone();
    // With the small model the edge answers too, and the answers dashboard is checked.
    let answer_model = small_model();
    let mut edge_flags = vec!["--control-plane", &cp_address, "--set", "retrieval.tau=1"];
    let model_path = answer_model.as_ref().map(|m| m.display().to_string());
    if let Some(model) = &model_path {
        edge_flags.extend(["--lm-model", model.as_str()]);
    }
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &router.addr("quic_addr"),
        &router_cert,
        // A corpus of three articles makes nearly every new question homologous to a
        // cached one; at tau 1 only exact repeats are answered at the edge, so fallbacks
        // (and with them the cloud's and the control plane's series) keep coming.
        &edge_flags,
    )
    .unwrap();
    let edge_http = edge.addr("http_addr");

    let targets = [
        Target {
            metrics: edge_http.clone(),
            job: "hasten-edge",
            pod: "hasten-edge-0",
        },
        Target {
            metrics: router.addr("metrics_addr"),
            job: "hasten-router",
            pod: "hasten-router-0",
        },
        Target {
            metrics: replicas[0].addr("metrics_addr"),
            job: "hasten-shard-0",
            pod: "hasten-shard-0-0",
        },
        Target {
            metrics: replicas[1].addr("metrics_addr"),
            job: "hasten-shard-0",
            pod: "hasten-shard-0-1",
        },
        Target {
            metrics: control_plane.nodes[&1].addr("metrics_addr"),
            job: "hasten-control-plane-headless",
            pod: "hasten-control-plane-0",
        },
    ];
    let prometheus = Prometheus::start(
        &tools.prometheus,
        &prometheus_config(&targets, &tools.rules),
        &work,
    )
    .await;

    // The load runs from here to the end of the dashboard checks, so every rate
    // window the checks read holds traffic.
    let loading = tokio::spawn(load(edge_http.clone(), questions.clone()));
    let answering = answer_model
        .is_some()
        .then(|| tokio::spawn(answer_load(edge_http.clone(), questions.clone())));
    tokio::time::sleep(Duration::from_secs(12)).await;

    // Every /metrics page passes promtool's own lint.
    let http = reqwest::Client::new();
    for target in &targets {
        let page = http
            .get(format!("http://{}/metrics", target.metrics))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut check = Command::new(&tools.promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        check
            .stdin
            .take()
            .unwrap()
            .write_all(page.as_bytes())
            .unwrap();
        let out = check.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics on {} ({}): {}{}",
            target.pod,
            target.metrics,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Every query of the three dashboards returns data while the load runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    let dashboards = workspace_root().join("helm/hasten/dashboards");
    let mut empty = Vec::new();
    let mut checked = 0;
    let mut names = vec!["hasten-edge", "hasten-cloud", "hasten-control-plane"];
    if answering.is_some() {
        names.push("hasten-answers");
    }
    for name in names {
        for (title, expr) in dashboard_queries(&dashboards.join(format!("{name}.json"))) {
            checked += 1;
            if !has_data_by(&prometheus, &expr, deadline).await {
                empty.push(format!("{name} / {title}: {expr}"));
            }
        }
    }
    loading.abort();
    if let Some(answering) = answering {
        answering.abort();
    }
    assert!(checked > 60, "only {checked} dashboard queries");
    assert!(
        empty.is_empty(),
        "{} of {checked} dashboard queries returned no data:\n{}",
        empty.len(),
        empty.join("\n")
    );

    // Healthy: nothing fires. Then both replicas of the shard die, and its alert fires.
    let firing = prometheus.firing().await;
    assert!(
        firing.is_empty(),
        "alerts firing on a healthy system: {firing:?}"
    );
    for replica in &mut replicas {
        replica.stop();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let firing = prometheus.firing().await;
        if firing.contains("HastenCloudShardNoLiveReplica") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "HastenCloudShardNoLiveReplica never fired; firing: {firing:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(edge);
    drop(router);
}
