//! What the CRD's schema cannot check, checked before anything is applied: a pool whose spec
//! fails here gets a `Degraded` condition naming the field, and none of its objects change.

use crate::crd::KvWorkerPoolSpec;

/// Longest pool name: the StatefulSet's pods (`<name>-<ordinal>`) carry a
/// `controller-revision-hash` label of the name plus a hash, which must fit in 63 characters.
pub const MAX_POOL_NAME: usize = 40;

/// A spec the operator refuses, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("spec.{field}: {message}")]
pub struct InvalidSpec {
    pub field: &'static str,
    pub message: String,
}

impl InvalidSpec {
    fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

/// The tier budgets in bytes, for the worker's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    pub ram: u64,
    pub gpu: u64,
}

/// Checks a pool's name and spec; returns the budgets in bytes.
pub fn validate(name: &str, spec: &KvWorkerPoolSpec) -> Result<Budgets, InvalidSpec> {
    if name.len() > MAX_POOL_NAME {
        return Err(InvalidSpec::new(
            "metadata.name",
            format!(
                "{} characters; at most {MAX_POOL_NAME}, so that the workers' pod labels fit",
                name.len()
            ),
        ));
    }
    if spec.replicas < 0 {
        return Err(InvalidSpec::new("replicas", "must not be negative"));
    }
    let ram = quantity_bytes(&spec.kv_store.ram_budget)
        .ok_or_else(|| quantity_error("kvStore.ramBudget", &spec.kv_store.ram_budget))?;
    let gpu = quantity_bytes(&spec.kv_store.gpu_budget)
        .ok_or_else(|| quantity_error("kvStore.gpuBudget", &spec.kv_store.gpu_budget))?;
    for (field, size) in [
        ("kvStore.disk.size", &spec.kv_store.disk.size),
        ("kvStore.origin.size", &spec.kv_store.origin.size),
    ] {
        match quantity_bytes(size) {
            Some(0) => return Err(InvalidSpec::new(field, "must be more than 0")),
            Some(_) => {}
            None => return Err(quantity_error(field, size)),
        }
    }
    if !(0.0..=1.0).contains(&spec.fusion.recompute_ratio) {
        return Err(InvalidSpec::new(
            "fusion.recomputeRatio",
            format!("{} is not within [0, 1]", spec.fusion.recompute_ratio),
        ));
    }
    if spec.device.gpus > 1 {
        return Err(InvalidSpec::new(
            "device.gpus",
            format!("{}: a worker drives one GPU", spec.device.gpus),
        ));
    }
    if spec.model.claim_name.is_some() && spec.model.image.is_some() {
        return Err(InvalidSpec::new(
            "model",
            "claimName and image are exclusive",
        ));
    }
    let from_volume = spec.model.claim_name.is_some() || spec.model.image.is_some();
    if from_volume == spec.model.path.starts_with('/') || spec.model.path.contains("..") {
        return Err(InvalidSpec::new(
            "model.path",
            format!(
                "{:?} must be {} and stay inside it",
                spec.model.path,
                if from_volume {
                    "relative to the claim or image"
                } else {
                    "absolute in the worker image"
                }
            ),
        ));
    }
    if spec.corpus.bundle_path.starts_with('/') || spec.corpus.bundle_path.contains("..") {
        return Err(InvalidSpec::new(
            "corpus.bundlePath",
            format!(
                "{:?} must be relative to the claim and stay inside it",
                spec.corpus.bundle_path
            ),
        ));
    }
    Ok(Budgets { ram, gpu })
}

fn quantity_error(field: &'static str, value: &str) -> InvalidSpec {
    InvalidSpec::new(
        field,
        format!(
            "{value:?} is not a whole number of bytes with an optional unit (Ki, Mi, Gi, Ti, Pi, k, M, G, T, P)"
        ),
    )
}

/// Bytes of a Kubernetes quantity without fraction or exponent (`512Mi`, `4G`, `1000`).
pub fn quantity_bytes(quantity: &str) -> Option<u64> {
    let digits = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (number, unit) = quantity.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let scale: u64 = match unit {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    number.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_in_both_unit_systems_and_refuse_the_rest() {
        assert_eq!(quantity_bytes("512Mi"), Some(512 << 20));
        assert_eq!(quantity_bytes("4G"), Some(4_000_000_000));
        assert_eq!(quantity_bytes("1000"), Some(1000));
        assert_eq!(quantity_bytes("1.5Gi"), None);
        assert_eq!(quantity_bytes("1e9"), None);
        assert_eq!(quantity_bytes("Gi"), None);
        assert_eq!(quantity_bytes("20000000Pi"), None);
    }
}
