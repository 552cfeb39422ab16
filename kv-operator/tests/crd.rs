//! The CRD in the chart is the one generated from the Rust type, and its schema refuses what
//! it should: the CEL rules are evaluated here with kube's client-side CEL validator on the
//! chart file's own schema (no API server can run on these machines).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use hasten_kv_operator::crd::KvWorkerPool;
use hasten_kv_operator::validate::validate;
use kube::CustomResourceExt;
use kube::core::cel::Validator;
use serde_json::{Value, json};

fn chart_crd_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../helm/hasten/crds/kvworkerpools.hasten.dev.yaml")
}

#[test]
fn the_chart_crd_is_the_generated_one() {
    let generated = serde_saphyr::to_string(&KvWorkerPool::crd()).expect("serialises");
    let in_chart = std::fs::read_to_string(chart_crd_path()).expect("reading the chart's CRD");
    assert!(
        generated == in_chart,
        "helm/hasten/crds/kvworkerpools.hasten.dev.yaml differs from the type's CRD: run `make crd`"
    );
}

fn chart_schema() -> Value {
    let text = std::fs::read_to_string(chart_crd_path()).expect("reading the chart's CRD");
    let crd: Value = serde_saphyr::from_str(&text).expect("parses");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn cel(spec: Value) -> Result<(), String> {
    let object = json!({"apiVersion": "hasten.dev/v1alpha1", "kind": "KvWorkerPool", "metadata": {"name": "wiki"}, "spec": spec});
    Validator::new()
        .validate(&chart_schema(), &object, None)
        .map_err(|errors| format!("{errors:?}"))
}

fn with(mut spec: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let target = spec.pointer_mut(parent).expect("parent exists");
    if value.is_null() {
        target.as_object_mut().expect("object").remove(key);
    } else {
        target[key] = value;
    }
    spec
}

#[test]
fn the_schema_rules_accept_good_pools_and_refuse_contradictions() {
    cel(common::cpu_spec()).expect("the CPU pool passes");
    cel(common::gpu_spec()).expect("the GPU pool passes");
    let refused = [
        // Both a claim and a package for the model.
        with(
            common::cpu_spec(),
            "/model/image",
            json!("ghcr.io/x/model:1"),
        ),
        // A path relative to nothing (no claim, no package).
        with(common::cpu_spec(), "/model/claimName", Value::Null),
        // An absolute path on a claim.
        with(common::cpu_spec(), "/model/path", json!("/models/m.gguf")),
        // A bundle path leaving its claim.
        with(
            common::cpu_spec(),
            "/corpus/bundlePath",
            json!("../secrets"),
        ),
    ];
    for spec in refused {
        assert!(cel(spec.clone()).is_err(), "the schema accepted {spec}");
    }
}

#[test]
fn what_the_schema_cannot_check_the_operator_refuses_naming_the_field() {
    let field = |spec: Value| {
        let pool = common::pool(spec);
        validate("wiki", &pool.spec).expect_err("refused").field
    };
    assert_eq!(
        field(with(
            common::cpu_spec(),
            "/kvStore/ramBudget",
            json!("1.5Gi")
        )),
        "kvStore.ramBudget"
    );
    assert_eq!(
        field(with(common::cpu_spec(), "/kvStore/disk/size", json!("0"))),
        "kvStore.disk.size"
    );
    assert_eq!(
        field(with(
            common::cpu_spec(),
            "/model/path",
            json!("../../etc/m.gguf")
        )),
        "model.path"
    );
    assert_eq!(
        field(with(common::gpu_spec(), "/device/gpus", json!(2))),
        "device.gpus"
    );
    let pool = common::pool(common::cpu_spec());
    assert_eq!(
        validate(&"w".repeat(41), &pool.spec)
            .expect_err("refused")
            .field,
        "metadata.name"
    );
    validate("wiki", &pool.spec).expect("the good pool passes");
}
