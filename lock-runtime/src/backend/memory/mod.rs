//! Locks that live in this process: the same semantics as Redis (leases with
//! a TTL on the monotonic clock, owner-checked release and renewal, fencing
//! counters, release wake-ups), for single-process services and for testing
//! code that uses locks. Not distributed: two processes never see each
//! other's locks.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use hashbrown::HashMap;
use hashbrown::hash_map::EntryRef;

use super::contract::{AcquireReply, AcquireRequest, Backend, Failure, LeaderRecord, RenewItem, Renewal};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;
use crate::timing::WRITER_CLAIM;

/// Held locks above which an insertion first sweeps out expired ones, so that
/// leases that were never released cannot grow the map without bound.
const SWEEP_ABOVE: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    held: HashMap<String, Entry>,
    /// Like the Redis fence counters: never expire, never reset.
    fences: HashMap<String, u64>,
    /// Fair locks' waiters, in order.
    lines: HashMap<String, Vec<Waiter>>,
    /// Elections' records, by their lock's key: the holder that wrote it
    /// and the value it proclaimed. Like the fence counters, never expire.
    records: HashMap<String, (String, String)>,
}

/// A fair lock's waiter, and when it loses its place unless it attempts.
#[derive(Debug)]
struct Waiter {
    holder: String,
    lapses: Instant,
}

/// What a key holds, as in Redis: a string for an exclusive lock (or one
/// segment), a set of members for a shared lock.
#[derive(Debug)]
enum Entry {
    Exclusive(Lease),
    /// Readers `r:<id>`, a writer `w:<id>` and writers' claims `q:<id>`; or
    /// permit holders `p:<id>`.
    Shared(Vec<Lease>),
}

#[derive(Debug)]
struct Lease {
    holder: String,
    expires: Instant,
}

impl Entry {
    /// Forgets what has expired; `false` when nothing is left.
    fn prune(&mut self, now: Instant) -> bool {
        match self {
            Entry::Exclusive(lease) => lease.expires > now,
            Entry::Shared(members) => {
                members.retain(|m| m.expires > now);
                !members.is_empty()
            }
        }
    }

    /// What Redis would report at this key, for a conflict.
    fn kind_name(&self) -> &'static str {
        match self {
            Entry::Exclusive(_) => "string",
            Entry::Shared(members) if members.iter().any(|m| is_read_write(&m.holder)) => "read-write lock",
            Entry::Shared(_) => "semaphore",
        }
    }
}

fn is_read_write(member: &str) -> bool {
    member.starts_with("r:") || member.starts_with("w:") || member.starts_with("q:")
}

/// The claim a waiting writer `w:<id>` leaves: `q:<id>`.
fn claim_of(writer: &str) -> Option<String> {
    writer.strip_prefix("w:").map(|id| format!("q:{id}"))
}

fn conflict(key: &LockKey, redis_key: &str, found: &str) -> Failure {
    Failure::permanent(LockError::KeyConflict {
        key: key.name.clone(),
        redis_key: redis_key.to_owned(),
        found_type: found.to_owned(),
    })
}

