//! The client-side rate limiter: Lambda allows about one request a second
//! per key, and one launch every 12 seconds (five a minute). Requests are
//! spaced to those windows before they are sent, so a well-behaved client
//! rarely sees a 429; those it sees are retried with [`backoff`].

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// What the API documents, at scale 1.
pub const REQUEST_INTERVAL: Duration = Duration::from_secs(1);
/// What the API documents for `/instance-operations/launch`, at scale 1
/// (document 1.8.3; earlier ones said 10 s).
pub const LAUNCH_INTERVAL: Duration = Duration::from_secs(12);

/// Spaces calls by a minimum interval: each caller is given the next free
/// instant and waits for it. Callers queue in arrival order.
#[derive(Debug)]
pub struct Spacing {
    interval: Duration,
    next: Option<Instant>,
}

impl Spacing {
    /// Calls at least `interval` apart.
    pub fn new(interval: Duration) -> Spacing {
        Spacing {
            interval,
            next: None,
        }
    }

    /// Reserves the next slot at or after `now`: how long to wait for it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let at = match self.next {
            Some(n) if n > now => n,
            _ => now,
        };
        self.next = Some(at + self.interval);
        at - now
    }
}

/// The two windows of one API key.
#[derive(Debug)]
pub struct Limiter {
    requests: Mutex<Spacing>,
    launches: Mutex<Spacing>,
    scale: f64,
}

impl Limiter {
    /// The documented windows multiplied by `scale` (1: as documented;
    /// tests use 0.01 against a fake run with the same `--rate-scale`; 0:
    /// no spacing at all).
    pub fn new(scale: f64) -> Limiter {
        let scale = if scale.is_finite() && scale >= 0.0 {
            scale
        } else {
            1.0
        };
        Limiter {
            requests: Mutex::new(Spacing::new(REQUEST_INTERVAL.mul_f64(scale))),
            launches: Mutex::new(Spacing::new(LAUNCH_INTERVAL.mul_f64(scale))),
            scale,
        }
    }

    /// The factor the windows were multiplied by.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Waits for this key's next request slot (and, for a launch, its next
    /// launch slot first).
    pub async fn acquire(&self, launch: bool) {
        if launch {
            let wait = self.launches.lock().await.reserve(Instant::now());
            tokio::time::sleep(wait).await;
        }
        let wait = self.requests.lock().await.reserve(Instant::now());
        tokio::time::sleep(wait).await;
    }
}

/// How long to wait before retry `attempt` (0-based) after a 429 or an
/// unavailable server: doubling from the request window (at least 50 ms
/// when scaled down), at most 30 s scaled, with up to a quarter of jitter
/// from `seed` so that several clients do not retry in step.
pub fn backoff(attempt: u32, scale: f64, seed: u64) -> Duration {
    let base = REQUEST_INTERVAL
        .mul_f64(scale)
        .max(Duration::from_millis(50));
    let cap = Duration::from_secs(30)
        .mul_f64(scale)
        .max(Duration::from_millis(200));
    let d = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    let jitter = d.mul_f64((seed % 1000) as f64 / 4000.0);
    d + jitter
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_spaced_by_the_interval_in_arrival_order() {
        let t0 = Instant::now();
        let mut s = Spacing::new(Duration::from_secs(1));
        assert_eq!(s.reserve(t0), Duration::ZERO);
        // Two more at once: one and two seconds of waiting.
        assert_eq!(s.reserve(t0), Duration::from_secs(1));
        assert_eq!(s.reserve(t0), Duration::from_secs(2));
        // Long after, no wait again.
        assert_eq!(s.reserve(t0 + Duration::from_secs(10)), Duration::ZERO);
        assert_eq!(
            s.reserve(t0 + Duration::from_millis(10_500)),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn the_documented_windows_scale_for_tests() {
        let l = Limiter::new(0.01);
        assert_eq!(l.scale(), 0.01);
        let mut launches = l.launches.try_lock().unwrap();
        let t0 = Instant::now();
        launches.reserve(t0);
        assert_eq!(launches.reserve(t0), Duration::from_millis(120));
        // A nonsense scale is the documented one.
        assert_eq!(Limiter::new(f64::NAN).scale(), 1.0);
        assert_eq!(Limiter::new(-2.0).scale(), 1.0);
    }

    #[tokio::test]
    async fn a_limiter_at_scale_zero_never_waits() {
        let l = Limiter::new(0.0);
        let t = Instant::now();
        for _ in 0..50 {
            l.acquire(true).await;
        }
        assert!(t.elapsed() < Duration::from_millis(200));
    }

    #[test]
    fn backoff_doubles_to_a_cap_with_bounded_jitter() {
        assert_eq!(backoff(0, 1.0, 0), Duration::from_secs(1));
        assert_eq!(backoff(1, 1.0, 0), Duration::from_secs(2));
        assert_eq!(backoff(3, 1.0, 0), Duration::from_secs(8));
        assert_eq!(backoff(9, 1.0, 0), Duration::from_secs(30));
        assert_eq!(backoff(40, 1.0, 0), Duration::from_secs(30));
        let j = backoff(0, 1.0, 999);
        assert!(
            j > Duration::from_secs(1) && j <= Duration::from_millis(1250),
            "{j:?}"
        );
        // Scaled down for tests, but never a busy loop.
        assert_eq!(backoff(0, 0.01, 0), Duration::from_millis(50));
        assert_eq!(backoff(0, 0.0, 0), Duration::from_millis(50));
        assert_eq!(backoff(20, 0.0, 0), Duration::from_millis(200));
    }
}
