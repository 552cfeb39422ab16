//! The BERT forward pass in ONNX Runtime, from `model.onnx` (scripts/export-encoder-onnx.py).
//!
//! The runtime library is loaded at run time (`libonnxruntime.so` in the model directory,
//! or the file `ORT_DYLIB_PATH` names), so building Hasten needs no ONNX Runtime and a
//! machine without one still encodes with candle.

use display_full_error::DisplayFullErrorExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;

use super::{EncoderError, HiddenStates};

const MODEL_FILE: &str = "model.onnx";
const LIBRARY_FILE: &str = "libonnxruntime.so";

pub(super) struct OnnxBert {
    /// A session runs one batch at a time (`Session::run` takes `&mut`); each run already
    /// uses every core through ONNX Runtime's own threads.
    session: Mutex<Session>,
}

/// The library to load: `ORT_DYLIB_PATH` when set, else the one in the model directory.
fn library_path(model_dir: &Path) -> PathBuf {
    std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| model_dir.join(LIBRARY_FILE))
}

/// ONNX Runtime is loaded once per process, and its environment (which sessions reach
/// through a weak reference) lives as long as the process; later loads reuse both whatever
/// path they name.
fn init_runtime(library: &Path) -> Result<&'static Environment, EncoderError> {
    static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();
    match ENVIRONMENT.get_or_init(|| {
        ort::init_from(library)
            .map_err(|e| e.to_string_full())?
            .with_name("hasten-encoder")
            .build()
            .map_err(|e| e.to_string_full())
    }) {
        Ok(environment) => Ok(environment),
        Err(message) => Err(EncoderError::OnnxRuntimeLibrary {
            path: library.to_path_buf(),
            message: message.clone(),
        }),
    }
}

fn ort_error(context: &str) -> impl FnOnce(ort::Error) -> EncoderError + '_ {
    move |source| EncoderError::OnnxRuntime {
        context: context.to_string(),
        source,
    }
}

impl OnnxBert {
    /// Whether `model_dir` has what this runtime needs.
    pub(super) fn available(model_dir: &Path) -> bool {
        model_dir.join(MODEL_FILE).is_file() && library_path(model_dir).is_file()
    }

    pub(super) fn load(model_dir: &Path) -> Result<Self, EncoderError> {
        let model = model_dir.join(MODEL_FILE);
        if !model.is_file() {
            return Err(EncoderError::MissingFile { path: model });
        }
        let environment = init_runtime(&library_path(model_dir))?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let session = Session::builder(environment)
            .map_err(ort_error("session options"))?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(|e| ort_error("optimisation level")(e.into()))?
            .with_intra_threads(threads)
            .map_err(|e| ort_error("threads")(e.into()))?
            // Idle compute threads sleep instead of spinning: the encoder shares its cores
            // with faiss and the servers' own threads.
            .with_intra_op_spinning(false)
            .map_err(|e| ort_error("spinning")(e.into()))?
            .commit_from_file(&model)
            .map_err(ort_error("loading model.onnx"))?;
        Ok(Self {
            session: Mutex::new(session),
        })
    }
}

impl HiddenStates for OnnxBert {
    fn forward(
        &self,
        ids: &[u32],
        mask: &[u32],
        rows: usize,
        tokens: usize,
    ) -> Result<Vec<f32>, EncoderError> {
        let shape = [rows as i64, tokens as i64];
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<i64>>();
        let input_ids = Tensor::from_array((shape, widen(ids))).map_err(ort_error("input_ids"))?;
        let attention_mask =
            Tensor::from_array((shape, widen(mask))).map_err(ort_error("attention_mask"))?;
        // A panic while running poisons the lock; the session itself holds no partial state.
        let mut session = self
            .session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let outputs = session
            .run(ort::inputs![
                "input_ids" => input_ids,
                "attention_mask" => attention_mask,
            ])
            .map_err(ort_error("run"))?;
        let (_, hidden) = outputs["last_hidden_state"]
            .try_extract_tensor::<f32>()
            .map_err(ort_error("last_hidden_state"))?;
        Ok(hidden.to_vec())
    }
}
