//! The state of one held lease: its identity, its validity deadline, when it
//! is renewed next, and the signal that tells its body it was lost.

use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::LostReason;
use crate::key::LockKey;
use crate::spec::Kind;
use crate::telemetry;
use crate::timing::{millis, renewal_interval, stop_margin, validity_deadline};

/// The state of one acquisition, shared between its owner (`Lease`), the
/// watchdog and the scopes nested inside its body. It knows no client: the
/// layers above it send the commands, and tell it what the server said.
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// Where the lease lives: the lock's key, or the segment's.
    pub(crate) key: LockKey,
    pub(crate) holder: String,
    pub(crate) kind: Kind,
    pub(crate) token: Option<u64>,
    /// Which segment of a segmented lock.
    pub(crate) segment: Option<u32>,
    /// The `lock` label of its metrics.
    pub(crate) name: &'static str,
    /// When the acquiring attempt was sent: the hold time counts from here.
    since: Instant,
    /// How long the acquisition waited for the lock (its metrics' wait).
    pub(crate) waited: Duration,
    /// How many handoffs in a row (`handoff.rs`) brought the lock here: 0
    /// when it was taken from the server.
    pub(crate) handed_in_row: u32,
    ttl_ms: AtomicU64,
    /// Renewed by the watchdog; `false` for a fixed lease (`renew = false`),
    /// whose end is not a failure to renew.
    renews: bool,
    /// After this instant the server may already have expired the key.
    deadline: Mutex<Instant>,
    /// When the watchdog should renew next (unused with `renew = false`).
    next_renewal: Mutex<Instant>,
    /// Released (or being released): the watchdog must leave it alone.
    ended: AtomicBool,
    /// 0 while trusted, else a `LostReason` code: set once, never cleared.
    lost: AtomicU8,
    lost_signal: tokio::sync::Notify,
    /// `hold_at_least`: until when the release keeps the lock held
    /// (`timing::hold_end`).
    hold_ends: Option<Instant>,
}

/// What an acquisition was granted, and under which name.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) key: LockKey,
    pub(crate) holder: String,
    pub(crate) kind: Kind,
    pub(crate) token: Option<u64>,
    pub(crate) segment: Option<u32>,
    pub(crate) name: &'static str,
    pub(crate) waited: Duration,
    pub(crate) handed_in_row: u32,
    pub(crate) hold_ends: Option<Instant>,
}

impl LeaseState {
    pub(crate) fn new(grant: Grant, ttl: Duration, renews: bool, sent: Instant) -> Self {
        let Grant {
            key,
            holder,
            kind,
            token,
            segment,
            name,
            waited,
            handed_in_row,
            hold_ends,
        } = grant;
        telemetry::lease_started();
        LeaseState {
            key,
            holder,
            kind,
            token,
            segment,
            name,
            since: sent,
            waited,
            handed_in_row,
            ttl_ms: AtomicU64::new(millis(ttl)),
            renews,
            deadline: Mutex::new(validity_deadline(sent, ttl)),
            next_renewal: Mutex::new(sent + renewal_interval(ttl)),
            ended: AtomicBool::new(false),
            lost: AtomicU8::new(0),
            lost_signal: tokio::sync::Notify::new(),
            hold_ends,
        }
    }

    /// Whether the release keeps the lock held (`hold_at_least`).
    pub(crate) fn holds_after_release(&self) -> bool {
        self.hold_ends.is_some()
    }

    /// How long the release should still keep the lock held
    /// (`hold_at_least`): `None` once the hold has ended, or without one.
    /// The clock is read only for a lock with a hold: every other release
    /// costs nothing here.
    pub(crate) fn hold_left(&self) -> Option<Duration> {
        self.hold_ends?
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }

