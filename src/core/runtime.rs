//! The async runtime that synchronous entry points run their I/O on.

/// A runtime on the calling thread: gangway's concurrency is I/O (many
/// SSH connections and API calls at once), not CPU.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}
