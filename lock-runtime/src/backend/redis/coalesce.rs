//! Coalescing: concurrent exclusive releases bound for one node go out as
//! one script call per flush.
//!
//! Redis runs commands one at a time on one core, and a script call costs it
//! several times a native command (the call, its arguments, a Lua frame):
//! many tasks releasing their own locks at once would pay that per release.
//! So a few calls are out at a time: a caller that finds a slot free sends
//! its release at once (`release_one.lua`), exactly as without coalescing
//! (a lone caller pays nothing); callers that arrive while every slot is
//! taken queue, and the next flush sends all of them as one call of
//! `coalesced.lua`, each caller woken with its own result. (Acquisitions
//! are not coalesced: a native `SET NX PX` costs the server less than the
//! same `SET` from a script, and the connection already pipelines them.
//! Measured on 2026-11-26 with 64 tasks on their own keys: sending their
//! first `SET`s the same way cut the client's CPU per pair by a sixth and
//! raised the server's by as much, at the same throughput;
//! docs/benchmarks.md.)
//!
//! Calls reach the server in the order their releases were taken: each is
//! first polled, which puts it in the connection's pipeline, under the
//! queue's lock. A caller that stops waiting before its release was taken
//! for a flush takes the release with it, under that lock: once its drop
//! returns, the release was either taken by a flush, whose call was started
//! under that lock before the drop, or is never sent (the lease's drop
//! guard sends it again). So whatever the caller sends next (the next
//! attempt of an acquisition whose give-back timed out) does not race it.
//!
//! Hand-written because no crate batches `redis` commands by key into one
//! script call; the queue is a mutex-guarded map by arrival, held for a
//! push, a take or a caller's leaving.

use std::collections::BTreeMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::task::Poll;

use redis::{RedisError, RedisResult, Script};
use tokio::sync::oneshot;

use super::Connection;
use super::call::ScriptCall;

/// Without the prelude the other scripts share: it needs none of it, and
/// defining it would cost every call.
static COALESCED: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/coalesced.lua")));
/// A release sent alone: `coalesced.lua` for one, with an integer reply.
static RELEASE_ONE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/release_one.lua")));

/// Calls are coalesced on one node (or a Sentinel's master) only, where
/// releases are announced with PUBLISH.
const ANNOUNCE: &str = "publish";

/// The most releases one flush sends: keeps one script call short (the server runs
/// nothing else meanwhile) and its reply small.
const MOST_PER_FLUSH: usize = 128;

/// The most calls out at once. More than one lets the client handle one
/// call's replies while the server runs the next; a few suffice.
const MOST_OUT: usize = 2;

/// The owner-checked release of an exclusive holder, borrowed from its
/// caller until it has to be queued: 1 released, 0 not held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Op<'a> {
    pub(crate) key: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) holder: &'a str,
}

/// A release waiting for a flush, owned, with where its result goes: its
/// key, channel and holder one after the other in one string (one
/// allocation instead of three).
struct Queued {
    text: String,
    key_end: usize,
    channel_end: usize,
    reply: oneshot::Sender<RedisResult<i64>>,
}

#[derive(Default)]
struct Queue {
    /// Calls out (callers' own, and flushes): at `MOST_OUT`, new ops queue.
    out: usize,
    /// By arrival: a flush takes the first, a caller that stops waiting
    /// takes its own out by its number. (A list searched for the caller's
    /// entry cost a search per caller: ten thousand releases given up at
    /// once kept a core busy for minutes.)
    waiting: BTreeMap<u64, Queued>,
    /// The number of the next op to queue.
    arrivals: u64,
}

/// A flush on the wire: it hands back its ops with their results.
type Flight = Pin<Box<dyn Future<Output = (Vec<Queued>, RedisResult<Vec<i64>>)> + Send>>;

pub(crate) struct Coalescer<C> {
    conn: C,
    /// Also orders the calls: a call is first polled (which puts it in the
    /// connection's pipeline) under this lock, so calls reach the server in
    /// the order their ops were taken.
    queue: Mutex<Queue>,
}

