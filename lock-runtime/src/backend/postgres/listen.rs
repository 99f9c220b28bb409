//! Hearing releases: one connection per client `LISTEN`s on the table's
//! channel, where every release is announced (`NOTIFY`, sent by the release
//! statement and delivered when it commits), and tells the client's waiters.
//!
//! A notification is delivered at most once, to connections listening at
//! the time: one sent while this connection is down, or before it
//! listens, is never heard. So each time the connection starts listening
//! every waiter looks again, and waiters never sleep longer than the
//! runtime's poll (200 ms) or the lease in their way; a silent connection
//! (a stopped server, a cut link) is found by a heartbeat and replaced.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Socket};

/// Where heard releases go (the client's waiters).
pub(crate) trait Releases: Send + Sync + 'static {
    /// `holder` released a lock whose waiters watch `channel`.
    fn released(&self, channel: &str, holder: &str);
    /// Releases may have gone unheard: every waiter looks again.
    fn missed(&self);
}

/// How often a listening connection is asked whether it is alive.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// The first pause before connecting again; it doubles up to a second.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// Listens for as long as the task runs (the backend aborts it when it is
/// dropped), connecting again whenever the connection fails.
pub(super) async fn listen<T>(
    config: tokio_postgres::Config,
    tls: T,
    listen: String,
    timeout: Duration,
    releases: Arc<dyn Releases>,
) where
    T: MakeTlsConnect<Socket> + Clone,
    T::Stream: Send + 'static,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        if let Ok(Ok((client, mut connection))) =
            tokio::time::timeout(timeout, config.connect(tls.clone())).await
        {
            // The connection's messages: the driver hands notifications
            // out here, and this stream must be polled for the client's
            // queries to get their answers too.
            let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
            let driver = tokio::spawn(async move {
                let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(Ok(message)) = messages.next().await {
                    if let AsyncMessage::Notification(n) = message
                        && tx.send(n).is_err()
                    {
                        return;
                    }
                }
            });
            let listening = tokio::time::timeout(timeout, client.batch_execute(&listen)).await;
            if matches!(listening, Ok(Ok(()))) {
                backoff = FIRST_BACKOFF;
                releases.missed();
                let mut heartbeat = tokio::time::interval(HEARTBEAT);
                heartbeat.tick().await;
                loop {
                    tokio::select! {
                        note = heard.recv() => match note {
                            Some(note) => {
                                if let Some((holder, channel)) = note.payload().split_once(' ') {
                                    releases.released(channel, holder);
                                }
                            }
                            None => break,
                        },
                        _ = heartbeat.tick() => {
                            let alive = tokio::time::timeout(timeout, client.batch_execute("SELECT 1")).await;
                            if !matches!(alive, Ok(Ok(()))) {
                                break;
                            }
                        }
                    }
                }
                tracing::debug!("the release listener's connection dropped; connecting again");
            }
            driver.abort();
            releases.missed();
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
