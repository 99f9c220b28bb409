//! Handing an exclusive lock straight to a waiter in the same process.
//!
//! A waiter that found the lock held leaves a standing [`Offer`] with the
//! notifier. A release that finds one sends a single owner-checked call
//! (`hand_over.lua`, or one `UPDATE` on PostgreSQL) that makes the waiter
//! the holder, instead of a release,
//! a wake-up and the waiter's own attempt: one round trip per handoff
//! instead of two, and no other waiter is woken to lose.
//!
//! Two tasks are involved, and either may be cancelled at any point, so the
//! lock a handoff creates is owned by a [`Claim`] from the moment the call is
//! sent: a claim dropped unconsumed (the waiter had gone, or went before it
//! looked) gives the lock back, owner-checked, after the handoff's reply;
//! the waiter disarms it when it takes the lock over. An offer is taken
//! under its lock, so a waiter never walks away from a handoff in flight
//! without its claim being dropped.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::oneshot;

use crate::backend::{AnyBackend, Backend};
use crate::drop_guard::{Cleanup, DropGuard};
use crate::error::LockError;
use crate::lease_state::LeaseState;

/// After this many handoffs in a row on one lock, a release goes through
/// the server as usual, so that waiters in other processes get their
/// chance: a process with waiters of its own would otherwise keep the lock
/// for as long as it has them.
pub(crate) const MOST_IN_A_ROW: u32 = 8;

/// A local waiter's standing offer to be handed a lock.
#[derive(Debug)]
pub(crate) struct Offer {
    holder: String,
    ttl: Duration,
    fencing: bool,
    slot: Mutex<Slot>,
}

#[derive(Debug)]
enum Slot {
    Open(oneshot::Sender<Handed>),
    /// A release took it: its handoff is in flight or done.
    Taken,
    /// The waiter withdrew it before any release took it.
    Withdrawn,
}

impl Offer {
    /// An open offer from the waiter `holder` (its lease `ttl`, with a
    /// fencing token or not), and the waiter's end of it.
    pub(crate) fn new(holder: &str, ttl: Duration, fencing: bool) -> (Arc<Offer>, OfferHandle) {
        let (tx, rx) = oneshot::channel();
        let offer = Arc::new(Offer {
            holder: holder.to_owned(),
            ttl,
            fencing,
            slot: Mutex::new(Slot::Open(tx)),
        });
        let handle = OfferHandle {
            offer: Arc::clone(&offer),
            rx,
        };
        (offer, handle)
    }

    /// The giver's side: takes the offer if it is still open.
    pub(crate) fn take(self: Arc<Self>) -> Option<TakenOffer> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Open(tx) => {
                drop(slot);
                Some(TakenOffer { offer: self, tx })
            }
            other => {
                *slot = other;
                None
            }
        }
    }

    /// The waiter's side: withdraws the offer if no release took it yet.
    fn withdraw(&self) -> bool {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match *slot {
            Slot::Open(_) => {
                *slot = Slot::Withdrawn;
                true
            }
            Slot::Withdrawn => true,
            Slot::Taken => false,
        }
    }
}

/// An offer a release took: whom to hand the lock to, and where to say so.
#[derive(Debug)]
pub(crate) struct TakenOffer {
    offer: Arc<Offer>,
    tx: oneshot::Sender<Handed>,
}

impl TakenOffer {
    pub(crate) fn holder(&self) -> &str {
        &self.offer.holder
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.offer.ttl
    }

    pub(crate) fn fencing(&self) -> bool {
        self.offer.fencing
    }

    /// From the moment the handoff may be on the wire: until the giver
    /// says how it went, the waiter may hold the lock under `claim`.
    pub(crate) fn sending(self, claim: DropGuard<Claim>) -> Sending {
        Sending {
            to: Some((self.tx, claim)),
        }
    }
}

