//! A loaded model: decoder, tokenizer and chat template from one GGUF file.

use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::chat::ChatTemplate;
use crate::decoder::Decoder;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::tokenizer::GgufTokenizer;
use crate::weights::WeightFormat;

pub struct LanguageModel {
    pub path: PathBuf,
    pub decoder: Decoder,
    pub tokenizer: GgufTokenizer,
    pub chat: ChatTemplate,
}

impl LanguageModel {
    /// Loads a GGUF llama or qwen2 model with its weights as stored; errors name the file and
    /// what is wrong with it.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        Self::load_with(path, device, WeightFormat::AsStored)
    }

    pub fn load_with(path: &Path, device: &Device, format: WeightFormat) -> Result<Self> {
        let _span = tracing::info_span!("lm_load", path = %path.display()).entered();
        let mut file = GgufFile::open(path)?;
        let tokenizer = GgufTokenizer::from_gguf(&file)?;
        let chat = ChatTemplate::for_tokenizer(&tokenizer)?;
        let decoder = Decoder::from_gguf(&mut file, device, format)?;
        Ok(Self {
            path: path.to_path_buf(),
            decoder,
            tokenizer,
            chat,
        })
    }

    /// The file name without its directory, for reports.
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}
