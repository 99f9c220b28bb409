//! Waking waiters when a lock is released, instead of only polling.
//!
//! Each client keeps one subscription connection. A lock's release channel is
//! subscribed while at least one local waiter wants it and unsubscribed when
//! the last one leaves. A release by this process wakes its local waiters
//! directly; a release elsewhere arrives as a message. Pub/sub delivers at
//! most once (a dropped connection loses messages), so waiters still re-poll
//! at `min(remaining lease, POLL)`: a lost message costs latency, never
//! correctness.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use redis::RedisResult;
use tokio::sync::Notify;

use crate::backend::redis::Topology;
use crate::backend::redis::cluster::cluster_builder;
use crate::drop_guard::{Cleanup, DropGuard};
use crate::error::LockError;
use crate::handoff::{MOST_IN_A_ROW, Offer, OfferHandle, TakenOffer};

/// The longest a waiter sleeps between attempts while subscribed.
pub(crate) const POLL: Duration = Duration::from_millis(200);

#[derive(Debug)]
pub(crate) struct Notifier {
    channels: Mutex<HashMap<String, Channel>>,
    /// Serialises SUBSCRIBE/UNSUBSCRIBE so they reach the server in the order
    /// the waiter counts changed.
    sink: tokio::sync::Mutex<Option<Sink>>,
    /// Where to open the subscription connection; `None`: local wake-ups only.
    transport: Option<Topology>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Offers queued on all channels, so that a release with nobody
    /// waiting here skips the channel table.
    queued_offers: AtomicUsize,
}

#[derive(Debug)]
struct Channel {
    waiters: usize,
    notify: Arc<Notify>,
    /// Fair waiters, each woken by its own name: a fair lock's release
    /// announces the one waiter first in line.
    named: HashMap<String, Arc<Notify>>,
    /// Waiters here ready to be handed the lock, first come first served
    /// (withdrawn ones are skipped when reached).
    offers: VecDeque<Arc<Offer>>,
}

/// A waiter's interest in one channel; dropping it withdraws the interest.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) notify: Arc<Notify>,
    _leave: DropGuard<Leave>,
}

/// Withdrawing one waiter's interest: counted at once, and the last waiter
/// of a channel unsubscribes from a spawned task.
#[derive(Debug)]
struct Leave {
    notifier: Arc<Notifier>,
    channel: String,
    /// A fair waiter's name.
    name: Option<String>,
}

impl Cleanup for Leave {
    fn needed(&mut self) -> bool {
        let mut channels = self
            .notifier
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match channels.get_mut(&self.channel) {
            Some(c) => {
                if let Some(name) = &self.name {
                    c.named.remove(name);
                }
                c.waiters -= 1;
                let last = c.waiters == 0;
                if last && let Some(gone) = channels.remove(&self.channel) {
                    self.notifier
                        .queued_offers
                        .fetch_sub(gone.offers.len(), Ordering::Relaxed);
                }
                last
            }
            None => false,
        }
    }

    async fn run(&self) -> Result<(), LockError> {
        self.notifier.sync_subscription(&self.channel).await;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("unsubscribing from `{}`", self.channel)
    }
}

impl Notifier {
    pub(crate) fn new(transport: Option<Topology>) -> Arc<Self> {
        Arc::new(Notifier {
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            transport,
            task: Mutex::new(None),
            queued_offers: AtomicUsize::new(0),
        })
    }

    /// Leaves a waiter's standing offer to be handed the lock of `channel`
    /// (see `handoff.rs`); `None` if the waiter is not watching it.
    pub(crate) fn offer(
        &self,
        channel: &str,
        holder: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Option<OfferHandle> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let c = channels.get_mut(channel)?;
        let (offer, handle) = Offer::new(holder, ttl, fencing);
        c.offers.push_back(offer);
        self.queued_offers.fetch_add(1, Ordering::Relaxed);
        Some(handle)
    }

    /// Whether waiters here have offers standing for the lock of `channel`
    /// (withdrawn ones may still be queued: a hint, not a promise).
    pub(crate) fn has_offers(&self, channel: &str) -> bool {
        if self.queued_offers.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.get(channel).is_some_and(|c| !c.offers.is_empty())
    }

