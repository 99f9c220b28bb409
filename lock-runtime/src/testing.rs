//! A test kit (feature `testing`): a lock server simulated in the process,
//! on tokio's clock, with faults a test injects, for testing code that
//! takes locks (a lost lock, a stolen lease, a slow or paused server)
//! without running a server. See `docs/testing.md`.
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::{LockError, LostReason, testing};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let (locks, sim) = testing::simulated(7);
//! let guard = locks.lock("report").ttl(Duration::from_secs(10)).acquire().await.unwrap();
//! sim.steal("report");
//! // The watchdog's next renewal finds the lock taken.
//! assert_eq!(guard.lost().await, LostReason::TakenOver);
//! # }
//! ```
//!
//! Run such tests on a current-thread runtime with the clock paused
//! (`#[tokio::test(start_paused = true)]`): time then moves only when every
//! task waits, so a 30 s lease runs out in microseconds and a seed gives
//! the same history every run.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::AnyBackend;
use crate::backend::sim::{RandomFaults, SimBackend, SimServer};
pub use crate::backend::sim::{SimEvent, SimEventKind};
use crate::client::{LockClient, LockClientBuilder};
use crate::entropy::Entropy;
use crate::key::LockKey;
use crate::waiter::Notifier;

tokio::task_local! {
    static CLIENT: LockClient;
}

/// How a simulated server and the way to it behave.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SimOptions {
    clock_rate_ppm: i64,
    faults: RandomFaults,
}

impl SimOptions {
    /// A server whose clock runs at the client's rate, no random faults.
    pub fn new() -> Self {
        SimOptions::default()
    }

    /// The server's clock runs this many parts per million faster than the
    /// client's (negative: slower). The client allows for 1% (10,000).
    pub fn server_clock_faster_ppm(mut self, ppm: i64) -> Self {
        self.clock_rate_ppm = ppm;
        self
    }

    /// Each request and each reply is delayed by a random time up to `max`.
    pub fn random_delay(mut self, max: Duration) -> Self {
        self.faults.max_delay = max;
        self
    }

    /// Out of 1,000 requests, this many are refused (not applied).
    pub fn random_refusals(mut self, per_mille: u32) -> Self {
        self.faults.refused_per_mille = per_mille.min(1000);
        self
    }

    /// Out of 1,000 requests, this many are applied and their reply lost.
    pub fn random_lost_replies(mut self, per_mille: u32) -> Self {
        self.faults.lost_reply_per_mille = per_mille.min(1000 - self.faults.refused_per_mille);
        self
    }

    /// Out of 1,000 requests, this many are applied twice: a copy lands
    /// after the first and before the reply reaches the caller (a driver's
    /// resend on its connection), its reply unread.
    pub fn random_duplicates(mut self, per_mille: u32) -> Self {
        self.faults.duplicated_per_mille = per_mille.min(1000);
        self
    }

    /// Out of 1,000 replies, this many are stale: the request is applied
    /// when it lands, and its reply then takes a random time up to `max`
    /// longer on its way back (a reply queued behind others on a busy
    /// connection, a slow network back), so that the grant or renewal it
    /// reports is that old when it arrives.
    pub fn random_stale_replies(mut self, per_mille: u32, max: Duration) -> Self {
        self.faults.stale_per_mille = per_mille.min(1000);
        self.faults.max_stale = max;
        self
    }
}

/// A client of a new simulated server, and the control of that server.
/// Every holder id, retry jitter and random fault comes from `seed`.
pub fn simulated(seed: u64) -> (LockClient, SimControl) {
    simulated_with(seed, SimOptions::default())
}

/// [`simulated`] with a server clock's rate and random faults.
pub fn simulated_with(seed: u64, options: SimOptions) -> (LockClient, SimControl) {
    let control = SimControl {
        server: SimServer::new(seed, options.clock_rate_ppm, options.faults),
        notifier: Notifier::local(),
        seed,
        clients: Arc::new(AtomicU64::new(0)),
    };
    (control.client(), control)
}

