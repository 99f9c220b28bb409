//! A lock server simulated in this process (`testing`): the in-process
//! backend's semantics (every kind, fencing, same-client handoff), on
//! tokio's clock so that
//! tests run on the paused clock, with a server clock that may run at
//! another rate than the client's, and faults injected between the client
//! and the server: delays, refused requests, requests applied whose reply
//! is lost, requests applied twice, stale replies (applied at once, their
//! reply long on its way back), pauses, restarts with or without the
//! server's state. A request once sent travels on its own: it lands even
//! if its caller gave up on it (a command timeout, a dropped future), as on
//! a real connection. Every random choice comes from one seed, and the
//! server keeps a history of what it granted and when, on its own clock,
//! against which the test kit checks the client's holds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::contract::{
    AcquireReply, AcquireRequest, Backend, Failure, HandOver, OwnedAcquireRequest, RenewItem, Renewal,
};
use super::memory::State;
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

/// Every request and every reply takes at least this long, as on a
/// loopback connection: a client that retries a refusal at once must still
/// let the clock move.
const LEG_FLOOR: Duration = Duration::from_micros(100);

/// How the simulated network and server misbehave at random, per request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RandomFaults {
    /// Each way, a delay drawn from `[0, max_delay]`.
    pub(crate) max_delay: Duration,
    /// Out of 1,000 requests, how many are refused (not applied).
    pub(crate) refused_per_mille: u32,
    /// Out of 1,000 requests, how many are applied and their reply lost.
    pub(crate) lost_reply_per_mille: u32,
    /// Out of 1,000 requests, how many are applied a second time, before
    /// the reply reaches the caller (a copy a driver sent again).
    pub(crate) duplicated_per_mille: u32,
    /// Out of 1,000 replies, how many are stale: delayed on their way back
    /// by a time drawn from `[0, max_stale]` more, so that what they say
    /// (a grant, a renewal) is that old when it arrives.
    pub(crate) stale_per_mille: u32,
    pub(crate) max_stale: Duration,
}

/// One thing the server did, at its own clock's time since it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimEvent {
    /// The server's time, since the simulation started.
    pub at: Duration,
    /// The lock's key as stored (with the client's prefix).
    pub key: String,
    /// Who: a holder id, or `sim:thief:<n>` for [`SimControl::steal`](crate::testing::SimControl::steal).
    pub holder: String,
    /// What happened.
    pub what: SimEventKind,
}

/// What happened in a [`SimEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimEventKind {
    /// The lease began.
    Granted {
        /// When it ends unless renewed or released.
        until: Duration,
    },
    /// The lease was renewed.
    Renewed {
        /// When it ends now.
        until: Duration,
    },
    /// The holder released it.
    Released,
    /// The test made the server drop it ([`SimControl::expire`](crate::testing::SimControl::expire)).
    Expired,
    /// Another holder took it over ([`SimControl::steal`](crate::testing::SimControl::steal)).
    Stolen,
    /// The client began holding it (its guard or body started).
    HoldBegan,
    /// The client stopped holding it (its guard was released or dropped).
    HoldEnded,
    /// A request was applied and its reply lost.
    ReplyLost,
    /// A request was refused unapplied.
    Refused,
    /// A copy of a request already applied was applied again.
    Duplicated,
    /// The server restarted (`key` and `holder` are empty); with its
    /// state, or without: every lease and fencing counter gone.
    Restarted {
        /// Whether the leases and counters survived.
        state_kept: bool,
    },
    /// A lease the server lost in a restart without its state.
    LostInRestart,
}

/// A lease as the server saw it: from its grant until it was released,
/// forced out, or ran out.
#[derive(Debug, Clone)]
struct ServerLease {
    /// When the request that got it was sent, on the server's clock.
    asked: Duration,
    granted: Duration,
    expires: Duration,
    ended: Option<Duration>,
    /// Ended by the test (`expire`, `steal`, a restart without state), not
    /// by the protocol: its holder must still stop by `expires`, the end
    /// it would have had.
    forced: bool,
}

impl ServerLease {
    fn end(&self) -> Duration {
        self.ended.map_or(self.expires, |e| e.min(self.expires))
    }
}

/// A client's hold: from when it had the lock in hand until it let go,
/// on the server's clock.
#[derive(Debug, Clone)]
struct Hold {
    key: String,
    holder: String,
    kind: Kind,
    from: Duration,
    until: Option<Duration>,
}

