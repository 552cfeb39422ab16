//! Golden tests of the pure function from a pool to its objects: the rendered YAML of two
//! pools (CPU before its first version is preprocessed; GPU serving one version while the
//! next one's Job runs) must equal the files in `tests/golden/`. After an intended change,
//! regenerate them with `HASTEN_UPDATE_GOLDEN=1 cargo test -p hasten-kv-operator --test
//! golden` and review the diff. `scripts/check-helm.sh` validates the same files with
//! kubernetes-validate.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use hasten_kv_operator::crd::KvWorkerPool;
use hasten_kv_operator::resources::{Desired, RenderSettings, desired, preprocess_job, workers};
use hasten_kv_operator::validate::validate;
use k8s_openapi::api::apps::v1::StatefulSet;

fn render(
    pool: &KvWorkerPool,
    serving: Option<&str>,
    job_version: &str,
    settings: &RenderSettings,
) -> String {
    let budgets = validate("wiki", &pool.spec).expect("valid spec");
    let desired = desired(pool, budgets, settings).expect("renders");
    let stateful_set = workers(pool, &desired, serving, settings).expect("renders");
    let Desired {
        config_map,
        service,
        pod_disruption_budget,
        origin,
    } = desired;
    let job = preprocess_job(pool, job_version, settings).expect("renders");
    let documents = [
        serde_saphyr::to_string(&config_map),
        serde_saphyr::to_string(&service),
        serde_saphyr::to_string(&pod_disruption_budget),
        serde_saphyr::to_string(&origin),
        serde_saphyr::to_string(&stateful_set),
        serde_saphyr::to_string(&job),
    ];
    documents
        .into_iter()
        .map(|document| document.expect("serialises"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn check(name: &str, rendered: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("HASTEN_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, rendered).expect("writing the golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).expect("reading the golden file");
    assert!(
        expected == rendered,
        "{} differs from the rendering; regenerate with HASTEN_UPDATE_GOLDEN=1 if intended\n--- rendered ---\n{rendered}",
        path.display()
    );
}

#[test]
fn a_cpu_pool_before_its_first_version_renders_as_pinned() {
    let pool = common::pool(common::cpu_spec());
    check(
        "cpu-pool-first-version.yaml",
        &render(&pool, None, "wiki-2026-11", &common::settings()),
    );
}

#[test]
fn a_gpu_pool_serving_a_version_while_the_next_preprocesses_renders_as_pinned() {
    let pool = common::pool(common::gpu_spec());
    check(
        "gpu-pool-next-version.yaml",
        &render(
            &pool,
            Some("wiki-2026-11"),
            "wiki-2026-12",
            &common::settings_with_tls(),
        ),
    );
}

#[test]
fn the_rendering_follows_the_spec() {
    // Not a golden: properties that must hold whatever the layout, so that a golden file
    // regenerated in haste cannot hide them.
    let pool = common::pool(common::gpu_spec());
    let budgets = validate("wiki", &pool.spec).expect("valid");
    let none = desired(&pool, budgets, &common::settings()).expect("renders");
    let not_serving = workers(&pool, &none, None, &common::settings()).expect("renders");
    let serving = workers(&pool, &none, Some("v1"), &common::settings()).expect("renders");
    let spec = |set: &StatefulSet| set.spec.clone().expect("spec");
    assert_eq!(
        spec(&not_serving).replicas,
        Some(0),
        "no workers before a version is served"
    );
    assert_eq!(spec(&serving).replicas, Some(4));
    let template = spec(&serving).template.spec.expect("pod spec");
    let init = template.init_containers.expect("sync init container");
    assert!(
        init[0]
            .command
            .as_ref()
            .expect("command")
            .contains(&"v1".to_string())
    );
    let worker = &template.containers[0];
    let limits = worker
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .expect("limits");
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
    assert_eq!(template.runtime_class_name.as_deref(), Some("nvidia"));
    let toml = &none.config_map.data.as_ref().expect("data")["kv-worker.toml"];
    assert!(
        toml.contains(&format!("ram_budget = {}", 32u64 << 30)),
        "{toml}"
    );
    assert!(toml.contains("device = \"cuda\""), "{toml}");
    assert!(toml.contains("exact_leading_chunk = true\n"), "{toml}");
    assert!(toml.contains("recompute_whole_chunks = 1\n"), "{toml}");
    let edge = &none.config_map.data.as_ref().expect("data")["edge-kv.toml"];
    assert!(
        edge.contains("wiki-3.wiki.rag.svc.cluster.local:7510"),
        "{edge}"
    );
    assert!(!edge.contains("wiki-4."), "{edge}");
    assert!(
        !toml.contains("tls_ca"),
        "plaintext without a TLS Secret: {toml}"
    );

    let tls_settings = common::settings_with_tls();
    let tls = desired(&pool, budgets, &tls_settings).expect("renders");
    let toml = &tls.config_map.data.as_ref().expect("data")["kv-worker.toml"];
    assert!(
        toml.contains("tls_key = \"/etc/hasten/tls/tls.key\""),
        "{toml}"
    );
    let volumes = spec(&workers(&pool, &tls, Some("v1"), &tls_settings).expect("renders"))
        .template
        .spec
        .expect("pod spec")
        .volumes
        .expect("volumes");
    let sources = volumes[0]
        .projected
        .as_ref()
        .and_then(|projected| projected.sources.clone())
        .expect("projected sources");
    assert_eq!(
        sources[1].secret.as_ref().map(|s| s.name.as_str()),
        Some("hasten-mtls")
    );
    assert_eq!(sources.len(), 2, "no extra CAs unless named");
    assert!(!toml.contains("tls_extra_ca"), "{toml}");

    // During a CA rotation the workers also trust the ConfigMap's CAs, from the file their
    // configuration names.
    let rotating = RenderSettings {
        worker_extra_ca_config_map: Some("hasten-mtls-extra-ca".into()),
        ..common::settings_with_tls()
    };
    let desired_rotating = desired(&pool, budgets, &rotating).expect("renders");
    let toml = &desired_rotating.config_map.data.as_ref().expect("data")["kv-worker.toml"];
    let extra_file = toml
        .lines()
        .find_map(|line| line.strip_prefix("tls_extra_ca = "))
        .expect("tls_extra_ca in the workers' configuration")
        .trim_matches('"')
        .to_string();
    let sources = spec(&workers(&pool, &desired_rotating, Some("v1"), &rotating).expect("renders"))
        .template
        .spec
        .and_then(|pod| pod.volumes)
        .and_then(|volumes| volumes[0].projected.clone())
        .and_then(|projected| projected.sources)
        .expect("projected sources");
    let extra = sources[2]
        .config_map
        .as_ref()
        .expect("the extra CAs' ConfigMap");
    assert_eq!(extra.name, "hasten-mtls-extra-ca");
    let item = &extra.items.as_ref().expect("items")[0];
    assert_eq!(item.key, "ca.crt");
    assert_eq!(format!("/etc/hasten/{}", item.path), extra_file);
    // The pods roll when the workers' configuration changes.
    let annotation = |set: &StatefulSet| {
        spec(set)
            .template
            .metadata
            .and_then(|m| m.annotations)
            .expect("annotations")["hasten.dev/config-sha256"]
            .clone()
    };
    assert_ne!(
        annotation(&serving),
        annotation(&workers(&pool, &tls, Some("v1"), &tls_settings).expect("renders"))
    );
}
