//! What names a stored chunk KV: the model that computed it, the corpus version it belongs
//! to, the chunk, and how it was computed. The key never holds the chunks before it in a
//! prompt, so every prefix that reaches a chunk finds the one stored copy (the paper's
//! alternative path).

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use hasten_worker_api::kv::Variant;

use super::StoreError;

/// Hex digits kept of a SHA-256 in names: 64 bits, collision-free at any corpus size here.
const SHORT_HASH: usize = 16;

/// Changes whenever what a stored entry means changes (prompt layout, entry format).
const LAYOUT_VERSION: &str = "hasten-kv-layout-1";

/// A model file's store id and its own SHA-256 (what a deployment pins), from one read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelIdentity {
    pub id: ModelId,
    /// The file's SHA-256, 64 lowercase hex digits.
    pub file_sha256: String,
}

impl ModelIdentity {
    pub fn compute(
        model_file: &Path,
        weights: &str,
        system_tokens: &[u32],
    ) -> Result<Self, StoreError> {
        let io = |source| StoreError::Io {
            path: model_file.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(model_file).map_err(io)?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            let read = file.read(&mut buffer).map_err(io)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
        let file_sha256 = hex::encode(hasher.clone().finalize());
        hasher.update(LAYOUT_VERSION.as_bytes());
        hasher.update(weights.as_bytes());
        for token in system_tokens {
            hasher.update(token.to_le_bytes());
        }
        Ok(Self {
            id: ModelId(short_hex(&hasher.finalize())),
            file_sha256,
        })
    }
}

/// The model a KV was computed with: a hash of the weights file, the weight layout the
/// runtime computed with (a re-quantised layout gives other numbers) and the system prompt's
/// tokens (every chunk's Full Reuse KV is computed after them).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelId(String);

impl ModelId {
    pub fn compute(
        model_file: &Path,
        weights: &str,
        system_tokens: &[u32],
    ) -> Result<Self, StoreError> {
        Ok(ModelIdentity::compute(model_file, weights, system_tokens)?.id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A chunk: a document of the corpus by id, or a text sent with a request (named by its
/// content, so the same text always finds the same entry).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkRef {
    Id(u64),
    Text(String),
}

impl ChunkRef {
    pub fn text(text: &str) -> Self {
        Self::Text(content_hash(text))
    }

    fn file_stem(&self) -> String {
        match self {
            Self::Id(id) => format!("id-{id}"),
            Self::Text(hash) => format!("text-{hash}"),
        }
    }
}

impl fmt::Display for ChunkRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Id(id) => write!(f, "chunk {id}"),
            Self::Text(hash) => write!(f, "text chunk {hash}"),
        }
    }
}

/// The corpus a text chunk's entry is filed under: texts do not depend on a corpus version.
pub const TEXT_CORPUS: &str = "text";

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KvKey {
    pub model: ModelId,
    pub corpus: String,
    pub chunk: ChunkRef,
    pub variant: Variant,
}

impl KvKey {
    /// A corpus chunk's key. The corpus version names a directory, so it is limited to
    /// letters, digits, `-`, `_` and `.` (bundle versions are hex).
    pub fn corpus_chunk(
        model: ModelId,
        corpus: &str,
        id: u64,
        variant: Variant,
    ) -> Result<Self, StoreError> {
        let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if corpus.is_empty()
            || corpus == TEXT_CORPUS
            || corpus.starts_with('.')
            || !corpus.chars().all(safe)
        {
            return Err(StoreError::InvalidKey(format!(
                "corpus version {corpus:?} must be letters, digits, `-`, `_` or `.` (not \
                 starting with `.`, not `{TEXT_CORPUS}`)"
            )));
        }
        Ok(Self {
            model,
            corpus: corpus.to_string(),
            chunk: ChunkRef::Id(id),
            variant,
        })
    }

    /// A text chunk's key: its Full Reuse KV only (its neighbours are unknown), under no corpus.
    pub fn text_chunk(model: ModelId, text: &str) -> Self {
        Self {
            model,
            corpus: TEXT_CORPUS.to_string(),
            chunk: ChunkRef::text(text),
            variant: Variant::FullReuse,
        }
    }

    /// Where the entry lives under the store's root.
    pub fn relative_path(&self) -> PathBuf {
        PathBuf::from(self.model.as_str())
            .join(&self.corpus)
            .join(format!(
                "{}.{}.kv",
                self.chunk.file_stem(),
                self.variant.name()
            ))
    }
}

impl fmt::Display for KvKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}) of corpus {} for model {}",
            self.chunk, self.variant, self.corpus, self.model
        )
    }
}

/// What a chunk's content hash covers: its title and text, as a prompt shows them.
pub fn chunk_content(title: &str, text: &str) -> String {
    format!("{title}\n{text}")
}

/// The first 64 bits of a text's SHA-256, in hex: a chunk's content hash.
pub fn content_hash(text: &str) -> String {
    short_hex(&Sha256::digest(text.as_bytes()))
}

fn short_hex(digest: &[u8]) -> String {
    let mut hex = hex::encode(digest);
    hex.truncate(SHORT_HASH);
    hex
}
