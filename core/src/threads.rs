//! The compute threads of faiss's two parallel runtimes: OpenMP (faiss's own loops: one
//! thread per query in a small batch, the top-k merge of a large one) and OpenBLAS (the
//! matrix product faiss uses for batches of 20 queries or more).
//!
//! Both runtimes start as many threads as there are cores. Left alone, a batched search runs
//! OpenBLAS's threads inside OpenMP's and the two oversubscribe the cores: on 2 cores that
//! halves batched throughput (docs/benchmarks/cloud-tier.md). A server therefore sets both counts at start,
//! and the batch size from which faiss uses the matrix product at all.
//!
//! OpenBLAS is reached through the dynamic loader rather than linked by name, because the
//! BLAS faiss links against is chosen by the system (`libblas.so.3`); when it is not OpenBLAS
//! the setting is reported as unavailable instead of failing the link.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// OpenMP threads chosen by [`set_compute_threads`]; 0 until then.
static OPENMP_THREADS: AtomicUsize = AtomicUsize::new(0);

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

fn get(getter: &CStr) -> Option<usize> {
    let get = symbol(getter)?;
    // SAFETY: the symbol is the C function `int f(void)` of the OpenMP or OpenBLAS runtime
    // API, looked up by its documented name.
    unsafe {
        let get: GetThreads = std::mem::transmute::<*mut libc::c_void, GetThreads>(get);
        usize::try_from(get()).ok()
    }
}

fn set(setter: &CStr, getter: &CStr, threads: usize) -> Option<usize> {
    let set = symbol(setter)?;
    let n = c_int::try_from(threads.max(1)).unwrap_or(c_int::MAX);
    // SAFETY: the symbol is the C function `void f(int)` of the OpenMP or OpenBLAS runtime
    // API, looked up by its documented name.
    unsafe {
        let set: SetThreads = std::mem::transmute::<*mut libc::c_void, SetThreads>(set);
        set(n);
    }
    get(getter)
}

/// Sets the OpenMP and OpenBLAS thread counts (at least 1 each) and returns the counts the
/// runtimes report back. OpenBLAS's count is process-wide; OpenMP's applies to the calling
/// thread, so every other thread that calls faiss must call [`apply_openmp_threads`] first.
pub fn set_compute_threads(openmp: usize, openblas: usize) -> ComputeThreads {
    OPENMP_THREADS.store(openmp.max(1), Ordering::Relaxed);
    ComputeThreads {
        openmp: set(c"omp_set_num_threads", c"omp_get_max_threads", openmp),
        openblas: set(
            c"openblas_set_num_threads",
            c"openblas_get_num_threads",
            openblas,
        ),
    }
}

/// Gives the calling thread the OpenMP thread count chosen by [`set_compute_threads`], if
/// one was chosen. OpenMP keeps the count per thread: a thread that never set it (a tokio
/// blocking-pool thread) runs faiss's parallel loops on every core, and on a machine shared
/// by several faiss processes those teams spin against each other (measured: a batch of 7
/// queries over 250k vectors took 2-4 s instead of ~40 ms).
///
/// Runs before every search, so the setter is looked up once and only called.
pub fn apply_openmp_threads() {
    static SETTER: OnceLock<Option<SetThreads>> = OnceLock::new();
    let n = OPENMP_THREADS.load(Ordering::Relaxed);
    let setter = SETTER.get_or_init(|| {
        symbol(c"omp_set_num_threads").map(|ptr| {
            // SAFETY: the symbol is OpenMP's `void omp_set_num_threads(int)`.
            unsafe { std::mem::transmute::<*mut libc::c_void, SetThreads>(ptr) }
        })
    });
    if let (true, Some(set)) = (n > 0, setter) {
        let n = c_int::try_from(n).unwrap_or(c_int::MAX);
        // SAFETY: as above; the call only sets the calling thread's OpenMP team size.
        unsafe { set(n) }
    }
}

/// Smallest batch faiss's flat search runs as one matrix product (faiss's default is 20).
/// Below it faiss scans the vectors once per query, spread over OpenMP threads; at or above
/// it the vectors are read once for the whole batch, spread over OpenBLAS threads.
pub fn set_blas_min_batch(queries: usize) {
    let n = c_int::try_from(queries.max(1)).unwrap_or(c_int::MAX);
    // SAFETY: a plain setter of a global int in faiss's C API, linked into this process.
    unsafe { faiss_sys::faiss_set_distance_compute_blas_threshold(n) }
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
        // OpenMP's count is per thread: another thread has the default until it applies
        // the choice.
        set_compute_threads(3, 1);
        let other = std::thread::spawn(|| {
            let before = get(c"omp_get_max_threads");
            apply_openmp_threads();
            (before, get(c"omp_get_max_threads"))
        });
        let (before, after) = other.join().unwrap();
        assert_ne!(before, Some(3));
        assert_eq!(after, Some(3));
        set_blas_min_batch(2);
        // SAFETY: the matching getter of the C API.
        assert_eq!(
            unsafe { faiss_sys::faiss_get_distance_compute_blas_threshold() },
            2
        );
    }
}
