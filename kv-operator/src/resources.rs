//! The pure function from a pool to the objects that run it: a ConfigMap (the workers'
//! configuration and the edges' connection fragment), a headless Service, a
//! PodDisruptionBudget, the shared origin volume claim, the workers' StatefulSet (a volume
//! claim each for the disk tier) and one preprocessing Job per corpus version. Nothing here
//! talks to the API server, so golden files pin its output.

use std::collections::BTreeMap;

use hasten_core::logging::LogFormat;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::crd::{FusionSpec, KvWorkerPool};
use crate::error::Error;
use crate::validate::Budgets;

/// Where the workers listen (the image's `kv-worker serve` defaults, bound on every address).
pub const GRPC_PORT: u16 = 7510;
pub const METRICS_PORT: u16 = 7512;
/// The name the operator applies its objects under (server-side apply's field manager).
pub const FIELD_MANAGER: &str = "hasten-kv-operator";
/// Pod template annotation carrying the corpus version the workers serve; changing it rolls
/// the workers, whose init container copies that version's entries first.
pub const SERVING_ANNOTATION: &str = "hasten.dev/corpus-version";
/// Label on everything the operator creates for a pool, volume claims included (the
/// finalizer deletes those by it).
pub const POOL_LABEL: &str = "hasten.dev/pool";
/// The preprocessing Job's container: its log carries the progress lines, its termination
/// message the summary.
pub const PREPROCESS_CONTAINER: &str = "preprocess";

const STORE_DIR: &str = "/var/lib/hasten/kv-store";
const ORIGIN_DIR: &str = "/var/lib/hasten/origin";
const MODEL_DIR: &str = "/var/lib/hasten/model";
const CORPUS_DIR: &str = "/var/lib/hasten/corpus";
const CONFIG_DIR: &str = "/etc/hasten";
const UID: i64 = 10001;
/// Where, under the configuration directory, the workers find the extra trusted CAs.
const EXTRA_CA_PATH: &str = "tls/extra-ca.crt";

/// What the operator brings to every pool.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderSettings {
    /// Image holding `kv-worker`, for pools that name none.
    pub worker_image: String,
    /// Cluster DNS domain, for the workers' stable addresses.
    pub cluster_domain: String,
    /// Secret (`ca.crt`, `tls.crt`, `tls.key`) the workers serve mutual TLS with; none:
    /// plaintext gRPC.
    pub worker_tls_secret: Option<String>,
    /// ConfigMap whose `ca.crt` holds CA certificates the workers trust besides the Secret's
    /// (a CA rotation); only with `worker_tls_secret`.
    pub worker_extra_ca_config_map: Option<String>,
    /// How the workers write their logs: the operator's own `log_format`.
    pub worker_log_format: LogFormat,
}

/// The objects a pool's spec asks for whatever corpus version the workers serve (their
/// StatefulSet is [`workers`], the Job [`preprocess_job`]: both depend on the version).
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub config_map: ConfigMap,
    pub service: Service,
    pub pod_disruption_budget: PodDisruptionBudget,
    pub origin: PersistentVolumeClaim,
}

/// The ConfigMap key of the workers' configuration.
const WORKER_CONFIG_KEY: &str = "kv-worker.toml";

/// Labels that select a pool's workers.
pub fn selector_labels(pool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "kv-worker".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), pool.to_string()),
    ])
}