impl State {
    /// The live entry at `key`, forgetting it if everything in it expired.
    /// One lookup: this runs on every attempt.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        let EntryRef::Occupied(mut slot) = self.held.entry_ref(key) else {
            return None;
        };
        if slot.get_mut().prune(now) {
            return Some(slot.into_mut());
        }
        slot.remove();
        None
    }

    fn insert(&mut self, key: &str, entry: Entry, now: Instant) {
        if self.held.len() >= SWEEP_ABOVE {
            self.held.retain(|_, e| e.prune(now));
        }
        self.held.insert(key.to_owned(), entry);
    }

    fn next_token(&mut self, fence_key: String) -> u64 {
        let counter = self.fences.entry(fence_key).or_insert(0);
        *counter += 1;
        *counter
    }

    fn acquire_exclusive(
        &mut self,
        req: &AcquireRequest<'_>,
        redis_key: &str,
        now: Instant,
    ) -> Result<Option<Duration>, Failure> {
        match self.live(redis_key, now) {
            Some(Entry::Exclusive(lease)) if lease.holder != req.holder => Ok(Some(lease.expires - now)),
            Some(Entry::Exclusive(lease)) => {
                // An earlier attempt of this acquisition got it (as in the
                // script): the token stays, and the lease only lengthens (a
                // late copy of an attempt must not undo an extension).
                lease.expires = lease.expires.max(now + req.ttl);
                Ok(None)
            }
            Some(other) => Err(conflict(req.key, redis_key, other.kind_name())),
            None => {
                let lease = Lease {
                    holder: req.holder.to_owned(),
                    expires: now + req.ttl,
                };
                self.insert(redis_key, Entry::Exclusive(lease), now);
                if req.fencing {
                    self.next_token(format!("{redis_key}:fence"));
                }
                Ok(None)
            }
        }
    }

    fn token(&self, req: &AcquireRequest<'_>, redis_key: &str) -> Option<u64> {
        req.fencing.then(|| {
            self.fences
                .get(&format!("{redis_key}:fence"))
                .copied()
                .unwrap_or(0)
        })
    }

    fn acquire_segment(
        &mut self,
        req: &AcquireRequest<'_>,
        count: u32,
        now: Instant,
    ) -> Result<AcquireReply, Failure> {
        let keys: Vec<String> = req.key.segment_keys(count).collect();
        let mine = keys.iter().position(
            |k| matches!(self.live(k, now), Some(Entry::Exclusive(lease)) if lease.holder == req.holder),
        );
        let mut soonest: Option<Duration> = None;
        for (i, redis_key) in keys.iter().enumerate() {
            if mine.is_some_and(|m| m != i) {
                continue;
            }
            match self.acquire_exclusive(req, redis_key, now) {
                Ok(None) => {
                    return Ok(AcquireReply::Acquired {
                        token: self.token(req, redis_key),
                        segment: u32::try_from(i).ok(),
                    });
                }
                Ok(Some(pttl)) => soonest = Some(soonest.map_or(pttl, |s| s.min(pttl))),
                // Another kind of lock at this segment's key: it never frees
                // for us, but the other segments may.
                Err(_) => {}
            }
        }
        match soonest {
            Some(pttl) => Ok(AcquireReply::Held {
                pttl: Some(pttl),
                claimed: false,
                blocked_by: 0,
            }),
            None => Err(conflict(req.key, &keys[0], "another kind of lock")),
        }
    }

    /// A fair lock, as `acquire_fair.lua` takes it: free and first in line
    /// (lapsed waiters dropped), or wait in line.
    fn acquire_fair(&mut self, req: &AcquireRequest<'_>, now: Instant) -> Result<AcquireReply, Failure> {
        let key = req.key.redis_key.as_str();
        let first = {
            let line = self.lines.entry(key.to_owned()).or_default();
            line.retain(|w| w.lapses > now);
            line.first().map(|w| (w.holder.clone(), w.lapses))
        };
        let in_the_way = match self.live(key, now) {
            Some(Entry::Exclusive(lease)) if lease.holder == req.holder => {
                // An earlier attempt of this acquisition got it.
                lease.expires = lease.expires.max(now + req.ttl);
                self.leave_line(key, req.holder);
                return Ok(AcquireReply::acquired(self.token(req, key)));
            }
            Some(Entry::Exclusive(lease)) => Some(lease.expires - now),
            Some(other) => return Err(conflict(req.key, key, other.kind_name())),
            None => None,
        };
        let pttl = match (in_the_way, &first) {
            (Some(pttl), _) => pttl,
            (None, Some((waiter, lapses))) if waiter != req.holder => *lapses - now,
            (None, _) => {
                let lease = Lease {
                    holder: req.holder.to_owned(),
                    expires: now + req.ttl,
                };
                self.insert(key, Entry::Exclusive(lease), now);
                self.leave_line(key, req.holder);
                if req.fencing {
                    self.next_token(req.key.fence_key());
                }
                return Ok(AcquireReply::acquired(self.token(req, key)));
            }
        };
        if req.waiting {
            let line = self.lines.entry(key.to_owned()).or_default();
            let lapses = now + req.waiter_timeout;
            match line.iter_mut().find(|w| w.holder == req.holder) {
                Some(waiter) => waiter.lapses = lapses,
                None => line.push(Waiter {
                    holder: req.holder.to_owned(),
                    lapses,
                }),
            }
        } else {
            // A last try, or a caller that does not wait: no place kept.
            self.leave_line(key, req.holder);
        }
        Ok(AcquireReply::Held {
            pttl: Some(pttl),
            claimed: req.waiting,
            blocked_by: 0,
        })
    }

    /// `holder` leaves the line of `key`, if it stood in it.
    fn leave_line(&mut self, key: &str, holder: &str) {
        // Every release passes here: with no fair lock waited for, it costs
        // no lookup.
        if self.lines.is_empty() {
            return;
        }
        if let Some(line) = self.lines.get_mut(key) {
            line.retain(|w| w.holder != holder);
            if line.is_empty() {
                self.lines.remove(key);
            }
        }
    }

    /// Every lock of a set, or none, as `acquire_many.lua` takes them.
    fn acquire_set(&mut self, req: &AcquireRequest<'_>, now: Instant) -> Result<AcquireReply, Failure> {
        let set: Vec<&LockKey> = std::iter::once(req.key).chain(req.also).collect();
        for (i, key) in set.iter().enumerate() {
            match self.live(&key.redis_key, now) {
                Some(Entry::Exclusive(lease)) if lease.holder != req.holder => {
                    return Ok(AcquireReply::Held {
                        pttl: Some(lease.expires - now),
                        claimed: false,
                        blocked_by: i,
                    });
                }
                Some(Entry::Shared(_)) => {
                    return Err(conflict(key, &key.redis_key, "another kind of lock"));
                }
                _ => {}
            }
        }
        for key in set {
            // One of ours already (an earlier attempt's) keeps a longer lease.
            let ours = match self.live(&key.redis_key, now) {
                Some(Entry::Exclusive(lease)) => Some(lease.expires),
                _ => None,
            };
            let lease = Lease {
                holder: req.holder.to_owned(),
                expires: ours.unwrap_or(now).max(now + req.ttl),
            };
            self.insert(&key.redis_key, Entry::Exclusive(lease), now);
        }
        Ok(AcquireReply::acquired(None))
    }

    /// A side of a read-write lock (`permits` 0) or a permit of a semaphore,
    /// as `acquire_shared.lua` takes it.
    fn acquire_shared(
        &mut self,
        req: &AcquireRequest<'_>,
        permits: u32,
        now: Instant,
    ) -> Result<AcquireReply, Failure> {
        let redis_key = &req.key.redis_key;
        let read_write = permits == 0;
        let members = match self.live(redis_key, now) {
            None => {
                self.insert(redis_key, Entry::Shared(Vec::new()), now);
                match self.held.get_mut(redis_key.as_str()) {
                    Some(Entry::Shared(members)) => members,
                    _ => unreachable!("just inserted"),
                }
            }
            Some(Entry::Shared(members))
                if members.iter().all(|m| is_read_write(&m.holder) == read_write) =>
            {
                members
            }
            Some(other) => return Err(conflict(req.key, redis_key, other.kind_name())),
        };
        let side = req.holder.as_bytes().first().copied();
        let mine = members.iter().find(|m| m.holder == req.holder).map(|m| m.expires);
        // Ascending by lease end, like the sorted set: the first member in
        // the way ends soonest.
        members.sort_by_key(|m| m.expires);
        let blocker = if mine.is_some() {
            None
        } else if read_write {
            members.iter().find(|m| {
                let other = m.holder.as_bytes().first().copied();
                // A reader yields to a writer and to a claim; a writer to
                // every holder, but not to another writer's claim.
                if side == Some(b'r') {
                    other != Some(b'r')
                } else {
                    other != Some(b'q')
                }
            })
        } else {
            (members.len() >= usize::try_from(permits).unwrap_or(usize::MAX)).then(|| &members[0])
        };
        if let Some(blocker) = blocker {
            let pttl = blocker.expires - now;
            let claim = claim_of(req.holder).filter(|_| req.waiting);
            let claimed = claim.is_some();
            if let Some(claim) = claim {
                members.retain(|m| m.holder != claim);
                members.push(Lease {
                    holder: claim,
                    expires: now + WRITER_CLAIM,
                });
            }
            return Ok(AcquireReply::Held {
                pttl: Some(pttl),
                claimed,
                blocked_by: 0,
            });
        }
        let claim = claim_of(req.holder);
        members.retain(|m| m.holder != req.holder && Some(&m.holder) != claim.as_ref());
        members.push(Lease {
            holder: req.holder.to_owned(),
            // Never shorter than the lease an earlier attempt got.
            expires: mine.unwrap_or(now).max(now + req.ttl),
        });
        let token = match (req.fencing, mine) {
            (false, _) => None,
            (true, Some(_)) => self.token(req, redis_key),
            (true, None) => Some(self.next_token(req.key.fence_key())),
        };
        Ok(AcquireReply::acquired(token))
    }

    fn release(&mut self, key: &str, holder: &str, now: Instant) -> bool {
        self.leave_line(key, holder);
        let EntryRef::Occupied(mut slot) = self.held.entry_ref(key) else {
            return false;
        };
        let released = match slot.get_mut() {
            Entry::Exclusive(lease) => {
                let owned = lease.holder == holder && lease.expires > now;
                if owned {
                    slot.remove();
                }
                return owned;
            }
            Entry::Shared(members) => {
                let released = members.iter().any(|m| m.holder == holder && m.expires > now);
                let claim = claim_of(holder);
                members.retain(|m| m.holder != holder && Some(&m.holder) != claim.as_ref());
                released
            }
        };
        self.live(key, now);
        released
    }

    fn renew(&mut self, key: &str, holder: &str, ttl: Duration, now: Instant) -> bool {
        let lease = match self.live(key, now) {
            Some(Entry::Exclusive(lease)) if lease.holder == holder => lease,
            Some(Entry::Shared(members)) => match members.iter_mut().find(|m| m.holder == holder) {
                Some(member) => member,
                None => return false,
            },
            _ => return false,
        };
        lease.expires = lease.expires.max(now + ttl);
        true
    }
}

