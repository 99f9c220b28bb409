//! Leader election (DESIGN §15): one replica leads, the others stand by and
//! can read who leads.
//!
//! An election is an exclusive, fenced lock on a key of its own
//! (`LockKey::election`, which no lock name renders to), taken through the
//! lock's one entry path (`entry::enter_key`). So a leader gets what every
//! holder gets: a lease the watchdog renews, the lost signal before its
//! validity deadline (before another candidate can be granted the lock),
//! and a fencing token, which is the term's epoch. What the election adds
//! is the record of who leads with what value, written by the leader under
//! an owner check (`AnyBackend::proclaim`) and read by followers
//! (`AnyBackend::leader`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{LeaderChange, LeaderRecord};
use crate::entry::{self, Entered};
use crate::error::{LockError, LostReason};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;
use crate::spec::LockSpec;

/// The longest value a leader may proclaim: an address or a small document,
/// read by every follower on every look.
pub(crate) const MAX_VALUE_BYTES: usize = 64 * 1024;

/// An election among the replicas of a service, by name. Owned and cheap to
/// clone: keep it in a service's state or move it into a task.
///
/// ```no_run
/// # async fn demo(client: lock_runtime::LockClient) -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
///
/// let election = client.election("scheduler").ttl(Duration::from_secs(10));
/// let leadership = election.campaign("10.0.0.7:8080").await?;
/// // Lead until the term is lost (or `resign`): `epoch` fences the work.
/// let epoch = leadership.epoch();
/// let reason = leadership.lost().await;
/// # let _ = (epoch, reason);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: Arc<ClientInner>,
    name: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    /// How this election's observers fare (`is_observing`); shared by its
    /// clones.
    observing: Arc<Observers>,
}

/// Who leads an election, as its store has it ([`Election::leader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's holder id: unique to its term.
    pub id: String,
    /// What the leader proclaimed (an address, say). Empty in the one
    /// round trip between its election and its first proclamation.
    pub value: String,
    /// The term's epoch: greater for every new term.
    pub epoch: u64,
}

impl Election {
    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Election {
            client,
            name,
            ttl: None,
            wait: None,
            observing: Arc::default(),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The leader's lease (the client's `default_ttl` if not set): renewed
    /// while it leads. A leader that stops renewing (a crash, a cut link)
    /// is succeeded within about this long on Redis, the SQL stores and in
    /// process; on ZooKeeper within the session timeout, on etcd within
    /// the client's etcd lease (a term's lease is capped by them, as a
    /// lock's is).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long [`campaign`](Self::campaign) waits to be elected before it
    /// fails with [`LockError::Timeout`]; without it, a campaign waits until
    /// it is elected.
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    fn key(&self) -> Result<LockKey, LockError> {
        LockKey::election(&self.client.config.prefix, &self.name)
    }

    fn spec(&self) -> LockSpec {
        let spec = LockSpec::DEFAULT
            .fencing(true)
            .wait(self.wait.unwrap_or(Duration::MAX))
            .name("election");
        match self.ttl {
            Some(ttl) => spec.ttl(ttl),
            None => spec,
        }
    }

    /// Waits until this candidate is elected, then proclaims `value` as
    /// what it leads with. The term lasts until the [`Leadership`] is
    /// resigned or dropped, or its lease is lost.
    ///
    /// Fails with `Unsupported` on a Redlock (no epochs), `InvalidRequest`
    /// for a value over 64 KiB, `Timeout` past [`wait`](Self::wait).
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership, LockError> {
        let value = value.into();
        let key = self.key()?;
        self.refuse(&key, &value)?;
        let lease = match entry::enter_key(&self.client, key, &self.spec()).await? {
            Entered::Acquired(lease) => lease,
            // Unreachable: no body is ever scoped to an election's key.
            Entered::Reentered(held) => {
                return Err(LockError::InvalidRequest {
                    key: held.key.name.clone(),
                    reason: "this code already leads the election".into(),
                });
            }
        };
        self.client.guards.mark(lease.state());
        let leadership = Leadership {
            client: Arc::clone(&self.client),
            election: self.name.clone(),
            value: String::new(),
            lease,
        };
        self.proclaimed(leadership, value).await
    }

