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
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

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
        if let Some(feature) = self.client.backend.cannot_elect() {
            return Err(LockError::Unsupported {
                key: key.name,
                feature: feature.to_owned(),
            });
        }
        let found = self.client.backend.leader(&key).await.map_err(|f| f.error)?;
        Ok(found.map(|record| Leader {
            id: record.holder,
            value: record.value.unwrap_or_default(),
            epoch: record.epoch,
        }))
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
