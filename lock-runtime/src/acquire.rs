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
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{Notify, oneshot};
use tracing::Instrument;

use crate::backend::{AcquireReply, AcquireRequest, Backend, Failure};
use crate::drop_guard::{Cleanup, DropGuard};
use crate::error::LockError;
use crate::handoff::{Granted, Handed, OfferHandle};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease_state::{Grant, LeaseState};
use crate::shared::{ClientInner, RECONNECTS_AT_ONCE};
use crate::spec::{Kind, LockOptions};
use crate::timing::{hold_end, millis, stop_margin, validity_deadline};
use crate::waiter::{POLL, Watch};

/// The shortest time a retry is given to answer, even with less of `wait` left.
const LATE_ATTEMPT_FLOOR: Duration = Duration::from_millis(10);

pub(crate) async fn acquire(
    client: &Arc<ClientInner>,
    key: LockKey,
    opts: &LockOptions,
) -> Result<Lease, LockError> {
    let holder = client.entropy.holder_id(opts.kind);
    let span = tracing::debug_span!(
        "lock_acquire",
        lock = opts.name,
        key = %key.name,
        holder = %holder,
        ttl_ms = millis(opts.ttl),
        wait_ms = millis(opts.wait)
    );
    let run = start(client, key, Vec::new(), holder, opts)?;
    let (lease, _) = acquire_within_wait(run).instrument(span).await?;
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
    let holder = client.entropy.holder_id(opts.kind);
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
            let acquired = match start(client, first, group.collect(), holder.clone(), &within) {
                Ok(run) => acquire_within_wait(run).await,
                Err(error) => Err(error),
            };
            match acquired {
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
///
/// One acquisition is a small state machine: it attempts (or takes what a
/// handoff granted), and the answer names what comes next ([`Next`]): the
/// lease, giving up, another attempt at once, subscribing to the lock in the
/// way, waiting in line, or waiting for a release (or a handoff, or the
/// poll), or backing off when nothing can wake it. Each transition is made
/// in one place, [`Acquisition::decide`].
///
/// `opts.ttl` is already no longer than the backend can vouch for
/// (`entry.rs` caps it with `AnyBackend::lease_for`).
async fn acquire_within_wait(mut run: Box<Acquisition<'_>>) -> Result<(Lease, Vec<Lease>), LockError> {
    // Boxed, as subscribing below: what a subscription awaits is larger
    // than the rest of the acquisition together (3.7 KB), and held inline
    // it made every acquisition's future that large, copied into its box
    // and allocated outside the allocator's small-block caches, for a step
    // an uncontended lock never takes.
    if run.others_wait_here() {
        Box::pin(run.join_the_waiters_here()).await;
    }
    loop {
        // Registered before the attempt, so that a release between its
        // reply and our sleep still wakes us.
        let released = run.watch.as_ref().map(|(_, w)| Arc::clone(&w.notify));
        let released = released.as_deref().map(Notify::notified);
        let mut released = std::pin::pin!(released);
        if let Some(r) = released.as_mut().as_pin_mut() {
            r.enable();
        }
        let (sent, answer) = run.attempt().await;
        match run.decide(sent, answer).await? {
            Next::Granted {
                granted,
                token,
                segment,
            } => return Ok(run.grant(sent, granted, token, segment)),
            Next::Attempt => {}
            Next::Subscribe { blocker } => Box::pin(run.subscribe(blocker)).await,
            Next::WaitInLine { blocker, pause } => run.wait_in_line(blocker, pause).await,
            Next::WaitForRelease { blocker, pause } => match released.as_pin_mut() {
                Some(released) => run.wait_for_release(released, blocker, pause).await,
                None => run.back_off(pause).await,
            },
        }
    }
}

/// An acquisition of `key` (and `also`) for `holder`, checked before any
/// I/O. Boxed, like the state machine that drives it
/// ([`acquire_within_wait`]) is by its caller, and apart from it: together
/// they are past 1 KB, which glibc serves outside its small-block cache by
/// a slow path (about 500 of an in-process pair's 7,500 instructions).
/// Built here rather than in the state machine, whose arguments would keep
/// their slots in its future after being moved into it.
fn start<'a>(
    client: &'a Arc<ClientInner>,
    key: LockKey,
    also: Vec<LockKey>,
    holder: String,
    opts: &'a LockOptions,
) -> Result<Box<Acquisition<'a>>, LockError> {
    refuse_unsupported(client, &key, opts)?;
    Ok(Box::new(Acquisition::new(client, key, also, holder, opts)))
}

