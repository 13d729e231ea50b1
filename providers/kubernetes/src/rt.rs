//! The provider's own runtime: every API call and exec stream runs here,
//! whatever runtime (or none) the caller has. A kube client's connections
//! are tasks of the runtime that made them, so one runtime that lives as
//! long as the process keeps them usable; the caller's runtime only awaits
//! a join handle, and the transport's synchronous methods wait on a plain
//! channel (never `block_on` inside the caller's runtime, which panics).

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gangway-k8s")
            .enable_all()
            .build()
            .unwrap_or_else(|e| {
                // No threads to be had: nothing gangway can do either.
                eprintln!("gangway: kubernetes: cannot start its runtime: {e}");
                std::process::exit(10)
            })
    })
}

/// Runs `f` on the provider's runtime; await the result from anywhere
/// (dropping that await aborts `f`).
pub async fn run<F>(f: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Dropping the caller's future (a launch given up on) aborts the task.
    struct Abort<T>(tokio::task::JoinHandle<T>);
    impl<T> Drop for Abort<T> {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let mut task = Abort(runtime().spawn(f));
    (&mut task.0)
        .await
        .map_err(|e| format!("the kubernetes provider's task failed: {e}"))
}

/// Starts `f` on the provider's runtime without waiting for it.
pub fn spawn<F>(f: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    drop(runtime().spawn(f));
}

/// Runs `f` on the provider's runtime and waits for it on this thread.
/// Not from the provider's own runtime threads.
pub fn block<F>(f: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .map_err(|_| "the kubernetes provider's task failed".to_string())
}

/// Runs `f` on a thread of its own with a current-thread runtime, giving
/// up after `limit` (the thread is left to finish alone): for the
/// catalog's synchronous question, which must never hang a command.
pub fn with_limit<F, Fut, T>(limit: Duration, f: F) -> Result<T, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gangway-k8s-capacity".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot start a runtime: {e}")));
                    return;
                }
            };
            let out = rt.block_on(async { tokio::time::timeout(limit, f()).await });
            let _ = tx.send(out.map_err(|_| format!("no answer within {} s", limit.as_secs())));
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    rx.recv_timeout(limit + Duration::from_secs(1))
        .map_err(|_| format!("no answer within {} s", limit.as_secs()))?
}