/// The operations as a server applies them at its instant `now`: the
/// in-process backend's, and the simulated server's (`sim.rs`), whose clock
/// may run at another rate.
impl State {
    pub(crate) fn acquire(
        &mut self,
        req: &AcquireRequest<'_>,
        now: Instant,
    ) -> Result<AcquireReply, Failure> {
        match req.kind {
            Kind::Exclusive if !req.also.is_empty() => self.acquire_set(req, now),
            Kind::Exclusive => Ok(match self.acquire_exclusive(req, &req.key.redis_key, now)? {
                Some(pttl) => AcquireReply::Held {
                    pttl: Some(pttl),
                    claimed: false,
                    blocked_by: 0,
                },
                None => AcquireReply::acquired(self.token(req, &req.key.redis_key)),
            }),
            Kind::Segments(n) => self.acquire_segment(req, n, now),
            Kind::Read | Kind::Write => self.acquire_shared(req, 0, now),
            Kind::Permits(n) => self.acquire_shared(req, n, now),
            Kind::Fair => self.acquire_fair(req, now),
        }
    }

    pub(crate) fn release_key(&mut self, key: &LockKey, holder: &str, now: Instant) -> bool {
        self.release(&key.redis_key, holder, now)
    }

    pub(crate) fn release_many(&mut self, keys: &[LockKey], holder: &str, now: Instant) -> bool {
        let mut released = false;
        for key in keys {
            released |= self.release(&key.redis_key, holder, now);
        }
        released
    }

