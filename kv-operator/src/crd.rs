//! The `KvWorkerPool` custom resource (`hasten.dev/v1alpha1`): one model's FusionRAG KV
//! workers over one corpus. The CRD's schema is generated from these types (`kv-operator crd`
//! prints it; the chart's `crds/` holds the same text), and what the schema can check it
//! checks: ranges, patterns, and CEL rules across fields. The rest is [`crate::validate`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The API group and version of the resource.
pub const API_VERSION: &str = "hasten.dev/v1alpha1";

/// A pool of `kv-worker` pods serving one GGUF model over one corpus version, with the
/// chunks' KV preprocessed once per version by a Job.
// Each `printcolumn(...)` repeats `type_`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hasten.dev",
    version = "v1alpha1",
    kind = "KvWorkerPool",
    namespaced,
    status = "KvWorkerPoolStatus",
    shortname = "kvpool",
    category = "hasten",
    doc = "A pool of Hasten FusionRAG KV workers: one GGUF model over one corpus version, its chunks' KV preprocessed once per version",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Serving",
        type_ = "string",
        json_path = ".status.servingVersion"
    ),
    printcolumn(
        name = "Preprocessed",
        type_ = "string",
        json_path = ".status.preprocessing.phase"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct KvWorkerPoolSpec {
    /// The GGUF model (llama or qwen2 architecture) whose chunk KV the workers hold.
    pub model: ModelSource,
    /// Worker pods. Scaled by `kubectl scale`, an HPA or KEDA through the scale subresource.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 64))]
    pub replicas: i32,
    /// Where the workers run: CPU, or a GPU with its scheduling constraints.
    #[serde(default)]
    pub device: DeviceSpec,
    /// CPU and memory of each worker container (a GPU is added from `device.gpus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Budgets of the KV store's tiers.
    #[serde(default)]
    pub kv_store: KvStoreSpec,
    /// Fusion settings the pool's clients use, and the preprocessing's neighbour count.
    #[serde(default)]
    pub fusion: FusionSpec,
    /// The corpus whose chunks' KV is preprocessed and served.
    pub corpus: CorpusSpec,
    /// Image holding `kv-worker` [default: the operator's `worker_image`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
}

fn default_replicas() -> i32 {
    1
}

/// Where the GGUF file comes from: a path in the worker image, a file on a volume claim, or
/// a model package (an OCI image holding the file) mounted as an image volume; with its
/// SHA-256, which the workers check before serving. (The package field is `image`: `package`
/// is a reserved word in CEL.)
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!(has(self.claimName) && has(self.image))").message("claimName and image are exclusive: the model comes from one of them"),
    validation = Rule::new("(has(self.claimName) || has(self.image)) != self.path.startsWith('/')").message("path is absolute (in the worker image) without claimName or image, and relative to the volume with one")
)]
pub struct ModelSource {
    /// The GGUF file: absolute in the worker image, or relative to the claim or image.
    #[schemars(length(min = 1))]
    pub path: String,
    /// A PersistentVolumeClaim holding the model, mounted read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub claim_name: Option<String>,
    /// A model package: an OCI image holding the model, mounted read-only as an image volume
    /// (Kubernetes' ImageVolume feature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// The GGUF file's SHA-256 (64 hex digits): a worker given another file refuses to start.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
}

/// CPU, or one GPU (`nvidia.com/gpu`), and where such pods may be scheduled.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    /// GPUs per worker: 0 runs on CPU, 1 on CUDA (a worker drives one device).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1))]
    pub gpus: u32,
    /// Node labels the worker pods require.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the worker pods tolerate (GPU nodes are often tainted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// RuntimeClass of the worker pods (`nvidia` on clusters whose GPU runtime is not the
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub runtime_class_name: Option<String>,
}

/// Sizes of the KV store's tiers. Memory budgets are Kubernetes quantities (`512Mi`, `4Gi`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KvStoreSpec {
    /// Chunk KV kept in each worker's RAM (added to its memory request).
    #[serde(default = "default_ram_budget")]
    #[schemars(regex(pattern = QUANTITY_PATTERN))]
    pub ram_budget: String,
    /// Chunk KV kept in each worker's GPU memory (CUDA only).
    #[serde(default = "default_gpu_budget")]
    #[schemars(regex(pattern = QUANTITY_PATTERN))]
    pub gpu_budget: String,
    /// Each worker's disk tier: a PersistentVolumeClaim per pod.
    #[serde(default)]
    pub disk: VolumeSpec,
    /// The pool's shared copy of every preprocessed entry, written by the preprocessing Jobs
    /// and copied onto each worker's disk before it serves a version (needs ReadWriteMany).
    #[serde(default)]
    pub origin: VolumeSpec,
}

impl Default for KvStoreSpec {
    fn default() -> Self {
        Self {
            ram_budget: default_ram_budget(),
            gpu_budget: default_gpu_budget(),
            disk: VolumeSpec::default(),
            origin: VolumeSpec::default(),
        }
    }
}