/// The selector as the scale subresource reports it.
pub fn selector_string(pool: &str) -> String {
    selector_labels(pool)
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn labels(pool: &str, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(pool);
    labels.insert("app.kubernetes.io/component".into(), component.into());
    labels.insert("app.kubernetes.io/managed-by".into(), FIELD_MANAGER.into());
    labels.insert(POOL_LABEL.into(), pool.into());
    labels
}

/// The preprocessing Job of a corpus version: named by a digest of the version, so that any
/// version string gives a valid, stable name.
pub fn job_name(pool: &str, version: &str) -> String {
    format!("{pool}-preprocess-{}", &digest(version.as_bytes())[..10])
}

pub fn config_map_name(pool: &str) -> String {
    format!("{pool}-config")
}

pub fn origin_claim_name(pool: &str) -> String {
    format!("{pool}-origin")
}

/// The stable gRPC address of worker `ordinal` (through the headless Service).
pub fn worker_address(pool: &KvWorkerPool, ordinal: i32, settings: &RenderSettings) -> String {
    let name = pool.name_any();
    format!(
        "{name}-{ordinal}.{name}.{}.svc.{}:{GRPC_PORT}",
        pool.namespace().unwrap_or_default(),
        settings.cluster_domain
    )
}

/// The assignment's identity: rendezvous hashing over the workers' names decides every
/// chunk's owner, so the (ordered) names are the whole assignment.
pub fn assignment_version(workers: &[String]) -> String {
    digest(workers.join("\n").as_bytes())[..16].to_string()
}

fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn owner(pool: &KvWorkerPool) -> Result<OwnerReference, Error> {
    pool.controller_owner_ref(&())
        .ok_or_else(|| Error::MissingObjectKey("metadata.uid"))
}

fn typed<K: DeserializeOwned>(kind: &'static str, value: Value) -> Result<K, Error> {
    serde_json::from_value(value).map_err(|source| Error::Render { kind, source })
}

/// The workers' `kv-worker serve` configuration (TOML).
pub fn worker_config(pool: &KvWorkerPool, budgets: Budgets, settings: &RenderSettings) -> String {
    let spec = &pool.spec;
    let device = if spec.device.gpus > 0 { "cuda" } else { "cpu" };
    format!(
        "# kv-worker serve configuration, rendered by {FIELD_MANAGER} from KvWorkerPool {name}.\n\
         grpc_addr = \"0.0.0.0:{GRPC_PORT}\"\n\
         metrics_addr = \"0.0.0.0:{METRICS_PORT}\"\n\
         model = {model:?}\n\
         model_sha256 = {sha:?}\n\
         device = \"{device}\"\n\
         store = \"{STORE_DIR}\"\n\
         ram_budget = {ram}\n\
         gpu_budget = {gpu}\n\
         log_format = \"{log_format}\"\n{fusion}{tls}",
        name = pool.name_any(),
        fusion = fusion_keys(&spec.fusion),
        tls = match (
            &settings.worker_tls_secret,
            &settings.worker_extra_ca_config_map
        ) {
            (Some(_), extra) => format!(
                "tls_ca = \"{CONFIG_DIR}/tls/ca.crt\"\n\
                 tls_cert = \"{CONFIG_DIR}/tls/tls.crt\"\n\
                 tls_key = \"{CONFIG_DIR}/tls/tls.key\"\n{extra}",
                extra = if extra.is_some() {
                    format!("tls_extra_ca = \"{CONFIG_DIR}/{EXTRA_CA_PATH}\"\n")
                } else {
                    String::new()
                }
            ),
            (None, _) => String::new(),
        },
        model = model_file(pool),
        sha = spec.model.sha256,
        ram = budgets.ram,
        gpu = budgets.gpu,
        log_format = settings.worker_log_format.as_str(),
    )
}

/// The workers' FusionRAG keys the pool sets (the rest keep the worker's defaults).
fn fusion_keys(fusion: &FusionSpec) -> String {
    let mut keys = String::new();
    if let Some(exact) = fusion.exact_leading_chunk {
        keys.push_str(&format!("exact_leading_chunk = {exact}\n"));
    }
    if let Some(chunks) = fusion.recompute_whole_chunks {
        keys.push_str(&format!("recompute_whole_chunks = {chunks}\n"));
    }
    keys
}

/// The edges' configuration fragment for this pool (`edge-node` keys): the workers' stable
/// addresses, in ordinal order, and the fusion settings.
pub fn edge_fragment(pool: &KvWorkerPool, settings: &RenderSettings) -> String {
    let workers: Vec<String> = (0..pool.spec.replicas)
        .map(|ordinal| format!("{:?}", worker_address(pool, ordinal, settings)))
        .collect();
    format!(
        "# edge-node keys for KvWorkerPool {name}, rendered by {FIELD_MANAGER}.\n\
         [kv]\n\
         workers = [{workers}]\n\
         mode = \"{mode}\"\n\
         recompute_ratio = {ratio}\n\
         routing = \"kv-aware\"\n",
        name = pool.name_any(),
        workers = workers.join(", "),
        mode = pool.spec.fusion.mode.as_str(),
        ratio = pool.spec.fusion.recompute_ratio,
    )
}

fn model_file(pool: &KvWorkerPool) -> String {
    let model = &pool.spec.model;
    if model.claim_name.is_some() || model.image.is_some() {
        format!("{MODEL_DIR}/{}", model.path)
    } else {
        model.path.clone()
    }
}

fn model_volume(pool: &KvWorkerPool) -> Option<Value> {
    let model = &pool.spec.model;
    if let Some(claim) = &model.claim_name {
        Some(
            json!({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}),
        )
    } else {
        model.image.as_ref().map(|image| {
            json!({"name": "model", "image": {"reference": image, "pullPolicy": "IfNotPresent"}})
        })
    }
}

fn image(pool: &KvWorkerPool, settings: &RenderSettings) -> String {
    pool.spec
        .image
        .clone()
        .unwrap_or_else(|| settings.worker_image.clone())
}

fn container_security() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": UID,
        "runAsGroup": UID,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}
    })
}

