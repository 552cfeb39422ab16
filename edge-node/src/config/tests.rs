use display_full_error::DisplayFullErrorExt;
use hasten_core::config::Validate;
use hasten_engine::ApiKey;
use hasten_worker_api::kv::{FusionMode, KvRouting, Variant};

use super::*;

#[test]
fn defaults_and_bad_values_name_their_key() {
    let mut config = EdgeConfig {
        bundle: Some("b".into()),
        ..EdgeConfig::default()
    };
    assert_eq!(
        (
            config.retrieval.k,
            config.retrieval.validation_depth,
            config.retrieval.tau,
            config.retrieval.cache_capacity,
            config.retrieval.fuzzy_candidates
        ),
        (10, 20, 0.4, 5000, 50)
    );
    assert!(!config.retrieval.expose_matched_query_text);
    assert!(!config.retrieval.expose_draft_trace);
    config.validate().unwrap();
    config.retrieval.validation_depth = 0;
    assert!(
        config
            .validate()
            .unwrap_err()
            .to_string_full()
            .contains("`retrieval.validation_depth`")
    );
    config.retrieval.validation_depth = 10;
    config.retrieval.tau = 1.5;
    assert!(
        config
            .validate()
            .unwrap_err()
            .to_string_full()
            .contains("`retrieval.tau`")
    );
    config.retrieval.tau = 0.2;
    let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
    config.retrieval.require_matched_top = 11;
    assert!(error(&config).contains("`retrieval.require_matched_top`"));
    config.retrieval.require_matched_top = 10;
    config.retrieval.hybrid_similarity = Some(1.5);
    assert!(error(&config).contains("`retrieval.hybrid_similarity`"));
    config.retrieval.hybrid_similarity = Some(0.7);
    config.validate().unwrap();
    config.retrieval.policy = RetrievalPolicy::SemanticCache;
    assert!(error(&config).contains("policy = \"has\""));
    config.retrieval.policy = RetrievalPolicy::Has;
    config.retrieval.hybrid_similarity = None;
    config.retrieval.corpus_fraction = 0.0;
    assert!(
        config
            .validate()
            .unwrap_err()
            .to_string_full()
            .contains("`retrieval.corpus_fraction`")
    );
    config.retrieval.corpus_fraction = 0.5;
    config.answer.speculative_draft_tokens = config.answer.max_tokens + 1;
    assert!(error(&config).contains("`answer.speculative_draft_tokens`"));
    config.answer.speculative_draft_tokens = 32;
    config.validate().unwrap();
    config.retrieval.k = 101;
    assert!(
        config
            .validate()
            .unwrap_err()
            .to_string_full()
            .contains("`retrieval.k`")
    );
}

#[test]
fn the_cloud_address_is_an_ip_or_a_name_with_a_port() {
    let mut config = EdgeConfig {
        bundle: Some("b".into()),
        ..EdgeConfig::default()
    };
    for good in [
        "10.96.0.10:7100",
        "[fd00::1]:7100",
        "hasten-router.hasten.svc.cluster.local:7100",
    ] {
        config.cloud.addr = good.into();
        config.validate().unwrap();
    }
    for bad in [
        "hasten-router",
        "router:",
        ":7100",
        "router:99999",
        "quic://router:7100",
    ] {
        config.cloud.addr = bad.into();
        let error = config.validate().unwrap_err().to_string_full();
        assert!(
            error.contains("`cloud.addr`") && error.contains(bad),
            "{bad}: {error}"
        );
    }
}

#[test]
fn kv_workers_are_exclusive_with_other_generation_and_checked() {
    let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
    let mut config = EdgeConfig {
        bundle: Some("b".into()),
        ..EdgeConfig::default()
    };
    config.kv.workers = vec!["127.0.0.1:7510".into(), "worker-1:7510".into()];
    assert_eq!(
        (
            config.kv.mode,
            config.kv.recompute_ratio,
            config.kv.variant,
            config.kv.routing
        ),
        (
            FusionMode::FusionRag,
            0.15,
            Variant::Similarity,
            KvRouting::KvAware
        ),
        "FusionRAG's defaults, KV-aware routing"
    );
    config.validate().unwrap();
    config.answer.worker = Some("127.0.0.1:7500".into());
    assert!(error(&config).contains("`kv.workers`"));
    config.answer.worker = None;
    config.kv.workers.push("http://w:1".into());
    assert!(error(&config).contains("http://w:1"));
    config.kv.workers.pop();
    config.kv.recompute_ratio = 1.5;
    assert!(error(&config).contains("`kv.recompute_ratio`"));
    config.kv.recompute_ratio = 0.15;
    config.kv.pool = Some("rag/wiki".into());
    assert!(
        error(&config).contains("`kv.pool`"),
        "no control plane to follow"
    );
    config.control_plane.nodes = vec!["127.0.0.1:7400".into()];
    config.validate().unwrap();
    config.kv.pool = Some("wiki".into());
    assert!(error(&config).contains("`kv.pool`"), "no namespace");
}

