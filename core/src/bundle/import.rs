//! Vectors computed elsewhere: many users already run an embedding pipeline, so a bundle can
//! take its passages' vectors from a file instead of encoding them. Two layouts:
//! - JSON lines (gzipped or not): `{"title": ..., "text": ..., "vector": [...]}` a line
//!   (`title` optional);
//! - a NumPy `.npy` file of float32 rows (`<f4`, C order, shape `(n, d)`) with a JSON-lines
//!   file of the `n` passages in row order (`{"title": ..., "text": ...}`).
//!
//! Retrieval compares query vectors from this build's encoder with these, so they must come
//! from the same model: [`ImportedVectors::check_against`] re-encodes a sample and refuses
//! vectors that disagree.

use display_full_error::DisplayFullErrorExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::corpus::{Corpus, Passage, read_text};
use crate::encoder::{EncoderError, TextEncoder};

/// Least cosine between an imported vector and this build's encoding of the same passage:
/// the same model run elsewhere (another runtime, fp16) agrees to ~0.999; another model
/// does not come close.
pub const MIN_IMPORT_COSINE: f32 = 0.99;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: not a float32 (n, d) .npy array: {message}")]
    Npy { path: PathBuf, message: String },
    #[error("{npy} has {rows} rows but {passages} lists {listed} passages")]
    RowCount {
        npy: PathBuf,
        rows: usize,
        passages: PathBuf,
        listed: usize,
    },
    #[error("{path}: vectors have {found} dimensions, the encoder {expected}")]
    Dimension {
        path: PathBuf,
        expected: usize,
        found: usize,
    },
    #[error(
        "{path}: row {row}'s vector disagrees with this build's encoder (cosine {cosine:.4} < \
         {MIN_IMPORT_COSINE}); imported vectors must come from the model the edges encode \
         queries with"
    )]
    Disagrees {
        path: PathBuf,
        row: usize,
        cosine: f32,
    },
    #[error("encoding the check sample")]
    Encoder(#[from] EncoderError),
}

/// Passages with their vectors (unit length, row-major), from one file or pair of files.
#[derive(Clone, Debug)]
pub struct ImportedVectors {
    path: PathBuf,
    passages: Vec<Passage>,
    vectors: Vec<f32>,
    dimension: usize,
}

#[derive(Deserialize)]
struct VectorLine {
    #[serde(default)]
    title: String,
    text: String,
    vector: Vec<f32>,
}

#[derive(Deserialize)]
struct PassageLine {
    #[serde(default)]
    title: String,
    text: String,
}

fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, ImportError> {
    let text = read_text(path).map_err(|source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| ImportError::Line {
                path: path.to_path_buf(),
                line: i + 1,
                message: e.to_string_full(),
            })
        })
        .collect()
}

impl ImportedVectors {
    /// Reads the JSON-lines layout.
    pub fn read_jsonl(path: &Path) -> Result<Self, ImportError> {
        let lines: Vec<VectorLine> = read_lines(path)?;
        let dimension = lines.first().map_or(0, |l| l.vector.len());
        let mut passages = Vec::with_capacity(lines.len());
        let mut vectors = Vec::with_capacity(lines.len() * dimension);
        for (row, line) in lines.into_iter().enumerate() {
            if line.vector.len() != dimension {
                return Err(ImportError::Line {
                    path: path.to_path_buf(),
                    line: row + 1,
                    message: format!(
                        "vector of {} dimensions, the first line's has {dimension}",
                        line.vector.len()
                    ),
                });
            }
            passages.push(Passage {
                title: line.title,
                text: line.text,
            });
            vectors.extend(line.vector);
        }
        Self::new(path, passages, vectors, dimension)
    }

    /// Reads the `.npy` layout: `npy`'s rows are the vectors of `passages`' lines in order.
    pub fn read_npy(npy: &Path, passages: &Path) -> Result<Self, ImportError> {
        let bytes = std::fs::read(npy).map_err(|source| ImportError::Io {
            path: npy.to_path_buf(),
            source,
        })?;
        let (rows, dimension, data) = parse_npy(&bytes).map_err(|message| ImportError::Npy {
            path: npy.to_path_buf(),
            message,
        })?;
        let listed: Vec<PassageLine> = read_lines(passages)?;
        if listed.len() != rows {
            return Err(ImportError::RowCount {
                npy: npy.to_path_buf(),
                rows,
                passages: passages.to_path_buf(),
                listed: listed.len(),
            });
        }
        let vectors = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let passages = listed
            .into_iter()
            .map(|p| Passage {
                title: p.title,
                text: p.text,
            })
            .collect();
        Self::new(npy, passages, vectors, dimension)
    }