enum Start<T> {
    Alone(Poll<T>),
    /// Where the result comes, and the op's number in the queue.
    Queued(oneshot::Receiver<RedisResult<i64>>, u64),
}

impl<C: Connection> Coalescer<C> {
    pub(crate) fn new(conn: C) -> Arc<Self> {
        Arc::new(Coalescer {
            conn,
            queue: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `op`: at once when fewer than `MOST_OUT` calls are out and nobody
    /// queues, else in the next flush.
    pub(crate) async fn run(self: &Arc<Self>, op: Op<'_>) -> RedisResult<i64> {
        let mut conn = self.conn.clone();
        let mut alone = pin!(send_alone(&mut conn, op, ANNOUNCE));
        let start = poll_fn(|cx| {
            let mut queue = self.lock();
            Poll::Ready(if queue.out < MOST_OUT && queue.waiting.is_empty() {
                queue.out += 1;
                Start::Alone(alone.as_mut().poll(cx))
            } else {
                let (reply, result) = oneshot::channel();
                let number = queue.arrivals;
                queue.arrivals += 1;
                queue.waiting.insert(number, Queued::new(op, reply));
                Start::Queued(result, number)
            })
        })
        .await;
        match start {
            Start::Queued(result, number) => {
                let mut waiting = Waiting {
                    coalescer: self,
                    result,
                    number,
                    answered: false,
                };
                let result = (&mut waiting.result).await;
                waiting.answered = true;
                result.unwrap_or_else(|_| Err(flush_lost()))
            }
            Start::Alone(first) => {
                // The call's slot is handed on however this ends, dropped
                // included.
                let _slot = Slot(Arc::clone(self));
                match first {
                    Poll::Ready(result) => result,
                    Poll::Pending => alone.await,
                }
            }
        }
    }

    /// A call ended: its slot goes to a flush of what queued meanwhile, run
    /// by a task of its own (the caller that ended it has its result and goes
    /// on), or is freed.
    fn call_ended(self: &Arc<Self>) {
        let mut queue = self.lock();
        if queue.waiting.is_empty() {
            queue.out -= 1;
            return;
        }
        drop(queue);
        // The slot travels with the flush: if it never runs, or is dropped
        // unfinished (no runtime, or its runtime shut down), the slot is
        // freed there.
        let flusher = Flusher::new(Arc::clone(self));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(flusher.flush_until_empty());
        }
    }
}

/// A queued caller's wait for its flush. Dropped unanswered, it takes its
/// release off the queue under the queue's lock. Without the lock, a flush
/// that had just checked the caller was still waiting could put the
/// release on the wire after the caller's next command: a give-back sent
/// after the acquisition's next attempt would free the lock that attempt
/// took.
struct Waiting<'c, C: Connection> {
    coalescer: &'c Coalescer<C>,
    result: oneshot::Receiver<RedisResult<i64>>,
    number: u64,
    answered: bool,
}

impl<C: Connection> Drop for Waiting<'_, C> {
    fn drop(&mut self) {
        if !self.answered {
            self.result.close();
            self.coalescer.lock().waiting.remove(&self.number);
        }
    }
}

/// A flush task's slot, freed when the task finds the queue empty. Dropped
/// before that (no runtime to run it on, the task was dropped with its
/// runtime, or it panicked), it
/// frees the slot and sends the callers still queued away: the task that was
/// to flush them is gone, and a runtime shutting down takes no new one. They
/// hear that their release was not sent (their locks expire by their ttl);
/// without this they would wait for good, and so would every later release
/// on the connection.
struct Flusher<C: Connection> {
    coalescer: Arc<Coalescer<C>>,
    finished: AtomicBool,
}

impl<C: Connection> Drop for Flusher<C> {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::Relaxed) {
            let mut queue = self.coalescer.lock();
            queue.out -= 1;
            queue.waiting.clear();
        }
    }
}

impl<C: Connection> Flusher<C> {
    fn new(coalescer: Arc<Coalescer<C>>) -> Self {
        Flusher {
            coalescer,
            finished: AtomicBool::new(false),
        }
    }

