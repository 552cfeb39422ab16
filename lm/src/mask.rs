//! Which cached and new entries each new token may attend to.

use candle_core::{Device, Tensor};

use crate::error::{LmError, Result};

/// The attention pattern of a forward pass over `t` new tokens after `p` cached entries.
#[derive(Debug, Clone, Default)]
pub enum AttentionMask {
    /// New token `i` sees every valid cached entry and new tokens `0..=i`; padding is never
    /// seen (but a padding token sees itself, so that its row stays finite).
    #[default]
    Causal,
    /// An explicit (batch, t, p + t) u8 tensor: 1 where the token may attend.
    Custom(Tensor),
}

impl AttentionMask {
    /// The (batch, t, p + t) u8 mask, or `None` when every token may see every entry
    /// (decoding one token after an unpadded past).
    pub(crate) fn build(
        &self,
        past_valid: &[Vec<bool>],
        new_valid: &[Vec<bool>],
        device: &Device,
    ) -> Result<Option<Tensor>> {
        let batch = new_valid.len();
        let t = new_valid.first().map_or(0, Vec::len);
        let p = past_valid.first().map_or(0, Vec::len);
        match self {
            Self::Custom(mask) => {
                let dims = mask.dims();
                if dims != [batch, t, p + t] {
                    return Err(LmError::InvalidInput(format!(
                        "custom mask of shape {dims:?}, expected [{batch}, {t}, {}]",
                        p + t
                    )));
                }
                Ok(Some(mask.clone()))
            }
            Self::Causal => {
                let all_valid = past_valid.iter().chain(new_valid).flatten().all(|v| *v);
                if t == 1 && all_valid {
                    return Ok(None);
                }
                let width = p + t;
                let mut allowed = vec![0u8; batch * t * width];
                for b in 0..batch {
                    let valid = |j: usize| {
                        if j < p {
                            past_valid[b][j]
                        } else {
                            new_valid[b][j - p]
                        }
                    };
                    for i in 0..t {
                        let row = &mut allowed[(b * t + i) * width..(b * t + i + 1) * width];
                        for (j, cell) in row.iter_mut().enumerate().take(p + i + 1) {
                            *cell = u8::from(j == p + i || valid(j));
                        }
                    }
                }
                Ok(Some(Tensor::from_vec(allowed, (batch, t, width), device)?))
            }
        }
    }
}