    /// The first open offer for the lock of `channel`, taken, unless the
    /// lease releasing it was handed over [`MOST_IN_A_ROW`] times in a row
    /// (`handed_in_row`) already: then this release goes through the
    /// server.
    pub(crate) fn take_offer(&self, channel: &str, handed_in_row: u32) -> Option<TakenOffer> {
        if handed_in_row >= MOST_IN_A_ROW || self.queued_offers.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let c = channels.get_mut(channel)?;
        while let Some(offer) = c.offers.pop_front() {
            self.queued_offers.fetch_sub(1, Ordering::Relaxed);
            if let Some(taken) = offer.take() {
                return Some(taken);
            }
        }
        None
    }

    /// Wakes the waiters an announcement on `channel` may let in: the fair
    /// waiter it names (a fair lock announces the next in line), every
    /// waiter after a writer's release (readers may all go), else one: one
    /// release lets one holder in, and waking them all would send a herd of
    /// attempts that all but one lose. If the woken waiter is gone before it
    /// looks, tokio hands the wake-up to the next one; if it loses to
    /// another process, it waits for the next release like the rest.
    pub(crate) fn released_by(&self, channel: &str, named: &str) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(c) = channels.get(channel) else {
            return;
        };
        if let Some(waiter) = c.named.get(named) {
            waiter.notify_one();
        } else if named.starts_with("w:") {
            c.notify.notify_waiters();
            // And one stored wake-up, for a waiter between two attempts.
            c.notify.notify_one();
        } else {
            c.notify.notify_one();
        }
    }

    /// Wakes every fair waiter of `channel` in this process, where no
    /// server names the next (the in-process backend): each looks again,
    /// and the one first in line gets the lock.
    pub(crate) fn wake_line(&self, channel: &str) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = channels.get(channel) {
            for waiter in c.named.values() {
                waiter.notify_one();
            }
        }
    }

    /// Announcements may have been missed (the connection that hears them
    /// was down): every waiter here looks again.
    #[cfg(feature = "postgres")]
    pub(crate) fn wake_all(&self) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        for c in channels.values() {
            c.notify.notify_waiters();
            for waiter in c.named.values() {
                waiter.notify_one();
            }
        }
    }

    /// Registers a waiter on `channel`, subscribing if it is the first.
    /// Returns once the subscription is confirmed (or known to be down).
    pub(crate) async fn watch(self: &Arc<Self>, channel: &str) -> Watch {
        self.watch_named(channel, None).await
    }

    /// Registers a fair waiter, woken only when an announcement names it.
    pub(crate) async fn watch_as(self: &Arc<Self>, channel: &str, name: &str) -> Watch {
        self.watch_named(channel, Some(name)).await
    }

    async fn watch_named(self: &Arc<Self>, channel: &str, name: Option<&str>) -> Watch {
        let (notify, first) = {
            let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Channel {
                waiters: 0,
                notify: Arc::new(Notify::new()),
                named: HashMap::new(),
                offers: VecDeque::new(),
            });
            entry.waiters += 1;
            let notify = match name {
                Some(name) => Arc::clone(entry.named.entry(name.to_owned()).or_default()),
                None => Arc::clone(&entry.notify),
            };
            (notify, entry.waiters == 1)
        };
        if first {
            self.sync_subscription(channel).await;
        }
        Watch {
            notify,
            _leave: DropGuard::new(Leave {
                notifier: Arc::clone(self),
                channel: channel.to_owned(),
                name: name.map(str::to_owned),
            }),
        }
    }

    fn wanted(&self, channel: &str) -> bool {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.get(channel).is_some_and(|c| c.waiters > 0)
    }

    fn wanted_channels(&self) -> Vec<String> {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.keys().cloned().collect()
    }

    /// Brings the server's subscription for `channel` in line with whether
    /// anyone here waits on it, connecting first if needed. On failure the
    /// connection is dropped, to be opened again by the next change; waiters
    /// poll meanwhile.
    async fn sync_subscription(self: &Arc<Self>, channel: &str) {
        let mut slot = self.sink.lock().await;
        let Some(sink) = slot.as_mut() else {
            if !self.wanted(channel) {
                // Nothing to unsubscribe from without a connection.
                return;
            }
            // A new connection subscribes to every wanted channel, this one
            // included.
            if let Some(stream) = self.connect(&mut slot).await {
                let reader = tokio::spawn(read_notifications(Arc::downgrade(self), stream));
                if let Some(old) = self
                    .task
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .replace(reader)
                {
                    old.abort();
                }
            }
            return;
        };
        let result = if self.wanted(channel) {
            sink.subscribe(&[channel.to_owned()]).await
        } else {
            sink.unsubscribe(channel).await
        };
        if let Err(e) = result {
            tracing::debug!(%channel, error = %e, "subscription change failed; waiters poll");
            *slot = None;
        }
    }

    /// Opens the subscription connection and subscribes to every wanted
    /// channel; returns the stream of announced channel names.
    async fn connect(&self, slot: &mut Option<Sink>) -> Option<Messages> {
        let topology = self.transport.as_ref()?;
        let (mut sink, stream) = match open_subscription(topology).await {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "subscription connection failed; waiters poll");
                return None;
            }
        };
        let wanted = self.wanted_channels();
        if !wanted.is_empty()
            && let Err(e) = sink.subscribe(&wanted).await
        {
            tracing::debug!(error = %e, "subscribe failed; waiters poll");
            return None;
        }
        *slot = Some(sink);
        Some(stream)
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

