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
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::lane::renewal_runtime;
use crate::backend::{AnyBackend, Backend, RenewItem, Renewal};
use crate::error::LostReason;
use crate::lease_state::LeaseState;
use crate::telemetry::{self, RenewalOutcome};
use crate::timing::{millis, renewal_interval};

/// How many leases one renewal script call carries. Bounds how long one
/// call keeps Redis busy (about 3 µs per lease).
const BATCH: usize = 1000;

/// How many batches are out at once: one for the server to run while the
/// client reads the other's reply. All of a round at once, anything sent
/// on the renewal lane meanwhile (a `hold_at_least` release's `keep`)
/// waited behind the whole round (250 batches and 1.9 s of the server's
/// time for a million leases of 30 s), and every batch's timeout ran from
/// the round's start, not its own.
const BATCHES_OUT: usize = 2;

/// A client's scheduler. It holds the backend weakly: the client owns the
/// backend, and a scheduler task that sleeps must not keep it alive.
#[derive(Debug)]
pub(crate) struct Watchdog {
    schedule: Arc<Schedule>,
    backend: Weak<AnyBackend>,
    command_timeout: Duration,
    /// The scheduler runs on the renewal thread (`backend/lane.rs`), not
    /// on the caller's runtime.
    apart: bool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What the scheduler task shares with the client.
#[derive(Debug, Default)]
struct Schedule {
    leases: Mutex<Watched>,
    /// Held apart, so that the task can sleep on it without the schedule.
    wake: Arc<tokio::sync::Notify>,
}

/// The watched leases and when the scheduler means to look at them next.
#[derive(Debug, Default)]
struct Watched {
    leases: Vec<Weak<LeaseState>>,
    /// When the scheduler wakes next; `None` while it sleeps with nothing
    /// to renew (or has not started).
    next_wake: Option<Instant>,
    /// Past this length the list is swept of released leases, so that
    /// short-lived locks do not pile up between renewal ticks (a dead `Weak`
    /// still pins its allocation).
    sweep_above: usize,
}

/// The list is never swept below this length.
const MIN_SWEEP: usize = 64;

impl Watchdog {
    pub(crate) fn new(backend: Weak<AnyBackend>, command_timeout: Duration, apart: bool) -> Self {
        Watchdog {
            schedule: Arc::default(),
            backend,
            command_timeout,
            apart,
            task: Mutex::new(None),
        }
    }

