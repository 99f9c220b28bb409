//! The owner of one acquisition: the release that must happen on every exit
//! path, and the extension a nested call may ask for. Above the shared
//! client state, because both send commands.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Failure, HandOver};
use crate::drop_guard::{Cleanup, DropGuard};
use crate::error::{LockError, LostReason};
use crate::handoff::{Claim, Granted, TakenOffer};
use crate::lease_state::LeaseState;
use crate::shared::{ClientInner, RECONNECTS_AT_ONCE};
use crate::spec::Kind;

/// The owner of an acquisition. Releasing consumes it; dropping it without a
/// release (a cancelled future, an early drop of a guard) sends the release
/// from the runtime the lock was taken on (see [`DropGuard`]).
#[derive(Debug)]
pub(crate) struct Lease {
    state: Arc<LeaseState>,
    release: DropGuard<Release>,
}

impl Lease {
    pub(crate) fn new(client: Arc<ClientInner>, state: Arc<LeaseState>) -> Self {
        client.backend.hold_began(&state.key, &state.holder, state.kind);
        Lease {
            release: DropGuard::new(Release {
                client,
                state: Arc::clone(&state),
            }),
            state,
        }
    }

    pub(crate) fn state(&self) -> &Arc<LeaseState> {
        &self.state
    }

    /// Releases the lock and reports how that went. If this future is itself
    /// dropped before the server answered, the drop guard sends the release
    /// again (it is owner-checked, so a duplicate is harmless).
    pub(crate) async fn release(mut self) -> Result<(), LockError> {
        let result = self.release.run().await;
        self.release.disarm();
        result
    }
}

/// Sending the release of one lease.
#[derive(Debug)]
struct Release {
    client: Arc<ClientInner>,
    state: Arc<LeaseState>,
}

impl Cleanup for Release {
    /// Dropped, the lease ends at once, before its release is sent: the
    /// watchdog stops renewing it, and its task no longer counts as
    /// holding it (`GuardTable`), so a call for the same key right after
    /// the drop waits for this release instead of failing with
    /// `WouldDeadlock`.
    fn needed(&mut self) -> bool {
        self.state.end();
        true
    }

    async fn run(&self) -> Result<(), LockError> {
        let (client, state) = (&self.client, &self.state);
        client.backend.hold_ended(&state.key, &state.holder);
        state.end();
        if let Some(left) = state.hold_left() {
            return keep(client, state, left).await;
        }
        if state.kind == Kind::Exclusive
            && client.backend.hands_over()
            && let Some(taken) = client
                .notifier
                .take_offer(&state.key.channel, state.handed_in_row)
            && let Some(handed) = hand_over(client, state, taken).await
        {
            client.notifier.wake_observers_of(&state.key.channel);
            return handed;
        }
        // A release that meets a broken connection is sent again now, once
        // the client reconnects, rather than leave the lock to its ttl (after
        // a server restart the client can hold more than one dead
        // connection). Owner-checked, so a second copy is harmless.
        let released = sent_again_if_broken(state, || {
            client
                .backend
                .release_lease(&state.key, &state.holder, state.token.is_some())
        })
        .await;
        match released {
            Ok(true) => {
                tracing::debug!(key = %state.key.name, lock = state.name, holder = %state.holder, "lock released");
                announce_release(client, state);
                Ok(())
            }
            Ok(false) => Err(LockError::NotHeld {
                key: state.key.name.clone(),
            }),
            Err(failure) => {
                if failure.transient {
                    send_again_later(client, Arc::clone(state));
                }
                Err(failure.error)
            }
        }
    }

    fn describe(&self) -> String {
        if self.state.holds_after_release() {
            return format!(
                "the release of lock `{}` after its hold_at_least (it stays held until the lease it was granted ends)",
                self.state.key.name
            );
        }
        format!(
            "the release of lock `{}` (sent again until the server answers; else it expires by its ttl)",
            self.state.key.name
        )
    }
}

