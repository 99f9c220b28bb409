//! Waking waiters when a lock is released, instead of only polling.
//!
//! Each client keeps one subscription connection (one per master on a
//! Redlock: `open_subscriptions`). A lock's release channel is
//! subscribed while at least one local waiter wants it and unsubscribed when
//! the last one leaves. A release by this process wakes its local waiters
//! directly; a release elsewhere arrives as a message. Pub/sub delivers at
//! most once (a dropped connection loses messages), so waiters still re-poll
//! at `min(remaining lease, POLL)`: a lost message costs latency, never
//! correctness.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

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

/// How far apart a Redlock's masters' copies of one announcement arrive at
/// most, to be heard once (`open_subscriptions`).
const SAME_RELEASE: Duration = Duration::from_millis(20);

/// How long a Redlock's subscription runs without a master that did not
/// answer before it is opened again, that master included
/// (`open_subscriptions`).
const LEFT_OUT_RETRY: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub(crate) struct Notifier {
    channels: Mutex<HashMap<String, Channel>>,
    /// Serialises SUBSCRIBE/UNSUBSCRIBE so they reach the server in the order
    /// the waiter counts changed.
    sink: tokio::sync::Mutex<Option<Sink>>,
    /// Where to open the subscription connections: one per entry (a
    /// Redlock's masters), none for local wake-ups only.
    transport: Vec<Topology>,
    /// How long a server has to answer a step of the subscription (opening
    /// it, SUBSCRIBE, UNSUBSCRIBE) before its connection is given up: a
    /// server that accepts and never answers (blackholed) must not hold the
    /// subscription, or the waiters that await it, for ever.
    answer_within: Duration,
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
    /// Ordered: a fair lock's release wakes its line in this order, the
    /// same every run (a simulation's seed must replay it).
    named: BTreeMap<String, Arc<Notify>>,
    /// Election observers (`Election::observe`), woken by every
    /// announcement on the channel, and after a reconnection, without
    /// taking a waiter's wake-up: they only read, they never take the lock.
    observers: Arc<Notify>,
    /// Waiters here ready to be handed the lock, first come first served
    /// (withdrawn ones are skipped when reached).
    offers: VecDeque<Arc<Offer>>,
    /// A Redlock's last copy of a release from another master: when the
    /// release's first copy was heard, and when this one was
    /// (`copy_heard`, `missed_release`).
    copy_heard: Option<(Instant, Instant)>,
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

/// Who a watch wakes for: any waiter, a fair waiter by its name, or an
/// observer.
#[derive(Debug, Clone, Copy)]
enum Interest<'a> {
    Any,
    Named(&'a str),
    Observer,
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
    /// Wake-ups within this process only (no server announces releases
    /// over pub/sub).
    pub(crate) fn local() -> Arc<Self> {
        Self::over(Vec::new(), Duration::ZERO)
    }

    /// Wake-ups heard on a subscription to each of `transport`, whose
    /// servers have `answer_within` to answer each step.
    pub(crate) fn over(transport: Vec<Topology>, answer_within: Duration) -> Arc<Self> {
        Arc::new(Notifier {
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            transport,
            answer_within,
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
        c.observers.notify_waiters();
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

    /// A copy, from another of a Redlock's masters, of a release on
    /// `channel` first heard at `first`. It wakes no one: the first copy
    /// woke a waiter, and a second woken now would split the masters'
    /// votes with it (W4's handoff p99 doubled when every copy woke one).
    /// But the woken waiter may have reached this master before the
    /// release did, and been refused: noted, so that it tries again at
    /// once ([`Self::missed_release`]) instead of sleeping out its poll
    /// while the lock is free.
    pub(crate) fn copy_heard(&self, channel: &str, first: Instant) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = channels.get_mut(channel) {
            c.copy_heard = Some((first, Instant::now()));
        }
    }

    /// Whether an attempt on a Redlock, sent at `sent` and refused, raced a
    /// release on its way to the masters: sent after the release's first
    /// copy was heard, and before a later copy (see [`Self::copy_heard`]).
    pub(crate) fn missed_release(&self, channel: &str, sent: Instant) -> bool {
        if self.transport.len() < 2 {
            // One server: no copies.
            return false;
        }
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels
            .get(channel)
            .and_then(|c| c.copy_heard)
            .is_some_and(|(first, heard)| first <= sent && sent <= heard)
    }

    /// Wakes every fair waiter of `channel` in this process, where no
    /// server names the next (the in-process backend): each looks again,
    /// and the one first in line gets the lock.
    pub(crate) fn wake_line(&self, channel: &str) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = channels.get(channel) {
            c.observers.notify_waiters();
            for waiter in c.named.values() {
                waiter.notify_one();
            }
        }
    }

    /// The election observers of `channel` here read again: its lock was
    /// handed to a waiter here, which no store announces.
    pub(crate) fn wake_observers_of(&self, channel: &str) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = channels.get(channel) {
            c.observers.notify_waiters();
        }
    }

    /// Every election observer here reads again.
    fn wake_observers(&self) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        for c in channels.values() {
            c.observers.notify_waiters();
        }
    }

    /// Announcements may have been missed (the connection that hears them
    /// was down): every waiter here looks again.
    #[cfg(feature = "postgres")]
    pub(crate) fn wake_all(&self) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        for c in channels.values() {
            c.notify.notify_waiters();
            c.observers.notify_waiters();
            for waiter in c.named.values() {
                waiter.notify_one();
            }
        }
    }

    /// Registers a waiter on `channel`, subscribing if it is the first.
    /// Returns once the subscription is confirmed, known to be down, or
    /// `patience` (at most [`POLL`]) has passed: see
    /// [`Self::confirm_subscription`].
    pub(crate) async fn watch(self: &Arc<Self>, channel: &str, patience: Duration) -> Watch {
        self.watch_for(channel, Interest::Any, patience).await
    }

    /// Registers a fair waiter, woken only when an announcement names it.
    pub(crate) async fn watch_as(self: &Arc<Self>, channel: &str, name: &str, patience: Duration) -> Watch {
        self.watch_for(channel, Interest::Named(name), patience).await
    }

    /// Registers an election's observer, woken by every announcement on
    /// `channel` (`notify_waiters`: only while it awaits one, so it
    /// enables its wake-up before each read) and by a reconnection.
    pub(crate) async fn observe(self: &Arc<Self>, channel: &str, patience: Duration) -> Watch {
        self.watch_for(channel, Interest::Observer, patience).await
    }

    async fn watch_for(self: &Arc<Self>, channel: &str, interest: Interest<'_>, patience: Duration) -> Watch {
        let (notify, first) = {
            let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Channel {
                waiters: 0,
                notify: Arc::new(Notify::new()),
                named: BTreeMap::new(),
                observers: Arc::new(Notify::new()),
                offers: VecDeque::new(),
                copy_heard: None,
            });
            entry.waiters += 1;
            let notify = match interest {
                Interest::Named(name) => Arc::clone(entry.named.entry(name.to_owned()).or_default()),
                Interest::Any => Arc::clone(&entry.notify),
                Interest::Observer => Arc::clone(&entry.observers),
            };
            (notify, entry.waiters == 1)
        };
        // Made before awaiting anything, so that a waiter dropped while
        // the subscription is confirmed still counts itself out.
        let watch = Watch {
            notify,
            _leave: DropGuard::new(Leave {
                notifier: Arc::clone(self),
                channel: channel.to_owned(),
                name: match interest {
                    Interest::Named(name) => Some(name.to_owned()),
                    Interest::Any | Interest::Observer => None,
                },
            }),
        };
        if first {
            self.confirm_subscription(channel, patience).await;
        }
        watch
    }

    /// Subscribes to `channel` for its first waiter here, which waits for
    /// the server's confirmation so that a release after it is heard. It
    /// waits `patience` at most, and never past [`POLL`]: a waiter that
    /// polls instead loses nothing but latency, while a server that never
    /// answers would otherwise hold it past its wait. The subscribing runs
    /// as a task of its own, to finish (or give the connection up) after
    /// the waiter has stopped waiting for it: cut short, it would leave the
    /// channel unsubscribed for as long as waiters here want it.
    async fn confirm_subscription(self: &Arc<Self>, channel: &str, patience: Duration) {
        if self.transport.is_empty() {
            return;
        }
        let (notifier, owned) = (Arc::clone(self), channel.to_owned());
        let subscribing = tokio::spawn(async move { notifier.sync_subscription(&owned).await });
        let _ = tokio::time::timeout(patience.min(POLL), subscribing).await;
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
        let change = async {
            if self.wanted(channel) {
                sink.subscribe(&[channel.to_owned()]).await
            } else {
                sink.unsubscribe(channel).await
            }
        };
        let result = within(self.answer_within, change).await;
        if let Err(e) = result {
            tracing::debug!(%channel, error = %e, "subscription change failed; waiters poll");
            *slot = None;
        }
    }

    /// Opens the subscription connection and subscribes to every wanted
    /// channel; returns the stream of announced channel names.
    async fn connect(&self, slot: &mut Option<Sink>) -> Option<Messages> {
        let (mut sink, stream) = match open_subscriptions(&self.transport, self.answer_within).await? {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "subscription connection failed; waiters poll");
                return None;
            }
        };
        let wanted = self.wanted_channels();
        if !wanted.is_empty()
            && let Err(e) = within(self.answer_within, sink.subscribe(&wanted)).await
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
        while let Some(heard) = stream.next().await {
            let Some(strong) = notifier.upgrade() else {
                return;
            };
            match heard.copy_of {
                Some(first) => strong.copy_heard(&heard.channel, first),
                None => strong.released_by(&heard.channel, &heard.holder),
            }
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
                // What was announced while disconnected is lost: observers
                // read again (waiters poll anyway).
                strong.wake_observers();
                break stream;
            }
            drop(slot);
            drop(strong);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(POLL);
        };
    }
}