    /// The first proclamation of a new term. A leader elected but not
    /// recorded would be read with an empty value, so a failure here gives
    /// the term back rather than lead unannounced.
    async fn proclaimed(&self, mut leadership: Leadership, value: String) -> Result<Leadership, LockError> {
        if !self.client.backend.keeps_leaders() {
            leadership.value = value;
            return Ok(leadership);
        }
        match leadership.proclaim(value).await {
            Ok(()) => Ok(leadership),
            Err(error) => {
                if let Err(e) = leadership.resign().await {
                    tracing::debug!(election = %self.name, error = %e, "resigning an unrecorded term failed");
                }
                Err(error)
            }
        }
    }

    /// Why a campaign cannot start: a Redlock, a value too long.
    fn refuse(&self, key: &LockKey, value: &str) -> Result<(), LockError> {
        if let Some(feature) = self.client.backend.cannot_elect() {
            return Err(LockError::Unsupported {
                key: key.name.clone(),
                feature: feature.to_owned(),
            });
        }
        check_value(key, value)
    }

    /// Who leads now, as the store has it: `None` when nobody does
    /// (resigned, expired, never elected).
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        let key = self.key()?;
        Ok(read(&self.client, &key).await?.map(Leader::from))
    }

    /// Follows who leads: the receiver holds the latest [`leader`](Self::leader)
    /// and changes when it does. Returns after its first read (its error,
    /// if that fails); the following reads run in a task of their own
    /// until every receiver is dropped.
    ///
    /// - The value never goes back to an older term: a read that finds a
    ///   lower epoch than one already seen is not passed on.
    /// - `None` only when the store says nobody leads (resigned, crashed,
    ///   expired). An observer that cannot reach the store keeps its last
    ///   value, and [`is_observing`](Self::is_observing) turns false until a
    ///   read succeeds again.
    /// - A release announced by the store (the same announcement that wakes
    ///   waiting candidates: Redis pub/sub, PostgreSQL `LISTEN`) wakes it,
    ///   as does a reconnection of the connection that hears them. On
    ///   ZooKeeper and etcd each read sets a watch on the election's line
    ///   and its leader's value, and any change wakes it. An expiry
    ///   announces nothing: it reads again when the lease it last read runs
    ///   out. Otherwise it reads at least once a second, which is how a new
    ///   leader and a proclaimed value reach it on the other stores
    ///   (neither is announced), and anything announced while it was
    ///   disconnected.
    pub async fn observe(&self) -> Result<watch::Receiver<Option<Leader>>, LockError> {
        let key = self.key()?;
        let watching = self
            .client
            .notifier
            .observe(&key.channel, crate::waiter::POLL)
            .await;
        // Enabled before the first read: an announcement between it and the
        // task's first wait must still end that wait.
        let mut woken = Box::pin(Arc::clone(&watching.notify).notified_owned());
        woken.as_mut().enable();
        let (first, changed) = read_watched(&self.client, &key).await?;
        let (tx, rx) = watch::channel(first.clone().map(Leader::from));
        let mut observer = Observer {
            client: Arc::clone(&self.client),
            health: Arc::clone(&self.observing),
            cut_off: false,
            shown: Shown::default(),
            key,
            tx,
        };
        observer.shown.judge(first.clone(), Instant::now());
        self.observing.live.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(observer.run(watching, first, woken, changed.unwrap_or_else(unwatched)));
        Ok(rx)
    }

    /// Whether this election's observers ([`observe`](Self::observe)) reach
    /// the store: true while at least one observes and none of them failed
    /// its last read. Their receivers meanwhile hold the last value read,
    /// which may be out of date. False before the first observation and
    /// once every receiver of every observation is dropped.
    pub fn is_observing(&self) -> bool {
        self.observing.live.load(Ordering::Acquire) > 0 && self.observing.cut_off.load(Ordering::Acquire) == 0
    }

    /// Campaigns, runs `lead`'s future while leading, and campaigns again,
    /// until this future is dropped:
    ///
    /// - elected, `lead` gets the [`Leadership`] and its future runs;
    /// - the term lost (the lease could not be renewed in time), that future
    ///   is dropped before the lease's validity deadline, when another
    ///   candidate can first be elected;
    /// - the future returns on its own, the term is resigned (the
    ///   `Leadership` it was given is dropped);
    /// - a campaign that failed on the way (the server down, `wait` out) is
    ///   tried again after a pause that doubles, up to the client's
    ///   `retry_backoff` maximum.
    ///
    /// Returns only an error that trying again cannot mend: `Unsupported`,
    /// `InvalidKey`, `InvalidRequest`, `InvalidConfig`.
    pub async fn run<F, Fut>(&self, value: impl Into<String>, mut lead: F) -> Result<Infallible, LockError>
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = ()> + Send,
    {
        let value = value.into();
        let key = self.key()?;
        self.refuse(&key, &value)?;
        let mut pause = self.client.config.retry_min;
        loop {
            let leadership = match self.campaign(value.clone()).await {
                Ok(leadership) => leadership,
                Err(error) if cannot_mend(&error) => return Err(error),
                Err(error) => {
                    tracing::warn!(election = %self.name, error = %error, "campaign failed; trying again");
                    tokio::time::sleep(self.client.entropy.jitter(pause)).await;
                    pause = (pause * 2).min(self.client.config.retry_max);
                    continue;
                }
            };
            pause = self.client.config.retry_min;
            let state = Arc::clone(leadership.lease.state());
            let epoch = leadership.epoch();
            let term = std::pin::pin!(lead(leadership));
            let lost = std::pin::pin!(state.lost());
            match while_leading(term, &state, lost).await {
                Ok(()) => tracing::debug!(election = %self.name, epoch, "term ended by its leader"),
                Err(reason) => {
                    tracing::warn!(election = %self.name, epoch, %reason, "leadership lost; its work dropped");
                }
            }
            // A future that handed its term to another task and returned:
            // the term is that task's until it ends, and a campaign from
            // here would wait for it (or, from the task that took it, fail
            // with `WouldDeadlock`).
            while state.is_live() {
                tokio::select! {
                    biased;
                    _ = state.lost() => {}
                    () = tokio::time::sleep(TERM_LOOK) => {}
                }
            }
            // A pause between terms, so that a future that returns at once
            // does not cycle through terms as fast as the store answers.
            tokio::time::sleep(self.client.entropy.jitter(self.client.config.retry_min)).await;
        }
    }
}