    /// Whether this is a lease on the lock `key` (on one of its segments,
    /// for a segmented lock).
    pub(crate) fn is_lock(&self, key: &LockKey) -> bool {
        match self.segment {
            None => self.key.redis_key == key.redis_key,
            // The segment's suffix `#i` is the key's last `#`.
            Some(_) => self
                .key
                .redis_key
                .rsplit_once('#')
                .is_some_and(|(lock, _)| lock == key.redis_key),
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Acquire))
    }

    pub(crate) fn next_renewal(&self) -> Instant {
        *self.next_renewal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_next_renewal(&self, at: Instant) {
        *self.next_renewal.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }

    /// Whether the watchdog should keep renewing this lease.
    pub(crate) fn is_live(&self) -> bool {
        !self.ended.load(Ordering::Acquire) && self.lost.load(Ordering::Acquire) == 0
    }

    /// A renewal sent at `sent` for `ttl` was confirmed by the server. A
    /// lease already declared lost stays lost: its body is gone.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        if !self.is_live() {
            return;
        }
        // Every backend only lengthens a lease (`Backend::renew`): a
        // renewal with a shorter ttl, overtaken on its way by a nested
        // call's extension, proves its own ttl and takes nothing away (the
        // simulation's seed 1787 found a body running 420 ms past its lease
        // when a renewal could shorten it).
        self.confirm(sent, ttl);
        self.set_next_renewal(sent + renewal_interval(ttl));
    }

    /// The server no longer holds the lock for us: tell the body now rather
    /// than at the deadline.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let code = match reason {
            LostReason::Expired => 1,
            LostReason::TakenOver => 2,
            LostReason::LeaseEnded => 3,
        };
        if self
            .lost
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::warn!(key = %self.key.name, lock = self.name, holder = %self.holder, %reason, "lock lost");
            telemetry::lost(self.name, reason);
            self.lost_signal.notify_waiters();
        }
    }

    fn lost_reason(&self) -> Option<LostReason> {
        match self.lost.load(Ordering::Acquire) {
            0 => None,
            1 => Some(LostReason::Expired),
            2 => Some(LostReason::TakenOver),
            _ => Some(LostReason::LeaseEnded),
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the deadline later only: a confirmation that was sent earlier
    /// than one already counted must not shorten it.
    fn confirm(&self, sent: Instant, ttl: Duration) {
        let mut d = self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        *d = (*d).max(validity_deadline(sent, ttl));
    }

    /// When the body must be stopped: a little before the deadline, because
    /// a timer fires at or after its instant, never before.
    fn cutoff(&self) -> Instant {
        let deadline = self.deadline();
        deadline.checked_sub(stop_margin(self.ttl())).unwrap_or(deadline)
    }

    /// Whether the lease was neither lost nor past its validity deadline at
    /// `at`, as far as the client knows.
    pub(crate) fn was_valid_at(&self, at: Instant) -> bool {
        self.lost_reason().is_none() && at < self.deadline()
    }

    /// Whether this holder may still act as the lock's owner.
    pub(crate) fn is_held(&self) -> bool {
        self.is_live() && Instant::now() < self.cutoff()
    }

    /// Why the lease can no longer be trusted, if it cannot, by the clock
    /// read now: the server said so, or its cutoff has passed, whether or
    /// not a timer has fired yet (after a process stop, timers fire late and
    /// in no particular order).
    pub(crate) fn lost_now(&self) -> Option<LostReason> {
        if let Some(reason) = self.lost_reason() {
            return Some(reason);
        }
        if Instant::now() < self.cutoff() {
            return None;
        }
        let reason = if self.renews {
            LostReason::Expired
        } else {
            LostReason::LeaseEnded
        };
        self.mark_lost(reason);
        // A concurrent `mark_lost` may have won: report what stuck.
        Some(self.lost_reason().unwrap_or(reason))
    }

    /// Resolves once the lease can no longer be trusted: the server said so,
    /// or the validity deadline passed without a confirmed renewal. The
    /// deadline moves while this waits, so it is re-read after every wake.
    pub(crate) async fn lost(&self) -> LostReason {
        loop {
            let signal = self.lost_signal.notified();
            let mut signal = std::pin::pin!(signal);
            // Registered before the checks below, so a loss marked between
            // them still wakes us.
            signal.as_mut().enable();
            if let Some(reason) = self.lost_now() {
                return reason;
            }
            tokio::select! {
                biased;
                () = signal => {}
                () = tokio::time::sleep_until(self.cutoff()) => {}
            }
        }
    }

    /// Whether the lease is at least `ttl` long already, so that a nested
    /// call asking for `ttl` needs no round trip.
    pub(crate) fn covers(&self, ttl: Duration) -> bool {
        millis(ttl) <= self.ttl_ms.load(Ordering::Acquire)
    }

    /// The server lengthened the lease to `ttl`, as asked at `sent`. The
    /// lease's ttl changes only when the server confirms, so that a failed
    /// extension leaves [`covers`](Self::covers) telling the truth.
    pub(crate) fn extended(&self, sent: Instant, ttl: Duration) {
        self.ttl_ms.fetch_max(millis(ttl), Ordering::AcqRel);
        self.confirm(sent, ttl);
    }

    /// The release is under way: the watchdog must leave the lease alone.
    /// The first call ends the lease's hold time.
    pub(crate) fn end(&self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            telemetry::lease_ended(self.name, self.since.elapsed());
        }
    }
}

/// A lease forgotten without a release (its runtime gone before the drop
/// guard could send one) still stops counting as held.
impl Drop for LeaseState {
    fn drop(&mut self) {
        self.end();
    }
}