/// A kind this backend cannot take, or fencing it cannot keep: refused
/// before any I/O.
fn refuse_unsupported(client: &ClientInner, key: &LockKey, opts: &LockOptions) -> Result<(), LockError> {
    if opts.fencing && !client.backend.supports_fencing() {
        return Err(LockError::Unsupported {
            key: key.name.clone(),
            feature: "fencing tokens (a Redlock cannot keep a counter that only grows when masters fail)"
                .into(),
        });
    }
    if let Some(feature) = client.backend.unsupported(opts.kind) {
        return Err(LockError::Unsupported {
            key: key.name.clone(),
            feature: feature.into(),
        });
    }
    if opts.hold_at_least.is_some()
        && let Some(feature) = client.backend.cannot_hold()
    {
        return Err(LockError::Unsupported {
            key: key.name.clone(),
            feature: feature.into(),
        });
    }
    Ok(())
}

/// What an acquisition does after an attempt's answer.
enum Next {
    /// The lock is ours (the answer came at `granted`): make the leases.
    Granted {
        granted: Instant,
        token: Option<u64>,
        segment: Option<u32>,
    },
    /// Attempt again at once.
    Attempt,
    /// Subscribe to the release channel of lock `blocker` (of a set), then
    /// look again: a release may have come while we subscribed.
    Subscribe { blocker: usize },
    /// In the backend's queue: wait for the one ahead to go, at most `pause`.
    WaitInLine { blocker: usize, pause: Duration },
    /// Wait at most `pause` for lock `blocker`'s release (or a handoff, or
    /// the poll); without a subscription, back off instead.
    WaitForRelease { blocker: usize, pause: Duration },
}

/// One acquisition between its attempts: what the state machine carries
/// from one step to the next.
struct Acquisition<'a> {
    client: &'a Arc<ClientInner>,
    opts: &'a LockOptions,
    started: Instant,
    give_up_at: Instant,
    pending: DropGuard<Pending>,
    backoff: Duration,
    attempts: u32,
    /// Attempts in a row, from the first, that met a broken connection.
    reconnects_in_row: u32,
    /// Whether the acquisition was in doubt before the latest attempt.
    doubt_before: bool,
    /// The latest attempt that failed for a reason of its own, kept to
    /// explain a give-up whose last attempt only ran out of time.
    last_failure: Option<LockError>,
    /// What the latest attempt that got an answer found in the way (its
    /// lease left, and which lock of a set), for the same purpose.
    last_held: Option<(Option<Duration>, usize)>,
    /// Subscribed to the release channel of the lock in the way (of a set,
    /// the one the last attempt found held) once an attempt finds it held
    /// and there is time left to wait.
    watch: Option<(usize, Watch)>,
    /// A single exclusive lock can be handed to us by a release in this
    /// process (`handoff.rs`): our standing offer while we wait, and what a
    /// handoff granted (the lease counted from when it was sent, a token).
    hands_over: bool,
    offer: Option<OfferHandle>,
    handed: Option<Granted>,
    /// Handoffs in a row that brought the lock to us (0: taken from the
    /// server).
    handed_in_row: u32,
}

impl<'a> Acquisition<'a> {
    /// Whether every attempt before the current one met a broken connection
    /// (true for the first): the current one is still the first real try.
    fn only_broken_connections_before(&self) -> bool {
        self.attempts == self.reconnects_in_row + 1
    }

