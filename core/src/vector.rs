//! Checks and arithmetic on embedding vectors.

/// Why a vector was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VectorError {
    #[error("expected {expected} dimensions, got {got}")]
    Dimension { expected: usize, got: usize },
    #[error("value at position {position} is not finite")]
    NotFinite { position: usize },
    #[error("vector has zero norm")]
    ZeroNorm,
}

/// Inner product.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise without -ffast-math.
    let mut acc = [0.0f32; 8];
    let chunks_a = a.chunks_exact(8);
    let chunks_b = b.chunks_exact(8);
    let tail: f32 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (ca, cb) in chunks_a.zip(chunks_b) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Validates a query vector of the expected dimension and returns it L2-normalised,
/// the form every index in Hasten is built for.
pub fn normalized_query(values: &[f32], dimension: usize) -> Result<Vec<f32>, VectorError> {
    if values.len() != dimension {
        return Err(VectorError::Dimension {
            expected: dimension,
            got: values.len(),
        });
    }
    if let Some(position) = values.iter().position(|v| !v.is_finite()) {
        return Err(VectorError::NotFinite { position });
    }
    // Scaled by the largest magnitude first, so that a vector of huge values (whose squares
    // overflow) or of tiny ones (whose squares underflow) keeps its direction.
    let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    if largest == 0.0 {
        return Err(VectorError::ZeroNorm);
    }
    let scaled: Vec<f32> = values.iter().map(|v| v / largest).collect();
    let norm = dot(&scaled, &scaled).sqrt();
    Ok(scaled.iter().map(|v| v / norm).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_and_tiny_vectors_keep_their_direction_and_only_zero_is_refused() {
        for scale in [1e30f32, 1e37, 1e-30, f32::MIN_POSITIVE / 4.0] {
            let values = [3.0 * scale, -4.0 * scale];
            let unit = normalized_query(&values, 2).unwrap();
            assert!(
                (unit[0] - 0.6).abs() < 1e-5 && (unit[1] + 0.8).abs() < 1e-5,
                "scale {scale}: {unit:?}"
            );
        }
        assert_eq!(
            normalized_query(&[0.0, -0.0], 2),
            Err(VectorError::ZeroNorm)
        );
    }

    #[test]
    fn dot_matches_the_naive_sum_for_odd_lengths() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.1).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-4);
    }

    #[test]
    fn query_checks_dimension_finiteness_and_norm() {
        assert_eq!(
            normalized_query(&[1.0, 2.0], 3),
            Err(VectorError::Dimension {
                expected: 3,
                got: 2
            })
        );
        assert_eq!(
            normalized_query(&[1.0, f32::NAN, 0.0], 3),
            Err(VectorError::NotFinite { position: 1 })
        );
        assert_eq!(
            normalized_query(&[1.0, f32::INFINITY, 0.0], 3),
            Err(VectorError::NotFinite { position: 1 })
        );
        assert_eq!(normalized_query(&[0.0; 3], 3), Err(VectorError::ZeroNorm));
        let v = normalized_query(&[3.0, 4.0, 0.0], 3).unwrap();
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
    }
}
