//! Work the node hands off its own thread (encoding and writing snapshots, freeing what a
//! compaction released) runs on a thread of its own at a lower CPU priority: on cores the
//! members share, the Raft threads then run first and the snapshot fills the gaps. On the
//! tokio blocking pool at normal priority, encoding a snapshot of megabytes took a core
//! from the Raft threads for 50-130 ms, which showed as the replication lag's p99.

use std::sync::mpsc;

/// The nice value of the thread (Linux: per thread; 0 is the default, 19 the lowest).
const NICENESS: libc::c_int = 10;

type Job = Box<dyn FnOnce() + Send>;

/// A thread running jobs one after the other at a lower priority; ends when dropped.
pub struct BesideNode {
    jobs: mpsc::Sender<Job>,
}

impl BesideNode {
    pub fn start(name: String) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new().name(name).spawn(move || {
            lower_priority();
            for job in queue {
                job();
            }
        })?;
        Ok(Self { jobs })
    }

    /// Queues `job`; runs it on the caller's thread when the worker is gone (a job
    /// panicked).
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        if let Err(mpsc::SendError(job)) = self.jobs.send(Box::new(job)) {
            job();
        }
    }
}

/// Lowers this thread's priority (`setpriority` on its thread id: Linux's nice is per
/// thread). Failing leaves it as it is: the work still gets done.
#[allow(unsafe_code)]
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take no pointers.
        let lowered = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICENESS)
        };
        if lowered != 0 {
            tracing::debug!(err = %std::io::Error::last_os_error(), "could not lower the snapshot thread's priority");
        }
    }
}