    fn new(
        client: &'a Arc<ClientInner>,
        key: LockKey,
        also: Vec<LockKey>,
        holder: String,
        opts: &'a LockOptions,
    ) -> Self {
        let started = Instant::now();
        let hands_over = opts.kind == Kind::Exclusive && also.is_empty() && client.backend.hands_over();
        Acquisition {
            client,
            opts,
            started,
            give_up_at: started + opts.wait,
            pending: DropGuard::new(Pending {
                client: Arc::clone(client),
                key,
                also,
                holder,
                kind: opts.kind,
                in_doubt: false,
            }),
            backoff: client.config.retry_min,
            attempts: 0,
            reconnects_in_row: 0,
            doubt_before: false,
            last_failure: None,
            last_held: None,
            watch: None,
            hands_over,
            offer: None,
            handed: None,
            handed_in_row: 0,
        }
    }

    /// Others here already wait for this lock with offers standing: it is
    /// held, and will be handed on or announced. Join them without a first
    /// attempt, which could only find it held and would cost the server and
    /// this client a call per newcomer. A lock that freed unannounced (its
    /// lease ran out) is found by the waiters that were told its remaining
    /// lease, and by us after at most `POLL`.
    fn others_wait_here(&self) -> bool {
        let (client, opts) = (self.client, self.opts);
        self.hands_over
            && !opts.wait.is_zero()
            && client.notifier.has_offers(&self.pending.key.channel)
            && !client.guards.held_by_this_task(&self.pending.key)
    }

    /// What is left of `wait`.
    fn left_to_wait(&self) -> Duration {
        self.give_up_at.saturating_duration_since(Instant::now())
    }

    /// Joins the waiters [`Self::others_wait_here`] found.
    async fn join_the_waiters_here(&mut self) {
        let (client, opts) = (self.client, self.opts);
        let watching = client
            .notifier
            .watch(&self.pending.key.channel, self.left_to_wait())
            .await;
        let released = Arc::clone(&watching.notify);
        let released = released.notified();
        let mut released = std::pin::pin!(released);
        released.as_mut().enable();
        self.offer = client.notifier.offer(
            &self.pending.key.channel,
            &self.pending.holder,
            client.backend.granted_lease(opts),
            opts.fencing,
        );
        self.watch = Some((0, watching));
        self.handed = wait_for_turn(
            &mut self.offer,
            released,
            opts.wait.min(POLL),
            &mut self.pending.in_doubt,
        )
        .await;
    }

