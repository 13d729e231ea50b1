//! Lambda's rate limits: about one request a second per key, and one
//! launch every 12 seconds (five a minute). The shared limiter spaces
//! requests to those windows before they are sent, so a well-behaved client
//! rarely sees a 429; those it sees are retried with [`backoff`].

use std::time::Duration;

pub use gangway_provider::http::limit::{backoff, Limiter, REQUEST_INTERVAL};

/// What the API documents for `/instance-operations/launch`, at scale 1
/// (document 1.8.3; earlier ones said 10 s).
pub const LAUNCH_INTERVAL: Duration = Duration::from_secs(12);

/// Lambda's two windows multiplied by `scale` (1: as documented; tests use
/// 0.01 against a fake run with the same `--rate-scale`; 0: no spacing).
pub fn limiter(scale: f64) -> Limiter {
    Limiter::with_launch_interval(scale, LAUNCH_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn launches_wait_for_the_launch_window_requests_do_not() {
        let l = limiter(0.01);
        let t = std::time::Instant::now();
        l.acquire(true).await;
        l.acquire(true).await;
        // The second launch waited 120 ms (12 s at 0.01).
        assert!(
            t.elapsed() >= Duration::from_millis(115),
            "{:?}",
            t.elapsed()
        );
        let t = std::time::Instant::now();
        l.acquire(false).await;
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
    }
}