/// Who leads the election `key`, if anyone: a Redlock refuses.
async fn read(client: &ClientInner, key: &LockKey) -> Result<Option<LeaderRecord>, LockError> {
    elects(client, key)?;
    client.backend.leader(key).await.map_err(|f| f.error)
}

/// [`read`] for an observer, with what tells it of the next change where
/// the store watches (ZooKeeper, etcd).
async fn read_watched(
    client: &ClientInner,
    key: &LockKey,
) -> Result<(Option<LeaderRecord>, Option<LeaderChange>), LockError> {
    elects(client, key)?;
    client.backend.leader_watched(key).await.map_err(|f| f.error)
}

/// `Unsupported` on a backend that holds no elections (a Redlock).
fn elects(client: &ClientInner, key: &LockKey) -> Result<(), LockError> {
    match client.backend.cannot_elect() {
        Some(feature) => Err(LockError::Unsupported {
            key: key.name.clone(),
            feature: feature.to_owned(),
        }),
        None => Ok(()),
    }
}

/// A change that never comes: for a store that does not watch, or after a
/// failed read.
fn unwatched() -> LeaderChange {
    Box::pin(std::future::pending())
}

impl From<LeaderRecord> for Leader {
    fn from(record: LeaderRecord) -> Self {
        Leader {
            id: record.holder,
            value: record.value.unwrap_or_default(),
            epoch: record.epoch,
        }
    }
}

/// The longest an observer goes without reading (`Election::observe`).
const OBSERVE_EVERY: Duration = Duration::from_secs(1);

/// The first pause before an observer reads again after finding nobody
/// leading, or after a failed read; it doubles up to [`OBSERVE_EVERY`]. A
/// release wakes observers at once, often before the next candidate has
/// been granted the lock: the quick second look sees it.
const OBSERVE_SOON: Duration = Duration::from_millis(5);

/// What the store says is left of a lease is rounded down to the
/// millisecond: read a little after it, when the key is surely gone.
const EXPIRY_MARGIN: Duration = Duration::from_millis(2);