    /// Checks every vector (finite, not zero) and scales it to unit length, as the index
    /// compares by inner product.
    fn new(
        path: &Path,
        passages: Vec<Passage>,
        mut vectors: Vec<f32>,
        dimension: usize,
    ) -> Result<Self, ImportError> {
        let line_error = |row: usize, message: &str| ImportError::Line {
            path: path.to_path_buf(),
            line: row + 1,
            message: message.to_string(),
        };
        if dimension == 0 {
            return Err(line_error(0, "no vectors"));
        }
        for (row, vector) in vectors.chunks_exact_mut(dimension).enumerate() {
            if passages[row].text.trim().is_empty() {
                return Err(line_error(row, "empty passage text"));
            }
            if !vector.iter().all(|x| x.is_finite()) {
                return Err(line_error(row, "vector with a non-finite component"));
            }
            let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
            if !(norm > 0.0 && norm.is_finite()) {
                return Err(line_error(row, "vector of zero length"));
            }
            vector.iter_mut().for_each(|x| *x /= norm);
        }
        Ok(Self {
            path: path.to_path_buf(),
            passages,
            vectors,
            dimension,
        })
    }

    pub fn len(&self) -> usize {
        self.passages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.passages.is_empty()
    }

    /// Re-encodes `sample` passages spread evenly over the file and refuses the file when
    /// one disagrees with its imported vector. Returns the least cosine seen.
    pub fn check_against(&self, encoder: &TextEncoder, sample: usize) -> Result<f32, ImportError> {
        if self.dimension != encoder.dimension() {
            return Err(ImportError::Dimension {
                path: self.path.clone(),
                expected: encoder.dimension(),
                found: self.dimension,
            });
        }
        let n = self.len();
        let mut rows: Vec<usize> = (0..sample.min(n)).map(|i| i * n / sample.min(n)).collect();
        rows.dedup();
        let texts: Vec<String> = rows
            .iter()
            .map(|&row| self.passages[row].embedding_text())
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let mut least = 1.0f32;
        for (&row, encoded) in rows.iter().zip(encoder.encode(&refs)?) {
            let imported = &self.vectors[row * self.dimension..(row + 1) * self.dimension];
            let cosine: f32 = imported.iter().zip(&encoded).map(|(a, b)| a * b).sum();
            if cosine < MIN_IMPORT_COSINE {
                return Err(ImportError::Disagrees {
                    path: self.path.clone(),
                    row,
                    cosine,
                });
            }
            least = least.min(cosine);
        }
        Ok(least)
    }

    /// The passages as a corpus (to merge with the other sources) and their vectors as
    /// texts the build need not encode.
    pub fn into_parts(self) -> (Corpus, Vec<(String, Vec<f32>)>) {
        let known = self
            .passages
            .iter()
            .zip(self.vectors.chunks_exact(self.dimension))
            .map(|(p, v)| (p.embedding_text(), v.to_vec()))
            .collect();
        let corpus = Corpus {
            passages: self.passages,
            questions: Vec::new(),
            sources: vec![format!("vectors:{}", self.path.display())],
        };
        (corpus, known)
    }
}