/// The control of a simulated server: more clients, faults, and what the
/// server saw.
#[derive(Debug, Clone)]
pub struct SimControl {
    server: Arc<SimServer>,
    /// Shared by the server's clients: a release wakes every client's
    /// waiters, as a server's announcement would.
    notifier: Arc<Notifier>,
    seed: u64,
    clients: Arc<AtomicU64>,
}

impl SimControl {
    /// The seed this simulation draws from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Another client of the same server, with holder ids of its own: the
    /// service's other replica.
    pub fn client(&self) -> LockClient {
        self.client_with(LockClient::builder())
    }

    /// Another client of the same server, with the builder's options (key
    /// prefix, default ttl and wait, retry and command timeouts).
    pub fn client_with(&self, builder: LockClientBuilder) -> LockClient {
        let n = self.clients.fetch_add(1, Ordering::Relaxed);
        let command_timeout = builder.config.command_timeout;
        builder.build_with(
            AnyBackend::Sim(SimBackend {
                server: Arc::clone(&self.server),
                command_timeout,
            }),
            Arc::clone(&self.notifier),
            "simulated".into(),
            Entropy::seeded(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        )
    }

    /// The server drops the lock `key` now, as if its lease ran out: its
    /// holder finds out at its next renewal. Whether anyone held it. `key`
    /// is the name your code locks (a segmented lock's segment is
    /// `key#i`), under the default prefix `lock:`.
    pub fn expire(&self, key: &str) -> bool {
        !self.server.expire(&stored(key)).is_empty()
    }

    /// Another holder takes the lock `key` over now, for what was left of
    /// the lease it replaces (30 s if it was free), with the next fencing
    /// token: its holder finds out at its next renewal. The thief holds it
    /// as an exclusive lock: a read-write lock's or a semaphore's key taken
    /// over this way refuses its other clients (`KeyConflict`) until the
    /// thief's lease ends.
    pub fn steal(&self, key: &str) {
        self.server.steal(&stored(key), Duration::from_secs(30));
    }

    /// The next `n` requests are refused unapplied (a transient error).
    pub fn fail_next(&self, n: u32) {
        self.server.refuse_next(n);
    }

    /// The next `n` requests are applied, and their replies lost: the
    /// client sees a transient error for a request that did happen.
    pub fn lose_replies(&self, n: u32) {
        self.server.lose_replies(n);
    }

    /// The next `n` requests are applied, and their connections break
    /// before the replies come back: the client sees a broken connection
    /// (and reconnects) for a request that did happen.
    pub fn cut_replies(&self, n: u32) {
        self.server.cut_replies(n);
    }

    /// The next `n` requests take `by` longer on their way to the server:
    /// a request sent after them can overtake them (another connection).
    pub fn delay_next(&self, n: u32, by: Duration) {
        self.server.slow_next(n, by);
    }

    /// The next `n` requests that land are applied once more before their
    /// replies reach their callers, as a driver's resent copy would be;
    /// the copies' replies go nowhere.
    pub fn duplicate_next(&self, n: u32) {
        self.server.duplicate_next(n);
    }

    /// The next `n` requests are applied when they land, and their replies
    /// take `by` longer on their way back: what a stale reply says (a
    /// grant, a renewal) is that old when its caller reads it, if its
    /// caller still waits for it (a command timeout shorter than `by`
    /// makes it a lost reply).
    pub fn delay_replies(&self, n: u32, by: Duration) {
        self.server.stale_next(n, by);
    }

    /// From now, every request and every reply takes `each_way` longer.
    pub fn delay(&self, each_way: Duration) {
        self.server.set_delay(each_way);
    }

    /// The server answers nothing for `d`, while its clock runs on; what
    /// was sent meanwhile is applied when it wakes, whether or not its
    /// caller still waits (a request given up on by a command timeout
    /// lands all the same, as on a real connection).
    pub fn pause(&self, d: Duration) {
        self.server.pause(d);
    }

    /// The server goes down now and is back after `down`, with every lease
    /// and fencing counter it had (as a server that persists its data
    /// would be): requests in flight and replies on their way are lost
    /// with their connections, requests sent while it is down are turned
    /// away (the client reconnects and tries again). Its clock ran on, so
    /// leases not renewed meanwhile have run out.
    pub fn restart(&self, down: Duration) {
        self.server.restart(down, true);
    }

    /// [`restart`](Self::restart), and the server comes back empty: every
    /// lease and fencing counter is gone (a Redis without persistence).
    /// Another client can take a lock whose holder still believes it holds
    /// it until its next renewal; [`assert_leases_respected`](Self::assert_leases_respected)
    /// checks that the holder stopped by the end its lease would have had,
    /// and [`assert_no_overlap`](Self::assert_no_overlap) leaves such holds out.
    pub fn restart_without_state(&self, down: Duration) {
        self.server.restart(down, false);
    }

    /// Every grant, renewal, release, forced end and fault, and each
    /// client's holds, with the server's times: the same for the same seed
    /// and the same calls on a current-thread runtime.
    pub fn history(&self) -> Vec<SimEvent> {
        self.server.history()
    }

    /// Panics if two clients held one lock at once where its kind allows
    /// no overlap (an exclusive lock, a writer; more holders than permits),
    /// judged on the server's clock. A hold whose lease the test ended
    /// ([`expire`](Self::expire), [`steal`](Self::steal),
    /// [`restart_without_state`](Self::restart_without_state)) is left out:
    /// its holder can only learn of the loss at its next renewal, and
    /// [`assert_leases_respected`](Self::assert_leases_respected) judges it.
    pub fn assert_no_overlap(&self) {
        let found = self.server.overlaps();
        assert!(
            found.is_empty(),
            "seed {}: overlapping holds:\n{}",
            self.seed,
            found.join("\n")
        );
    }

    /// Panics if a client held a lock outside the lease the server gave it,
    /// on the server's clock: a body that ran on after its lease ended. A
    /// lease the test ended ([`expire`](Self::expire),
    /// [`steal`](Self::steal), [`restart_without_state`](Self::restart_without_state))
    /// is judged by the end it would have had: its holder must have
    /// stopped by then. Also panics if a release (late, or sent twice)
    /// freed a lease asked for after it was sent.
    pub fn assert_leases_respected(&self) {
        let found = self.server.holds_outside_leases();
        assert!(
            found.is_empty(),
            "seed {}: holds outside their leases:\n{}",
            self.seed,
            found.join("\n")
        );
    }
}

/// The key as the simulated server stores it, with the default prefix; a
/// segment `K#i` is stored as the segment of `K`'s key (`lock:{K}#i`).
fn stored(key: &str) -> String {
    let prefix = crate::config::ClientConfig::default().prefix;
    let segment = key
        .rsplit_once('#')
        .and_then(|(base, i)| Some((base, i.parse::<u32>().ok()?)));
    let found = match segment {
        Some((base, i)) => LockKey::new(&prefix, base.to_owned()).map(|k| k.segment(i)),
        None => LockKey::new(&prefix, key.to_owned()),
    };
    found.map(|k| k.redis_key).unwrap_or_else(|_| key.to_owned())
}

/// Runs `fut` with `client` as the client of the `#[distributed_lock]`
/// functions it calls, in place of the one [`init`](crate::init) installed:
/// a test can call a service's locked functions against a simulated server
/// (`init` takes one client per process). For that task only: a task
/// `fut` spawns uses the global client unless it is wrapped too.
pub async fn with_client<F: Future>(client: LockClient, fut: F) -> F::Output {
    CLIENT.scope(client, fut).await
}

/// The client [`with_client`] set for the running task.
pub(crate) fn scoped_client() -> Option<LockClient> {
    CLIENT.try_with(LockClient::clone).ok()
}
