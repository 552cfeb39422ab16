//! Helpers for the integration tests, which run Hasten's binaries as real processes on
//! loopback (see `hasten_eval::process` for starting and stopping them).

pub mod admin;
pub mod answering;
pub mod cluster;
pub mod edge;
pub mod relay;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use hasten_core::Question;
use hasten_core::bundle::CorpusBundle;
use hasten_core::corpus::Document;
use hasten_core::encoder::TextEncoder;
use hasten_eval::process::{
    ManagedProcess, binary, cloud_index_route_args, cloud_index_serve_args, edge_serve_args,
};

/// The workspace root (this crate lives in `tests/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch directory under the target directory that survives between runs, so corpus
/// bundles are encoded once and reused (the bundle build's own reuse path).
pub fn persistent_work_dir(name: &str) -> Result<PathBuf> {
    let bin = binary("cloud-index")?;
    let dir = bin
        .parent()
        .and_then(Path::parent)
        .context("binary directory has no parent")?
        .join("hasten-tests")
        .join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub fn model_dir() -> PathBuf {
    std::env::var_os("HASTEN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(hasten_core::encoder::DEFAULT_MODEL_DIR))
}

/// `../shared/data` next to the workspace, or `HASTEN_DATA_DIR`.
pub fn data_dir() -> PathBuf {
    std::env::var_os("HASTEN_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("..").join("shared").join("data"))
}

/// Writes a SQuAD-format file holding the first `articles` articles of `source`.
pub fn squad_subset(source: &Path, articles: usize, out: &Path) -> Result<()> {
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(source)?)?;
    let data = json["data"]
        .as_array_mut()
        .context("SQuAD file without data")?;
    data.truncate(articles);
    std::fs::write(out, serde_json::to_string(&json)?)?;
    Ok(())
}

/// Builds a small real corpus with the real `cloud-index build`: the first `articles`
/// SQuAD articles from ../shared/data, or the synthetic knowledge base (10 entities per
/// article, at least 40) when the data is absent; with `shards`, also its shard bundles. The
/// work directory holds `squad-subset.json` exactly when the bundle is SQuAD's. Returns the
/// bundle and the build's JSON summary.
pub fn build_small_bundle(
    work: &Path,
    articles: usize,
    shards: Option<u32>,
) -> Result<(PathBuf, serde_json::Value)> {
    let squad = data_dir().join("squad-dev-v1.1-visible.json");
    let mut args: Vec<String> = vec!["build".into()];
    let subset = work.join("squad-subset.json");
    let bundle = if squad.exists() {
        squad_subset(&squad, articles, &subset)?;
        args.extend(["--squad".into(), subset.display().to_string()]);
        work.join("bundle-squad")
    } else {
        // Tests read the subset to tell a SQuAD bundle from a synthetic one, and the work
        // directory outlives runs that had the data.
        if let Err(e) = std::fs::remove_file(&subset)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(e.into());
        }
        args.extend([
            "--synthetic-entities".into(),
            (articles * 10).max(40).to_string(),
        ]);
        work.join("bundle-synthetic")
    };
    args.extend(["--out".into(), bundle.display().to_string()]);
    if let Some(shards) = shards {
        args.extend(["--shards".into(), shards.to_string()]);
    }
    let out = Command::new(binary("cloud-index")?)
        .args(&args)
        .env("HASTEN_MODEL_DIR", model_dir())
        .output()?;
    if !out.status.success() {
        bail!(
            "cloud-index build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((bundle, serde_json::from_slice(&out.stdout)?))
}

/// How long a test waits for a cloud index to load its bundle and serve.
const CLOUD_START_TIMEOUT: Duration = Duration::from_secs(120);

/// Where [`start_cloud_index`] writes the dev certificate of the server `name` (the file an
/// edge or router trusts).
pub fn dev_cert(work: &Path, name: &str) -> PathBuf {
    work.join(format!("{name}.pem"))
}

/// `cloud-index serve` over `bundle` (a whole corpus or a shard) as process `name`: QUIC on
/// any port, gRPC on `grpc_addr` (port 0: any), a dev certificate at [`dev_cert`].
pub fn start_cloud_index(
    work: &Path,
    name: &str,
    bundle: &Path,
    grpc_addr: &str,
) -> Result<ManagedProcess> {
    start_cloud_index_with(work, name, bundle, grpc_addr, &[])
}

/// [`start_cloud_index`] with `extra` flags.
pub fn start_cloud_index_with(
    work: &Path,
    name: &str,
    bundle: &Path,
    grpc_addr: &str,
    extra: &[String],
) -> Result<ManagedProcess> {
    let cert = dev_cert(work, name);
    let mut args = cloud_index_serve_args(bundle, grpc_addr, &cert);
    args.extend_from_slice(extra);
    Ok(ManagedProcess::start(
        name,
        &binary("cloud-index")?,
        args,
        work,
        CLOUD_START_TIMEOUT,
    )?)
}

/// `cloud-index route` over `shards` (each shard's replicas' gRPC addresses) as process
/// `name`, every address on any loopback port, a dev certificate at [`dev_cert`], with
/// `extra` flags.
pub fn start_router(
    work: &Path,
    name: &str,
    shards: &[Vec<String>],
    extra: &[String],
) -> Result<ManagedProcess> {
    let mut args = cloud_index_route_args(shards, &dev_cert(work, name));
    args.extend_from_slice(extra);
    Ok(ManagedProcess::start(
        name,
        &binary("cloud-index")?,
        args,
        work,
        CLOUD_START_TIMEOUT,
    )?)
}

/// A self-signed certificate for `localhost` and `127.0.0.1` and its key, written to
/// `<dir>/<name>.crt` and `<dir>/<name>.key`: a server identity given explicitly
/// (`--tls-cert`/`--tls-key`), the same for every server given it.
pub fn write_tls_identity(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".into()])?;
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, certified.cert.pem())?;
    std::fs::write(&key, certified.signing_key.serialize_pem())?;
    Ok((cert, key))
}

/// Edge flags for the paper's validation (10 documents, tau 0.2). The tests whose
/// homologous pair is chosen on a small bundle's exact top 10 need them: the edge's defaults
/// (20 documents, tau 0.4) were chosen on 104,603 passages, where such a pair need not
/// reach them.
pub const PAPER_VALIDATION: [&str; 4] = [
    "--set",
    "retrieval.validation_depth=10",
    "--set",
    "retrieval.tau=0.2",
];

/// `edge-node serve` over `bundle` as process `name`, falling back to the cloud at
/// `cloud_addr` (QUIC, trusting `cloud_ca`), with `extra` flags.
pub fn start_edge(
    work: &Path,
    name: &str,
    bundle: &Path,
    cloud_addr: &str,
    cloud_ca: &Path,
    extra: &[&str],
) -> Result<ManagedProcess> {
    let mut args = edge_serve_args(bundle, &model_dir(), cloud_addr, cloud_ca);
    args.extend(extra.iter().map(|a| a.to_string()));
    Ok(ManagedProcess::start(
        name,
        &binary("edge-node")?,
        args,
        work,
        CLOUD_START_TIMEOUT,
    )?)
}

/// Exact top-k by brute force (plain Rust, no faiss): `(id, score)` best first.
pub fn brute_force_top_k(
    documents: &[Document],
    vectors: &[f32],
    query: &[f32],
    k: usize,
) -> Vec<(u64, f32)> {
    let d = query.len();
    let mut scored: Vec<(u64, f32)> = documents
        .iter()
        .zip(vectors.chunks(d))
        .map(|(doc, v)| (doc.id, v.iter().zip(query).map(|(a, b)| a * b).sum()))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.truncate(k);
    scored
}

/// Exact top-k document ids of `text` (real encoder, brute force).
pub fn exact_ids(
    bundle: &CorpusBundle,
    encoder: &TextEncoder,
    text: &str,
    k: usize,
) -> Result<HashSet<u64>> {
    let vector = encoder.encode_one(text)?;
    Ok(
        brute_force_top_k(&bundle.documents, bundle.vectors(), &vector, k)
            .into_iter()
            .map(|(id, _)| id)
            .collect(),
    )
}

/// The bundle's first question and its most homologous sibling: among the next 30
/// questions of the same entity, the one whose exact top-k shares the most documents with
/// the first's.
pub fn homologous_pair(
    bundle: &CorpusBundle,
    encoder: &TextEncoder,
    k: usize,
) -> Result<(Question, Question)> {
    let first = bundle
        .questions
        .first()
        .context("the bundle has no questions")?;
    let first_docs = exact_ids(bundle, encoder, &first.question, k)?;
    let mut best: Option<(usize, &Question)> = None;
    for q in bundle
        .questions
        .iter()
        .filter(|q| q.entity == first.entity && q.question != first.question)
        .take(30)
    {
        let shared = exact_ids(bundle, encoder, &q.question, k)?
            .intersection(&first_docs)
            .count();
        if best.is_none_or(|(most, _)| shared >= most) {
            best = Some((shared, q));
        }
    }
    let (_, sibling) = best.context("the first question's entity has no other question")?;
    Ok((first.clone(), sibling.clone()))
}

/// What `grpc.health.v1.Health/Check` answers for the whole server (service `""`) at the
/// plaintext gRPC address `addr`: `SERVING`, `NOT_SERVING`, ...
pub async fn grpc_health(addr: &str) -> Result<String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let mut client = HealthClient::new(channel);
    let reply = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .with_context(|| format!("health check of {addr}"))?
        .into_inner();
    Ok(reply.status().as_str_name().to_string())
}

/// Polls [`grpc_health`] until it answers `want` (the health service checks readiness once a
/// second); returns the last answer.
pub async fn grpc_health_becomes(addr: &str, want: &str, within: Duration) -> String {
    let deadline = std::time::Instant::now() + within;
    loop {
        let got = grpc_health(addr)
            .await
            .unwrap_or_else(|err| format!("{err:#}"));
        if got == want || std::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