/// Parses a version 1-3 `.npy` header of a C-order little-endian float32 2-D array:
/// returns rows, columns and the data bytes.
fn parse_npy(bytes: &[u8]) -> Result<(usize, usize, &[u8]), String> {
    let rest = bytes
        .strip_prefix(b"\x93NUMPY")
        .ok_or("no .npy magic string")?;
    let (major, rest) = rest.split_first().ok_or("truncated header")?;
    let rest = rest.get(1..).ok_or("truncated header")?;
    let (header_len, rest) = match major {
        1 => {
            let len = rest.get(..2).ok_or("truncated header")?;
            (
                usize::from(u16::from_le_bytes([len[0], len[1]])),
                &rest[2..],
            )
        }
        2 | 3 => {
            let len = rest.get(..4).ok_or("truncated header")?;
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
            (len as usize, &rest[4..])
        }
        v => return Err(format!("format version {v} unknown")),
    };
    let header = rest.get(..header_len).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "header is not text")?;
    let data = &rest[header_len..];
    let field = |key: &str| -> Option<&str> {
        let start = header.find(&format!("'{key}'"))? + key.len() + 2;
        let value = header[start..].trim_start().strip_prefix(':')?.trim_start();
        Some(value)
    };
    let descr = field("descr").ok_or("no descr")?;
    if !descr.starts_with("'<f4'") {
        return Err(format!(
            "dtype {} (want '<f4', float32 little-endian)",
            descr.split(',').next().unwrap_or(descr)
        ));
    }
    if !field("fortran_order")
        .ok_or("no fortran_order")?
        .starts_with("False")
    {
        return Err("Fortran order (want C order)".into());
    }
    let shape = field("shape").ok_or("no shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or("shape is not a tuple")?;
    let dims: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("shape entry {s:?}")))
        .collect::<Result<_, _>>()?;
    let [rows, columns] = dims[..] else {
        return Err(format!("shape ({inner}) is not 2-D"));
    };
    let expected = rows
        .checked_mul(columns)
        .and_then(|n| n.checked_mul(4))
        .ok_or("shape too large")?;
    if data.len() != expected {
        return Err(format!(
            "{} data bytes for shape ({rows}, {columns}), want {expected}",
            data.len()
        ));
    }
    Ok((rows, columns, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 `.npy` file as NumPy writes it (header padded to a multiple of 64 bytes).
    fn npy(rows: usize, columns: usize, values: &[f32]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {columns}), }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        for v in values {
            out.extend(v.to_le_bytes());
        }
        out
    }

    /// `bytes` with the first `from` replaced by `to` (same length: the header stays valid).
    fn replaced(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let at = bytes
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .unwrap();
        let mut out = bytes.to_vec();
        out[at..at + to.len()].copy_from_slice(to.as_bytes());
        out
    }

    #[test]
    fn npy_headers_parse_and_bad_ones_say_why() {
        let file = npy(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (rows, columns, data) = parse_npy(&file).unwrap();
        assert_eq!((rows, columns, data.len()), (2, 3, 24));
        assert_eq!(&data[..4], &1.0f32.to_le_bytes());
        let err = parse_npy(&replaced(&file, "<f4", "<f8")).unwrap_err();
        assert!(err.contains("<f8"), "{err}");
        let err = parse_npy(&replaced(&file, "False", "True ")).unwrap_err();
        assert!(err.contains("Fortran"), "{err}");
        assert!(
            parse_npy(&file[..file.len() - 4])
                .unwrap_err()
                .contains("data bytes")
        );
        let one_d = replaced(&npy(6, 1, &[0.0; 6]), "(6, 1)", "(6,)  ");
        assert!(parse_npy(&one_d).unwrap_err().contains("2-D"));
        assert!(parse_npy(b"PK\x03\x04").is_err());
    }

    #[test]
    fn vectors_are_scaled_to_unit_length_and_bad_rows_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.jsonl");
        std::fs::write(
            &path,
            "{\"title\": \"A\", \"text\": \"a\", \"vector\": [3, 4]}\n{\"text\": \"b\", \"vector\": [0, 2]}\n",
        )
        .unwrap();
        let imported = ImportedVectors::read_jsonl(&path).unwrap();
        assert_eq!(imported.vectors, [0.6, 0.8, 0.0, 1.0]);
        let (corpus, known) = imported.into_parts();
        assert_eq!(corpus.passages[0].title, "A");
        assert_eq!(known[1].0, "b");
        std::fs::write(&path, "{\"text\": \"a\", \"vector\": [0, 0]}\n").unwrap();
        let err = ImportedVectors::read_jsonl(&path)
            .unwrap_err()
            .to_string_full();
        assert!(
            err.contains("v.jsonl:1") && err.contains("zero length"),
            "{err}"
        );
        std::fs::write(
            &path,
            "{\"text\": \"a\", \"vector\": [1, 0]}\n{\"text\": \"b\", \"vector\": [1]}\n",
        )
        .unwrap();
        let err = ImportedVectors::read_jsonl(&path)
            .unwrap_err()
            .to_string_full();
        assert!(err.contains("v.jsonl:2"), "{err}");
        let npy_path = dir.path().join("v.npy");
        std::fs::write(&npy_path, npy(2, 2, &[1.0, 0.0, 0.0, 1.0])).unwrap();
        let passages = dir.path().join("p.jsonl");
        std::fs::write(&passages, "{\"text\": \"only one\"}\n").unwrap();
        assert!(matches!(
            ImportedVectors::read_npy(&npy_path, &passages),
            Err(ImportError::RowCount {
                rows: 2,
                listed: 1,
                ..
            })
        ));
    }
}