/// How an election's observers fare: how many run, and how many of them
/// failed their last read (`Election::is_observing`).
#[derive(Debug, Default)]
struct Observers {
    live: AtomicUsize,
    cut_off: AtomicUsize,
}

/// An election's observer task (`Election::observe`).
struct Observer {
    client: Arc<ClientInner>,
    health: Arc<Observers>,
    /// Whether this observer's last read failed (counted in `health`).
    cut_off: bool,
    shown: Shown,
    key: LockKey,
    tx: watch::Sender<Option<Leader>>,
}

impl Observer {
    async fn run(
        mut self,
        watching: crate::waiter::Watch,
        first: Option<LeaderRecord>,
        mut woken: Pin<Box<tokio::sync::futures::OwnedNotified>>,
        mut changed: LeaderChange,
    ) {
        let mut soon = OBSERVE_SOON;
        let mut pause = self.pause_after(first.as_ref(), &mut soon);
        loop {
            tokio::select! {
                biased;
                () = self.tx.closed() => break,
                () = &mut woken => soon = OBSERVE_SOON,
                // Every read below sets the next watch (or none), so a
                // watch that fired is never awaited again.
                () = &mut changed => soon = OBSERVE_SOON,
                () = tokio::time::sleep(pause) => {}
            }
            // Enabled before the read: `notify_waiters` wakes only those
            // already waiting, and an announcement during the read must
            // still end the pause after it.
            woken = Box::pin(Arc::clone(&watching.notify).notified_owned());
            woken.as_mut().enable();
            pause = match read_watched(&self.client, &self.key).await {
                Ok((found, change)) => {
                    changed = change.unwrap_or_else(unwatched);
                    self.reached(true);
                    let pause = self.pause_after(found.as_ref(), &mut soon);
                    match self.shown.judge(found, Instant::now()) {
                        Judged::Show(next) => {
                            self.tx.send_if_modified(|shown| {
                                let changed = *shown != next;
                                *shown = next;
                                changed
                            });
                            pause
                        }
                        // An older term: look again soon, to tell a lagging
                        // read from a counter that went back.
                        Judged::Doubted => grow(&mut soon),
                        Judged::WentBack(next) => {
                            tracing::warn!(election = %self.key.name, "an election's epoch went back (its store lost its counter): showing the lower epoch it keeps reading");
                            self.tx.send_replace(next);
                            pause
                        }
                    }
                }
                Err(error) => {
                    changed = unwatched();
                    if !self.cut_off {
                        tracing::warn!(election = %self.key.name, %error, "an election's observer cannot read who leads; keeping the last value");
                    }
                    self.reached(false);
                    grow(&mut soon)
                }
            };
        }
        self.reached(true);
        self.health.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// Counts this observer in or out of those cut off from the store.
    fn reached(&mut self, reached: bool) {
        if self.cut_off == reached {
            self.cut_off = !reached;
            if reached {
                self.health.cut_off.fetch_sub(1, Ordering::AcqRel);
            } else {
                self.health.cut_off.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// How long to wait for an announcement before reading again, after
    /// reading `found`.
    fn pause_after(&self, found: Option<&LeaderRecord>, soon: &mut Duration) -> Duration {
        match found {
            // Nobody leads: a candidate may be about to be elected.
            None => grow(soon),
            Some(record) => {
                *soon = OBSERVE_SOON;
                record
                    .left
                    .map_or(OBSERVE_EVERY, |left| (left + EXPIRY_MARGIN).min(OBSERVE_EVERY))
            }
        }
    }
}

/// What an observer has shown, to judge the next read by.
#[derive(Debug, Default)]
struct Shown {
    /// The highest epoch shown.
    highest: u64,
    /// A term older than `highest` read since, and when it was first read.
    doubted: Option<(String, u64, Instant)>,
}

/// What to do with a read.
#[derive(Debug, PartialEq)]
enum Judged {
    Show(Option<Leader>),
    /// An older term than one shown: not shown (yet).
    Doubted,
    /// An older term read for [`OBSERVE_EVERY`] and more: the store's
    /// counter went back (a Redis restarted without persistence, a replica
    /// promoted before it had the counter), and the store's leader is shown
    /// rather than hidden behind a term that is over.
    WentBack(Option<Leader>),
}

impl Shown {
    /// Judges a read made at `now`. A term older than one shown is a read
    /// from a store that lags, or a store whose counter went back: shown
    /// only once it has been read for [`OBSERVE_EVERY`].
    fn judge(&mut self, found: Option<LeaderRecord>, now: Instant) -> Judged {
        let Some(record) = found else {
            return Judged::Show(None);
        };
        if record.epoch >= self.highest {
            self.highest = record.epoch;
            self.doubted = None;
            return Judged::Show(Some(Leader::from(record)));
        }
        match &self.doubted {
            Some((holder, epoch, since))
                if *holder == record.holder && *epoch == record.epoch && now - *since >= OBSERVE_EVERY =>
            {
                self.highest = record.epoch;
                self.doubted = None;
                Judged::WentBack(Some(Leader::from(record)))
            }
            Some((holder, epoch, _)) if *holder == record.holder && *epoch == record.epoch => Judged::Doubted,
            _ => {
                self.doubted = Some((record.holder, record.epoch, now));
                Judged::Doubted
            }
        }
    }
}

/// The pause `soon`, which doubles for the next time up to
/// [`OBSERVE_EVERY`].
fn grow(soon: &mut Duration) -> Duration {
    let pause = *soon;
    *soon = (*soon * 2).min(OBSERVE_EVERY);
    pause
}

/// How often `run` looks whether a term it handed on has ended.
const TERM_LOOK: Duration = Duration::from_millis(50);

/// Polls a term's future while the term holds: `Ok` when the future
/// returns, or when it let its term go (dropped or resigned the
/// `Leadership`) and would run on without it; `Err` when the lease is lost.
/// The lease is looked at before and after each poll of the future, so a
/// lost or given-up term never gets one more step of it.
fn while_leading<'a, F, L>(
    mut term: Pin<&'a mut F>,
    state: &'a LeaseState,
    mut lost: Pin<&'a mut L>,
) -> impl Future<Output = Result<(), LostReason>> + 'a
where
    F: Future<Output = ()>,
    L: Future<Output = LostReason>,
{
    std::future::poll_fn(move |cx| {
        if let Some(reason) = state.lost_now() {
            return Poll::Ready(Err(reason));
        }
        if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
            return Poll::Ready(Err(reason));
        }
        if !state.is_live() || term.as_mut().poll(cx).is_ready() || !state.is_live() {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    })
}

/// Errors a new campaign would meet again.
fn cannot_mend(error: &LockError) -> bool {
    matches!(
        error,
        LockError::Unsupported { .. }
            | LockError::InvalidKey { .. }
            | LockError::InvalidRequest { .. }
            | LockError::InvalidConfig { .. }
            | LockError::KeyConflict { .. }
            | LockError::NotInitialized
    )
}

fn check_value(key: &LockKey, value: &str) -> Result<(), LockError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(LockError::InvalidRequest {
            key: key.name.clone(),
            reason: format!(
                "a leader's value is at most {MAX_VALUE_BYTES} bytes, not {}",
                value.len()
            ),
        });
    }
    Ok(())
}

/// A term as leader of an [`Election`]. Dropping it resigns in the
/// background; [`resign`](Self::resign) says how that went.
#[derive(Debug)]
#[must_use = "dropping the leadership resigns at once"]
pub struct Leadership {
    client: Arc<ClientInner>,
    election: String,
    value: String,
    lease: Lease,
}

impl Leadership {
    fn state(&self) -> &Arc<LeaseState> {
        self.lease.state()
    }