    /// One attempt: what a handoff granted, or a request to the backend
    /// within what is left of `wait`. Returns when it was sent (the lease
    /// counts from then) and the answer.
    async fn attempt(&mut self) -> (Instant, Result<AcquireReply, Failure>) {
        // A handoff in parts (a Redlock's, one call per master) must not
        // meet an attempt of ours: the attempt could find it half done and,
        // winning no majority, give back what it found ours, which is part
        // of the lock being handed to us. So the offer is withdrawn first
        // (a later wait offers again), or, if a release took it already,
        // its word is awaited (the giver's call, bounded by its timeout).
        if self.handed.is_none() && self.client.backend.hands_over_in_parts() {
            if self.offer.as_ref().is_some_and(|offer| !offer.withdraw()) {
                self.handed = hear_from_the_giver(&mut self.offer, &mut self.pending.in_doubt).await;
            }
            self.offer = None;
        }
        self.attempts += 1;
        self.doubt_before = self.pending.in_doubt;
        if let Some(granted) = self.handed.take() {
            self.handed_in_row = granted.in_row;
            return (granted.sent, Ok(AcquireReply::acquired(granted.token)));
        }
        self.handed_in_row = 0;
        let (client, opts) = (self.client, self.opts);
        let config = &client.config;
        // In doubt from the moment the request may be on the wire: if the
        // caller drops us now, the drop guard gives back what it may have
        // taken.
        self.pending.in_doubt = true;
        // The first attempt goes out with nothing awaited since the
        // acquisition started (unless it joined waiters): that reading is
        // early enough to count the lease from, and saves a clock read.
        let sent = if self.attempts == 1 && self.watch.is_none() {
            self.started
        } else {
            Instant::now()
        };
        let request = AcquireRequest {
            key: &self.pending.key,
            holder: &self.pending.holder,
            kind: opts.kind,
            also: &self.pending.also,
            ttl: client.backend.granted_lease(opts),
            waiter_timeout: config.fair_waiter_timeout,
            fencing: opts.fencing,
            first: self.attempts == 1,
            waiting: sent < self.give_up_at,
            renew: opts.renew,
        };
        // Later attempts get what is left of `wait` (but at least a floor a
        // healthy round trip fits in), so a stalled server cannot carry the
        // call a whole command timeout past the wait the caller asked for.
        // An attempt that follows only broken connections is still the
        // first real try, and its reconnect needs more than a round trip.
        let budget = if self.only_broken_connections_before() {
            config.command_timeout
        } else {
            config.command_timeout.min(
                self.give_up_at
                    .saturating_duration_since(sent)
                    .max(LATE_ATTEMPT_FLOOR),
            )
        };
        // The in-process backend answers within the call: no timer for it.
        // A backend behind a network is boxed: its future (half a kilobyte
        // for Redis) held inline would set the size of the acquisition's,
        // which is boxed once per call and past 1 KB leaves glibc's
        // small-block cache for its slow path (`start`).
        let answer = match client.backend.acquire_at_once(&request) {
            Some(answer) => Ok(answer),
            None => {
                let deadline = sent + budget;
                tokio::time::timeout_at(deadline, Box::pin(client.backend.acquire(&request))).await
            }
        };
        let answer = match answer {
            Ok(answer) => answer,
            // Cut short by what was left of `wait`: that says nothing about
            // the server, so an earlier attempt's failure (a Redlock's
            // per-master causes, say) is the better account.
            Err(_) if budget < config.command_timeout => match (self.last_failure.take(), self.last_held) {
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
                (None, None) => Err(client.timed_out(&self.pending.key, "acquire", budget)),
            },
            Err(_) => Err(client.timed_out(&self.pending.key, "acquire", budget)),
        };
        (sent, answer)
    }

