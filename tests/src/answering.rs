//! What the answer tests share: the real small model (skipped, saying so, when it is not
//! installed) and a cloud index with an edge that answers.

// Test helpers fail the calling test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use hasten_eval::process::{ManagedProcess, binary, edge_serve_args};

use crate::edge::wait_for;
use crate::{
    build_small_bundle, dev_cert, model_dir, persistent_work_dir, start_cloud_index, workspace_root,
};

/// Loading a model and the encoder in a debug test build takes a while on 2 cores.
pub const START_TIMEOUT: Duration = Duration::from_secs(180);
const SMALL_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Held by each answer test of a test binary while it generates: two models decoding at
/// once on the machine's two cores (a llama.cpp server's threads spin-wait) slowed one
/// engine draft past the edge's 30 s deadline in CI, and the tests that time answers need
/// the cores to themselves.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// SmolLM2-135M-Instruct from HASTEN_LM_DIR (`make models`), or the file of that directory
/// named by HASTEN_ANSWER_MODEL (how the answer tests run on a larger model, `make
/// test-answers-large`); `None` when HASTEN_LM_DIR is unset.
pub fn small_model() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("HASTEN_LM_DIR") else {
        eprintln!("HASTEN_LM_DIR is unset: skipping the answer tests");
        return None;
    };
    let file = std::env::var_os("HASTEN_ANSWER_MODEL").unwrap_or_else(|| SMALL_MODEL.into());
    let path = Path::new(&dir).join(file);
    assert!(
        path.is_file(),
        "HASTEN_LM_DIR is set but {} is missing",
        path.display()
    );
    Some(path)
}

/// The Python interpreter of a client venv named by the environment variable `var` (`make
/// test` installs them); `None` when it is unset, saying which test is skipped.
pub fn client_python(var: &str, test: &str) -> Option<PathBuf> {
    let python = std::env::var_os(var).map(PathBuf::from);
    if python.is_none() {
        eprintln!("{var} is unset: skipping {test}");
    }
    python
}

/// A cloud index and an edge over the small test bundle.
pub struct Answering {
    pub cloud: ManagedProcess,
    pub edge: ManagedProcess,
    pub bundle_dir: PathBuf,
    pub work: PathBuf,
}

/// Starts a cloud index and an edge named `edge_name` whose generation flags are
/// `generation` (`--lm-model PATH`, or `--lm-worker ADDR`).
pub fn start_answering(work_name: &str, edge_name: &str, generation: &[String]) -> Answering {
    let work = persistent_work_dir(work_name).unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "cloud", &bundle_dir, "127.0.0.1:0").unwrap();
    let edge = start_edge(&work, edge_name, &bundle_dir, &cloud, generation);
    Answering {
        cloud,
        edge,
        bundle_dir,
        work,
    }
}

/// Another edge in front of `cloud`, answering with `generation`.
pub fn start_edge(
    work: &Path,
    name: &str,
    bundle_dir: &Path,
    cloud: &ManagedProcess,
    generation: &[String],
) -> ManagedProcess {
    let cert = dev_cert(work, "cloud");
    ManagedProcess::start(
        name,
        &binary("edge-node").unwrap(),
        edge_serve_args(bundle_dir, &model_dir(), &cloud.addr("quic_addr"), &cert)
            .into_iter()
            .chain(generation.iter().cloned()),
        work,
        START_TIMEOUT,
    )
    .unwrap()
}

/// `--lm-model PATH`.
pub fn with_model(model: &Path) -> Vec<String> {
    vec!["--lm-model".into(), model.display().to_string()]
}

/// The name the llama.cpp server of [`start_llama_server`] serves its model under.
pub const ENGINE_MODEL: &str = "smollm2";

/// llama.cpp's own HTTP server (`tests/clients/llama_server.py`, from the xllamacpp wheel
/// `make test` installs) serving `model` as [`ENGINE_MODEL`] on a free loopback port, two
/// requests at a time; `None` when HASTEN_LLAMA_SERVER_PYTHON is unset.
pub fn start_llama_server(work: &Path, name: &str, model: &Path) -> Option<ManagedProcess> {
    let python = client_python("HASTEN_LLAMA_SERVER_PYTHON", "the llama.cpp engine tests")?;
    let script = workspace_root().join("tests/clients/llama_server.py");
    let args = [
        script.display().to_string(),
        model.display().to_string(),
        "--alias".into(),
        ENGINE_MODEL.into(),
        "--parallel".into(),
        "2".into(),
    ];
    Some(ManagedProcess::start(name, &python, args, work, START_TIMEOUT).unwrap())
}

/// vLLM's scoring routes in front of the llama.cpp server at `engine`
/// (`tests/clients/vllm_shim.py`: no vLLM can run here; its numbers are the llama.cpp
/// server's), with the shim's flags `extra`; `None` when HASTEN_LLAMA_SERVER_PYTHON is unset.
pub fn start_vllm_shim(
    work: &Path,
    name: &str,
    engine: &str,
    extra: &[&str],
) -> Option<ManagedProcess> {
    let python = client_python("HASTEN_LLAMA_SERVER_PYTHON", "the vLLM-route tests")?;
    let script = workspace_root().join("tests/clients/vllm_shim.py");
    let args = [script.display().to_string(), engine.to_string()]
        .into_iter()
        .chain(extra.iter().map(ToString::to_string));
    Some(ManagedProcess::start(name, &python, args, work, START_TIMEOUT).unwrap())
}

/// A client of the engine at `addr` serving [`ENGINE_MODEL`], no drafter of its own, each
/// call given `timeout`.
pub fn engine_at(addr: &str, timeout: Duration) -> hasten_engine::EngineLm {
    hasten_engine::EngineLm::new(hasten_engine::EngineSettings {
        url: format!("http://{addr}/v1"),
        model: ENGINE_MODEL.into(),
        drafter_url: None,
        drafter_model: None,
        api_key: None,
        timeout,
        ca_file: None,
    })
    .unwrap()
}

/// `--lm-engine-url http://ADDR/v1 --lm-engine-model MODEL`.
pub fn with_engine(addr: &str, model: &str) -> Vec<String> {
    vec![
        "--lm-engine-url".into(),
        format!("http://{addr}/v1"),
        "--lm-engine-model".into(),
        model.into(),
    ]
}

/// Waits until the edge at `edge` has reached its engine and found how it scores drafts
/// (`/v1/status` lists speculative among its modes).
pub async fn wait_engine_detected(http: &reqwest::Client, edge: &str) {
    wait_for(
        http,
        edge,
        "the edge never reached its engine",
        Duration::from_secs(30),
        |status| {
            status["generation"]["modes"]
                .as_array()
                .is_some_and(|modes| modes.iter().any(|m| m == "speculative"))
        },
    )
    .await;
}

/// A llama.cpp server on the small model and a cloud index with an edge generating on it.
pub struct OnEngine {
    pub engine: ManagedProcess,
    pub answering: Answering,
}

/// Starts [`start_llama_server`] and an edge on it ([`start_answering`] with
/// [`with_engine`] and the edge flags `extra`) in the work directory `work_name`; `None`,
/// saying why, without the model or the server.
pub fn start_on_engine(work_name: &str, edge_name: &str, extra: &[String]) -> Option<OnEngine> {
    let model = small_model()?;
    let work = persistent_work_dir(work_name).unwrap();
    let engine = start_llama_server(&work, "llama-server", &model)?;
    let mut generation = with_engine(&engine.addr("http_addr"), ENGINE_MODEL);
    generation.extend_from_slice(extra);
    let answering = start_answering(work_name, edge_name, &generation);
    Some(OnEngine { engine, answering })
}
