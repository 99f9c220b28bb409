//! Taking a lock within a wait budget.
//!
//! Every attempt of one acquisition uses the same holder id, and the acquire
//! script treats "already mine" as success, so retrying after an attempt whose
//! reply never came is safe. What is not safe is walking away from such an
//! attempt: it may have been applied. Those attempts leave the acquisition
//! *in doubt*, and an acquisition that ends in doubt (timed out, failed, or
//! dropped by its caller) sends an owner-checked release. The release goes on
//! the same multiplexed connection as the attempts, after them, so the server
//! applies it after any late attempt (TCP keeps their order).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::backend::{AcquireReply, AcquireRequest, Backend, Failure};
use crate::drop_guard::{Cleanup, DropGuard};
use crate::error::LockError;
use crate::handoff::{Granted, OfferHandle};
use crate::holder;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease_state::{Grant, LeaseState};
use crate::shared::ClientInner;
use crate::spec::{Kind, LockOptions};
use crate::timing::{millis, stop_margin, validity_deadline};
use crate::waiter::{POLL, Watch};

/// The shortest time a retry is given to answer, even with less of `wait` left.
const LATE_ATTEMPT_FLOOR: Duration = Duration::from_millis(10);

pub(crate) async fn acquire(
    client: &Arc<ClientInner>,
    key: LockKey,
    opts: &LockOptions,
) -> Result<Lease, LockError> {
    let holder = holder::new_holder_id(opts.kind);
    let span = tracing::debug_span!(
        "lock_acquire",
        lock = opts.name,
        key = %key.name,
        holder = %holder,
        ttl_ms = millis(opts.ttl),
        wait_ms = millis(opts.wait)
    );
    let (lease, _) = acquire_within_wait(client, key, Vec::new(), holder, opts)
        .instrument(span)
        .await?;
    Ok(lease)
}

/// Takes every lock of `keys` (sorted, without duplicates, at least two), or
/// none: group by group in the backend's order (one group, except on a
/// cluster), each group at once, all within the one `wait`. If a group
/// cannot be had, the groups taken so far are released before the error
/// is returned.
pub(crate) async fn acquire_all(
    client: &Arc<ClientInner>,
    keys: Vec<LockKey>,
    opts: &LockOptions,
) -> Result<Vec<Lease>, LockError> {
    let holder = holder::new_holder_id(opts.kind);
    let span = tracing::debug_span!(
        "lock_acquire_all",
        lock = opts.name,
        holder = %holder,
        keys = keys.len(),
        first = %keys.first().map_or("", |k| k.name.as_str()),
        ttl_ms = millis(opts.ttl),
        wait_ms = millis(opts.wait)
    );
    async {
        let give_up_at = Instant::now() + opts.wait;
        let mut taken: Vec<Lease> = Vec::new();
        for group in client.backend.groups(keys) {
            let mut group = group.into_iter();
            let Some(first) = group.next() else {
                continue;
            };
            let within = LockOptions {
                wait: give_up_at.saturating_duration_since(Instant::now()),
                ..*opts
            };
            match acquire_within_wait(client, first, group.collect(), holder.clone(), &within).await {
                Ok((lease, more)) => {
                    taken.push(lease);
                    taken.extend(more);
                }
                Err(error) => {
                    futures_util::future::join_all(taken.into_iter().map(Lease::release)).await;
                    return Err(error);
                }
            }
        }
        Ok(taken)
    }
    .instrument(span)
    .await
}