fn default_ram_budget() -> String {
    "1Gi".into()
}

fn default_gpu_budget() -> String {
    "2Gi".into()
}

/// Binary or decimal Kubernetes quantities of bytes, without fractions or exponents.
const QUANTITY_PATTERN: &str = r"^[0-9]+(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$";

/// A volume claim's size and storage class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    #[serde(default = "default_volume_size")]
    #[schemars(regex(pattern = QUANTITY_PATTERN))]
    pub size: String,
    /// Storage class [default: the cluster's].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub storage_class_name: Option<String>,
}

impl Default for VolumeSpec {
    fn default() -> Self {
        Self {
            size: default_volume_size(),
            storage_class_name: None,
        }
    }
}

fn default_volume_size() -> String {
    "20Gi".into()
}

/// How the pool's clients (edges) generate, and what preprocessing computes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FusionSpec {
    /// Generation mode the edges ask for.
    #[serde(default)]
    pub mode: FusionMode,
    /// Share of chunk tokens recomputed (the paper's r).
    #[serde(default = "default_recompute_ratio")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub recompute_ratio: f64,
    /// Neighbours each chunk's similarity-guided KV attends to (the paper's n).
    #[serde(default = "default_top_n")]
    #[schemars(range(min = 1, max = 64))]
    pub top_n: u32,
    /// The workers' `exact_leading_chunk`: a prompt's first chunk reads its Full Reuse KV
    /// (exactly a full prefill's) and the budget goes to the other chunks (default: the
    /// worker's, true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_leading_chunk: Option<bool>,
    /// The workers' `recompute_whole_chunks`: chunks after the exact leading one recomputed
    /// whole, on top of the budget, so that their KV is a full prefill's (default: the
    /// worker's, 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute_whole_chunks: Option<u32>,
}

impl Default for FusionSpec {
    fn default() -> Self {
        Self {
            mode: FusionMode::default(),
            recompute_ratio: default_recompute_ratio(),
            top_n: default_top_n(),
            exact_leading_chunk: None,
            recompute_whole_chunks: None,
        }
    }
}

fn default_recompute_ratio() -> f64 {
    0.15
}

fn default_top_n() -> u32 {
    10
}

/// The worker's generation modes.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
#[serde(rename_all = "kebab-case")]
pub enum FusionMode {
    FullPrefill,
    FullReuse,
    Cacheblend,
    #[default]
    Fusionrag,
}

impl FusionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FullPrefill => "full-prefill",
            Self::FullReuse => "full-reuse",
            Self::Cacheblend => "cacheblend",
            Self::Fusionrag => "fusionrag",
        }
    }
}

/// The corpus bundle (`cloud-index build --out`) and its version.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CorpusSpec {
    /// The corpus version (the bundle's); changing it preprocesses the new version while the
    /// workers serve the old one, then switches them.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"))]
    pub version: String,
    /// A PersistentVolumeClaim holding bundles, mounted read-only.
    #[schemars(length(min = 1))]
    pub claim_name: String,
    /// The bundle's directory, relative to the claim.
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.contains('..')").message("bundlePath is relative to the claim and stays inside it"))]
    #[schemars(length(min = 1))]
    pub bundle_path: String,
}

/// What the operator observed and did.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KvWorkerPoolStatus {
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Worker pods (the scale subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,
    /// Worker pods ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The worker pods' label selector (the scale subresource's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The corpus version the workers serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_version: Option<String>,
    /// The latest preprocessing Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preprocessing: Option<PreprocessingStatus>,
    /// Identity of the chunk-to-worker assignment: a digest of the ready workers' names
    /// (rendezvous hashing over them decides each chunk's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_version: Option<String>,
    /// The assignment version the control plane last committed for this pool (edges with
    /// `kv_pool` route by it); behind `assignmentVersion` until the next publication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_assignment_version: Option<String>,
    /// The ready workers' gRPC addresses, in ordinal order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<String>,
    /// `Ready`, `Progressing` and `Degraded`, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One corpus version's preprocessing Job.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreprocessingStatus {
    pub version: String,
    pub job: String,
    /// `Running`, `Succeeded` or `Failed`.
    pub phase: String,
    /// When the Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// Chunks whose KV is stored, of all the version's chunks, as the Job last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preprocessed_chunks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_chunks: Option<u64>,
    /// While the Job runs: the step its pod last logged (Full Reuse KV of the chunks and
    /// their neighbours, then each chunk's similarity-guided KV), entries done of the step's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<PreprocessingProgress>,
}

/// One step of a running preprocessing Job, as `kv-worker preprocess` logs it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreprocessingProgress {
    /// `full-reuse` or `similarity`.
    pub step: String,
    pub done: u64,
    pub total: u64,
}