    pub(crate) fn release_segments(&mut self, key: &LockKey, count: u32, holder: &str, now: Instant) -> bool {
        let mut released = false;
        for segment in key.segment_keys(count) {
            released |= self.release(&segment, holder, now);
        }
        released
    }

    /// Sets the exclusive lock's lease to end `left` after `now` if
    /// `holder` still has it (`AnyBackend::keep`).
    pub(crate) fn keep(&mut self, key: &LockKey, holder: &str, left: Duration, now: Instant) -> bool {
        match self.live(&key.redis_key, now) {
            Some(Entry::Exclusive(lease)) if lease.holder == holder => {
                lease.expires = now + left;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn renew_key(&mut self, key: &LockKey, holder: &str, ttl: Duration, now: Instant) -> bool {
        self.renew(&key.redis_key, holder, ttl, now)
    }

    pub(crate) fn renew_many(&mut self, items: &[RenewItem<'_>], now: Instant) -> Vec<Renewal> {
        items
            .iter()
            .map(|item| self.renew(&item.key.redis_key, item.holder, item.ttl, now).into())
            .collect()
    }

    /// Records `value` as what the leader `holder` of the election `key`
    /// proclaims, if it still holds the election's lock.
    pub(crate) fn proclaim(&mut self, key: &LockKey, holder: &str, value: &str, now: Instant) -> bool {
        match self.live(&key.redis_key, now) {
            Some(Entry::Exclusive(lease)) if lease.holder == holder => {
                self.records
                    .insert(key.redis_key.clone(), (holder.to_owned(), value.to_owned()));
                true
            }
            _ => false,
        }
    }

    /// Who leads the election `key` now, if anyone.
    pub(crate) fn leader(&mut self, key: &LockKey, now: Instant) -> Option<LeaderRecord> {
        let (holder, left) = match self.live(&key.redis_key, now)? {
            Entry::Exclusive(lease) => (lease.holder.clone(), lease.expires - now),
            Entry::Shared(_) => return None,
        };
        let epoch = self.fences.get(&key.fence_key()).copied().unwrap_or(0);
        let value = self
            .records
            .get(&key.redis_key)
            .filter(|(by, _)| *by == holder)
            .map(|(_, value)| value.clone());
        Some(LeaderRecord {
            holder,
            epoch,
            value,
            left: Some(left),
        })
    }

    /// When `holder`'s lease at `redis_key` ends, if it holds one now.
    #[cfg(feature = "testing")]
    pub(crate) fn lease_of(&mut self, redis_key: &str, holder: &str, now: Instant) -> Option<Instant> {
        match self.live(redis_key, now)? {
            Entry::Exclusive(lease) => (lease.holder == holder).then_some(lease.expires),
            Entry::Shared(members) => members.iter().find(|m| m.holder == holder).map(|m| m.expires),
        }
    }

    /// Who holds `redis_key` now, with when each lease ends.
    #[cfg(feature = "testing")]
    pub(crate) fn holders(&mut self, redis_key: &str, now: Instant) -> Vec<(String, Instant)> {
        match self.live(redis_key, now) {
            None => Vec::new(),
            Some(Entry::Exclusive(lease)) => vec![(lease.holder.clone(), lease.expires)],
            Some(Entry::Shared(members)) => members.iter().map(|m| (m.holder.clone(), m.expires)).collect(),
        }
    }

    /// Drops whatever is at `redis_key`, as a lease expiring would.
    #[cfg(feature = "testing")]
    pub(crate) fn forget(&mut self, redis_key: &str) {
        self.held.remove(redis_key);
    }

    /// Gives the exclusive lock at `redis_key` to `holder` until `expires`,
    /// with the next fencing token: what another client's grant after a
    /// lost lease would do.
    #[cfg(feature = "testing")]
    pub(crate) fn take_over(&mut self, redis_key: &str, holder: &str, expires: Instant) -> u64 {
        self.held.insert(
            redis_key.to_owned(),
            Entry::Exclusive(Lease {
                holder: holder.to_owned(),
                expires,
            }),
        );
        self.next_token(format!("{redis_key}:fence"))
    }

    /// Gives the exclusive lock at `redis_key` from `from`, if its lease
    /// is still `from`'s, to `to` until `expires`: a handoff. The fencing
    /// token `to` gets, or `None` if `from` no longer had it.
    #[cfg(feature = "testing")]
    pub(crate) fn hand_over(
        &mut self,
        redis_key: &str,
        from: &str,
        to: &str,
        expires: Instant,
        now: Instant,
    ) -> Option<u64> {
        match self.held.get(redis_key) {
            Some(Entry::Exclusive(lease)) if lease.holder == from && lease.expires > now => {
                Some(self.take_over(redis_key, to, expires))
            }
            _ => None,
        }
    }
}

impl MemoryBackend {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `AnyBackend::proclaim`, answered within the call.
    pub(crate) fn proclaim(&self, key: &LockKey, holder: &str, value: &str) -> bool {
        self.state().proclaim(key, holder, value, Instant::now())
    }

    /// `AnyBackend::leader`, answered within the call.
    pub(crate) fn leader(&self, key: &LockKey) -> Option<LeaderRecord> {
        self.state().leader(key, Instant::now())
    }

    /// `AnyBackend::keep`, answered within the call.
    pub(crate) fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> bool {
        self.state().keep(key, holder, left, Instant::now())
    }

    /// An acquire, answered within the call (`AnyBackend::acquire_at_once`).
    pub(crate) fn acquire_now(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        self.state().acquire(req, Instant::now())
    }
}

impl Backend for MemoryBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        self.acquire_now(req)
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        Ok(self.state().release_key(key, holder, Instant::now()))
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        Ok(self.state().release_many(keys, holder, Instant::now()))
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        Ok(self.state().release_segments(key, count, holder, Instant::now()))
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        Ok(self.state().renew_key(key, holder, ttl, Instant::now()))
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        Ok(self.state().renew_many(items, Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LockKey {
        LockKey::new("lock:", name.to_owned()).expect("valid key")
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn request<'a>(key: &'a LockKey, holder: &'a str, ttl_ms: u64, fencing: bool) -> AcquireRequest<'a> {
        AcquireRequest {
            key,
            holder,
            kind: Kind::Exclusive,
            also: &[],
            waiter_timeout: Duration::from_secs(2),
            ttl: Duration::from_millis(ttl_ms),
            fencing,
            first: true,
            waiting: false,
            renew: true,
        }
    }

    /// A late copy of an earlier attempt, or a renewal sent before an
    /// extension and landing after it, must not shorten the lease the
    /// holder already counts on (the simulation's seeds 1535 and 1787).
    #[test]
    fn renewals_and_repeated_attempts_never_shorten_a_lease() {
        let k = key("k");
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        let exclusive = |holder, ttl_ms| request(&k, holder, ttl_ms, false);
        let read = |holder, ttl_ms| AcquireRequest {
            kind: Kind::Read,
            ..request(&k, holder, ttl_ms, false)
        };
        let write = |holder, ttl_ms| AcquireRequest {
            kind: Kind::Write,
            ..request(&k, holder, ttl_ms, false)
        };
        for (long, short, rival) in [
            (
                exclusive("a:1", 30_000),
                exclusive("a:1", 100),
                exclusive("b:1", 100),
            ),
            (read("r:a:1", 30_000), read("r:a:1", 100), write("w:b:1", 100)),
        ] {
            let mut state = State::default();
            assert!(matches!(
                state.acquire(&long, now),
                Ok(AcquireReply::Acquired { .. })
            ));
            assert!(matches!(
                state.acquire(&short, now),
                Ok(AcquireReply::Acquired { .. })
            ));
            assert!(state.renew_key(&k, long.holder, Duration::from_millis(100), now));
            assert_eq!(
                state.renew_many(
                    &[RenewItem {
                        key: &k,
                        holder: long.holder,
                        ttl: Duration::from_millis(100)
                    }],
                    now
                ),
                [Renewal::Renewed]
            );
            assert!(
                matches!(state.acquire(&rival, later), Ok(AcquireReply::Held { .. })),
                "{}: the 30 s lease was shortened",
                long.holder
            );
        }
    }

    #[test]
    fn owner_checks_expiry_and_fences_match_the_redis_scripts() {
        block_on(async {
            let backend = MemoryBackend::default();
            let k = key("k");
            let first = backend.acquire(&request(&k, "a:1", 50, true)).await.expect("ok");
            assert_eq!(first, AcquireReply::acquired(Some(1)));
            // Someone else waits; the same holder retrying gets it again.
            assert!(matches!(
                backend.acquire(&request(&k, "b:1", 50, true)).await.expect("ok"),
                AcquireReply::Held { pttl: Some(_), .. }
            ));
            assert_eq!(
                backend.acquire(&request(&k, "a:1", 50, true)).await.expect("ok"),
                AcquireReply::acquired(Some(1))
            );
            // Only the owner releases or renews.
            assert!(!backend.release(&k, "b:1").await.expect("ok"));
            assert!(
                !backend
                    .renew(&k, "b:1", Duration::from_secs(1))
                    .await
                    .expect("ok")
            );
            assert!(
                backend
                    .renew(&k, "a:1", Duration::from_millis(30))
                    .await
                    .expect("ok")
            );
            assert!(backend.release(&k, "a:1").await.expect("ok"));
            assert!(!backend.release(&k, "a:1").await.expect("ok"), "double release");
            // A fresh acquisition gets the next token; an expired one frees.
            let again = backend.acquire(&request(&k, "b:1", 5, true)).await.expect("ok");
            assert_eq!(again, AcquireReply::acquired(Some(2)));
            std::thread::sleep(Duration::from_millis(10));
            assert!(
                !backend
                    .renew(&k, "b:1", Duration::from_secs(1))
                    .await
                    .expect("ok")
            );
            let third = backend.acquire(&request(&k, "c:1", 50, false)).await.expect("ok");
            assert_eq!(third, AcquireReply::acquired(None));
        });
    }
}