#[derive(Debug)]
struct World {
    locks: State,
    /// Where the client's and the server's clocks both start.
    origin: Instant,
    /// How much faster than the client's the server's clock runs, in parts
    /// per million (negative: slower).
    rate_ppm: i64,
    rng: StdRng,
    random: RandomFaults,
    refuse_next: u32,
    lose_next: u32,
    /// Of the lost replies, the next this many are lost with their
    /// connection: the client sees it break and reconnects.
    cut_next: u32,
    /// The next this many requests take `slow_by` longer on their way.
    slow_next: u32,
    slow_by: Duration,
    /// The next this many replies take `stale_by` longer on their way back.
    stale_next: u32,
    stale_by: Duration,
    delay: Duration,
    paused_until: Option<Instant>,
    /// Until when the server is down (restarting): requests are refused
    /// as on a closed port.
    down_until: Option<Instant>,
    /// Counts restarts: a reply the server sent before one is lost with
    /// its connection.
    generation: u64,
    dup_next: u32,
    history: Vec<SimEvent>,
    /// Every lease by (key, holder), the latest last.
    leases: BTreeMap<(String, String), Vec<ServerLease>>,
    holds: Vec<Hold>,
    thieves: u64,
    /// Releases that freed a lease asked for after they were sent: a late
    /// or repeated release taking away a newer lease.
    late_releases: Vec<String>,
}

impl World {
    /// The server's clock now, as an instant the lock state can use, and
    /// as the time since the start for the history.
    fn server_now(&self) -> (Instant, Duration) {
        let client = Instant::now().saturating_duration_since(self.origin);
        let nanos = i128::try_from(client.as_nanos()).unwrap_or(i128::MAX);
        let scaled = nanos + nanos * i128::from(self.rate_ppm) / 1_000_000;
        let since = Duration::from_nanos(u64::try_from(scaled.max(0)).unwrap_or(u64::MAX));
        (self.origin + since, since)
    }

    fn record(&mut self, at: Duration, key: &str, holder: &str, what: SimEventKind) {
        self.history.push(SimEvent {
            at,
            key: key.to_owned(),
            holder: holder.to_owned(),
            what,
        });
    }

    /// Brings the lease ledger of (`key`, `holder`) up to what the lock
    /// state says now, after an operation (`sent` at that server time) or
    /// a fault.
    fn observe(&mut self, key: &str, holder: &str, op: Op) {
        let (now, at) = self.server_now();
        let live = self
            .locks
            .lease_of(key, holder, now)
            .map(|expires| at + (expires - now));
        let leases = self
            .leases
            .entry((key.to_owned(), holder.to_owned()))
            .or_default();
        let open = leases.last_mut().filter(|l| l.ended.is_none() && l.expires > at);
        let event = match (live, open) {
            (Some(until), Some(lease)) if lease.expires != until => {
                lease.expires = until;
                Some(SimEventKind::Renewed { until })
            }
            (Some(_), Some(_)) => None,
            (Some(until), None) => {
                leases.push(ServerLease {
                    asked: match op {
                        Op::Acquire { sent } => sent,
                        _ => at,
                    },
                    granted: at,
                    expires: until,
                    ended: None,
                    forced: false,
                });
                Some(SimEventKind::Granted { until })
            }
            (None, Some(lease)) => {
                lease.ended = Some(at);
                match op {
                    Op::Release { sent } => {
                        if sent < lease.asked {
                            let asked = lease.asked;
                            self.late_releases.push(format!(
                                "a release of `{key}` by {holder} sent at {sent:?} freed the lease asked for at {asked:?}, after it"
                            ));
                        }
                        Some(SimEventKind::Released)
                    }
                    _ => None,
                }
            }
            (None, None) => None,
        };
        if let Some(event) = event {
            self.record(at, key, holder, event);
        }
    }

    /// Ends by force every lease at `key`: the test expired or stole it.
    fn force_end(&mut self, key: &str, what: SimEventKind) -> Vec<String> {
        let (now, at) = self.server_now();
        let holders = self.locks.holders(key, now);
        for (holder, _) in &holders {
            if let Some(lease) = self
                .leases
                .get_mut(&(key.to_owned(), holder.clone()))
                .and_then(|l| l.last_mut())
                .filter(|l| l.ended.is_none())
            {
                lease.ended = Some(at);
                lease.forced = true;
            }
            self.record(at, key, holder, what);
        }
        self.locks.forget(key);
        holders.into_iter().map(|(h, _)| h).collect()
    }