    /// Every transition after an attempt: granted, given up (the error), or
    /// how to wait for the next attempt.
    async fn decide(
        &mut self,
        sent: Instant,
        answer: Result<AcquireReply, Failure>,
    ) -> Result<Next, LockError> {
        let (client, opts) = (self.client, self.opts);
        let mut sleep_cap = None;
        let mut blocker = 0;
        let mut retry_now = false;
        let outcome = match answer {
            Ok(AcquireReply::Acquired { token, segment }) => {
                // A handoff to us may be under way: the lock it hands over
                // is this one (the same holder id), so it is ours either way.
                if let Some(offer) = self.offer.take() {
                    self.handed_in_row = self.handed_in_row.max(offer.settle().await);
                }
                let cutoff = validity_deadline(sent, opts.ttl) - stop_margin(opts.ttl);
                let granted = Instant::now();
                if granted < cutoff {
                    return Ok(Next::Granted {
                        granted,
                        token,
                        segment,
                    });
                }
                // The reply came back after the lease could already have
                // expired on the server, so the lock is useless: give it back
                // before the next attempt, which reuses this holder id and
                // would otherwise find the lock "already mine". A queue's
                // place is not a lease (ZooKeeper: the child lives as long
                // as the session), so it is kept: the next attempt, sent
                // later, finds it first in line and counts its lease from
                // then. Given back, it would send the caller to the end of
                // the line, and under a slow ensemble every waiter in turn.
                if !client.backend.queues_waiters() {
                    // Boxed: a release's future, held inline, would double
                    // the size of every acquisition's for this rare step.
                    Box::pin(self.pending.settle()).await;
                }
                Outcome::Failed(LockError::backend(
                    &client.node,
                    Some(&self.pending.key.name),
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
                if self.last_held.is_none() {
                    // The first answer that made this call wait: a fair
                    // lock's caller is in its line from here (the fault
                    // suite's checker judges arrival order by it).
                    tracing::debug!(key = %self.pending.key.name, attempts = self.attempts, "waiting for the lock");
                }
                self.last_held = Some((pttl, blocked_by));
                // Attempts are applied in the order sent, and a later one would
                // have found an earlier success ("already mine"): so no attempt
                // holds the lock. A writer's claim is withdrawn like a lock
                // if we stop waiting.
                self.pending.in_doubt = claimed;
                sleep_cap = pttl;
                Outcome::Held {
                    no_expiry: pttl.is_none(),
                }
            }
            Err(failure) if failure.transient => {
                // Said, so that an operator (and the server-death tests)
                // can see what a call that succeeded went through.
                tracing::debug!(key = %self.pending.key.name, error = %failure.error, "attempt failed; trying again within the wait");
                // A first attempt that met a broken connection is not a real
                // try: the client reconnects on that error, so try again now
                // (a few times: see `RECONNECTS_AT_ONCE`).
                if failure.reconnecting && self.only_broken_connections_before() {
                    self.reconnects_in_row += 1;
                    retry_now = self.reconnects_in_row < RECONNECTS_AT_ONCE;
                }
                Outcome::Failed(failure.error)
            }
            Err(failure) => {
                // Refused outright (a foreign value, a bad argument): this
                // attempt wrote nothing, but an earlier one may have, in which
                // case Drop gives it back.
                self.pending.in_doubt = self.doubt_before;
                tracing::debug!(key = %self.pending.key.name, error = %failure.error, "lock not acquired");
                return Err(failure.error);
            }
        };

        let now = Instant::now();
        let giving_up = now >= self.give_up_at && !retry_now;
        // About to wait, or to skip: not for a guard this very task holds.
        // A wait would never end (the guard is not released while it
        // waits); a skip would hide the mistake on every run.
        if matches!(outcome, Outcome::Held { .. })
            && (!giving_up || opts.skip)
            && self.watch.is_none()
            && client.guards.held_by_this_task(self.pending.lock(blocker))
        {
            return Err(LockError::WouldDeadlock {
                key: self.pending.lock(blocker).name.clone(),
            });
        }
        if giving_up {
            // Anything still in doubt is given back by Drop from a spawned
            // task: its release is queued behind our attempts on the same
            // connection, and waiting for it would overrun `wait`.
            let error = match outcome {
                Outcome::Held { no_expiry } => LockError::Timeout {
                    key: self.pending.lock(blocker).name.clone(),
                    wait: opts.wait,
                    no_expiry,
                },
                Outcome::Failed(error) => error,
            };
            tracing::debug!(key = %self.pending.key.name, waited_ms = millis(now - self.started), error = %error, "lock not acquired");
            return Err(error);
        }
        let held = match outcome {
            Outcome::Held { .. } => true,
            Outcome::Failed(error) => {
                self.last_failure = Some(error);
                false
            }
        };
        if retry_now {
            return Ok(Next::Attempt);
        }
        let mut pause = self.give_up_at.saturating_duration_since(now);
        if let Some(pttl) = sleep_cap {
            pause = pause.min(pttl.max(Duration::from_millis(1)));
        }
        Ok(if held && client.backend.queues_waiters() {
            Next::WaitInLine { blocker, pause }
        } else if held && self.watch.as_ref().is_none_or(|(watched, _)| *watched != blocker) {
            Next::Subscribe { blocker }
        } else if client
            .notifier
            .missed_release(&self.pending.lock(blocker).channel, sent)
        {
            // Refused by a release still on its way to some masters.
            Next::Attempt
        } else {
            Next::WaitForRelease { blocker, pause }
        })
    }

    /// The leases of a granted acquisition: nothing is left in doubt. Takes
    /// the box, so that only the fields it needs leave it (moving the
    /// state out first copied all of it, 480 bytes).
    fn grant(
        self: Box<Self>,
        sent: Instant,
        granted: Instant,
        token: Option<u64>,
        segment: Option<u32>,
    ) -> (Lease, Vec<Lease>) {
        let (client, opts) = (self.client, self.opts);
        // The clock read that judged the grant in time: no second read.
        let waited = granted - self.started;
        let (attempts, handed_in_row) = (self.attempts, self.handed_in_row);
        let Pending {
            key,
            also,
            holder,
            kind,
            ..
        } = self.pending.into_inner();
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
                hold_ends: opts.hold_at_least.map(|hold| hold_end(granted, hold)),
            };
            let state = Arc::new(LeaseState::new(grant, opts.ttl, opts.renew, sent));
            if opts.renew {
                client.watchdog.watch(&state);
            }
            Lease::new(Arc::clone(client), state)
        };
        // The set's other locks share the holder id; the first takes the
        // original, so a single lock copies nothing (and skips collecting
        // an empty list, 70 instructions of an in-process pair).
        let more = if also.is_empty() {
            Vec::new()
        } else {
            also.into_iter()
                .map(|key| lease(key, holder.clone(), None))
                .collect()
        };
        let key = match segment {
            Some(i) => key.segment(i),
            None => key,
        };
        (lease(key, holder, token), more)
    }