/// A handoff on its way. However it ends (answered, failed, or dropped
/// with the giver's cancelled release), the waiter is told: dropped
/// unsettled, it tells the waiter the lock may be its own.
#[derive(Debug)]
pub(crate) struct Sending {
    to: Option<(oneshot::Sender<Handed>, DropGuard<Claim>)>,
}

impl Sending {
    /// The waiter holds the lock now. If it is gone, the claim is dropped
    /// here, which gives the lock back.
    pub(crate) fn handed(mut self, granted: Granted) {
        if let Some((tx, claim)) = self.to.take() {
            drop(tx.send(Handed {
                granted: Some(granted),
                claim,
            }));
        }
    }

    /// Nothing was written: the waiter, told nothing, looks again.
    pub(crate) fn not_handed(mut self) {
        if let Some((_, mut claim)) = self.to.take() {
            claim.disarm();
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if let Some((tx, claim)) = self.to.take() {
            drop(tx.send(Handed { granted: None, claim }));
        }
    }
}

/// What a waiter is told when a release took its offer. Dropping the
/// offer's sender unsent tells it the lock was not handed (the giver no
/// longer had it): it looks again.
#[derive(Debug)]
pub(crate) struct Handed {
    /// What the waiter was granted; `None` when the call got no answer, so
    /// the waiter may hold the lock: its next attempt finds out ("already
    /// mine" is success).
    pub(crate) granted: Option<Granted>,
    /// Gives the lock back unless the waiter disarms it.
    pub(crate) claim: DropGuard<Claim>,
}

/// A lock handed over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Granted {
    /// When the handoff was sent: the waiter's lease counts from here.
    pub(crate) sent: Instant,
    pub(crate) token: Option<u64>,
    /// Handoffs in a row, this one included.
    pub(crate) in_row: u32,
}

/// The waiter's end of an offer. Dropped while the offer is open, it
/// withdraws it; dropped after a release took it, the claim the release
/// sends (or sent) is dropped with it and gives the lock back.
#[derive(Debug)]
pub(crate) struct OfferHandle {
    offer: Arc<Offer>,
    pub(crate) rx: oneshot::Receiver<Handed>,
}

impl OfferHandle {
    /// Withdraws the offer, unless a release took it already: then its
    /// handoff is on the wire or done, how it went comes on `rx`, and this
    /// returns false. Decided under the offer's lock, so no release takes
    /// it after a `true`.
    pub(crate) fn withdraw(&self) -> bool {
        self.offer.withdraw()
    }

    /// For a waiter that got the lock by its own attempt (same holder id):
    /// a handoff under way for it is waited for and its claim disarmed,
    /// since the lock it hands over is the one the waiter now holds.
    /// Returns the handoffs in a row that brought it (0: none did).
    pub(crate) async fn settle(mut self) -> u32 {
        if self.offer.withdraw() {
            return 0;
        }
        match (&mut self.rx).await {
            Ok(mut handed) => {
                handed.claim.disarm();
                handed.granted.map_or(0, |g| g.in_row)
            }
            Err(_) => 0,
        }
    }
}

impl Drop for OfferHandle {
    fn drop(&mut self) {
        self.offer.withdraw();
    }
}

/// The lock a handoff gave to `holder`, until the waiter takes it over.
#[derive(Debug)]
pub(crate) struct Claim {
    backend: Arc<AnyBackend>,
    /// The giver's lease: where the lock lives.
    given: Arc<LeaseState>,
    holder: String,
}

impl Claim {
    pub(crate) fn new(backend: Arc<AnyBackend>, given: Arc<LeaseState>, holder: &str) -> Self {
        Claim {
            backend,
            given,
            holder: holder.to_owned(),
        }
    }
}

impl Cleanup for Claim {
    async fn run(&self) -> Result<(), LockError> {
        self.backend
            .release(&self.given.key, &self.holder)
            .await
            .map(drop)
            .map_err(LockError::from)
    }

    fn describe(&self) -> String {
        format!(
            "giving back lock `{}`, handed to a waiter that had stopped waiting",
            self.given.key.name
        )
    }
}