    /// Starts renewing `lease`. The scheduler task runs on the renewal
    /// thread, or on the caller's runtime for in-process leases (started
    /// again there if that runtime has gone away).
    pub(crate) fn watch(&self, lease: &Arc<LeaseState>) {
        let wake = {
            let mut watched = self
                .schedule
                .leases
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A released lease's `Weak` pins its allocation until the list
            // lets go of it. The lease last pushed is usually released by
            // the time the next comes: letting go of dead ones at the end
            // now hands their blocks back to the allocator's per-thread
            // cache, where the next acquisition finds them, instead of
            // freeing dozens at once at the next sweep (in-process pair:
            // the lease's block came from the allocator's slow path).
            while watched.leases.last().is_some_and(|weak| weak.strong_count() == 0) {
                watched.leases.pop();
            }
            watched.leases.push(Arc::downgrade(lease));
            if watched.leases.len() > watched.sweep_above.max(MIN_SWEEP) {
                watched
                    .leases
                    .retain(|weak| weak.upgrade().is_some_and(|l| l.is_live()));
                watched.sweep_above = 2 * watched.leases.len();
            }
            // Wake the scheduler only if this lease falls due before it
            // meant to look again: leases of one ttl never do, so a busy
            // client does not wake it on every acquisition.
            watched.next_wake.is_none_or(|next| lease.next_renewal() < next)
        };
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        let runtime = || match self.apart.then(renewal_runtime).flatten() {
            Some(apart) => Some(apart),
            None => tokio::runtime::Handle::try_current().ok(),
        };
        if task.as_ref().is_none_or(tokio::task::JoinHandle::is_finished)
            && let Some(runtime) = runtime()
        {
            *task = Some(runtime.spawn(run(
                Arc::downgrade(&self.schedule),
                self.backend.clone(),
                self.command_timeout,
            )));
        }
        drop(task);
        if wake {
            self.schedule.wake.notify_one();
        }
    }
}

impl Schedule {
    /// The leases to renew now, and when to look again otherwise. Drops
    /// released, lost and forgotten leases as it goes.
    fn due(&self, now: Instant) -> (Vec<Arc<LeaseState>>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        let mut any_due = false;
        let mut watched = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        watched.leases.retain(|weak| {
            let Some(lease) = weak.upgrade().filter(|l| l.is_live()) else {
                return false;
            };
            let at = lease.next_renewal();
            if at <= now + early(lease.ttl()) {
                any_due |= at <= now;
                due.push(lease);
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            true
        });
        // Wake at the first lease that falls due, and take with it every
        // lease due within `early` after: one batch instead of many. Only
        // once one is due: taken early while none is, a renewal that failed
        // and waits `retry_after` (shorter than `early`) was tried again at
        // once, every round trip, for as long as the server refused (the
        // simulation found it).
        if !any_due {
            for lease in due.drain(..) {
                let at = lease.next_renewal();
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        watched.sweep_above = 2 * watched.leases.len();
        // With leases to renew now, the scheduler looks again right after.
        watched.next_wake = if due.is_empty() { next } else { Some(now) };
        (due, next)
    }
}

/// When to try again after a renewal that was not confirmed: well within
/// what is left of the lease, which has two more intervals to run.
fn retry_after(ttl: Duration) -> Duration {
    (renewal_interval(ttl) / 10).max(Duration::from_millis(5))
}

/// How much earlier than planned a lease may be renewed, to share a batch
/// with leases falling due just before it.
fn early(ttl: Duration) -> Duration {
    renewal_interval(ttl) / 4
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

async fn run(schedule: Weak<Schedule>, backend: Weak<AnyBackend>, command_timeout: Duration) {
    loop {
        let (Some(strong), Some(backend)) = (schedule.upgrade(), backend.upgrade()) else {
            return;
        };
        let (mut due, next) = strong.due(Instant::now());
        if !due.is_empty() {
            // Most urgent first (outside the schedule's lock, which every
            // acquisition takes): a round's batches go out in this order
            // and the server runs them one after the other, so a lease due
            // now does not wait behind a thousand taken early (under
            // 100,000 leases of 3 s, one round carried 25,000 of them,
            // 200 ms of the server's time; `lock-bench`, WSF).
            due.sort_by_cached_key(|lease| lease.next_renewal());
            renew(&backend, command_timeout, &due).await;
            continue;
        }
        // `watch` uses `notify_one`, which leaves a permit when nobody is
        // waiting yet: a lease added since `due` still wakes this sleep.
        let wake = Arc::clone(&strong.wake);
        drop((strong, backend));
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    () = wake.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Renews `due` in batches, most urgent first, `BATCHES_OUT` at a time.
async fn renew(backend: &AnyBackend, command_timeout: Duration, due: &[Arc<LeaseState>]) {
    use futures_util::StreamExt;
    futures_util::stream::iter(due.chunks(BATCH))
        .for_each_concurrent(BATCHES_OUT, |batch| {
            // Looked at as the batch goes out, not as the round began: a
            // lease released meanwhile is left alone, so that a renewal
            // cannot follow its release's `keep` (`hold_at_least`) and
            // lengthen it again.
            let live: Vec<Arc<LeaseState>> = batch.iter().filter(|l| l.is_live()).cloned().collect();
            async move {
                if !live.is_empty() {
                    renew_batch(backend, command_timeout, &live).await;
                }
            }
        })
        .await;
}

async fn renew_batch(backend: &AnyBackend, command_timeout: Duration, batch: &[Arc<LeaseState>]) {
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
    let timeout = command_timeout.min(renewal_interval(shortest));
    let sent = Instant::now();
    let outcome = tokio::time::timeout(timeout, backend.renew_many(&items)).await;
    match outcome {
        Ok(Ok(renewed)) => {
            let now = Instant::now();
            let (mut confirmed, mut unconfirmed) = (0, 0);
            let mut first_due: Option<Instant> = None;
            for ((lease, &ttl), renewal) in batch.iter().zip(&ttls).zip(renewed) {
                match renewal {
                    Renewal::Renewed => {
                        confirmed += 1;
                        let due = lease.next_renewal();
                        first_due = Some(first_due.map_or(due, |d| d.min(due)));
                        lease.renewed(sent, ttl);
                    }
                    // Not a release racing this renewal (`is_live` would be
                    // false): the key is gone or someone else has it.
                    // Counted before the holder is told: a caller that reads
                    // the metric once its body was stopped sees the loss.
                    Renewal::Gone if lease.is_live() => {
                        telemetry::renewals(RenewalOutcome::Lost, 1);
                        lease.mark_lost(LostReason::TakenOver);
                    }
                    Renewal::Gone => {}
                    Renewal::Unconfirmed => {
                        unconfirmed += 1;
                        lease.set_next_renewal(now + retry_after(ttl));
                    }
                }
            }
            if let Some(due) = first_due {
                telemetry::renewal_lag(now.saturating_duration_since(due));
            }
            telemetry::renewals(RenewalOutcome::Renewed, confirmed);
            telemetry::renewals(RenewalOutcome::Unconfirmed, unconfirmed);
            tracing::trace!(leases = batch.len(), "leases renewed");
        }
        failed => {
            let error = match failed {
                Ok(Err(failure)) => failure.error.to_string(),
                _ => format!("no reply within {}ms", millis(timeout)),
            };
            tracing::warn!(leases = batch.len(), %error, "lease renewal failed; retrying until the leases' deadlines");
            telemetry::renewals(RenewalOutcome::Failed, batch.len());
            let now = Instant::now();
            for (lease, &ttl) in batch.iter().zip(&ttls) {
                lease.set_next_renewal(now + retry_after(ttl));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockClient;

    /// How many leases `client`'s watchdog has in its list, released ones
    /// included.
    fn watched(client: &LockClient) -> usize {
        client
            .inner
            .watchdog
            .schedule
            .leases
            .lock()
            .expect("not poisoned")
            .leases
            .len()
    }

    #[tokio::test]
    async fn released_leases_do_not_pile_up_between_renewals() {
        let client = LockClient::in_memory();
        for i in 0..10_000 {
            let guard = client
                .lock(format!("short:{i}"))
                .acquire()
                .await
                .expect("acquire");
            guard.release().await.expect("release");
        }
        let watched = watched(&client);
        assert!(
            watched <= 2 * MIN_SWEEP,
            "{watched} leases still watched after 10,000 releases"
        );
    }

    /// One caller taking and releasing a lock over and over holds on to no
    /// released lease: each acquisition lets go of the one before, in the
    /// watchdog's list and in the guard table, so that its block is free
    /// for the next (without that, 64 pile up before a sweep).
    #[tokio::test]
    async fn the_next_acquisition_lets_go_of_a_released_lease() {
        let client = LockClient::in_memory();
        for _ in 0..100 {
            let guard = client.lock("again").acquire().await.expect("acquire");
            guard.release().await.expect("release");
        }
        let guard = client.lock("again").acquire().await.expect("acquire");
        let watched = watched(&client);
        assert_eq!(watched, 1, "released leases still watched");
        assert_eq!(client.inner.guards.len(), 1, "released guards still in the table");
        guard.release().await.expect("release");
    }
}