    /// Whether the server is paused or down at `now`.
    fn unavailable(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|until| until > now) || self.down_until.is_some_and(|until| until > now)
    }

    /// The server's time for judging holds still open: its clock now, and
    /// never before the last thing it recorded (a check run after the
    /// runtime that moved the paused clock has ended sees the real clock).
    fn judged_now(&self) -> Duration {
        let last = self.history.last().map_or(Duration::ZERO, |e| e.at);
        self.server_now().1.max(last)
    }

    /// The lease a client's hold began in. A lease the test ended may end
    /// while its grant's reply is on its way: the hold that begins after
    /// is still in it, up to the end it would have had.
    fn covering(&self, hold: &Hold) -> Option<&ServerLease> {
        self.leases
            .get(&(hold.key.clone(), hold.holder.clone()))?
            .iter()
            .rev()
            .find(|l| {
                let end = if l.forced { l.expires } else { l.end() };
                l.granted <= hold.from && hold.from <= end
            })
    }
}

/// The simulated server, shared by every client of one simulation.
#[derive(Debug)]
pub(crate) struct SimServer {
    world: Mutex<World>,
}

/// What brought a lease's change about, for the ledger: a request sent
/// at a server time, or a renewal or a fault.
#[derive(Clone, Copy)]
enum Op {
    Acquire { sent: Duration },
    Release { sent: Duration },
    Other,
}

/// What becomes of a request's reply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reply {
    Delivered,
    /// Lost on its way: the caller sees a transient error.
    Lost,
    /// Lost with its connection: the caller sees it break, and reconnects.
    Cut,
}

/// What a request meets on its way, drawn when it is sent.
#[derive(Clone, Copy)]
struct Journey {
    there: Duration,
    back: Duration,
    refused: bool,
    reply: Reply,
    /// Applied once more, this long after the first time.
    again_after: Option<Duration>,
}

/// How a request ended at the server.
enum Landing<T> {
    Refused,
    /// The server was down: the connection was refused or reset.
    Down,
    Applied(T),
}

impl SimServer {
    pub(crate) fn new(seed: u64, rate_ppm: i64, random: RandomFaults) -> Arc<Self> {
        Arc::new(SimServer {
            world: Mutex::new(World {
                locks: State::default(),
                origin: Instant::now(),
                rate_ppm,
                rng: StdRng::seed_from_u64(seed),
                random,
                refuse_next: 0,
                lose_next: 0,
                cut_next: 0,
                slow_next: 0,
                slow_by: Duration::ZERO,
                stale_next: 0,
                stale_by: Duration::ZERO,
                delay: Duration::ZERO,
                paused_until: None,
                down_until: None,
                generation: 0,
                dup_next: 0,
                history: Vec::new(),
                leases: BTreeMap::new(),
                holds: Vec::new(),
                thieves: 0,
                late_releases: Vec::new(),
            }),
        })
    }

    fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn journey(&self) -> Journey {
        let mut w = self.world();
        let max = w.random.max_delay;
        let leg = |w: &mut World| {
            let random = if max.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(
                    w.rng
                        .random_range(0..=u64::try_from(max.as_nanos()).unwrap_or(u64::MAX)),
                )
            };
            LEG_FLOOR + w.delay + random
        };
        let mut there = leg(&mut w);
        if w.slow_next > 0 {
            w.slow_next -= 1;
            there += w.slow_by;
        }
        let mut back = leg(&mut w);
        if w.stale_next > 0 {
            w.stale_next -= 1;
            back += w.stale_by;
        } else if w.random.stale_per_mille > 0 && w.rng.random_range(0..1000) < w.random.stale_per_mille {
            let max = u64::try_from(w.random.max_stale.as_nanos()).unwrap_or(u64::MAX);
            back += Duration::from_nanos(w.rng.random_range(0..=max));
        }
        let (refused_rate, lost_rate) = (w.random.refused_per_mille, w.random.lost_reply_per_mille);
        let draw = w.rng.random_range(0..1000);
        let refused = if w.refuse_next > 0 {
            w.refuse_next -= 1;
            true
        } else {
            draw < refused_rate
        };
        let reply = if refused {
            Reply::Delivered
        } else if w.cut_next > 0 {
            w.cut_next -= 1;
            Reply::Cut
        } else if w.lose_next > 0 {
            w.lose_next -= 1;
            Reply::Lost
        } else if (refused_rate..refused_rate + lost_rate).contains(&draw) {
            Reply::Lost
        } else {
            Reply::Delivered
        };
        let duplicated = if !refused && w.dup_next > 0 {
            w.dup_next -= 1;
            true
        } else {
            let dup_rate = w.random.duplicated_per_mille;
            !refused && dup_rate > 0 && w.rng.random_range(0..1000) < dup_rate
        };
        // A driver resends a request when its connection broke after
        // sending it; the copy lands before the reply reaches the caller
        // (the resend's reply is the one the caller gets), never after the
        // caller's next request. (When copies landed at any time, seed 1535
        // found a late copy of an acquisition cutting an extended lease
        // back to its ttl; every backend now only lengthens a lease on a
        // repeated attempt, which the simulation's
        // `a_late_attempt_of_the_holder_does_not_shorten_its_lease` keeps.)
        let again_after = duplicated.then(|| {
            let back_ns = u64::try_from(back.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(w.rng.random_range(0..back_ns))
        });
        Journey {
            there,
            back,
            refused,
            reply,
            again_after,
        }
    }