/// The release announcements heard on a subscription.
type Messages = BoxStream<'static, Heard>;

/// A release announcement.
#[derive(Debug, Clone, PartialEq)]
struct Heard {
    channel: String,
    /// The holder that released.
    holder: String,
    /// For a copy from another of a Redlock's masters of an announcement
    /// heard already: when the first copy was heard (`open_subscriptions`).
    copy_of: Option<Instant>,
}

/// The subscribing half of a subscription connection. Dropping it ends its
/// messages (`ended_with`), so that a connection given up for not
/// answering is opened again by the reader, as a closed one is.
struct Sink {
    link: Link,
    _ends_messages: tokio::sync::oneshot::Sender<()>,
}

enum Link {
    Single(redis::aio::PubSubSink),
    Cluster(redis::cluster_async::ClusterConnection),
    /// One per master of a Redlock.
    Each(Vec<Sink>),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.link {
            Link::Single(_) => "Sink::Single",
            Link::Cluster(_) => "Sink::Cluster",
            Link::Each(_) => "Sink::Each",
        })
    }
}

impl Sink {
    /// `link`, and `messages` made to end when it is dropped.
    fn ended_with(link: Link, messages: Messages) -> (Sink, Messages) {
        let (ends, ended) = tokio::sync::oneshot::channel();
        let sink = Sink {
            link,
            _ends_messages: ends,
        };
        (sink, messages.take_until(ended).boxed())
    }