    /// The term's epoch, a fencing token: strictly greater for every new
    /// term of this election, whichever client wins it. Pass it with every
    /// write the leader makes, and have the store refuse a write with an
    /// epoch lower than one it has seen.
    pub fn epoch(&self) -> u64 {
        // Every grant of an election's lock is fenced (`Election::spec`).
        self.state().token.unwrap_or(0)
    }

    /// The value this leader proclaimed last.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The election this term is of.
    pub fn election(&self) -> &str {
        &self.election
    }

    /// Whether the term still holds by the local clock: not resigned and
    /// its validity deadline not passed.
    pub fn is_held(&self) -> bool {
        self.state().is_held()
    }

    /// Until when the term is sure to hold (the lease's validity deadline),
    /// moved on by every confirmed renewal. On tokio's clock.
    pub fn valid_until(&self) -> Instant {
        self.state().deadline()
    }

    /// Resolves when the term is lost: the store reported the lock gone or
    /// taken, or no renewal was confirmed in time. It resolves before the
    /// validity deadline, so before any other candidate can be elected.
    pub async fn lost(&self) -> LostReason {
        self.state().lost().await
    }

    /// Records `value` as what this leader leads with, for followers to
    /// read. `NotHeld` when the term has ended; `Unsupported` on a backend
    /// that keeps no election records yet (the value is still kept here).
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<(), LockError> {
        let value = value.into();
        let state = Arc::clone(self.lease.state());
        check_value(&state.key, &value)?;
        let written = self
            .client
            .backend
            .proclaim(&state.key, &state.holder, &value)
            .await
            .map_err(|f| f.error);
        match written {
            Ok(true) => {
                self.value = value;
                Ok(())
            }
            Ok(false) => Err(LockError::NotHeld {
                key: state.key.name.clone(),
            }),
            Err(error) => {
                // No record here: the value is this term's alone.
                if matches!(error, LockError::Unsupported { .. }) {
                    self.value = value;
                }
                Err(error)
            }
        }
    }

