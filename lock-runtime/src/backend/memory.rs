//! Locks that live in this process: the same semantics as Redis (leases with
//! a TTL on the monotonic clock, owner-checked release and renewal, fencing
//! counters, release wake-ups), for single-process services and for testing
//! code that uses locks. Not distributed: two processes never see each
//! other's locks.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::contract::{AcquireReply, AcquireRequest, Backend, Failure, RenewItem, Renewal};
use crate::key::LockKey;

/// Held locks above which an insertion first sweeps out expired ones, so that
/// leases that were never released cannot grow the map without bound.
const SWEEP_ABOVE: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    held: HashMap<String, Lease>,
    /// Like the Redis fence counters: never expire, never reset.
    fences: HashMap<String, u64>,
}

#[derive(Debug)]
struct Lease {
    holder: String,
    expires: Instant,
}

impl State {
    /// The live lease at `key`, forgetting it if it has expired.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Lease> {
        if self.held.get(key).is_some_and(|l| l.expires <= now) {
            self.held.remove(key);
        }
        self.held.get_mut(key)
    }

    fn renew(&mut self, key: &LockKey, holder: &str, ttl: Duration, extend_only: bool, now: Instant) -> bool {
        match self.live(&key.redis_key, now) {
            Some(lease) if lease.holder == holder => {
                let expires = now + ttl;
                lease.expires = if extend_only {
                    lease.expires.max(expires)
                } else {
                    expires
                };
                true
            }
            _ => false,
        }
    }
}

impl MemoryBackend {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Backend for MemoryBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(lease) = state.live(&req.key.redis_key, now) {
            if lease.holder != req.holder {
                return Ok(AcquireReply::Held {
                    pttl: Some(lease.expires - now),
                });
            }
            // An earlier attempt of this acquisition got it (as in the script).
            lease.expires = now + req.ttl;
            let token = state.fences.get(&req.key.fence_key()).copied().unwrap_or(0);
            return Ok(AcquireReply::Acquired {
                token: req.fencing.then_some(token),
            });
        }
        if state.held.len() >= SWEEP_ABOVE {
            state.held.retain(|_, l| l.expires > now);
        }
        state.held.insert(
            req.key.redis_key.clone(),
            Lease {
                holder: req.holder.to_owned(),
                expires: now + req.ttl,
            },
        );
        let token = req.fencing.then(|| {
            let counter = state.fences.entry(req.key.fence_key()).or_insert(0);
            *counter += 1;
            *counter
        });
        Ok(AcquireReply::Acquired { token })
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        let now = Instant::now();
        let mut state = self.state();
        let owned = state
            .live(&key.redis_key, now)
            .is_some_and(|l| l.holder == holder);
        if owned {
            state.held.remove(&key.redis_key);
        }
        Ok(owned)
    }

    async fn renew(
        &self,
        key: &LockKey,
        holder: &str,
        ttl: Duration,
        extend_only: bool,
    ) -> Result<bool, Failure> {
        Ok(self.state().renew(key, holder, ttl, extend_only, Instant::now()))
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(items
            .iter()
            .map(|item| state.renew(item.key, item.holder, item.ttl, false, now).into())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LockKey {
        LockKey::new("lock:", name.to_owned()).expect("valid key")
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn request<'a>(key: &'a LockKey, holder: &'a str, ttl_ms: u64, fencing: bool) -> AcquireRequest<'a> {
        AcquireRequest {
            key,
            holder,
            ttl: Duration::from_millis(ttl_ms),
            fencing,
            first: true,
            waiting: false,
        }
    }

    #[test]
    fn owner_checks_expiry_and_fences_match_the_redis_scripts() {
        block_on(async {
            let backend = MemoryBackend::default();
            let k = key("k");
            let first = backend.acquire(&request(&k, "a:1", 50, true)).await.expect("ok");
            assert_eq!(first, AcquireReply::Acquired { token: Some(1) });
            // Someone else waits; the same holder retrying gets it again.
            assert!(matches!(
                backend.acquire(&request(&k, "b:1", 50, true)).await.expect("ok"),
                AcquireReply::Held { pttl: Some(_) }
            ));
            assert_eq!(
                backend.acquire(&request(&k, "a:1", 50, true)).await.expect("ok"),
                AcquireReply::Acquired { token: Some(1) }
            );
            // Only the owner releases or renews.
            assert!(!backend.release(&k, "b:1").await.expect("ok"));
            assert!(
                !backend
                    .renew(&k, "b:1", Duration::from_secs(1), false)
                    .await
                    .expect("ok")
            );
            assert!(
                backend
                    .renew(&k, "a:1", Duration::from_millis(30), true)
                    .await
                    .expect("ok")
            );
            assert!(backend.release(&k, "a:1").await.expect("ok"));
            assert!(!backend.release(&k, "a:1").await.expect("ok"), "double release");
            // A fresh acquisition gets the next token; an expired one frees.
            let again = backend.acquire(&request(&k, "b:1", 5, true)).await.expect("ok");
            assert_eq!(again, AcquireReply::Acquired { token: Some(2) });
            std::thread::sleep(Duration::from_millis(10));
            assert!(
                !backend
                    .renew(&k, "b:1", Duration::from_secs(1), false)
                    .await
                    .expect("ok")
            );
            let third = backend.acquire(&request(&k, "c:1", 50, false)).await.expect("ok");
            assert_eq!(third, AcquireReply::Acquired { token: None });
        });
    }
}