/// Takes `key` and, all at once, the locks of `also` (on the same node).
async fn acquire_within_wait(
    client: &Arc<ClientInner>,
    key: LockKey,
    also: Vec<LockKey>,
    holder: String,
    opts: &LockOptions,
) -> Result<(Lease, Vec<Lease>), LockError> {
    if opts.fencing && !client.backend.supports_fencing() {
        return Err(LockError::Unsupported {
            key: key.name,
            feature: "fencing tokens (a Redlock cannot keep a counter that only grows when masters fail)"
                .into(),
        });
    }
    if let Some(feature) = client.backend.unsupported(opts.kind) {
        return Err(LockError::Unsupported {
            key: key.name,
            feature: feature.into(),
        });
    }
    // A lease no longer than the backend can vouch for (ZooKeeper: its
    // session timeout); renewals and deadlines follow from it.
    let capped = LockOptions {
        ttl: client.backend.lease_for(opts.ttl),
        ..*opts
    };
    let opts = &capped;
    let started = Instant::now();
    let give_up_at = started + opts.wait;
    let mut pending = DropGuard::new(Pending {
        client: Arc::clone(client),
        key,
        also,
        holder,
        kind: opts.kind,
        in_doubt: false,
    });
    let config = &client.config;
    let mut backoff = config.retry_min;
    let mut attempts = 0u32;
    // The latest attempt that failed for a reason of its own, kept to
    // explain a give-up whose last attempt only ran out of time.
    let mut last_failure: Option<LockError> = None;
    // What the latest attempt that got an answer found in the way (its
    // lease left, and which lock of a set), to explain a give-up whose last
    // attempt only ran out of time.
    let mut last_held: Option<(Option<Duration>, usize)> = None;
    // Subscribed to the release channel of the lock in the way (of a set,
    // the one the last attempt found held) once an attempt finds it held
    // and there is time left to wait.
    let mut watch: Option<(usize, Watch)> = None;
    // A single exclusive lock can be handed to us by a release in this
    // process (`handoff.rs`): our standing offer while we wait, and what a
    // handoff granted (the lease counted from when it was sent, a token).
    let hands_over = opts.kind == Kind::Exclusive && pending.also.is_empty() && client.backend.hands_over();
    let mut offer: Option<OfferHandle> = None;
    let mut handed: Option<Granted> = None;
    // Handoffs in a row that brought the lock to us (0: taken from the server).
    let mut handed_in_row;
    // Others here already wait for this lock with offers standing: it is
    // held, and will be handed on or announced. Join them without a first
    // attempt, which could only find it held and would cost the server and
    // this client a call per newcomer. A lock that freed unannounced (its
    // lease ran out) is found by the waiters that were told its remaining
    // lease, and by us after at most `POLL`.
    if hands_over
        && !opts.wait.is_zero()
        && client.notifier.has_offers(&pending.key.channel)
        && !client.guards.held_by_this_task(&pending.key)
    {
        let watching = client.notifier.watch(&pending.key.channel).await;
        let released = Arc::clone(&watching.notify);
        let released = released.notified();
        let mut released = std::pin::pin!(released);
        released.as_mut().enable();
        offer = client
            .notifier
            .offer(&pending.key.channel, &pending.holder, opts.ttl, opts.fencing);
        watch = Some((0, watching));
        handed = wait_for_turn(&mut offer, released, opts.wait.min(POLL), &mut pending.in_doubt).await;
    }

    loop {
        attempts += 1;
        // Registered before the attempt, so that a release between its reply
        // and our sleep still wakes us.
        let released = watch.as_ref().map(|(_, w)| w.notify.clone());
        let released = released.as_deref().map(Notify::notified);
        let mut released = std::pin::pin!(released);
        if let Some(r) = released.as_mut().as_pin_mut() {
            r.enable();
        }
        let doubt_before = pending.in_doubt;
        let (sent, attempt) = match handed.take() {
            Some(granted) => {
                handed_in_row = granted.in_row;
                (granted.sent, Ok(AcquireReply::acquired(granted.token)))
            }
            None => {
                handed_in_row = 0;
                // In doubt from the moment the request may be on the wire: if the
                // caller drops us now, the drop guard gives back what it may have
                // taken.
                pending.in_doubt = true;
                let sent = Instant::now();
                let request = AcquireRequest {
                    key: &pending.key,
                    holder: &pending.holder,
                    kind: opts.kind,
                    also: &pending.also,
                    ttl: opts.ttl,
                    waiter_timeout: config.fair_waiter_timeout,
                    fencing: opts.fencing,
                    first: attempts == 1,
                    waiting: sent < give_up_at,
                    renew: opts.renew,
                };
                // Later attempts get what is left of `wait` (but at least a floor a
                // healthy round trip fits in), so a stalled server cannot carry the
                // call a whole command timeout past the wait the caller asked for.
                let budget = if attempts == 1 {
                    config.command_timeout
                } else {
                    config
                        .command_timeout
                        .min(give_up_at.saturating_duration_since(sent).max(LATE_ATTEMPT_FLOOR))
                };
                let attempt = match tokio::time::timeout(budget, client.backend.acquire(&request)).await {
                    Ok(attempt) => attempt,
                    // Cut short by what was left of `wait`: that says nothing about
                    // the server, so an earlier attempt's failure (a Redlock's
                    // per-master causes, say) is the better account.
                    Err(_) if budget < config.command_timeout => match (last_failure.take(), last_held) {
                        (Some(error), _) => Err(Failure {
                            error,
                            transient: true,
                            reconnecting: false,
                        }),
                        // The lock was held at the last look, and the look after it
                        // ran out of wait: the caller waited the whole `wait` for a
                        // held lock. Still in doubt: the cut attempt may have been
                        // applied, so it counts as a claim to give back.
                        (None, Some((pttl, blocked_by))) => Ok(AcquireReply::Held {
                            pttl,
                            claimed: true,
                            blocked_by,
                        }),
                        (None, None) => Err(client.timed_out(&pending.key, "acquire", budget)),
                    },
                    Err(_) => Err(client.timed_out(&pending.key, "acquire", budget)),
                };
                (sent, attempt)
            }
        };

        let mut sleep_cap = None;
        let mut blocker = 0;
        let mut retry_now = false;
        let outcome = match attempt {
            Ok(AcquireReply::Acquired { token, segment }) => {
                // A handoff to us may be under way: the lock it hands over
                // is this one (the same holder id), so it is ours either way.
                if let Some(offer) = offer.take() {
                    handed_in_row = handed_in_row.max(offer.settle().await);
                }
                let cutoff = validity_deadline(sent, opts.ttl) - stop_margin(opts.ttl);
                let granted = Instant::now();
                if granted < cutoff {
                    let waited = granted - started;
                    // Handed over to the lease: nothing is left in doubt.
                    let Pending {
                        key,
                        also,
                        holder,
                        kind,
                        ..
                    } = pending.into_inner();
                    tracing::debug!(key = %key.name, waited_ms = millis(waited), attempts, segment, "lock acquired");
                    let lease = |key: LockKey, holder: String, token: Option<u64>| {
                        let grant = Grant {
                            key,
                            holder,
                            kind,
                            token,
                            segment,
                            name: opts.name,
                            waited,
                            handed_in_row,
                        };
                        let state = Arc::new(LeaseState::new(grant, opts.ttl, opts.renew, sent));
                        if opts.renew {
                            client.watchdog.watch(&state);
                        }
                        Lease::new(Arc::clone(client), state)
                    };
                    // The set's other locks share the holder id; the first
                    // takes the original, so a single lock copies nothing.
                    let more = also
                        .into_iter()
                        .map(|key| lease(key, holder.clone(), None))
                        .collect();
                    let key = match segment {
                        Some(i) => key.segment(i),
                        None => key,
                    };
                    return Ok((lease(key, holder, token), more));
                }
                // The reply came back after the lease could already have
                // expired on the server, so the lock is useless: give it back
                // before the next attempt, which reuses this holder id and
                // would otherwise find the lock "already mine".
                pending.settle().await;
                Outcome::Failed(LockError::backend(
                    &client.node,
                    Some(&pending.key.name),
                    format!(
                        "the server granted the lock after {}ms, past the {}ms lease; retrying",
                        millis(sent.elapsed()),
                        millis(opts.ttl)
                    ),
                ))
            }
            Ok(AcquireReply::Held {
                pttl,
                claimed,
                blocked_by,
            }) => {
                blocker = blocked_by;
                last_held = Some((pttl, blocked_by));
                // Attempts are applied in the order sent, and a later one would
                // have found an earlier success ("already mine"): so no attempt
                // holds the lock. A writer's claim is withdrawn like a lock
                // if we stop waiting.
                pending.in_doubt = claimed;
                sleep_cap = pttl;
                Outcome::Held {
                    no_expiry: pttl.is_none(),
                }
            }
            Err(failure) if failure.transient => {
                // A first attempt that met a broken connection is not a real
                // try: the client reconnects on that error, so try again now.
                retry_now = attempts == 1 && failure.reconnecting;
                Outcome::Failed(failure.error)
            }
            Err(failure) => {
                // Refused outright (a foreign value, a bad argument): this
                // attempt wrote nothing, but an earlier one may have, in which
                // case Drop gives it back.
                pending.in_doubt = doubt_before;
                tracing::debug!(key = %pending.key.name, error = %failure.error, "lock not acquired");
                return Err(failure.error);
            }
        };

        let now = Instant::now();
        if now >= give_up_at && !retry_now {
            // Anything still in doubt is given back by Drop from a spawned
            // task: its release is queued behind our attempts on the same
            // connection, and waiting for it would overrun `wait`.
            let error = match outcome {
                Outcome::Held { no_expiry } => LockError::Timeout {
                    key: pending.lock(blocker).name.clone(),
                    wait: opts.wait,
                    no_expiry,
                },
                Outcome::Failed(error) => error,
            };
            tracing::debug!(key = %pending.key.name, waited_ms = millis(now - started), error = %error, "lock not acquired");
            return Err(error);
        }

        let held = match outcome {
            Outcome::Held { .. } => true,
            Outcome::Failed(error) => {
                last_failure = Some(error);
                false
            }
        };
        if retry_now {
            continue;
        }
        // About to wait: not for a guard this very task holds, which would
        // never be released while it waits.
        if held && watch.is_none() && client.guards.held_by_this_task(pending.lock(blocker)) {
            return Err(LockError::WouldDeadlock {
                key: pending.lock(blocker).name.clone(),
            });
        }
        let mut pause = give_up_at.saturating_duration_since(now);
        if let Some(pttl) = sleep_cap {
            pause = pause.min(pttl.max(Duration::from_millis(1)));
        }
        if held && client.backend.queues_waiters() {
            // In line: the backend watches the one ahead of us alone, so a
            // release wakes one waiter, whichever process it is in.
            tokio::select! {
                () = client.backend.turn(pending.lock(blocker), &pending.holder) => {}
                () = tokio::time::sleep(pause) => {}
            }
            continue;
        }
        if held && watch.as_ref().is_none_or(|(watched, _)| *watched != blocker) {
            let channel = &pending.lock(blocker).channel;
            // A fair waiter is woken by name, when it is first in line.
            let watching = match opts.kind {
                Kind::Fair => client.notifier.watch_as(channel, &pending.holder).await,
                _ => client.notifier.watch(channel).await,
            };
            watch = Some((blocker, watching));
            // Offered before the look below, so that a release here after
            // it hands the lock to us.
            if hands_over {
                offer = client
                    .notifier
                    .offer(channel, &pending.holder, opts.ttl, opts.fencing);
            }
            // The release may have come while we subscribed: look again now.
            continue;
        }
        match released.as_pin_mut() {
            // Subscribed: a release wakes us; the poll only covers lost
            // messages.
            Some(released) => {
                // Without announcements from other processes, the poll is
                // how their releases are seen: jittered, so that waiters
                // that started together do not query in lockstep.
                let poll = if client.backend.polls_for_releases() {
                    jitter(config.poll_interval)
                } else {
                    POLL
                };
                let poll = pause.min(poll);
                if hands_over && offer.is_none() {
                    let channel = &pending.lock(blocker).channel;
                    offer = client
                        .notifier
                        .offer(channel, &pending.holder, opts.ttl, opts.fencing);
                }
                handed = wait_for_turn(&mut offer, released, poll, &mut pending.in_doubt).await;
            }
            None => {
                tokio::time::sleep(jitter(backoff).min(pause)).await;
                backoff = (backoff * 2).min(config.retry_max);
            }
        }
    }
}