    /// Sends a request: it travels, waits out a pause or a restart, is
    /// refused or applied by `apply` (given the lock state and the
    /// server's instant), perhaps applied again later, and its reply
    /// travels back, or is lost. The request travels on a task of its
    /// own, so it lands whether or not its caller still waits.
    async fn call<T, F>(self: &Arc<Self>, key: &LockKey, holder: &str, mut apply: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnMut(&mut World, Instant, Duration) -> Result<T, Failure> + Send + 'static,
    {
        let journey = self.journey();
        let (sent, connection) = {
            let w = self.world();
            (w.server_now().1, w.generation)
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        let server = Arc::clone(self);
        let (redis_key, who) = (key.redis_key.clone(), holder.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(journey.there).await;
            let landing = server
                .land(&redis_key, &who, journey, connection, |w, now| {
                    apply(w, now, sent)
                })
                .await;
            if let Some(after) = journey
                .again_after
                .filter(|_| matches!(landing.0, Landing::Applied(_)))
            {
                // The copy lands before the reply starts back, so that the
                // caller's next request (and its timer, which counts whole
                // milliseconds) cannot come first. A resend goes with its
                // connection: to a server that stopped answering
                // meanwhile, it is not sent.
                tokio::time::sleep(after).await;
                let copy = Journey {
                    refused: false,
                    reply: Reply::Delivered,
                    ..journey
                };
                if !server.world().unavailable(Instant::now()) {
                    server
                        .land(&redis_key, &who, copy, connection, |w, now| {
                            let (_, at) = w.server_now();
                            w.record(at, &redis_key, &who, SimEventKind::Duplicated);
                            apply(w, now, sent)
                        })
                        .await;
                }
            }
            // The caller may be gone: the reply then goes nowhere.
            let _ = reply_tx.send(landing);
        });
        let (landing, generation) = reply_rx
            .await
            .map_err(|_| transient(key, "the simulated request was dropped"))?;
        tokio::time::sleep(journey.back).await;
        if self.world().generation != generation {
            return Err(broken(
                key,
                "the simulated server restarted before its reply arrived",
            ));
        }
        match landing {
            Landing::Refused => Err(transient(key, "the simulated server refused the request")),
            Landing::Down => Err(broken(key, "the simulated server is restarting")),
            Landing::Applied(_) if journey.reply == Reply::Cut => Err(broken(
                key,
                "the simulated connection broke before the reply arrived",
            )),
            Landing::Applied(_) if journey.reply == Reply::Lost => {
                Err(transient(key, "the simulated server's reply was lost"))
            }
            Landing::Applied(result) => result,
        }
    }

    /// A request arrives: it waits out a pause, and is refused, turned
    /// away by a server that is down or restarted since it was sent (its
    /// connection is gone), or applied. With the server's generation when
    /// it landed.
    async fn land<T>(
        &self,
        redis_key: &str,
        holder: &str,
        journey: Journey,
        connection: u64,
        apply: impl FnOnce(&mut World, Instant) -> Result<T, Failure>,
    ) -> (Landing<Result<T, Failure>>, u64) {
        loop {
            // A restart ends a pause: a request waiting it out meets the
            // restarted server (down, then up) when it wakes.
            let paused = self.world().paused_until.filter(|until| *until > Instant::now());
            match paused {
                Some(until) => tokio::time::sleep_until(until).await,
                None => break,
            }
        }
        let mut w = self.world();
        let (now, at) = w.server_now();
        let generation = w.generation;
        let down = w.down_until.is_some_and(|until| until > Instant::now());
        let landing = if down || w.generation != connection {
            Landing::Down
        } else if journey.refused {
            w.record(at, redis_key, holder, SimEventKind::Refused);
            Landing::Refused
        } else {
            let result = apply(&mut w, now);
            if journey.reply != Reply::Delivered {
                w.record(at, redis_key, holder, SimEventKind::ReplyLost);
            }
            Landing::Applied(result)
        };
        (landing, generation)
    }

    /// The client began holding `key` (its guard is in hand).
    pub(crate) fn hold_began(&self, key: &LockKey, holder: &str, kind: Kind) {
        let mut w = self.world();
        let (_, at) = w.server_now();
        w.holds.push(Hold {
            key: key.redis_key.clone(),
            holder: holder.to_owned(),
            kind,
            from: at,
            until: None,
        });
        w.record(at, &key.redis_key, holder, SimEventKind::HoldBegan);
    }

    /// The client stopped holding `key`.
    pub(crate) fn hold_ended(&self, key: &LockKey, holder: &str) {
        let mut w = self.world();
        let (_, at) = w.server_now();
        if let Some(hold) = w
            .holds
            .iter_mut()
            .rev()
            .find(|h| h.key == key.redis_key && h.holder == holder && h.until.is_none())
        {
            hold.until = Some(at);
            w.record(at, &key.redis_key, holder, SimEventKind::HoldEnded);
        }
    }

    pub(crate) fn refuse_next(&self, n: u32) {
        self.world().refuse_next += n;
    }

    pub(crate) fn lose_replies(&self, n: u32) {
        self.world().lose_next += n;
    }

    pub(crate) fn cut_replies(&self, n: u32) {
        self.world().cut_next += n;
    }

    pub(crate) fn slow_next(&self, n: u32, by: Duration) {
        let mut w = self.world();
        w.slow_next += n;
        w.slow_by = by;
    }

    pub(crate) fn stale_next(&self, n: u32, by: Duration) {
        let mut w = self.world();
        w.stale_next += n;
        w.stale_by = by;
    }

    pub(crate) fn set_delay(&self, each_way: Duration) {
        self.world().delay = each_way;
    }

    pub(crate) fn duplicate_next(&self, n: u32) {
        self.world().dup_next += n;
    }

    pub(crate) fn pause(&self, d: Duration) {
        let until = Instant::now() + d;
        let mut w = self.world();
        w.paused_until = Some(w.paused_until.map_or(until, |u| u.max(until)));
    }

    /// The server goes down now for `down`: requests in flight and replies
    /// on their way are lost with their connections, requests sent
    /// meanwhile are refused. Without `keep_state`, every lease and every
    /// fencing counter is gone when it comes back (a Redis without
    /// persistence); with it, they are as they were (on the server's
    /// clock, which ran on).
    pub(crate) fn restart(&self, down: Duration, keep_state: bool) {
        let mut w = self.world();
        let (_, at) = w.server_now();
        w.generation += 1;
        w.paused_until = None;
        w.down_until = Some(Instant::now() + down);
        w.record(
            at,
            "",
            "",
            SimEventKind::Restarted {
                state_kept: keep_state,
            },
        );
        if !keep_state {
            // Every key with a live lease ends as an expiry would end it;
            // then the counters go too.
            let mut keys: Vec<String> = w
                .leases
                .iter()
                .filter(|(_, ls)| ls.last().is_some_and(|l| l.ended.is_none() && l.expires > at))
                .map(|((key, _), _)| key.clone())
                .collect();
            keys.dedup();
            for key in keys {
                w.force_end(&key, SimEventKind::LostInRestart);
            }
            w.locks = State::default();
        }
    }

    /// Drops every lease at `redis_key` now; the holders found.
    pub(crate) fn expire(&self, redis_key: &str) -> Vec<String> {
        self.world().force_end(redis_key, SimEventKind::Expired)
    }

    /// Another holder takes the lock at `redis_key` for what was left of
    /// the lease it replaces (or `ttl` if it was free); its id.
    pub(crate) fn steal(&self, redis_key: &str, ttl: Duration) -> String {
        let mut w = self.world();
        let (now, at) = w.server_now();
        let left = w
            .locks
            .holders(redis_key, now)
            .iter()
            .map(|(_, expires)| *expires - now)
            .max()
            .unwrap_or(ttl);
        w.force_end(redis_key, SimEventKind::Stolen);
        w.thieves += 1;
        let thief = format!("sim:thief:{}", w.thieves);
        w.locks.take_over(redis_key, &thief, now + left);
        w.observe(redis_key, &thief, Op::Other);
        w.holds.push(Hold {
            key: redis_key.to_owned(),
            holder: thief.clone(),
            kind: Kind::Exclusive,
            from: at,
            until: Some(at + left),
        });
        thief
    }

    pub(crate) fn history(&self) -> Vec<SimEvent> {
        self.world().history.clone()
    }

    /// Every client hold that was not inside a lease the server gave that
    /// holder, on the server's clock: a body that ran while its lock was
    /// not its own. A lease the test ended by force (expired, stolen, lost
    /// in a restart) is judged by the end it would have had: its holder
    /// learns of the loss at its next renewal at the earliest, and must
    /// stop by its own deadline all the same. Then every release that
    /// freed a lease asked for after it was sent.
    pub(crate) fn holds_outside_leases(&self) -> Vec<String> {
        let w = self.world();
        let now = w.judged_now();
        let mut found = w.late_releases.clone();
        for hold in w.holds.iter().filter(|h| !h.holder.starts_with("sim:")) {
            let until = hold.until.unwrap_or(now);
            match w.covering(hold) {
                None => found.push(format!(
                    "{} held `{}` from {:?} without a lease",
                    hold.holder, hold.key, hold.from
                )),
                Some(lease) if until > lease.end() && !lease.forced => found.push(format!(
                    "{} held `{}` until {:?}, past its lease's end at {:?} (server clock)",
                    hold.holder,
                    hold.key,
                    until,
                    lease.end()
                )),
                Some(lease) if until > lease.expires && lease.forced => found.push(format!(
                    "{} held `{}` until {:?}, past the end its lease would have had at {:?} (server clock; the test ended it at {:?})",
                    hold.holder,
                    hold.key,
                    until,
                    lease.expires,
                    lease.end()
                )),
                Some(_) => {}
            }
        }
        found
    }

    /// Every pair of holds of one lock that overlapped where its kind
    /// allows no overlap, on the server's clock. A hold whose lease the
    /// test ended by force counts only until that end: after it, the hold
    /// may run on until its holder's next renewal, and
    /// [`Self::holds_outside_leases`] judges it.
    pub(crate) fn overlaps(&self) -> Vec<String> {
        let w = self.world();
        let now = w.judged_now();
        let mut by_key: BTreeMap<&str, Vec<Hold>> = BTreeMap::new();
        for hold in &w.holds {
            let mut counted = hold.clone();
            let until = hold.until.unwrap_or(now);
            counted.until = Some(match w.covering(hold) {
                Some(lease) if lease.forced => until.min(lease.end()),
                _ => until,
            });
            if counted.until.is_some_and(|until| until > counted.from) {
                by_key.entry(hold.key.as_str()).or_default().push(counted);
            }
        }
        let mut found = Vec::new();
        for (key, holds) in by_key {
            for (i, a) in holds.iter().enumerate() {
                for b in &holds[i + 1..] {
                    let (a_end, b_end) = (a.until.unwrap_or(now), b.until.unwrap_or(now));
                    let meet = a.from < b_end && b.from < a_end;
                    if meet && a.holder != b.holder && excludes(a.kind, b.kind) {
                        found.push(format!(
                            "`{key}`: {} ({:?}..{:?}) and {} ({:?}..{:?})",
                            a.holder, a.from, a_end, b.holder, b.from, b_end
                        ));
                    }
                }
            }
            // Permits: more holders at once than there are permits.
            if let Some(Kind::Permits(n)) = holds.first().map(|h| h.kind) {
                let mut edges: Vec<(Duration, i64)> = holds
                    .iter()
                    .flat_map(|h| [(h.from, 1), (h.until.unwrap_or(now), -1)])
                    .collect();
                edges.sort_by_key(|&(at, step)| (at, step));
                let mut inside = 0_i64;
                for (at, step) in edges {
                    inside += step;
                    if inside > i64::from(n) {
                        found.push(format!("`{key}`: {inside} holders of {n} permits at {at:?}"));
                        break;
                    }
                }
            }
        }
        found
    }
}

/// Whether holds of these two kinds of one lock may not overlap.
fn excludes(a: Kind, b: Kind) -> bool {
    !matches!(
        (a, b),
        (Kind::Read, Kind::Read) | (Kind::Permits(_), Kind::Permits(_))
    )
}

fn transient(key: &LockKey, why: &str) -> Failure {
    Failure {
        error: LockError::backend("simulated", Some(&key.name), why),
        transient: true,
        reconnecting: false,
    }
}

/// A connection that broke: the client reconnects, and may try at once.
fn broken(key: &LockKey, why: &str) -> Failure {
    Failure {
        reconnecting: true,
        ..transient(key, why)
    }
}

/// One client's view of a simulated server.
#[derive(Debug, Clone)]
pub(crate) struct SimBackend {
    pub(crate) server: Arc<SimServer>,
    /// The client's command timeout: how long it waits for a reply, as
    /// every real backend's driver does (Redis's response timeout, the
    /// SQL and ZooKeeper backends' own), whichever call it is.
    pub(crate) command_timeout: Duration,
}

impl SimBackend {
    /// A request through [`SimServer::call`], given up on after the
    /// command timeout: it still lands, and its reply goes nowhere. Without
    /// this, a call the runtime does not time out itself (a nested call's
    /// extension) waited for a stale reply as long as it took (the
    /// simulation's seed 1035, once replies could be stale: a caller
    /// waited 951 ms for a lock with a `wait` of 326 ms and a command
    /// timeout of 200 ms).
    async fn call<T, F>(&self, key: &LockKey, holder: &str, apply: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnMut(&mut World, Instant, Duration) -> Result<T, Failure> + Send + 'static,
    {
        tokio::time::timeout(self.command_timeout, self.server.call(key, holder, apply))
            .await
            .unwrap_or_else(|_| {
                Err(transient(
                    key,
                    &format!("no reply within {}ms", self.command_timeout.as_millis()),
                ))
            })
    }
}

/// The keys a granted acquisition holds leases at.
fn granted_keys(req: &AcquireRequest<'_>, reply: &AcquireReply) -> Vec<String> {
    match (req.kind, reply) {
        (Kind::Segments(n), AcquireReply::Acquired { segment: Some(i), .. }) => req
            .key
            .segment_keys(n)
            .nth(usize::try_from(*i).unwrap_or(usize::MAX))
            .into_iter()
            .collect(),
        _ => std::iter::once(req.key)
            .chain(req.also)
            .map(|k| k.redis_key.clone())
            .collect(),
    }
}

impl SimBackend {
    /// Gives the exclusive lock `key` from `from` to `to`, with a lease of
    /// `ttl` from when it lands, if `from` still has it: a same-client
    /// handoff, as Redis's `hand_over.lua` or PostgreSQL's `UPDATE` does it.
    pub(crate) async fn hand_over(
        &self,
        key: &LockKey,
        from: &str,
        to: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<HandOver, Failure> {
        let (owned_key, giver, taker) = (key.redis_key.clone(), from.to_owned(), to.to_owned());
        self.call(key, from, move |w, now, sent| {
            let Some(token) = w.locks.hand_over(&owned_key, &giver, &taker, now + ttl, now) else {
                return Ok(HandOver::NotHeld);
            };
            w.observe(&owned_key, &giver, Op::Release { sent });
            w.observe(&owned_key, &taker, Op::Acquire { sent });
            Ok(HandOver::Handed {
                token: fencing.then_some(token),
            })
        })
        .await
    }
}

impl SimBackend {
    /// `AnyBackend::keep` on the simulated server, by its clock. The
    /// client's hold ended; the server's lease goes on.
    pub(crate) async fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> Result<bool, Failure> {
        let (owned_key, owned_holder) = (key.clone(), holder.to_owned());
        self.call(key, holder, move |w, now, _| {
            let kept = w.locks.keep(&owned_key, &owned_holder, left, now);
            w.observe(&owned_key.redis_key, &owned_holder, Op::Other);
            Ok(kept)
        })
        .await
    }
}

impl Backend for SimBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let sent = OwnedAcquireRequest::new(req);
        self.call(req.key, req.holder, move |w, now, at| {
            let req = sent.borrowed();
            let reply = w.locks.acquire(&req, now)?;
            if matches!(reply, AcquireReply::Acquired { .. }) {
                for key in granted_keys(&req, &reply) {
                    w.observe(&key, req.holder, Op::Acquire { sent: at });
                }
            }
            Ok(reply)
        })
        .await
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        let (owned_key, owned_holder) = (key.clone(), holder.to_owned());
        self.call(key, holder, move |w, now, sent| {
            let released = w.locks.release_key(&owned_key, &owned_holder, now);
            w.observe(&owned_key.redis_key, &owned_holder, Op::Release { sent });
            Ok(released)
        })
        .await
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        let Some(first) = keys.first() else {
            return Ok(false);
        };
        let (keys, owned_holder) = (keys.to_vec(), holder.to_owned());
        self.call(first, holder, move |w, now, sent| {
            let released = w.locks.release_many(&keys, &owned_holder, now);
            for key in &keys {
                w.observe(&key.redis_key, &owned_holder, Op::Release { sent });
            }
            Ok(released)
        })
        .await
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        let (owned_key, owned_holder) = (key.clone(), holder.to_owned());
        self.call(key, holder, move |w, now, sent| {
            let released = w.locks.release_segments(&owned_key, count, &owned_holder, now);
            for segment in owned_key.segment_keys(count) {
                w.observe(&segment, &owned_holder, Op::Release { sent });
            }
            Ok(released)
        })
        .await
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        let (owned_key, owned_holder) = (key.clone(), holder.to_owned());
        self.call(key, holder, move |w, now, _| {
            let renewed = w.locks.renew_key(&owned_key, &owned_holder, ttl, now);
            w.observe(&owned_key.redis_key, &owned_holder, Op::Other);
            Ok(renewed)
        })
        .await
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let owned: Vec<(LockKey, String, Duration)> = items
            .iter()
            .map(|item| (item.key.clone(), item.holder.to_owned(), item.ttl))
            .collect();
        self.call(first.key, first.holder, move |w, now, _| {
            let items: Vec<RenewItem<'_>> = owned
                .iter()
                .map(|(key, holder, ttl)| RenewItem {
                    key,
                    holder,
                    ttl: *ttl,
                })
                .collect();
            let renewals = w.locks.renew_many(&items, now);
            for (key, holder, _) in &owned {
                w.observe(&key.redis_key, holder, Op::Other);
            }
            Ok(renewals)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(key: &'a LockKey, holder: &'a str) -> AcquireRequest<'a> {
        AcquireRequest {
            key,
            holder,
            kind: Kind::Exclusive,
            also: &[],
            ttl: Duration::from_secs(1),
            waiter_timeout: Duration::from_secs(1),
            fencing: false,
            first: true,
            waiting: false,
            renew: true,
        }
    }

    fn backend() -> SimBackend {
        SimBackend {
            server: SimServer::new(1, 0, RandomFaults::default()),
            command_timeout: Duration::from_secs(1),
        }
    }

    /// The checks the simulation relies on catch what they are for: a hold
    /// past the natural end of a lease the test ended, and a release that
    /// freed a lease asked for after it was sent.
    #[tokio::test(start_paused = true)]
    async fn the_checks_catch_a_hold_past_a_forced_lease_and_a_late_release() {
        let sim = backend();
        let key = LockKey::new("lock:", "k".to_owned()).expect("a key");
        sim.acquire(&request(&key, "a")).await.expect("granted");
        sim.server.hold_began(&key, "a", Kind::Exclusive);
        sim.server.restart(Duration::from_millis(1), false);
        tokio::time::sleep(Duration::from_millis(999)).await;
        sim.server.hold_ended(&key, "a");
        assert_eq!(sim.server.holds_outside_leases(), Vec::<String>::new());

        sim.acquire(&request(&key, "b")).await.expect("granted");
        sim.server.hold_began(&key, "b", Kind::Exclusive);
        sim.server.restart(Duration::from_millis(1), false);
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        sim.server.hold_ended(&key, "b");
        let found = sim.server.holds_outside_leases();
        assert!(
            found.len() == 1 && found[0].contains("would have had"),
            "{found:?}"
        );

        // A release of `c` delayed past `c`'s next grant frees that grant.
        let late = backend();
        late.acquire(&request(&key, "c")).await.expect("granted");
        late.server.slow_next(1, Duration::from_millis(100));
        let release = {
            let (late, key) = (late.clone(), key.clone());
            tokio::spawn(async move { late.release(&key, "c").await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        late.server.expire(&key.redis_key);
        late.acquire(&request(&key, "c")).await.expect("granted again");
        release.await.expect("join").expect("released");
        let found = late.server.holds_outside_leases();
        assert!(
            found.iter().any(|f| f.contains("freed the lease asked for")),
            "{found:?}"
        );
    }
}