/// Waiters in this process retry now, without waiting for the server's
/// notification to come back.
fn announce_release(client: &ClientInner, state: &LeaseState) {
    if state.kind == Kind::Fair {
        // The server names the next in line; in-process, the line's
        // waiters look again and the first gets it.
        if !client.backend.announces_releases() {
            client.notifier.wake_line(&state.key.channel);
        }
    } else {
        client.notifier.released_by(&state.key.channel, &state.holder);
    }
}

/// The first pause before a release that got no answer is sent again; each
/// later copy waits about twice as long as the one before (jittered, so
/// that releases that failed together are not sent again together), up to
/// [`RESEND_LONGEST_GAP`].
const RESEND_FIRST_GAP: Duration = Duration::from_millis(100);
const RESEND_LONGEST_GAP: Duration = Duration::from_secs(1);

/// The longest a release is sent again: a lock whose ttl is longer (up to
/// a day) is left to it after that, rather than keep a task resending
/// once a second all day.
const RESEND_AT_MOST: Duration = Duration::from_secs(300);

/// A release that got no answer (timed out, refused by a busy or loading
/// server, its connection broken again) is sent again in the background
/// until the server answers it, rather than leave the lock held to its ttl
/// (30 s by default) because of one slow moment. The caller has heard its
/// error already. Past the lease's end on the server (the ttl, counted
/// from now, since no renewal leaves after a release, plus the clocks'
/// drift) the key is gone by expiry and nothing is sent; nor once the
/// client is dropped (the task holds it weakly, so it does not keep the
/// client's connections alive). Owner-checked, so a copy that lands after
/// another is harmless, and a holder id is never granted twice, so no copy
/// can free a later lease.
fn send_again_later(client: &Arc<ClientInner>, state: Arc<LeaseState>) {
    let ttl = state.ttl();
    let until = Instant::now() + (ttl + crate::timing::drift(ttl)).min(RESEND_AT_MOST);
    let client = Arc::downgrade(client);
    tokio::spawn(async move {
        let mut gap = RESEND_FIRST_GAP;
        loop {
            let Some(pause) = client.upgrade().map(|c| c.entropy.jitter(gap)) else {
                return;
            };
            tokio::time::sleep(pause).await;
            let Some(client) = client.upgrade().filter(|_| Instant::now() < until) else {
                return;
            };
            let answer = client
                .backend
                .release_lease(&state.key, &state.holder, state.token.is_some())
                .await;
            match answer {
                Ok(true) => {
                    tracing::debug!(key = %state.key.name, lock = state.name, holder = %state.holder, "lock released by a later copy of its release");
                    announce_release(&client, &state);
                    return;
                }
                Ok(false) => return,
                Err(failure) if failure.transient => gap = (gap * 2).min(RESEND_LONGEST_GAP),
                Err(failure) => {
                    tracing::debug!(key = %state.key.name, lock = state.name, holder = %state.holder, error = %failure.error, "a later copy of a release was refused; the lock expires by its ttl");
                    return;
                }
            }
        }
    });
}

/// Sends `op`, an owner-checked end of the lease, and sends it again at
/// once when it meets a broken connection (the client reconnects), rather
/// than leave the lock to its ttl (after a server restart the client can
/// hold more than one dead connection). A second copy is harmless.
async fn sent_again_if_broken<F, Fut>(state: &LeaseState, op: F) -> Result<bool, Failure>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<bool, Failure>>,
{
    let first_sent = Instant::now();
    let mut attempts = 1;
    let done = loop {
        match op().await {
            Err(failure) if failure.reconnecting && attempts < RECONNECTS_AT_ONCE => attempts += 1,
            done => break done,
        }
    };
    // A copy that found the lock gone, after an earlier one broke with its
    // connection, most likely follows that earlier copy's success (applied,
    // its answer lost on the way back). If the lease was still valid when
    // the first copy left, the body ran inside it, which is what `NotHeld`
    // would deny: the release is done.
    match done {
        Ok(false) if attempts > 1 && state.was_valid_at(first_sent) => {
            tracing::debug!(key = %state.key.name, lock = state.name, holder = %state.holder, "sent again, found the lock already let go");
            Ok(true)
        }
        done => done,
    }
}