/// The worker container's resources: the spec's, with the GPU added.
fn resources(pool: &KvWorkerPool) -> Result<Value, Error> {
    let mut resources = match &pool.spec.resources {
        Some(resources) => serde_json::to_value(resources).map_err(|source| Error::Render {
            kind: "ResourceRequirements",
            source,
        })?,
        None => json!({}),
    };
    if pool.spec.device.gpus > 0
        && let Some(object) = resources.as_object_mut()
    {
        let limits = object.entry("limits").or_insert_with(|| json!({}));
        if let Some(limits) = limits.as_object_mut() {
            limits.insert(
                "nvidia.com/gpu".into(),
                json!(pool.spec.device.gpus.to_string()),
            );
        }
    }
    Ok(resources)
}

/// Pod-level fields shared by the workers and the preprocessing Job: scheduling, security.
fn pod_spec_base(pool: &KvWorkerPool) -> Value {
    let device = &pool.spec.device;
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"}
        },
    });
    if !device.node_selector.is_empty() {
        spec["nodeSelector"] = json!(device.node_selector);
    }
    if !device.tolerations.is_empty() {
        spec["tolerations"] = json!(device.tolerations);
    }
    if let Some(class) = &device.runtime_class_name {
        spec["runtimeClassName"] = json!(class);
    }
    spec
}

/// The version-independent objects of `pool`.
pub fn desired(
    pool: &KvWorkerPool,
    budgets: Budgets,
    settings: &RenderSettings,
) -> Result<Desired, Error> {
    let name = pool.name_any();
    let namespace = pool
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    let owner = owner(pool)?;
    let meta = |object_name: String, component: &str| {
        json!({
            "name": object_name,
            "namespace": namespace,
            "labels": labels(&name, component),
            "ownerReferences": [owner],
        })
    };
    let config_map = typed(
        "ConfigMap",
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(config_map_name(&name), "config"),
            "data": {
                WORKER_CONFIG_KEY: worker_config(pool, budgets, settings),
                "edge-kv.toml": edge_fragment(pool, settings),
            }
        }),
    )?;
    let service = typed(
        "Service",
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(name.clone(), "worker"),
            "spec": {
                "clusterIP": "None",
                "selector": selector_labels(&name),
                "ports": [
                    {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "appProtocol": "grpc"},
                    {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}
                ]
            }
        }),
    )?;
    let pod_disruption_budget = typed(
        "PodDisruptionBudget",
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta(name.clone(), "worker"),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": selector_labels(&name)}
            }
        }),
    )?;
    let origin = typed(
        "PersistentVolumeClaim",
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": meta(origin_claim_name(&name), "origin"),
            "spec": claim_spec(&pool.spec.kv_store.origin, "ReadWriteMany"),
        }),
    )?;
    Ok(Desired {
        config_map,
        service,
        pod_disruption_budget,
        origin,
    })
}