    /// Sends the queue, flush after flush, until nobody is waiting.
    async fn flush_until_empty(self) {
        let this = &self.coalescer;
        loop {
            let flight = poll_fn(|cx| {
                // Callers that stopped waiting took their ops off the queue
                // as they left (`Waiting`): every op here is awaited.
                let mut queue = this.lock();
                if queue.waiting.is_empty() {
                    // Under the lock that found it empty: a caller arriving
                    // next finds the slot free.
                    queue.out -= 1;
                    self.finished.store(true, Ordering::Relaxed);
                    return Poll::Ready(None);
                }
                let cut = queue.waiting.len().min(MOST_PER_FLUSH);
                let batch: Vec<Queued> = (0..cut)
                    .filter_map(|_| queue.waiting.pop_first().map(|(_, queued)| queued))
                    .collect();
                let mut flight = this.flight(batch);
                let first = flight.as_mut().poll(cx);
                Poll::Ready(Some((flight, first)))
            })
            .await;
            let Some((flight, first)) = flight else { return };
            let (batch, results) = match first {
                Poll::Ready(done) => done,
                Poll::Pending => flight.await,
            };
            answer(batch, results);
        }
    }
}

impl<C: Connection> Coalescer<C> {
    /// The call that carries `batch`, as one call of `coalesced.lua`.
    fn flight(&self, batch: Vec<Queued>) -> Flight {
        let mut conn = self.conn.clone();
        Box::pin(async move {
            let mut call = ScriptCall::new(&COALESCED, 2 * batch.len(), 3 * batch.len() + 1);
            for queued in &batch {
                call.arg(queued.key()).arg(queued.channel());
            }
            call.arg(ANNOUNCE);
            for queued in &batch {
                call.arg(queued.holder());
            }
            let results = call.invoke(&mut conn).await;
            (batch, results)
        })
    }
}

/// Each op's caller gets its own result, or the call's error.
fn answer(batch: Vec<Queued>, results: RedisResult<Vec<i64>>) {
    match results {
        Ok(results) if results.len() == batch.len() => {
            for (queued, result) in batch.into_iter().zip(results) {
                let _ = queued.reply.send(Ok(result));
            }
        }
        Ok(results) => {
            let error = unexpected_reply(batch.len(), results.len());
            for queued in batch {
                let _ = queued.reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for queued in batch {
                let _ = queued.reply.send(Err(error.clone()));
            }
        }
    }
}

/// A call's place among the `MOST_OUT`, handed on when the call ends.
struct Slot<C: Connection>(Arc<Coalescer<C>>);

impl<C: Connection> Drop for Slot<C> {
    fn drop(&mut self) {
        self.0.call_ended();
    }
}

impl Queued {
    fn new(op: Op<'_>, reply: oneshot::Sender<RedisResult<i64>>) -> Self {
        let mut text = String::with_capacity(op.key.len() + op.channel.len() + op.holder.len());
        text.push_str(op.key);
        text.push_str(op.channel);
        text.push_str(op.holder);
        Queued {
            text,
            key_end: op.key.len(),
            channel_end: op.key.len() + op.channel.len(),
            reply,
        }
    }

    fn key(&self) -> &str {
        &self.text[..self.key_end]
    }

    fn channel(&self) -> &str {
        &self.text[self.key_end..self.channel_end]
    }

    fn holder(&self) -> &str {
        &self.text[self.channel_end..]
    }
}

/// One release as its own call (`announce`: 'publish' on one node,
/// 'spublish' on a cluster).
pub(crate) async fn send_alone<C: Connection>(conn: &mut C, op: Op<'_>, announce: &str) -> RedisResult<i64> {
    ScriptCall::new(&RELEASE_ONE, 2, 4)
        .arg(op.key)
        .arg(op.channel)
        .arg(announce)
        .arg(op.holder)
        .invoke(conn)
        .await
}

fn flush_lost() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the release was queued to be sent with others, and the task that was to send them ended first (its runtime shut down)",
    ))
}

fn unexpected_reply(sent: usize, got: usize) -> RedisError {
    RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "coalesced call",
        format!("{got} results for {sent} ops"),
    ))
}