    /// Subscribes to lock `blocker`'s releases; a fair waiter is woken by
    /// name, when it is first in line.
    async fn subscribe(&mut self, blocker: usize) {
        let (client, opts) = (self.client, self.opts);
        let channel = &self.pending.lock(blocker).channel;
        let watching = match opts.kind {
            Kind::Fair => {
                client
                    .notifier
                    .watch_as(channel, &self.pending.holder, self.left_to_wait())
                    .await
            }
            _ => client.notifier.watch(channel, self.left_to_wait()).await,
        };
        self.watch = Some((blocker, watching));
        // Offered before the look that follows, so that a release here
        // after it hands the lock to us.
        if self.hands_over {
            self.offer = client.notifier.offer(
                channel,
                &self.pending.holder,
                client.backend.granted_lease(opts),
                opts.fencing,
            );
        }
    }

    /// In line: the backend watches the one ahead of us alone, so a release
    /// wakes one waiter, whichever process it is in.
    async fn wait_in_line(&self, blocker: usize, pause: Duration) {
        tokio::select! {
            biased;
            () = self.client.backend.turn(self.pending.lock(blocker), &self.pending.holder) => {}
            () = tokio::time::sleep(pause) => {}
        }
    }

    /// Subscribed: a release (or a handoff) wakes us; the poll only covers
    /// lost messages.
    async fn wait_for_release(
        &mut self,
        released: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        blocker: usize,
        pause: Duration,
    ) {
        let (client, opts) = (self.client, self.opts);
        // Without announcements from other processes, the poll is how their
        // releases are seen: jittered, so that waiters that started together
        // do not query in lockstep.
        let poll = if client.backend.polls_for_releases() {
            client.entropy.jitter(client.config.poll_interval)
        } else {
            POLL
        };
        let poll = pause.min(poll);
        if self.hands_over && self.offer.is_none() {
            let channel = &self.pending.lock(blocker).channel;
            self.offer = client.notifier.offer(
                channel,
                &self.pending.holder,
                client.backend.granted_lease(opts),
                opts.fencing,
            );
        }
        self.handed = wait_for_turn(&mut self.offer, released, poll, &mut self.pending.in_doubt).await;
    }

    /// Nothing can wake us (no subscription): a growing, jittered pause.
    async fn back_off(&mut self, pause: Duration) {
        tokio::time::sleep(self.client.entropy.jitter(self.backoff).min(pause)).await;
        self.backoff = (self.backoff * 2).min(self.client.config.retry_max);
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
        biased;
        told = handoff => told,
        () = released => return None,
        () = tokio::time::sleep(poll) => return None,
    };
    taken_over(offer, told, in_doubt)
}

/// How the handoff of the release that took `offer` went, once it went.
async fn hear_from_the_giver(offer: &mut Option<OfferHandle>, in_doubt: &mut bool) -> Option<Granted> {
    let told = (&mut offer.as_mut()?.rx).await;
    taken_over(offer, told, in_doubt)
}

/// A release took `offer`, and `told` us: handed, maybe handed (its call
/// got no answer), or not (the giver no longer had the lock).
fn taken_over(
    offer: &mut Option<OfferHandle>,
    told: Result<Handed, oneshot::error::RecvError>,
    in_doubt: &mut bool,
) -> Option<Granted> {
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