/// The workers' StatefulSet, serving `serving` (none yet: no workers run until the first
/// version is preprocessed); its pods roll when `desired`'s worker configuration changes.
pub fn workers(
    pool: &KvWorkerPool,
    desired: &Desired,
    serving: Option<&str>,
    settings: &RenderSettings,
) -> Result<StatefulSet, Error> {
    let name = pool.name_any();
    let namespace = pool
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    let owner = owner(pool)?;
    let worker_toml = desired
        .config_map
        .data
        .as_ref()
        .and_then(|data| data.get(WORKER_CONFIG_KEY))
        .ok_or(Error::MissingObjectKey("ConfigMap data kv-worker.toml"))?;
    let mut config_sources = vec![json!({"configMap": {"name": config_map_name(&name)}})];
    if let Some(secret) = &settings.worker_tls_secret {
        config_sources.push(json!({"secret": {"name": secret, "items": [
            {"key": "ca.crt", "path": "tls/ca.crt"},
            {"key": "tls.crt", "path": "tls/tls.crt"},
            {"key": "tls.key", "path": "tls/tls.key", "mode": 0o440},
        ]}}));
        if let Some(config_map) = &settings.worker_extra_ca_config_map {
            config_sources.push(json!({"configMap": {"name": config_map, "items": [
                {"key": "ca.crt", "path": EXTRA_CA_PATH},
            ]}}));
        }
    }
    let mut volumes = vec![
        // The configuration and, under mutual TLS, the deployment's certificate: one
        // projected volume, since a Secret cannot be mounted inside a ConfigMap's mount.
        json!({"name": "config", "projected": {"defaultMode": 0o444, "sources": config_sources}}),
        json!({"name": "origin", "persistentVolumeClaim": {"claimName": origin_claim_name(&name), "readOnly": true}}),
        json!({"name": "tmp", "emptyDir": {}}),
    ];
    let mut mounts = vec![
        json!({"name": "config", "mountPath": CONFIG_DIR, "readOnly": true}),
        json!({"name": "kv-store", "mountPath": STORE_DIR}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    if let Some(volume) = model_volume(pool) {
        volumes.push(volume);
        mounts.push(json!({"name": "model", "mountPath": MODEL_DIR, "readOnly": true}));
    }
    let mut template_annotations = BTreeMap::from([(
        "hasten.dev/config-sha256".to_string(),
        digest(worker_toml.as_bytes()),
    )]);
    let mut init_containers = Vec::new();
    if let Some(version) = serving {
        template_annotations.insert(SERVING_ANNOTATION.into(), version.into());
        init_containers.push(json!({
            "name": "sync",
            "image": image(pool, settings),
            "command": ["kv-worker", "sync", "--from", ORIGIN_DIR, "--store", STORE_DIR, "--version", version],
            "securityContext": container_security(),
            "volumeMounts": [
                {"name": "origin", "mountPath": ORIGIN_DIR, "readOnly": true},
                {"name": "kv-store", "mountPath": STORE_DIR},
            ]
        }));
    }
    let mut pod_spec = pod_spec_base(pool);
    pod_spec["initContainers"] = json!(init_containers);
    pod_spec["containers"] = json!([{
        "name": "kv-worker",
        "image": image(pool, settings),
        "command": ["kv-worker", "serve", "--config", format!("{CONFIG_DIR}/kv-worker.toml")],
        "env": [{"name": "RUST_LOG", "value": "info"}],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT}
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10, "failureThreshold": 6},
        // Loading the model and the hottest entries takes a while on a cold disk.
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 5, "failureThreshold": 120},
        "resources": resources(pool)?,
        "securityContext": container_security(),
        "volumeMounts": mounts,
    }]);
    pod_spec["volumes"] = json!(volumes);
    let mut template_labels = labels(&name, "worker");
    template_labels.remove(POOL_LABEL);
    typed(
        "StatefulSet",
        json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels(&name, "worker"),
                "annotations": serving.map(|version| BTreeMap::from([(SERVING_ANNOTATION, version)])).unwrap_or_default(),
                "ownerReferences": [owner],
            },
            "spec": {
                "serviceName": name,
                "replicas": if serving.is_some() { pool.spec.replicas } else { 0 },
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": selector_labels(&name)},
                "template": {
                    "metadata": {"labels": template_labels, "annotations": template_annotations},
                    "spec": pod_spec,
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "kv-store", "labels": {POOL_LABEL: name}},
                    "spec": claim_spec(&pool.spec.kv_store.disk, "ReadWriteOnce"),
                }]
            }
        }),
    )
}