/// Waits for a release here to hand us the lock (through `offer`), for a
/// release announcement (`released`), or for `poll`, whichever comes
/// first. A release that took the offer leaves the lock, if any, ours to
/// give back (`in_doubt`): our next attempt or the acquisition's drop guard
/// does. Returns what a handoff granted.
async fn wait_for_turn(
    offer: &mut Option<OfferHandle>,
    released: impl Future<Output = ()>,
    poll: Duration,
    in_doubt: &mut bool,
) -> Option<Granted> {
    let handoff = async {
        match offer.as_mut() {
            Some(offer) => (&mut offer.rx).await,
            None => std::future::pending().await,
        }
    };
    let told = tokio::select! {
        told = handoff => told,
        () = released => return None,
        () = tokio::time::sleep(poll) => return None,
    };
    // Taken: handed, maybe handed (its call got no answer), or not (the
    // giver no longer had the lock).
    *offer = None;
    let mut told = told.ok()?;
    told.claim.disarm();
    *in_doubt = true;
    told.granted
}

enum Outcome {
    Held { no_expiry: bool },
    Failed(LockError),
}

/// A random pause in `[d/2, d]`, so waiters released together do not retry in
/// lockstep.
fn jitter(d: Duration) -> Duration {
    let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if nanos < 2 {
        return d;
    }
    Duration::from_nanos(rand::rng().random_range(nanos / 2..=nanos))
}

