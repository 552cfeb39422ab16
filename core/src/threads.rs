//! The compute threads of faiss's two parallel runtimes: OpenMP (faiss's own loops: one
//! thread per query in a small batch, the top-k merge of a large one) and OpenBLAS (the
//! matrix product faiss uses for batches of 20 queries or more).
//!
//! Both runtimes start as many threads as there are cores. Left alone, a batched search runs
//! OpenBLAS's threads inside OpenMP's and the two oversubscribe the cores: on 2 cores that
//! halves batched throughput (bench/README.md). A server therefore sets both counts at start.
//!
//! OpenBLAS is reached through the dynamic loader rather than linked by name, because the
//! BLAS faiss links against is chosen by the system (`libblas.so.3`); when it is not OpenBLAS
//! the setting is reported as unavailable instead of failing the link.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};

/// Thread counts in effect after [`set_compute_threads`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComputeThreads {
    /// OpenMP threads faiss may use; `None` when OpenMP was not found in the process.
    pub openmp: Option<usize>,
    /// OpenBLAS threads; `None` when the process's BLAS is not OpenBLAS.
    pub openblas: Option<usize>,
}

type SetThreads = unsafe extern "C" fn(c_int);
type GetThreads = unsafe extern "C" fn() -> c_int;

/// Looks a function up among the libraries already loaded into the process.
fn symbol(name: &CStr) -> Option<*mut libc::c_void> {
    // SAFETY: `dlsym` with RTLD_DEFAULT only reads the loader's tables; `name` is a valid
    // NUL-terminated string.
    let ptr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!ptr.is_null()).then_some(ptr)
}

fn set(setter: &CStr, getter: &CStr, threads: usize) -> Option<usize> {
    let set = symbol(setter)?;
    let get = symbol(getter)?;
    let n = c_int::try_from(threads.max(1)).unwrap_or(c_int::MAX);
    // SAFETY: both symbols are the C functions `void f(int)` and `int f(void)` of the
    // OpenMP and OpenBLAS runtime APIs, looked up by their documented names.
    unsafe {
        let set: SetThreads = std::mem::transmute::<*mut libc::c_void, SetThreads>(set);
        let get: GetThreads = std::mem::transmute::<*mut libc::c_void, GetThreads>(get);
        set(n);
        usize::try_from(get()).ok()
    }
}

/// Sets the OpenMP and OpenBLAS thread counts for the whole process (at least 1 each) and
/// returns the counts the runtimes report back.
pub fn set_compute_threads(openmp: usize, openblas: usize) -> ComputeThreads {
    ComputeThreads {
        openmp: set(c"omp_set_num_threads", c"omp_get_max_threads", openmp),
        openblas: set(
            c"openblas_set_num_threads",
            c"openblas_get_num_threads",
            openblas,
        ),
    }
}

/// Cores available to this process (its CPU affinity and cgroup quota), at least 1.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linking faiss (which this crate does) brings both runtimes into the process; a change
    /// of count must be visible through each runtime's own getter.
    #[test]
    fn both_runtimes_take_the_requested_counts() {
        // Keep a reference to faiss so the linker keeps its libraries in the test binary.
        let _ = crate::index::ExactIndex::build(2, &[1.0, 0.0]);
        let applied = set_compute_threads(1, 2);
        assert_eq!(applied.openmp, Some(1));
        assert_eq!(applied.openblas, Some(2));
        let applied = set_compute_threads(2, 1);
        assert_eq!(applied.openmp, Some(2));
        assert_eq!(applied.openblas, Some(1));
    }
}
