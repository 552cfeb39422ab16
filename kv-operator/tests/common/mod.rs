//! Pools the operator's tests share.
#![allow(dead_code, clippy::unwrap_used)]

use hasten_core::logging::LogFormat;
use hasten_kv_operator::crd::KvWorkerPool;
use hasten_kv_operator::resources::RenderSettings;

pub fn settings() -> RenderSettings {
    RenderSettings {
        worker_image: "ghcr.io/hasten-rag/hasten:0.1.0".into(),
        cluster_domain: "cluster.local".into(),
        worker_tls_secret: None,
        worker_extra_ca_config_map: None,
        worker_log_format: LogFormat::Json,
    }
}

/// The settings of a deployment under mutual TLS.
pub fn settings_with_tls() -> RenderSettings {
    RenderSettings {
        worker_tls_secret: Some("hasten-mtls".into()),
        ..settings()
    }
}

/// A pool as `kubectl apply` would send it, with the identity the API server adds.
pub fn pool(spec: serde_json::Value) -> KvWorkerPool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "hasten.dev/v1alpha1",
        "kind": "KvWorkerPool",
        "metadata": {
            "name": "wiki",
            "namespace": "rag",
            "uid": "6f1f4c1e-0000-4000-8000-000000000001",
            "generation": 3,
            "resourceVersion": "100",
        },
        "spec": spec,
    }))
    .unwrap()
}

/// Two CPU workers; the model on a volume claim.
pub fn cpu_spec() -> serde_json::Value {
    serde_json::json!({
        "model": {
            "claimName": "models",
            "path": "qwen2.5-0.5b-instruct-q8_0.gguf",
            "sha256": "a".repeat(64),
        },
        "replicas": 2,
        "kvStore": {"ramBudget": "2Gi", "disk": {"size": "10Gi"}, "origin": {"size": "50Gi", "storageClassName": "nfs"}},
        "corpus": {"version": "wiki-2026-11", "claimName": "bundles", "bundlePath": "wiki-2026-11"},
        "resources": {"requests": {"cpu": "4", "memory": "6Gi"}, "limits": {"memory": "8Gi"}},
    })
}

/// Four GPU workers; the model from an OCI package; scheduling constraints.
pub fn gpu_spec() -> serde_json::Value {
    serde_json::json!({
        "model": {
            "image": "ghcr.io/hasten-rag/models/qwen2.5-7b:q8_0",
            "path": "model.gguf",
            "sha256": "b".repeat(64),
        },
        "replicas": 4,
        "device": {
            "gpus": 1,
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "runtimeClassName": "nvidia",
        },
        "kvStore": {"ramBudget": "32Gi", "gpuBudget": "40Gi", "disk": {"size": "200Gi", "storageClassName": "local-nvme"}},
        "fusion": {"mode": "fusionrag", "recomputeRatio": 0.15, "topN": 10, "exactLeadingChunk": true, "recomputeWholeChunks": 1},
        "corpus": {"version": "wiki-2026-12", "claimName": "bundles", "bundlePath": "wiki-2026-12"},
        "image": "ghcr.io/hasten-rag/hasten:0.1.0-cuda",
    })
}
