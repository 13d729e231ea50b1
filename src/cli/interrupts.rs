//! Counts Ctrl-C presses so a follow loop can escalate: once stops the job
//! gracefully, twice kills it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

static COUNT: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

extern "C" fn on_interrupt(_: libc::c_int) {
    // Only an atomic add: async-signal-safe.
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Installs the SIGINT handler (once).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: installs a handler that only touches an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        }
    });
}

/// Ctrl-C presses so far.
pub(crate) fn count() -> usize {
    COUNT.load(Ordering::SeqCst)
}
