//! A trained faiss IVF index searched through a shared reference.
//!
//! faiss-rs offers parameterised search through `&self` only for the index types it marks
//! as concurrent, and a factory-built IVF-PQ index is not one of them, so the edge used to
//! serialise every fuzzy- and cache-channel search behind a mutex: 16 clients probing 103
//! lists took turns on one core. faiss's `Index::search` is a `const` method, and faiss
//! documents its CPU indexes as safe for concurrent searches while nothing modifies them;
//! here every modification goes through `&mut self`, so the borrow checker keeps writers
//! and readers apart and searches need no lock.

#![allow(unsafe_code)]

use std::ffi::CStr;

use faiss::index::IndexImpl;
use faiss::search_params::SearchParametersIVF;
use faiss::{Idx, Index};
use faiss_sys::idx_t;

use super::{Hit, IndexError, hits_per_query};

/// An IVF index and the probe count its searches use.
pub(super) struct SharedIvf {
    index: IndexImpl,
    params: SearchParametersIVF,
}

impl SharedIvf {
    pub fn new(index: IndexImpl, nprobe: usize) -> Result<Self, IndexError> {
        let mut params = SearchParametersIVF::new()?;
        params.set_nprobe(nprobe);
        Ok(Self { index, params })
    }

    pub fn index(&self) -> &IndexImpl {
        &self.index
    }

    pub fn index_mut(&mut self) -> &mut IndexImpl {
        &mut self.index
    }

    /// Top-`k` of one query of the index's dimension (checked by the caller), probing the
    /// configured number of lists; empty when the index is.
    pub fn search_one(&self, query: &[f32], k: usize) -> Result<Vec<Hit>, IndexError> {
        if k == 0 || self.index.ntotal() == 0 {
            return Ok(Vec::new());
        }
        let mut distances = vec![0f32; k];
        let mut labels = vec![Idx::none(); k];
        // SAFETY: the index pointer is valid for `self`'s lifetime and only read: faiss's
        // search is `const` and safe to run concurrently while the index is not modified,
        // which `&self` guarantees (modification needs `index_mut`). `query` is one vector of
        // the index's dimension; `distances` and `labels` hold `k` slots;
        // `Idx` is a transparent `idx_t`. The parameters are only read.
        let code = unsafe {
            faiss_sys::faiss_Index_search_with_params(
                self.index.inner_ptr(),
                1,
                query.as_ptr(),
                k as idx_t,
                self.params.inner_ptr(),
                distances.as_mut_ptr(),
                labels.as_mut_ptr().cast::<idx_t>(),
            )
        };
        if code != 0 {
            return Err(IndexError::Search {
                code,
                message: last_faiss_error(),
            });
        }
        Ok(hits_per_query(&labels, &distances, k)
            .pop()
            .unwrap_or_default())
    }
}

/// The message of the exception faiss's C API caught last on this thread.
fn last_faiss_error() -> String {
    // SAFETY: faiss keeps the last error per thread; the pointer, when not null, is a
    // NUL-terminated string valid until the next failing call on this thread, and it is
    // copied before returning.
    unsafe {
        let message = faiss_sys::faiss_get_last_error();
        if message.is_null() {
            return "unknown faiss error".to_owned();
        }
        CStr::from_ptr(message).to_string_lossy().into_owned()
    }
}
