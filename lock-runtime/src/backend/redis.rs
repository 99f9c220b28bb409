//! Locks in Redis: the scripts and their replies, over one node's
//! connection or a cluster's.
//!
//! One connection per node, not a pool, on purpose: every command of one
//! acquisition and its compensating release then travel in order on the same
//! socket, so a release can never overtake the acquire it undoes.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_routing::Slot;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::{AcquireReply, AcquireRequest, Backend, Failure, RenewItem, Renewal};
use crate::LockError;
use crate::client::ClientConfig;
use crate::key::LockKey;
use crate::lease::millis;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/renew.lua")));
static RENEW_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/renew_many.lua")));

/// What a connection to Redis must offer: the redis crate's async
/// connection, cheap to clone (clones share the connection).
pub(crate) trait Connection: ConnectionLike + Clone + Send + Sync + 'static {}
impl<T: ConnectionLike + Clone + Send + Sync + 'static> Connection for T {}

/// How releases are announced, and where their subscriptions connect.
#[derive(Debug, Clone)]
pub(crate) enum Topology {
    /// One node: PUBLISH, heard on a pub/sub connection to that node.
    Single(redis::Client),
    /// A cluster: SPUBLISH to the shard that owns the lock's slot, heard by
    /// SSUBSCRIBE through a RESP3 cluster client of its own (built from
    /// these seed URLs), which follows slots as they move.
    Cluster { urls: Vec<String>, timeout: Duration },
}

pub(crate) struct RedisBackend<C = ConnectionManager> {
    conn: C,
    topology: Topology,
    node: String,
}

impl<C> std::fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl<C: Connection> RedisBackend<C> {
    pub(crate) fn new(conn: C, topology: Topology, node: String) -> Self {
        RedisBackend { conn, topology, node }
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }
}

impl RedisBackend {
    pub(crate) async fn connect(url: &str, config: &ClientConfig) -> Result<Self, LockError> {
        let client = redis::Client::open(url).map_err(|e| LockError::InvalidConfig {
            node: redact_url(url),
            reason: redact_secrets(&e.to_string(), url),
        })?;
        let node = client.get_connection_info().addr().to_string();
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config(config))
            .await
            .map_err(|e| LockError::backend(&node, None, redact_error(e, url)))?;
        let backend = RedisBackend::new(conn, Topology::Single(client), node);
        backend.check_eviction_policy().await;
        Ok(backend)
    }

    /// Lock keys always carry a TTL, so every eviction policy but
    /// `noeviction` (the `volatile-*` ones first) may delete a held lock under
    /// memory pressure, and a second holder then gets in. That is a deployment
    /// choice the library cannot undo, so it says so once, at connect.
    async fn check_eviction_policy(&self) {
        let reply: Result<Vec<String>, RedisError> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut self.conn.clone())
            .await;
        match reply.as_deref() {
            Ok([_, policy]) if policy != "noeviction" => tracing::warn!(
                node = %self.node,
                policy = %policy,
                "maxmemory-policy `{policy}` can evict held locks under memory pressure, letting a second holder in; set `maxmemory-policy noeviction` on lock servers"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                node = %self.node,
                error = %e,
                "could not verify the eviction policy (CONFIG GET refused); lock servers need `maxmemory-policy noeviction`"
            ),
        }
    }

    /// Like [`connect`](Self::connect), but a node that does not answer now
    /// is kept, to be connected on first use: a Redlock must start with a
    /// minority of its masters down. The second value says whether it
    /// answered. An unusable URL is still an error.
    pub(crate) async fn connect_tolerant(
        url: &str,
        config: &ClientConfig,
    ) -> Result<(Self, bool), LockError> {
        match Self::connect(url, config).await {
            Ok(backend) => Ok((backend, true)),
            Err(LockError::Backend { .. }) => {
                let client = redis::Client::open(url).map_err(|e| LockError::InvalidConfig {
                    node: redact_url(url),
                    reason: redact_secrets(&e.to_string(), url),
                })?;
                let node = client.get_connection_info().addr().to_string();
                let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config(config))
                    .map_err(|e| LockError::backend(&node, None, redact_error(e, url)))?;
                Ok((RedisBackend::new(conn, Topology::Single(client), node), false))
            }
            Err(other) => Err(other),
        }
    }

    /// The server's `run_id` and whether it runs in cluster mode: what a
    /// Redlock needs to know that its masters are independent.
    pub(crate) async fn identity(&self) -> Result<(String, bool), LockError> {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .arg("cluster")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| LockError::backend(&self.node, None, e))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        };
        let run_id = field("run_id").unwrap_or_default();
        Ok((run_id, field("cluster_enabled").as_deref() == Some("1")))
    }
}