/// Turns messages into wake-ups; when the connection drops, reconnects for
/// as long as anyone waits.
async fn read_notifications(notifier: Weak<Notifier>, mut stream: Messages) {
    loop {
        while let Some((channel, holder)) = stream.next().await {
            let Some(strong) = notifier.upgrade() else {
                return;
            };
            strong.released_by(&channel, &holder);
        }
        // Messages sent while disconnected are lost; waiters poll meanwhile.
        let mut backoff = Duration::from_millis(10);
        stream = loop {
            let Some(strong) = notifier.upgrade() else {
                return;
            };
            let mut slot = strong.sink.lock().await;
            *slot = None;
            if strong.wanted_channels().is_empty() {
                // Nobody waits: the next waiter connects.
                return;
            }
            if let Some(stream) = strong.connect(&mut slot).await {
                break stream;
            }
            drop(slot);
            drop(strong);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(POLL);
        };
    }
}

/// The channels that announced a release, each with the holder that
/// released.
type Messages = BoxStream<'static, (String, String)>;

/// The subscribing half of a subscription connection.
enum Sink {
    Single(redis::aio::PubSubSink),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sink::Single(_) => "Sink::Single",
            Sink::Cluster(_) => "Sink::Cluster",
        })
    }
}

impl Sink {
    async fn subscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.subscribe(channels).await,
            Sink::Cluster(conn) => {
                // Sharded channels of different slots live on different
                // shards: one SSUBSCRIBE each.
                for channel in channels {
                    conn.ssubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.unsubscribe(channel).await,
            Sink::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// A release announcement: the channel, and the holder that released.
fn announcement(message: redis::Msg) -> (String, String) {
    let holder = message.get_payload::<String>().unwrap_or_default();
    (message.get_channel_name().to_owned(), holder)
}

/// Opens a subscription connection for `topology`.
async fn open_subscription(topology: &Topology) -> RedisResult<(Sink, Messages)> {
    match topology {
        Topology::Single(client) => {
            let (sink, stream) = client.get_async_pubsub().await?.split();
            Ok((Sink::Single(sink), stream.map(announcement).boxed()))
        }
        Topology::Sentinel(link) => {
            let (sink, stream) = link.master_client().await?.get_async_pubsub().await?.split();
            Ok((Sink::Single(sink), stream.map(announcement).boxed()))
        }
        Topology::Cluster {
            urls,
            timeout,
            tls_root,
        } => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<redis::PushInfo>();
            let client = cluster_builder(urls, *timeout, tls_root.as_deref())
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(tx)
                .build()?;
            let conn = client.get_async_connection().await?;
            let pushes =
                futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
            let names = pushes.filter_map(|push| async move {
                match (push.kind, push.data.as_slice()) {
                    (redis::PushKind::SMessage, [channel, holder, ..]) => Some((
                        redis::from_redis_value_ref::<String>(channel).ok()?,
                        redis::from_redis_value_ref::<String>(holder).unwrap_or_default(),
                    )),
                    _ => None,
                }
            });
            Ok((Sink::Cluster(conn), names.boxed()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unsubscribing needs no connection: with none open, the last waiter's
    /// departure must not open one just to say so.
    #[tokio::test]
    async fn leaving_does_not_open_a_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
        let notifier = Notifier::new(Some(Topology::Single(client)));
        // The listener never answers, so a connection attempt would hang here.
        let done = tokio::time::timeout(
            Duration::from_millis(200),
            notifier.sync_subscription("lock:{k}:released"),
        )
        .await;
        let accepted = tokio::time::timeout(Duration::from_millis(50), listener.accept()).await;
        assert!(
            done.is_ok() && accepted.is_err(),
            "a connection was opened to unsubscribe from nothing"
        );
    }
}