/// The release of a lock that must stay held `left` longer
/// (`hold_at_least`): its lease is set to end then, by the server's clock,
/// instead of the lock being deleted. Nothing is announced and nothing
/// handed over: no one may have the lock before then. The lease the
/// server granted already lasts at least the hold; this only shortens
/// what renewals added past it. If it fails, the lock stays held until
/// that later end, never less than the hold.
async fn keep(client: &ClientInner, state: &LeaseState, left: Duration) -> Result<(), LockError> {
    let kept = sent_again_if_broken(state, || client.backend.keep(&state.key, &state.holder, left)).await;
    match kept {
        Ok(true) => {
            tracing::debug!(key = %state.key.name, lock = state.name, holder = %state.holder, left_ms = crate::timing::millis(left), "lock kept held until its hold_at_least");
            Ok(())
        }
        Ok(false) => Err(LockError::NotHeld {
            key: state.key.name.clone(),
        }),
        Err(failure) => Err(failure.error),
    }
}

/// Hands the lock to the waiter whose offer this release took (see
/// `handoff.rs`). `None` when the server refused the call outright, so
/// nothing was written: the caller releases as usual, and the waiter, told
/// nothing, looks again.
async fn hand_over(
    client: &Arc<ClientInner>,
    state: &Arc<LeaseState>,
    taken: TakenOffer,
) -> Option<Result<(), LockError>> {
    let (to, ttl, fencing) = (taken.holder().to_owned(), taken.ttl(), taken.fencing());
    let claim = Claim::new(Arc::clone(&client.backend), Arc::clone(state), &to);
    // From here the waiter may hold the lock, whatever becomes of this call.
    let sending = taken.sending(DropGuard::new(claim));
    // The waiter's lease counts from here, before the server can start it.
    let sent = Instant::now();
    let handed = client
        .backend
        .hand_over(&state.key, &state.holder, &to, ttl, fencing)
        .await;
    match handed {
        Ok(HandOver::Handed { token }) => {
            tracing::debug!(key = %state.key.name, lock = state.name, holder = %state.holder, to = %to, "lock handed over");
            sending.handed(Granted {
                sent,
                token,
                in_row: state.handed_in_row + 1,
            });
            Some(Ok(()))
        }
        // Lost before its release.
        Ok(HandOver::NotHeld) => {
            sending.not_handed();
            Some(Err(LockError::NotHeld {
                key: state.key.name.clone(),
            }))
        }
        // No answer: the waiter may hold the lock now (dropping `sending`
        // tells it so), and this lease is in the same doubt as a release
        // that got no answer.
        Err(failure) if failure.transient => Some(Err(failure.error)),
        Err(failure) => {
            tracing::debug!(key = %state.key.name, error = %failure.error, "handoff refused; releasing instead");
            sending.not_handed();
            None
        }
    }
}

/// A nested call asked for `ttl`: lengthen the lease if that outlasts the
/// one it has, never shorten it. Costs a round trip only when it extends.
pub(crate) async fn extend(client: &ClientInner, state: &LeaseState, ttl: Duration) -> Result<(), LockError> {
    let ttl = client.backend.lease_for(ttl);
    if state.covers(ttl) {
        return Ok(());
    }
    let sent = Instant::now();
    let renewed = client.backend.renew(&state.key, &state.holder, ttl).await;
    if let Ok(true) = renewed {
        state.extended(sent, ttl);
    }
    if renewed? {
        Ok(())
    } else {
        Err(LockError::Lost {
            key: state.key.name.clone(),
            reason: LostReason::TakenOver,
        })
    }
}
