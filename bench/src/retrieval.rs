//! Passages retrieved for questions that bring none (TriviaQA, NQ, PopQA): the exact top k
//! over a corpus bundle, the search a cloud shard runs (faiss flat inner product over the
//! bundle's all-MiniLM-L6-v2 vectors), with the bundle's vectors handed on as the edge
//! hands on the vectors it holds.

use std::path::Path;

use anyhow::{Context, Result, bail};
use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_core::index::ExactIndex;
use hasten_eval::metrics;
use hasten_rag::Document;

pub struct PassageRetriever {
    bundle: CorpusBundle,
    index: ExactIndex,
}

impl PassageRetriever {
    /// Loads the bundle at `dir` (checked against its manifest) and indexes its vectors.
    pub fn load(dir: &Path) -> Result<Self> {
        let bundle = CorpusBundle::load(dir)
            .with_context(|| format!("loading the corpus bundle {}", dir.display()))?;
        if bundle.is_empty() {
            bail!("the corpus bundle {} holds no passages", dir.display());
        }
        let index = ExactIndex::build(bundle.dimension(), bundle.vectors())
            .with_context(|| format!("indexing the corpus bundle {}", dir.display()))?;
        Ok(Self { bundle, index })
    }

    /// Passages it retrieves from.
    pub fn passages(&self) -> usize {
        self.bundle.len()
    }

    /// The `k` passages nearest to `question`, best first, each with its vector.
    pub fn retrieve(
        &self,
        encoder: &TextEncoder,
        question: &str,
        k: usize,
    ) -> Result<Vec<Document>> {
        if encoder.dimension() != self.bundle.dimension() {
            bail!(
                "the encoder writes {}-d vectors, the bundle holds {}-d ones",
                encoder.dimension(),
                self.bundle.dimension()
            );
        }
        let query = encoder
            .encode_one(question)
            .context("encoding the question")?;
        Ok(self
            .search(std::slice::from_ref(&query), k)?
            .pop()
            .unwrap_or_default())
    }

    /// The exact top `k` of every query in one faiss call, best first, each passage with
    /// its id and vector: what a cloud shard answers a batch with.
    pub fn search(&self, queries: &[Vec<f32>], k: usize) -> Result<Vec<Vec<Document>>> {
        let flat = queries.concat();
        let hits = self
            .index
            .search(&flat, k)
            .context("searching the corpus")?;
        hits.iter()
            .map(|hits| {
                hits.iter()
                    .map(|hit| {
                        let row = usize::try_from(hit.id).context("hit id out of range")?;
                        let passage = self
                            .bundle
                            .documents
                            .get(row)
                            .with_context(|| format!("hit row {row} outside the bundle"))?;
                        Ok(Document::new(passage.title.clone(), passage.text.clone())
                            .with_vector(self.bundle.vector(row).to_vec())
                            .with_id(passage.id))
                    })
                    .collect()
            })
            .collect()
    }
}

/// Whether some passage holds some gold answer (normalised): the ceiling of any reader's
/// accuracy on the question.
pub fn holds_answer(documents: &[Document], golds: &[String]) -> bool {
    documents.iter().any(|d| {
        let text = format!("{} {}", d.title, d.text);
        golds.iter().any(|gold| metrics::contains(&text, gold))
    })
}