    async fn subscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match &mut self.link {
            Link::Each(sinks) => {
                let each = sinks.iter_mut().map(|sink| Box::pin(sink.subscribe(channels)));
                futures_util::future::join_all(each).await.into_iter().collect()
            }
            Link::Single(sink) => sink.subscribe(channels).await,
            Link::Cluster(conn) => {
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
        match &mut self.link {
            Link::Each(sinks) => {
                let each = sinks.iter_mut().map(|sink| Box::pin(sink.unsubscribe(channel)));
                futures_util::future::join_all(each).await.into_iter().collect()
            }
            Link::Single(sink) => sink.unsubscribe(channel).await,
            Link::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// `step`, or an error if the server has not answered within `bound`.
async fn within<T>(bound: Duration, step: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    tokio::time::timeout(bound, step).await.unwrap_or_else(|_| {
        Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "no answer within the command timeout",
        )))
    })
}

/// A release announcement, from a pub/sub message.
fn announcement(message: redis::Msg) -> Heard {
    Heard {
        holder: message.get_payload::<String>().unwrap_or_default(),
        channel: message.get_channel_name().to_owned(),
        copy_of: None,
    }
}

/// Opens a subscription connection for each of `topologies`, giving each
/// server `answer_within`: `None` if there are none.
///
/// A Redlock gets one per master, because a release is announced only
/// where a waiter marked the lock, and an attempt that won no majority
/// gives back what it got on some masters alone: heard on the first master
/// only, those announcements were lost, and every waiter slept out its
/// poll (W4, 16 tasks on one key: a third of runs made 500 increments/s
/// instead of 2,000). A master that does not answer is left out (its
/// announcements are polled for, as any lost message is), and tried again
/// [`LEFT_OUT_RETRY`] later. The messages end with the first connection
/// that ends, so that all are opened again together.
async fn open_subscriptions(
    topologies: &[Topology],
    answer_within: Duration,
) -> Option<RedisResult<(Sink, Messages)>> {
    match topologies {
        [] => None,
        [one] => Some(within(answer_within, open_subscription(one)).await),
        many => {
            let opening = many
                .iter()
                .map(|topology| within(answer_within, open_subscription(topology)));
            let (mut sinks, mut streams, mut failure) = (Vec::new(), Vec::new(), None);
            for (master, opened) in futures_util::future::join_all(opening)
                .await
                .into_iter()
                .enumerate()
            {
                match opened {
                    Ok((sink, stream)) => {
                        sinks.push(sink);
                        // `None` marks the end of one connection's messages.
                        streams.push(
                            stream
                                .map(move |message| Some((message, master)))
                                .chain(futures_util::stream::once(std::future::ready(None)))
                                .boxed(),
                        );
                    }
                    Err(e) => failure = Some(e),
                }
            }
            if sinks.is_empty() {
                return failure.map(Err);
            }
            if let Some(e) = failure {
                tracing::debug!(error = %e, "a master left out of the subscription; its releases are polled for");
                // The set ends after a while, to be opened again with it.
                streams.push(
                    futures_util::stream::once(tokio::time::sleep(LEFT_OUT_RETRY))
                        .map(|()| None)
                        .boxed(),
                );
            }
            // A release is announced on every master that a waiter marked.
            // A holder id is one acquisition's, so the same channel and
            // holder from another master within moments is the same
            // release: a copy (`Notifier::copy_heard`). From the same
            // master it is a new one (an attempt without a majority gave
            // that master back, then the holder took the lock and let go).
            let mut recent: VecDeque<(Heard, usize, Instant)> = VecDeque::new();
            let merged = futures_util::stream::select_all(streams)
                .take_while(|message| std::future::ready(message.is_some()))
                .filter_map(std::future::ready)
                .map(move |(mut heard, master)| {
                    let now = Instant::now();
                    recent.retain(|(_, _, at)| now.duration_since(*at) < SAME_RELEASE);
                    let (mut first_elsewhere, mut here) = (None, false);
                    for (seen, from, at) in &recent {
                        if *seen == heard {
                            here |= *from == master;
                            if *from != master {
                                first_elsewhere = first_elsewhere.or(Some(*at));
                            }
                        }
                    }
                    recent.push_back((heard.clone(), master, now));
                    if !here {
                        heard.copy_of = first_elsewhere;
                    }
                    heard
                });
            Some(Ok(Sink::ended_with(Link::Each(sinks), merged.boxed())))
        }
    }
}

/// Opens a subscription connection for `topology`.
async fn open_subscription(topology: &Topology) -> RedisResult<(Sink, Messages)> {
    match topology {
        Topology::Single(client) => {
            let (sink, stream) = client.get_async_pubsub().await?.split();
            Ok(Sink::ended_with(
                Link::Single(sink),
                stream.map(announcement).boxed(),
            ))
        }
        Topology::Sentinel(link) => {
            let (sink, stream) = link.master_client().await?.get_async_pubsub().await?.split();
            Ok(Sink::ended_with(
                Link::Single(sink),
                stream.map(announcement).boxed(),
            ))
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
                    (redis::PushKind::SMessage, [channel, holder, ..]) => Some(Heard {
                        channel: redis::from_redis_value_ref::<String>(channel).ok()?,
                        holder: redis::from_redis_value_ref::<String>(holder).unwrap_or_default(),
                        copy_of: None,
                    }),
                    _ => None,
                }
            });
            Ok(Sink::ended_with(Link::Cluster(conn), names.boxed()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A notifier whose server accepts connections and never answers
    /// (nothing reads the listener), with 5 s for each step.
    async fn never_answering() -> (tokio::net::TcpListener, Arc<Notifier>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
        let notifier = Notifier::over(vec![Topology::Single(client)], Duration::from_secs(5));
        (listener, notifier)
    }

    /// A waiter dropped while the server has not confirmed its
    /// subscription still counts itself out of the channel: left counted,
    /// the channel would stay subscribed, and wanted, for the client's life.
    #[tokio::test]
    async fn a_waiter_dropped_while_subscribing_counts_itself_out() {
        let (_listener, notifier) = never_answering().await;
        let channel = "lock:{k}:released";
        // The listener never answers, so the confirmation never comes.
        let watching = tokio::time::timeout(
            Duration::from_millis(20),
            notifier.watch(channel, Duration::from_secs(5)),
        )
        .await;
        assert!(
            watching.is_err(),
            "a server that never answers confirmed a subscription"
        );
        assert!(
            !notifier.wanted(channel),
            "the dropped waiter is still counted on its channel"
        );
    }

    /// A first waiter waits for its subscription's confirmation no longer
    /// than it was told to, however long the server takes.
    #[tokio::test]
    async fn a_waiter_waits_for_its_subscription_only_as_long_as_it_may() {
        let (_listener, notifier) = never_answering().await;
        let watching = tokio::time::timeout(
            Duration::from_secs(2),
            notifier.watch("lock:{k}:released", Duration::from_millis(30)),
        )
        .await;
        assert!(
            watching.is_ok(),
            "a 30 ms patience was held up by a server that never answers"
        );
    }

    /// Unsubscribing needs no connection: with none open, the last waiter's
    /// departure must not open one just to say so.
    #[tokio::test]
    async fn leaving_does_not_open_a_connection() {
        let (listener, notifier) = never_answering().await;
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