fn claim_spec(volume: &crate::crd::VolumeSpec, access: &str) -> Value {
    let mut spec = json!({
        "accessModes": [access],
        "resources": {"requests": {"storage": volume.size}},
    });
    if let Some(class) = &volume.storage_class_name {
        spec["storageClassName"] = json!(class);
    }
    spec
}

/// The Job that preprocesses `version`'s chunks into the pool's origin store. Its summary
/// (chunks done of all) comes back as the container's termination message.
pub fn preprocess_job(
    pool: &KvWorkerPool,
    version: &str,
    settings: &RenderSettings,
) -> Result<Job, Error> {
    let name = pool.name_any();
    let namespace = pool
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    let spec = &pool.spec;
    let mut mounts = vec![
        json!({"name": "origin", "mountPath": ORIGIN_DIR}),
        json!({"name": "corpus", "mountPath": CORPUS_DIR, "readOnly": true}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    let mut volumes = vec![
        json!({"name": "origin", "persistentVolumeClaim": {"claimName": origin_claim_name(&name)}}),
        json!({"name": "corpus", "persistentVolumeClaim": {"claimName": spec.corpus.claim_name, "readOnly": true}}),
        json!({"name": "tmp", "emptyDir": {}}),
    ];
    if let Some(volume) = model_volume(pool) {
        volumes.push(volume);
        mounts.push(json!({"name": "model", "mountPath": MODEL_DIR, "readOnly": true}));
    }
    let device = if spec.device.gpus > 0 { "cuda" } else { "cpu" };
    let mut pod_spec = pod_spec_base(pool);
    pod_spec["restartPolicy"] = json!("Never");
    pod_spec["containers"] = json!([{
        "name": PREPROCESS_CONTAINER,
        "image": image(pool, settings),
        "command": [
            "kv-worker", "preprocess",
            "--bundle", format!("{CORPUS_DIR}/{}", spec.corpus.bundle_path),
            "--expect-version", version,
            "--model", model_file(pool),
            "--model-sha256", spec.model.sha256,
            "--device", device,
            "--store", ORIGIN_DIR,
            "--top-n", spec.fusion.top_n.to_string(),
            "--summary-file", "/dev/termination-log",
        ],
        "env": [{"name": "RUST_LOG", "value": "info"}],
        "terminationMessagePolicy": "File",
        "resources": resources(pool)?,
        "securityContext": container_security(),
        "volumeMounts": mounts,
    }]);
    pod_spec["volumes"] = json!(volumes);
    let mut job_labels = labels(&name, "preprocess");
    job_labels.remove("app.kubernetes.io/name");
    job_labels.insert("app.kubernetes.io/name".into(), "kv-preprocess".into());
    typed(
        "Job",
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job_name(&name, version),
                "namespace": namespace,
                "labels": job_labels,
                "annotations": {SERVING_ANNOTATION: version},
                "ownerReferences": [owner(pool)?],
            },
            "spec": {
                "backoffLimit": 3,
                "template": {
                    "metadata": {"labels": job_labels},
                    "spec": pod_spec,
                }
            }
        }),
    )
}