/// An acquisition under way. `in_doubt` is set once an attempt may have been
/// applied without our seeing the reply; an acquisition that ends that way
/// gives the lock back, and one that is dropped mid-flight does so from its
/// drop guard.
#[derive(Debug)]
struct Pending {
    client: Arc<ClientInner>,
    key: LockKey,
    /// The other locks of a set, taken with `key`.
    also: Vec<LockKey>,
    holder: String,
    kind: Kind,
    in_doubt: bool,
}

impl Pending {
    /// Lock `i` of the set: 0 is `key`.
    fn lock(&self, i: usize) -> &LockKey {
        match i.checked_sub(1).and_then(|i| self.also.get(i)) {
            Some(other) => other,
            None => &self.key,
        }
    }

    /// Gives back a lock an attempt may hold, before the next attempt is sent.
    async fn settle(&mut self) {
        if !self.in_doubt {
            return;
        }
        if let Ok(Ok(())) = tokio::time::timeout(self.client.config.command_timeout, self.give_back()).await {
            self.in_doubt = false;
        }
        // Otherwise still unanswered: the drop guard retries it in the
        // background.
    }

    /// Releases whatever an attempt may have taken: for a segmented lock,
    /// any of its segments.
    async fn give_back(&self) -> Result<(), LockError> {
        let backend = &self.client.backend;
        let released = match self.kind {
            Kind::Segments(n) => backend.release_segments(&self.key, n, &self.holder).await,
            _ if !self.also.is_empty() => {
                let set: Vec<LockKey> = std::iter::once(&self.key).chain(&self.also).cloned().collect();
                backend.release_many(&set, &self.holder).await
            }
            _ => backend.release(&self.key, &self.holder).await,
        };
        released.map(drop).map_err(LockError::from)
    }
}

impl Cleanup for Pending {
    fn needed(&mut self) -> bool {
        self.in_doubt
    }

    async fn run(&self) -> Result<(), LockError> {
        self.give_back().await
    }

    fn describe(&self) -> String {
        format!(
            "giving back lock `{}` after an abandoned acquisition",
            self.key.name
        )
    }
}
