//! The seam between the edge and answer generation: [`LmBackend`], and [`LocalLm`], which
//! runs both roles on this machine with hasten-lm.

use std::path::Path;
use std::sync::Arc;

use hasten_lm::{DeviceKind, LanguageModel, WeightFormat};

use crate::answer::{Answer, BackendInfo};
use crate::error::Result;
use crate::request::{AnswerMode, AnswerRequest, ChatTurn};
use crate::rewrite::rewrite_locally;
use crate::sink::AnswerSink;
use crate::speculative::{answer_speculative, check_speculative};
use crate::standard::{answer_standard, prompt_for};

/// Answers questions over retrieved documents.
pub trait LmBackend: Send + Sync {
    fn answer(&self, request: &AnswerRequest, sink: &mut dyn AnswerSink) -> Result<Answer>;

    /// Refuses, without running a model, a request that [`LmBackend::answer`] would refuse:
    /// a caller checks before it takes a place in the queue or starts a reply.
    fn check(&self, request: &AnswerRequest) -> Result<()> {
        request.validate()
    }

    /// Rewrites a chat's last question into a standalone one for retrieval, from the
    /// conversation before it ([`crate::rewrite`]); `None` when this backend cannot.
    fn rewrite_query(&self, conversation: &[ChatTurn], question: &str) -> Option<Result<String>> {
        let _ = (conversation, question);
        None
    }

    /// Whether this backend answers in `mode`.
    fn serves(&self, mode: AnswerMode) -> bool {
        let _ = mode;
        true
    }

    fn info(&self) -> BackendInfo;
}

/// Both roles on local models: the drafter (small) writes Speculative RAG's drafts, the
/// verifier (large) verifies them and answers in standard mode. One model may play both.
#[derive(Clone)]
pub struct LocalLm {
    drafter: Arc<LanguageModel>,
    verifier: Arc<LanguageModel>,
}

impl LocalLm {
    pub fn new(drafter: Arc<LanguageModel>, verifier: Arc<LanguageModel>) -> Self {
        Self { drafter, verifier }
    }

    /// Loads both models on `device` with their weights as stored; the same path is loaded
    /// once and shared.
    pub fn load(drafter: &Path, verifier: &Path, device: DeviceKind) -> Result<Self> {
        Self::load_with(drafter, verifier, device, WeightFormat::AsStored)
    }

    /// [`LocalLm::load`] with the weights held as `weights` (see [`WeightFormat`]).
    pub fn load_with(
        drafter: &Path,
        verifier: &Path,
        device: DeviceKind,
        weights: WeightFormat,
    ) -> Result<Self> {
        let _span = tracing::info_span!(
            "rag_load",
            drafter = %drafter.display(),
            verifier = %verifier.display(),
            %device,
            %weights
        )
        .entered();
        let device = device.open()?;
        let drafter_model = Arc::new(LanguageModel::load_with(drafter, &device, weights)?);
        let verifier_model = if same_file(drafter, verifier) {
            Arc::clone(&drafter_model)
        } else {
            Arc::new(LanguageModel::load_with(verifier, &device, weights)?)
        };
        Ok(Self::new(drafter_model, verifier_model))
    }

    pub fn drafter(&self) -> &Arc<LanguageModel> {
        &self.drafter
    }

    pub fn verifier(&self) -> &Arc<LanguageModel> {
        &self.verifier
    }
}

impl LmBackend for LocalLm {
    fn answer(&self, request: &AnswerRequest, sink: &mut dyn AnswerSink) -> Result<Answer> {
        request.validate()?;
        match request.mode {
            AnswerMode::Standard => answer_standard(&self.verifier, request, sink),
            AnswerMode::Speculative => {
                answer_speculative(&self.drafter, &self.verifier, request, sink)
            }
        }
    }

    /// Validates and builds the prompts (tokenising, no forward pass): a question or
    /// conversation that cannot fit the context is refused here.
    fn check(&self, request: &AnswerRequest) -> Result<()> {
        request.validate()?;
        match request.mode {
            AnswerMode::Standard => prompt_for(&self.verifier, request).map(drop),
            AnswerMode::Speculative => check_speculative(&self.drafter, &self.verifier, request),
        }
    }

    fn rewrite_query(&self, conversation: &[ChatTurn], question: &str) -> Option<Result<String>> {
        Some(rewrite_locally(&self.verifier, conversation, question))
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            drafter: self.drafter.name(),
            verifier: self.verifier.name(),
            device: if self.verifier.decoder.device().is_cuda() {
                "cuda".into()
            } else {
                "cpu".into()
            },
        }
    }
}

/// Whether two paths name one file (compared after resolving links; as written when either
/// does not resolve, so that loading reports the missing file).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
