//! The BERT forward pass in candle, from `model.safetensors`.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};

use super::{EncoderError, HiddenStates, read};

pub(super) struct CandleBert {
    model: BertModel,
}

impl CandleBert {
    pub(super) fn load(
        model_dir: &Path,
        config: &BertConfig,
        device: &Device,
    ) -> Result<Self, EncoderError> {
        let weights = read(&model_dir.join("model.safetensors"))?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, device)?;
        Ok(Self {
            model: BertModel::load(vb, config)?,
        })
    }
}

impl HiddenStates for CandleBert {
    fn forward(
        &self,
        ids: &[u32],
        mask: &[u32],
        rows: usize,
        tokens: usize,
    ) -> Result<Vec<f32>, EncoderError> {
        let device = &self.model.device;
        let input_ids = Tensor::from_slice(ids, (rows, tokens), device)?;
        let type_ids = input_ids.zeros_like()?;
        let mask = Tensor::from_slice(mask, (rows, tokens), device)?;
        let hidden = self.model.forward(&input_ids, &type_ids, Some(&mask))?;
        Ok(hidden.flatten_all()?.to_vec1::<f32>()?)
    }
}