impl<C: Connection> RedisBackend<C> {
    fn failure(&self, key: &LockKey, e: RedisError) -> Failure {
        let transient = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(
                e.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
            )
            || e.code() == Some("BUSY");
        let reconnecting = e.is_unrecoverable_error() && !e.is_timeout();
        Failure {
            error: LockError::backend(&self.node, Some(&key.name), e),
            transient,
            reconnecting,
        }
    }

    fn unexpected(&self, key: &LockKey, what: &str, reply: &Value) -> Failure {
        Failure::permanent(LockError::backend(
            &self.node,
            Some(&key.name),
            format!("unexpected reply to {what}: {reply:?}"),
        ))
    }
}

impl<C: Connection> Backend for RedisBackend<C> {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let key = req.key;
        // Uncontended fast path: a native SET NX PX costs the server a
        // fraction of a script call. A refusal (held, foreign, or ours from an
        // unanswered earlier attempt) falls through to the script, which tells
        // those apart.
        if req.first && !req.fencing {
            let set: Option<String> = redis::cmd("SET")
                .arg(&key.redis_key)
                .arg(req.holder)
                .arg("NX")
                .arg("PX")
                .arg(millis(req.ttl))
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| self.failure(key, e))?;
            if set.is_some() {
                return Ok(AcquireReply::Acquired { token: None });
            }
        }
        let reply: Value = ACQUIRE
            .key(&key.redis_key)
            .key(key.fence_key())
            .arg(req.holder)
            .arg(millis(req.ttl))
            .arg(if req.fencing { "1" } else { "0" })
            .arg(if req.waiting { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        match reply.as_sequence() {
            Some([Value::Int(1), Value::Int(token)]) => Ok(AcquireReply::Acquired {
                token: req.fencing.then(|| u64::try_from(*token).unwrap_or(0)),
            }),
            Some([Value::Int(0), Value::Int(pttl)]) => Ok(AcquireReply::Held {
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            Some([Value::Int(-1), found]) => Err(Failure::permanent(LockError::KeyConflict {
                key: key.name.clone(),
                redis_key: key.redis_key.clone(),
                found_type: redis::from_redis_value_ref::<String>(found).unwrap_or_else(|_| "unknown".into()),
            })),
            _ => Err(self.unexpected(key, "acquire", &reply)),
        }
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        let announce = match self.topology {
            Topology::Single(_) => "publish",
            Topology::Cluster { .. } => "spublish",
        };
        let released: i64 = RELEASE
            .key(&key.redis_key)
            .key(&key.channel)
            .arg(holder)
            .arg(announce)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        Ok(released == 1)
    }

    async fn renew(
        &self,
        key: &LockKey,
        holder: &str,
        ttl: Duration,
        extend_only: bool,
    ) -> Result<bool, Failure> {
        let renewed: i64 = RENEW
            .key(&key.redis_key)
            .arg(holder)
            .arg(millis(ttl))
            .arg(if extend_only { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        Ok(renewed == 1)
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        if let Topology::Cluster { .. } = self.topology {
            return self.renew_per_slot(items).await;
        }
        self.renew_batch(items).await
    }
}

impl<C: Connection> RedisBackend<C> {
    /// A script may only touch keys of one slot on a cluster: one batch per
    /// slot, all sent at once (the cluster client pipelines them per node).
    async fn renew_per_slot(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let mut by_slot: std::collections::HashMap<Slot, Vec<usize>> = std::collections::HashMap::new();
        for (i, item) in items.iter().enumerate() {
            by_slot
                .entry(Slot::for_key(&item.key.redis_key))
                .or_default()
                .push(i);
        }
        let batches = by_slot.into_values().map(|indices| async move {
            let batch: Vec<RenewItem<'_>> = indices
                .iter()
                .map(|&i| RenewItem {
                    key: items[i].key,
                    holder: items[i].holder,
                    ttl: items[i].ttl,
                })
                .collect();
            (indices, self.renew_batch(&batch).await)
        });
        let mut out = vec![Renewal::Unconfirmed; items.len()];
        for (indices, result) in futures_util::future::join_all(batches).await {
            // A failed slot leaves its leases unconfirmed, to be retried;
            // the other slots' answers stand.
            if let Ok(renewals) = result {
                for (i, renewal) in indices.into_iter().zip(renewals) {
                    out[i] = renewal;
                }
            }
        }
        Ok(out)
    }

    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let mut invocation = RENEW_MANY.prepare_invoke();
        for item in items {
            invocation
                .key(&item.key.redis_key)
                .arg(item.holder)
                .arg(millis(item.ttl));
        }
        let renewed: Vec<i64> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(first.key, e))?;
        if renewed.len() != items.len() {
            return Err(Failure::permanent(LockError::backend(
                &self.node,
                Some(&first.key.name),
                format!(
                    "renewal batch of {} answered {} results",
                    items.len(),
                    renewed.len()
                ),
            )));
        }
        Ok(renewed.into_iter().map(|r| Renewal::from(r == 1)).collect())
    }
}

fn manager_config(config: &ClientConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        // Our own loops retry within the caller's wait; a reconnect that
        // retried on its own would hold every caller hostage to its backoff.
        .set_number_of_retries(0)
        .set_connection_timeout(Some(config.command_timeout))
        .set_response_timeout(Some(config.command_timeout))
}

/// The URL with any password replaced by `***`, for messages. Handles URLs
/// that do not parse, since those are exactly the ones that end up in errors.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        // Malformed: no telling where the authority ends, so keep only what
        // follows the last `@`.
        return match url.rfind('@') {
            Some(at) => format!("***{}", &url[at..]),
            None => url.to_owned(),
        };
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => format!("***{}", &authority[at..]),
        None => authority.to_owned(),
    };
    // `redis+unix:///sock?pass=secret` carries the password in the query.
    let tail = match tail.find('?') {
        Some(q) if tail[q..].contains("pass") => format!("{}?***", &tail[..q]),
        _ => tail.to_owned(),
    };
    format!("{head}{authority}{tail}")
}

