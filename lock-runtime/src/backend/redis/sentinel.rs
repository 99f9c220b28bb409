//! The connection to a master found through Redis Sentinel.
//!
//! Every command goes to the master Sentinel names (and that confirms its
//! role with `ROLE`). After a connection-level failure, or a `READONLY`
//! reply from a master that was demoted, the connection is dropped and the
//! next command asks Sentinel again: after a failover, new locks go to the
//! new master. The redis crate's `SentinelClient` finds the master; this
//! wrapper adds the re-resolution, which it does not do.
//!
//! The failed command itself returns its error: the caller's retry loop
//! (an acquisition's `wait`, the watchdog's renewal deadline) decides what
//! to do, exactly as for a single node that reconnects.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind,
    Value,
};

/// Cheap to clone: clones share the connection and the Sentinel client.
#[derive(Clone)]
pub(crate) struct SentinelLink(Arc<Link>);

struct Link {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<Master>>,
    /// Numbers each new master connection, so that a failure on an old one
    /// cannot drop a newer one.
    generations: AtomicU64,
    timeout: Duration,
}

/// The master Sentinel named last: its connection, and its client for the
/// subscription connection.
#[derive(Clone)]
struct Master {
    conn: MultiplexedConnection,
    client: redis::Client,
    generation: u64,
}

impl SentinelLink {
    pub(crate) fn new(sentinel: SentinelClient, timeout: Duration) -> Self {
        SentinelLink(Arc::new(Link {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            generations: AtomicU64::new(0),
            timeout,
        }))
    }

    fn current(&self) -> Option<Master> {
        self.0
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The master, asking Sentinel for it first when there is none.
    async fn master(&self) -> RedisResult<Master> {
        if let Some(master) = self.current() {
            return Ok(master);
        }
        // One resolution at a time; whoever waited finds its result.
        let mut sentinel = self.0.sentinel.lock().await;
        if let Some(master) = self.current() {
            return Ok(master);
        }
        let client = tokio::time::timeout(self.0.timeout, sentinel.async_get_client())
            .await
            .map_err(|_| timed_out("asking Sentinel for the master"))??;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.0.timeout))
            .set_response_timeout(Some(self.0.timeout));
        let master = Master {
            conn: client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
            client,
            generation: self.0.generations.fetch_add(1, Ordering::Relaxed),
        };
        *self.0.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(master.clone());
        Ok(master)
    }

    /// A client for the current master (resolved now if needed), for a
    /// subscription connection of its own.
    pub(crate) async fn master_client(&self) -> RedisResult<redis::Client> {
        Ok(self.master().await?.client)
    }

    /// Forgets connection `generation` after `error`, if the error says the
    /// master may have moved.
    fn after(&self, generation: u64, error: &RedisError) {
        let moved = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || matches!(error.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly));
        if !moved {
            return;
        }
        let mut current = self.0.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|m| m.generation == generation) {
            *current = None;
        }
    }
}

fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} took too long"),
    ))
}

impl ConnectionLike for SentinelLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let Master {
                mut conn, generation, ..
            } = self.master().await?;
            let reply = conn.req_packed_command(cmd).await;
            if let Err(e) = &reply {
                self.after(generation, e);
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let Master {
                mut conn, generation, ..
            } = self.master().await?;
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &reply {
                self.after(generation, e);
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
