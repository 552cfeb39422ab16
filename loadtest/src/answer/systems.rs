//! The systems an answer evaluation compares, each made of two choices: how the edges
//! retrieve (the cloud for every question, or HaS with replicated hot caches) and how the KV
//! workers prefill (every token, round-robin over the workers; or FusionRAG on
//! similarity-guided chunk KV, each request to the worker that holds most of its chunks).

use serde::Serialize;

use crate::experiment::EvalError;

/// The share of chunk tokens FusionRAG recomputes by default (the paper's 15%).
pub const FUSION_RATIO: f64 = 0.15;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Retrieval {
    /// Every question's documents from the cloud (a vector database).
    Cloud,
    /// HaS on each edge, the edges' hot caches replicated through a control plane.
    Has,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prefill {
    /// Every context token prefilled, requests spread round-robin (an LLM server).
    Full,
    /// FusionRAG over similarity-guided chunk KV, KV-aware routing.
    Fusion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AnswerSystem {
    pub name: &'static str,
    pub retrieval: Retrieval,
    pub prefill: Prefill,
}

/// Every system, in report order: the standard stack, each half of Hasten alone, Hasten.
pub const ANSWER_SYSTEMS: [AnswerSystem; 4] = [
    AnswerSystem {
        name: "standard",
        retrieval: Retrieval::Cloud,
        prefill: Prefill::Full,
    },
    AnswerSystem {
        name: "has+full-prefill",
        retrieval: Retrieval::Has,
        prefill: Prefill::Full,
    },
    AnswerSystem {
        name: "cloud+fusionrag",
        retrieval: Retrieval::Cloud,
        prefill: Prefill::Fusion,
    },
    AnswerSystem {
        name: "hasten",
        retrieval: Retrieval::Has,
        prefill: Prefill::Fusion,
    },
];

/// The baseline every system's quality is paired against.
pub const BASELINE: &str = "standard";

impl AnswerSystem {
    /// The systems `names` lists, in the order given.
    pub fn parse_list(names: &[String]) -> Result<Vec<Self>, EvalError> {
        names
            .iter()
            .map(|name| {
                ANSWER_SYSTEMS
                    .iter()
                    .find(|s| s.name == name)
                    .copied()
                    .ok_or_else(|| {
                        let known: Vec<&str> = ANSWER_SYSTEMS.iter().map(|s| s.name).collect();
                        EvalError::Invalid(format!(
                            "unknown answer system {name:?}: expected one of {}",
                            known.join(", ")
                        ))
                    })
            })
            .collect()
    }

    /// Whether the edges share their hot cache (through a fresh control plane).
    pub fn replicated(&self) -> bool {
        self.retrieval == Retrieval::Has
    }

    /// The `edge-node serve` flags that make this system (the KV workers' addresses aside),
    /// FusionRAG recomputing `fusion_ratio` of the chunk tokens.
    pub fn edge_args(&self, fusion_ratio: f64) -> Vec<String> {
        let policy = match self.retrieval {
            Retrieval::Cloud => "cloud-only",
            Retrieval::Has => "has",
        };
        let mut settings = vec![format!("retrieval.policy={policy}")];
        let prefill: &[&str] = match self.prefill {
            Prefill::Full => &["kv.mode=full-prefill", "kv.routing=round-robin"],
            Prefill::Fusion => &[
                "kv.mode=fusionrag",
                "kv.variant=similarity",
                "kv.routing=kv-aware",
            ],
        };
        settings.extend(prefill.iter().map(|s| s.to_string()));
        if self.prefill == Prefill::Fusion {
            settings.push(format!("kv.recompute_ratio={fusion_ratio}"));
        }
        settings
            .into_iter()
            .flat_map(|setting| ["--set".to_string(), setting])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_system_is_its_two_halves() {
        let names: Vec<String> = ["hasten", "standard"].map(String::from).to_vec();
        let systems = AnswerSystem::parse_list(&names).unwrap();
        let hasten = systems[0].edge_args(FUSION_RATIO).join(" ");
        assert!(
            hasten.starts_with("--set retrieval.policy=has --set kv.mode=fusionrag"),
            "{hasten}"
        );
        assert!(hasten.contains("--set kv.routing=kv-aware --set kv.recompute_ratio=0.15"));
        assert!(systems[0].replicated());
        assert!(
            systems[0]
                .edge_args(0.3)
                .join(" ")
                .ends_with("--set kv.recompute_ratio=0.3")
        );
        let standard = systems[1].edge_args(0.3).join(" ");
        assert_eq!(
            standard,
            "--set retrieval.policy=cloud-only --set kv.mode=full-prefill --set kv.routing=round-robin"
        );
        assert!(!systems[1].replicated());
        let unknown = AnswerSystem::parse_list(&["vllm".into()]).unwrap_err();
        assert!(unknown.to_string().contains("cloud+fusionrag"), "{unknown}");
    }
}