#[test]
fn an_engine_needs_a_url_and_a_model_and_no_other_backend() {
    let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
    let mut config = EdgeConfig {
        bundle: Some("b".into()),
        ..EdgeConfig::default()
    };
    config.engine.url = Some("http://vllm:8000/v1".into());
    assert!(error(&config).contains("`engine.model`"));
    config.engine.model = Some("Qwen/Qwen2.5-1.5B-Instruct".into());
    config.validate().unwrap();
    config.answer.model = Some("m.gguf".into());
    let both = error(&config);
    assert!(
        both.contains("`engine.url`") && both.contains("`answer.model`"),
        "{both}"
    );
    config.answer.model = None;
    config.kv.workers = vec!["w:7510".into()];
    assert!(error(&config).contains("`kv.workers`"));
    config.kv.workers.clear();
    config.engine.url = Some("vllm:8000".into());
    assert!(error(&config).contains("not an http"));
    config.engine.url = Some("https://vllm:8000/v1".into());
    config.engine.api_key = Some(ApiKey::new("sk-secret"));
    config.engine.api_key_file = Some("key".into());
    assert!(error(&config).contains("`engine.api_key_file`"));
    assert!(
        !format!("{config:?}").contains("sk-secret"),
        "the key is never printed"
    );
    config.engine.api_key_file = None;
    config.engine.concurrency = 0;
    assert!(error(&config).contains("`engine.concurrency`"));
    config.engine.concurrency = 8;
    config.engine.url = None;
    assert!(
        error(&config).contains("`engine.model`"),
        "engine keys without the engine are a mistake"
    );
}

#[test]
fn the_fuzzy_ablations_and_warm_queries_refuse_what_cannot_work() {
    let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
    let mut config = EdgeConfig {
        bundle: Some("b".into()),
        ..EdgeConfig::default()
    };
    config.retrieval.fuzzy_in_validation = false;
    config.retrieval.warm_queries = Some("warm.txt".into());
    config.validate().unwrap();
    config.retrieval.fuzzy_in_draft = false;
    assert!(error(&config).contains("`retrieval.fuzzy_in_validation`"));
    config.retrieval.fuzzy_channel = false;
    config.validate().unwrap();
    config.retrieval.fuzzy_channel = true;
    config.retrieval.fuzzy_in_validation = true;
    config.retrieval.policy = RetrievalPolicy::EdgeIvf;
    assert!(error(&config).contains("`retrieval.fuzzy_in_draft`"));
    config.retrieval.fuzzy_in_draft = true;
    assert!(error(&config).contains("`retrieval.warm_queries`"));
    config.retrieval.policy = RetrievalPolicy::Has;
    config.server.tenants_file = Some("tenants.toml".into());
    assert!(error(&config).contains("`retrieval.warm_queries`"));
}

#[test]
fn each_moved_key_names_a_key_of_the_tables_and_an_old_file_is_refused_naming_it() {
    let defaults = serde_json::to_value(EdgeConfig::default()).unwrap();
    for (old, new) in MOVED_KEYS {
        let pointer = format!("/{}", new.replace('.', "/"));
        assert!(defaults.pointer(&pointer).is_some(), "{old} -> {new}");
        assert!(
            defaults.get(old).is_none(),
            "{old} is still a top-level key"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.toml");
    std::fs::write(&file, "bundle = \"b\"\ntau = 0.2\n").unwrap();
    let error = hasten_core::config::load_config::<EdgeConfig, _>(
        Some(&file),
        "HASTEN_EDGE_TEST_UNUSED_",
        &serde_json::json!({}),
        &[],
    )
    .unwrap_err();
    assert_eq!(error.unknown_key(), Some("tau"));
    assert_eq!(moved_key("tau"), Some("retrieval.tau"));
    std::fs::write(&file, "bundle = \"b\"\n[retrieval]\ntau = 0.2\n").unwrap();
    let nested: EdgeConfig = hasten_core::config::load_config(
        Some(&file),
        "HASTEN_EDGE_TEST_UNUSED_",
        &serde_json::json!({}),
        &[],
    )
    .unwrap();
    assert_eq!(nested.retrieval.tau, 0.2);
}