/// Removes the URL's secrets from a message that may quote the URL.
fn redact_secrets(message: &str, url: &str) -> String {
    let redacted = redact_url(url);
    let mut out = message.replace(url, &redacted);
    for secret in secrets_of(url) {
        out = out.replace(secret, "***");
    }
    out
}

fn secrets_of(url: &str) -> Vec<&str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let mut found = Vec::new();
    if let Some((userinfo, _)) = rest.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
        && !password.is_empty()
    {
        found.push(password);
    }
    if let Some((_, query)) = rest.split_once('?') {
        found.extend(
            query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, v)| k.contains("pass") && !v.is_empty())
                .map(|(_, v)| v),
        );
    }
    found
}

fn redact_error(e: RedisError, url: &str) -> String {
    redact_secrets(&e.to_string(), url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_survive_redaction() {
        assert_eq!(redact_url("redis://:hunter2@db:6379/0"), "redis://***@db:6379/0");
        assert_eq!(redact_url("redis://app:hunter2@db"), "redis://***@db");
        assert_eq!(redact_url("redis://db:6379"), "redis://db:6379");
        assert_eq!(redact_url("redis//app:hunter2@db"), "***@db");
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?pass=hunter2"),
            "redis+unix:///tmp/r.sock?***"
        );
        let msg = redact_secrets("bad url redis://u:hunter2@x: hunter2", "redis://u:hunter2@x");
        assert!(!msg.contains("hunter2"), "{msg}");
    }
}
