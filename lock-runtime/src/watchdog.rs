//! One renewal scheduler per client, not a timer per lock.
//!
//! Every held lease with `renew = true` is renewed a third of the way through
//! its ttl. Leases that fall due close together (within a quarter of their
//! renewal interval) are renewed early, together, in one batched script call:
//! renewing early only lengthens a lease, and it turns a thousand timers into
//! one round trip. A renewal moves the validity deadline from its own send
//! time; one that finds the lock gone marks the lease lost at once; errors and
//! timeouts are retried until the deadline, where the lease's own timer
//! declares it lost.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::LostReason;
use crate::backend::{Backend, RenewItem};
use crate::client::ClientInner;
use crate::lease::{LeaseState, millis, renewal_interval};

/// How many leases one renewal script call carries. Bounds how long one
/// call keeps Redis busy (about 3 µs per lease).
const BATCH: usize = 1000;

#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    leases: Mutex<Vec<Weak<LeaseState>>>,
    /// Shared with the scheduler task, which must not keep the client alive
    /// while it sleeps.
    wake: Arc<tokio::sync::Notify>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Watchdog {
    /// Starts renewing `lease`. The scheduler task runs on the caller's
    /// runtime, and is started again if that runtime has gone away.
    pub(crate) fn watch(&self, client: &Arc<ClientInner>, lease: &Arc<LeaseState>) {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(lease));
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_none_or(tokio::task::JoinHandle::is_finished)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            *task = Some(runtime.spawn(run(Arc::downgrade(client))));
        }
        drop(task);
        self.wake.notify_one();
    }

    /// The leases to renew now, and when to look again otherwise. Drops
    /// released, lost and forgotten leases as it goes.
    fn due(&self, now: Instant) -> (Vec<Arc<LeaseState>>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|weak| {
                let Some(lease) = weak.upgrade().filter(|l| l.is_live()) else {
                    return false;
                };
                let at = lease.next_renewal();
                let early = renewal_interval(lease.ttl()) / 4;
                if at <= now + early {
                    due.push(lease);
                } else {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
                true
            });
        (due, next)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

async fn run(client: Weak<ClientInner>) {
    loop {
        let Some(strong) = client.upgrade() else {
            return;
        };
        let (due, next) = strong.watchdog.due(Instant::now());
        if !due.is_empty() {
            renew(&strong, &due).await;
            continue;
        }
        // `watch` uses `notify_one`, which leaves a permit when nobody is
        // waiting yet: a lease added since `due` still wakes this sleep.
        let wake = Arc::clone(&strong.watchdog.wake);
        drop(strong);
        match next {
            Some(at) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Renews `due` in batches sent together on the client's connection.
async fn renew(client: &ClientInner, due: &[Arc<LeaseState>]) {
    let batches = due.chunks(BATCH).map(|batch| renew_batch(client, batch));
    futures_util::future::join_all(batches).await;
}

async fn renew_batch(client: &ClientInner, batch: &[Arc<LeaseState>]) {
    let ttls: Vec<Duration> = batch.iter().map(|l| l.ttl()).collect();
    let items: Vec<RenewItem<'_>> = batch
        .iter()
        .zip(&ttls)
        .map(|(lease, &ttl)| RenewItem {
            key: &lease.key,
            holder: &lease.holder,
            ttl,
        })
        .collect();
    // A renewal that takes longer than the interval is of no use: the next
    // one is already due.
    let shortest = ttls.iter().min().copied().unwrap_or_default();
    let timeout = client.config.command_timeout.min(renewal_interval(shortest));
    let sent = Instant::now();
    let outcome = tokio::time::timeout(timeout, client.backend.renew_many(&items)).await;
    match outcome {
        Ok(Ok(renewed)) => {
            for ((lease, &ttl), renewed) in batch.iter().zip(&ttls).zip(renewed) {
                if renewed {
                    lease.renewed(sent, ttl);
                } else if lease.is_live() {
                    // Not a release racing this renewal (`is_live` would be
                    // false): the key is gone or someone else has it.
                    lease.mark_lost(LostReason::TakenOver);
                }
            }
            tracing::trace!(leases = batch.len(), "leases renewed");
        }
        failed => {
            let error = match failed {
                Ok(Err(failure)) => failure.error.to_string(),
                _ => format!("no reply within {}ms", millis(timeout)),
            };
            tracing::warn!(leases = batch.len(), %error, "lease renewal failed; retrying until the leases' deadlines");
            let now = Instant::now();
            for (lease, &ttl) in batch.iter().zip(&ttls) {
                // Retry well within what is left of the lease.
                let retry = (renewal_interval(ttl) / 10).max(Duration::from_millis(5));
                lease.set_next_renewal(now + retry);
            }
        }
    }
}
