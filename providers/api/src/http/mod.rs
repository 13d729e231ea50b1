//! What the providers of GPU clouds with a plain JSON API over HTTPS
//! (Lambda, RunPod, Vast.ai) share: an API key that never prints
//! ([`key`]), a client-side rate limiter and backoff ([`limit`]), the one
//! send loop that spaces, authenticates and retries requests ([`Client`]),
//! and the per-cluster record each keeps on disk ([`record`]). Behind the
//! `http` feature, so that providers without such an API do not build
//! reqwest for it.

mod client;
pub mod key;
pub mod limit;
pub mod record;

pub use client::{Answer, Client, Retry};
