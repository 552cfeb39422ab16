//! Bundles from vectors computed elsewhere: imported vectors of the encoder's own model build
//! the same bundle as encoding, in both layouts; vectors that belong to other passages (a
//! pipeline that shuffled its rows) are refused before anything is written.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use display_full_error::DisplayFullErrorExt;
use std::path::{Path, PathBuf};

use hasten_core::bundle::{CorpusBundle, ImportError, ImportedVectors, build_bundle};
use hasten_core::corpus::{Corpus, Passage};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, TextEncoder};

fn model_dir() -> PathBuf {
    std::env::var_os("HASTEN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(DEFAULT_MODEL_DIR)
        })
}

fn passages() -> Vec<Passage> {
    [
        ("Ada Lovelace", "Ada Lovelace was born in London in 1815."),
        (
            "Warsaw",
            "Warsaw lies on the Vistula river in east-central Poland.",
        ),
        (
            "Kepler",
            "Kepler's laws describe the motion of planets around the Sun.",
        ),
        (
            "Basalt",
            "Basalt is a fine-grained volcanic rock rich in magnesium and iron.",
        ),
        (
            "Jazz",
            "Jazz originated in the African-American communities of New Orleans.",
        ),
        ("", "A passage without a title still has a vector."),
    ]
    .iter()
    .map(|(title, text)| Passage {
        title: title.to_string(),
        text: text.to_string(),
    })
    .collect()
}

/// Vectors as another pipeline would hand them over: not unit length (scaled by 3).
fn foreign_vectors(encoder: &TextEncoder, passages: &[Passage]) -> Vec<Vec<f32>> {
    let texts: Vec<String> = passages.iter().map(Passage::embedding_text).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    encoder
        .encode(&refs)
        .unwrap()
        .into_iter()
        .map(|v| v.into_iter().map(|x| 3.0 * x).collect())
        .collect()
}

fn write_jsonl(path: &Path, passages: &[Passage], vectors: &[Vec<f32>]) {
    let lines: Vec<String> = passages
        .iter()
        .zip(vectors)
        .map(|(p, v)| {
            serde_json::json!({"title": p.title, "text": p.text, "vector": v}).to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n")).unwrap();
}

/// A version 1 `.npy` of float32 rows, written here by hand as NumPy lays it out.
fn write_npy(path: &Path, vectors: &[Vec<f32>]) {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
        vectors.len(),
        vectors[0].len()
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    for x in vectors.iter().flatten() {
        bytes.extend(x.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

fn build(encoder: &TextEncoder, imported: ImportedVectors, out: &Path) -> CorpusBundle {
    let (corpus, known) = imported.into_parts();
    let stats = build_bundle(&corpus, encoder, out, known, |_, _| {}).unwrap();
    assert_eq!((stats.imported, stats.encoded), (passages().len(), 0));
    CorpusBundle::load(out).unwrap()
}

#[test]
fn imported_vectors_build_the_bundle_encoding_would() {
    let encoder = TextEncoder::load(&model_dir()).expect("model missing: run `make models`");
    let dir = tempfile::tempdir().unwrap();
    let passages = passages();
    let vectors = foreign_vectors(&encoder, &passages);

    let encoded_dir = dir.path().join("encoded");
    let corpus = Corpus {
        passages: passages.clone(),
        ..Corpus::default()
    };
    let stats = build_bundle(&corpus, &encoder, &encoded_dir, Vec::new(), |_, _| {}).unwrap();
    assert_eq!((stats.imported, stats.encoded), (0, passages.len()));
    let encoded = CorpusBundle::load(&encoded_dir).unwrap();

    let jsonl = dir.path().join("vectors.jsonl");
    write_jsonl(&jsonl, &passages, &vectors);
    let from_jsonl = ImportedVectors::read_jsonl(&jsonl).unwrap();
    assert!(from_jsonl.check_against(&encoder, 16).unwrap() > 0.9999);
    let npy = dir.path().join("vectors.npy");
    write_npy(&npy, &vectors);
    let texts = dir.path().join("passages.jsonl");
    write_jsonl(&texts, &passages, &vec![Vec::new(); passages.len()]);
    let from_npy = ImportedVectors::read_npy(&npy, &texts).unwrap();
    assert!(from_npy.check_against(&encoder, 16).unwrap() > 0.9999);

    for (name, imported) in [("jsonl", from_jsonl), ("npy", from_npy)] {
        let bundle = build(&encoder, imported, &dir.path().join(name));
        assert_eq!(bundle.documents, encoded.documents, "{name}");
        for row in 0..passages.len() {
            let cosine: f32 = bundle
                .vector(row)
                .iter()
                .zip(encoded.vector(row))
                .map(|(a, b)| a * b)
                .sum();
            assert!(cosine > 0.9999, "{name} row {row}: {cosine}");
            let norm: f32 = bundle.vector(row).iter().map(|x| x * x).sum();
            assert!(
                (norm - 1.0).abs() < 1e-4,
                "{name} row {row} not unit length"
            );
        }
    }
}

#[test]
fn vectors_of_other_passages_are_refused() {
    let encoder = TextEncoder::load(&model_dir()).expect("model missing: run `make models`");
    let dir = tempfile::tempdir().unwrap();
    let passages = passages();
    let mut vectors = foreign_vectors(&encoder, &passages);
    // The broken pipeline: every row's vector belongs to the next passage.
    vectors.rotate_left(1);
    let jsonl = dir.path().join("shifted.jsonl");
    write_jsonl(&jsonl, &passages, &vectors);
    let imported = ImportedVectors::read_jsonl(&jsonl).unwrap();
    let err = imported.check_against(&encoder, 16).unwrap_err();
    assert!(
        matches!(err, ImportError::Disagrees { row: 0, .. }),
        "{err}"
    );
    assert!(err.to_string_full().contains("shifted.jsonl"), "{err}");
    // Too short for the model: refused by dimension before any encoding.
    let short: Vec<Vec<f32>> = vectors.iter().map(|v| v[..128].to_vec()).collect();
    write_jsonl(&jsonl, &passages, &short);
    let imported = ImportedVectors::read_jsonl(&jsonl).unwrap();
    assert!(matches!(
        imported.check_against(&encoder, 16),
        Err(ImportError::Dimension {
            expected: 384,
            found: 128,
            ..
        })
    ));
}
