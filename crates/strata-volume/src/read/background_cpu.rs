//! CPU work the clients do not wait for (decoding and verifying what
//! hydration and read-ahead fetch), on threads of its own at a lower
//! scheduling priority than the ones that serve requests.
//!
//! Why: a client reading file after file sends tens of thousands of small
//! requests, one after the other; each one's latency is the read's pace.
//! On the tokio workers, an 8 MiB run's decode held a worker for
//! milliseconds while a client request waited behind it, and the kernel
//! could not tell the two apart. Here the kernel can: these threads run
//! at `NICE`, so a woken request handler preempts them, and they take
//! what CPU the clients leave.
//!
//! Bounded: the jobs come from GETs, whose number in flight is bounded
//! (hydration's and read-ahead's slots), and each job's bytes are already
//! in memory; the queue holds no more than those GETs.

use std::sync::mpsc;
use std::sync::OnceLock;

use parking_lot::Mutex;

/// Threads of the pool: both of a small host's cores may decode while no
/// client reads.
const THREADS: usize = 2;
/// Their nice value (0 is the default; 19 the lowest priority): low enough
/// that a request handler preempts them, not so low that a busy host
/// starves hydration.
const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The pool's queue; `None` when no thread could start (jobs run inline).
fn queue() -> &'static Option<mpsc::Sender<Job>> {
    static QUEUE: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    QUEUE.get_or_init(start)
}

fn start() -> Option<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = std::sync::Arc::new(Mutex::new(rx));
    let mut started = 0;
    for i in 0..THREADS {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("strata-bg-cpu-{i}"))
            .spawn(move || {
                lower_priority();
                loop {
                    // One thread waits on the queue at a time; the lock is
                    // released before the job runs.
                    let job = rx.lock().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            });
        match spawned {
            Ok(_) => started += 1,
            Err(e) => {
                tracing::warn!(error = %strata_store::ErrorText(&e), "cannot start a background CPU thread; its work runs beside the clients'")
            }
        }
    }
    (started > 0).then_some(tx)
}

/// The calling thread's id and nice value (`None`: unknown).
fn this_thread_nice() -> (libc::id_t, Option<i32>) {
    // SAFETY: gettid and getpriority take no pointers; `which` and `who`
    // name this thread only. errno is cleared first because -1 is a valid
    // nice value.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
        (tid, (*libc::__errno_location() == 0).then_some(nice))
    }
}

/// Lowers the calling thread's priority to `NICE` (Linux: a thread's own
/// nice value), unless the process runs lower already. A failure only
/// costs the clients some latency.
fn lower_priority() {
    let (tid, nice) = this_thread_nice();
    if nice.is_some_and(|n| n >= NICE) {
        return;
    }
    // SAFETY: setpriority takes no pointers; it names this thread only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, NICE) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "cannot lower a background thread's priority"
        );
    }
}

/// Runs `f` on the pool and returns its result; inline when the pool
/// could not start or has stopped.
pub(crate) async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let Some(queue) = queue() else { return f() };
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A panic is caught on the pool's thread (which goes on) and resumed
    // in the caller, as if `f` had run inline.
    let job: Job = Box::new(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    if let Err(mpsc::SendError(job)) = queue.send(job) {
        job();
    }
    match rx.await {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The job is dropped unrun only when its thread is gone mid-job,
        // which a caught panic never does.
        Err(_) => unreachable!("a background CPU job was dropped unrun"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> i32 {
        this_thread_nice().1.unwrap_or(i32::MIN)
    }

    #[tokio::test]
    async fn jobs_run_on_lower_priority_threads_and_return_their_result() {
        let caller = nice_of_this_thread();
        let (value, nice, name) = run(|| {
            let name = std::thread::current().name().map(str::to_owned);
            (6 * 7, nice_of_this_thread(), name)
        })
        .await;
        assert_eq!(value, 42);
        assert!(
            name.is_some_and(|n| n.starts_with("strata-bg-cpu-")),
            "ran on the pool"
        );
        // Raising a nice value needs no privilege: it always takes.
        assert_eq!(nice, NICE.max(caller), "the pool's threads run at NICE");
        assert_eq!(nice_of_this_thread(), caller, "the caller's is unchanged");
    }

    #[tokio::test]
    async fn a_panicking_job_panics_its_caller_and_the_pool_goes_on() {
        let caught = tokio::spawn(run(|| -> u32 { panic!("decode bug") })).await;
        assert!(caught.is_err_and(|e| e.is_panic()));
        for i in 0..THREADS * 2 {
            assert_eq!(run(move || i).await, i, "the pool still answers");
        }
    }
}