    /// Ends the term: the election's lock is released, and the next
    /// candidate can be elected at once. `Err(NotHeld)` when the term had
    /// already ended.
    pub async fn resign(self) -> Result<(), LockError> {
        self.lease.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(holder: &str, epoch: u64) -> Option<LeaderRecord> {
        Some(LeaderRecord {
            holder: holder.to_owned(),
            epoch,
            value: None,
            left: None,
        })
    }

    fn shown(judged: Judged) -> Option<u64> {
        match judged {
            Judged::Show(leader) | Judged::WentBack(leader) => leader.map(|l| l.epoch),
            Judged::Doubted => panic!("not shown"),
        }
    }

    /// On tokio's paused clock, an observer woken by the release shows it
    /// with no time passed; one that missed it would show it at its next
    /// read, a second later (the lease it read has a minute left).
    #[cfg(feature = "testing")]
    #[tokio::test(start_paused = true)]
    async fn an_observer_is_woken_by_a_release_not_by_its_next_read() {
        let locks = crate::LockClient::in_memory();
        let election = locks.election("woken").ttl(Duration::from_secs(60));
        let mut seen = election.observe().await.expect("observe");
        let term = election.campaign("here").await.expect("elected");
        seen.wait_for(Option::is_some).await.expect("observing");
        let resigned = Instant::now();
        term.resign().await.expect("resign");
        seen.wait_for(Option::is_none).await.expect("observing");
        assert!(
            resigned.elapsed() < OBSERVE_EVERY,
            "the release was seen {:?} after it, at a later read",
            resigned.elapsed()
        );
    }

    #[test]
    fn an_observer_never_shows_an_older_term_unless_the_store_keeps_it() {
        let start = Instant::now();
        let mut seen = Shown::default();
        assert_eq!(shown(seen.judge(term("a", 5), start)), Some(5));
        // A lagging read of an older term: not shown.
        assert_eq!(seen.judge(term("z", 3), start), Judged::Doubted);
        assert_eq!(shown(seen.judge(term("b", 7), start)), Some(7));
        assert_eq!(shown(seen.judge(None, start)), None);
        // After nobody led, an older term is still not shown at once...
        assert_eq!(seen.judge(term("c", 2), start), Judged::Doubted);
        assert_eq!(
            seen.judge(term("c", 2), start + OBSERVE_EVERY / 2),
            Judged::Doubted
        );
        // ...nor another older one, which starts the doubt again...
        assert_eq!(
            seen.judge(term("d", 2), start + OBSERVE_EVERY / 2),
            Judged::Doubted
        );
        assert_eq!(seen.judge(term("d", 2), start + OBSERVE_EVERY), Judged::Doubted);
        // ...but a term the store keeps showing is its leader: the counter
        // went back.
        assert!(matches!(
            seen.judge(term("d", 2), start + OBSERVE_EVERY * 2),
            Judged::WentBack(Some(Leader { epoch: 2, .. }))
        ));
        assert_eq!(
            shown(seen.judge(term("e", 3), start + OBSERVE_EVERY * 2)),
            Some(3)
        );
    }
}
