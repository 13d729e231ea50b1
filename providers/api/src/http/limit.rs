//! The client-side rate limiter: requests of one key are spaced one a
//! second before they are sent (and, where an API documents one, launches
//! by a longer launch window), so a well-behaved client rarely sees a 429;
//! those it sees are retried after [`backoff`].

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// The spacing of requests at scale 1.
pub const REQUEST_INTERVAL: Duration = Duration::from_secs(1);

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

/// The windows of one API key: requests, and launches where the API has a
/// window of its own for them.
#[derive(Debug)]
pub struct Limiter {
    requests: Mutex<Spacing>,
    launches: Option<Mutex<Spacing>>,
    scale: f64,
}

impl Limiter {
    /// One request a second multiplied by `scale` (1: as documented; tests
    /// use 0.01 against a fake run with the same `--rate-scale`; 0: no
    /// spacing at all; a negative or not-a-number scale is 1).
    pub fn new(scale: f64) -> Limiter {
        let scale = if scale.is_finite() && scale >= 0.0 {
            scale
        } else {
            1.0
        };
        Limiter {
            requests: Mutex::new(Spacing::new(REQUEST_INTERVAL.mul_f64(scale))),
            launches: None,
            scale,
        }
    }

    /// The same, with launches also spaced by `interval` (scaled).
    pub fn with_launch_interval(scale: f64, interval: Duration) -> Limiter {
        let mut l = Limiter::new(scale);
        l.launches = Some(Mutex::new(Spacing::new(interval.mul_f64(l.scale))));
        l
    }

    /// The factor the windows were multiplied by.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Waits for this key's next request slot (and, for a launch where
    /// launches have a window, its next launch slot first).
    pub async fn acquire(&self, launch: bool) {
        if let (true, Some(launches)) = (launch, &self.launches) {
            let wait = launches.lock().await.reserve(Instant::now());
            tokio::time::sleep(wait).await;
        }
        let wait = self.requests.lock().await.reserve(Instant::now());
        tokio::time::sleep(wait).await;
    }
}

/// How long to wait before retry `attempt` (0-based) after a 429 or an
/// unavailable server: the answer's `Retry-After` seconds (scaled) where it
/// gave one, else doubling from the request window (at least 50 ms when
/// scaled down), at most 30 s scaled; with up to a quarter of jitter from
/// `seed` so that several clients do not retry in step.
pub fn backoff(attempt: u32, scale: f64, retry_after: Option<u64>, seed: u64) -> Duration {
    let floor = Duration::from_millis(50);
    let cap = Duration::from_secs(30)
        .mul_f64(scale)
        .max(Duration::from_millis(200));
    let d = match retry_after {
        Some(s) => Duration::from_secs(s.min(300)).mul_f64(scale).max(floor),
        None => REQUEST_INTERVAL
            .mul_f64(scale)
            .max(floor)
            .saturating_mul(1u32 << attempt.min(16))
            .min(cap),
    };
    d + d.mul_f64((seed % 1000) as f64 / 4000.0)
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
    fn the_launch_window_scales_for_tests_and_nonsense_is_one() {
        let l = Limiter::with_launch_interval(0.01, Duration::from_secs(12));
        assert_eq!(l.scale(), 0.01);
        let mut launches = l.launches.as_ref().unwrap().try_lock().unwrap();
        let t0 = Instant::now();
        launches.reserve(t0);
        assert_eq!(launches.reserve(t0), Duration::from_millis(120));
        assert!(Limiter::new(1.0).launches.is_none());
        assert_eq!(Limiter::new(f64::NAN).scale(), 1.0);
        assert_eq!(Limiter::new(-2.0).scale(), 1.0);
    }

    // On a paused clock: what the limiter slept, whatever the load.
    #[tokio::test(start_paused = true)]
    async fn a_limiter_at_scale_zero_never_waits() {
        let l = Limiter::with_launch_interval(0.0, Duration::from_secs(12));
        let t = tokio::time::Instant::now();
        for _ in 0..50 {
            l.acquire(true).await;
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
        // At scale 1 the same calls are spaced a second apart.
        let l = Limiter::new(1.0);
        let t = tokio::time::Instant::now();
        for _ in 0..3 {
            l.acquire(false).await;
        }
        assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn backoff_follows_retry_after_else_doubles_to_a_cap() {
        assert_eq!(backoff(0, 1.0, None, 0), Duration::from_secs(1));
        assert_eq!(backoff(1, 1.0, None, 0), Duration::from_secs(2));
        assert_eq!(backoff(3, 1.0, None, 0), Duration::from_secs(8));
        assert_eq!(backoff(9, 1.0, None, 0), Duration::from_secs(30));
        assert_eq!(backoff(40, 1.0, None, 0), Duration::from_secs(30));
        assert_eq!(backoff(0, 1.0, Some(7), 0), Duration::from_secs(7));
        assert_eq!(backoff(5, 0.01, Some(60), 0), Duration::from_millis(600));
        let j = backoff(0, 1.0, None, 999);
        assert!(
            j > Duration::from_secs(1) && j <= Duration::from_millis(1250),
            "{j:?}"
        );
        // Scaled down for tests, but never a busy loop.
        assert_eq!(backoff(0, 0.01, None, 0), Duration::from_millis(50));
        assert_eq!(backoff(0, 0.0, None, 0), Duration::from_millis(50));
        assert_eq!(backoff(20, 0.0, None, 0), Duration::from_millis(200));
        assert_eq!(backoff(0, 0.0, Some(60), 0), Duration::from_millis(50));
    }
}
