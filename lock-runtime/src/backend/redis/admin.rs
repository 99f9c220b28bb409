//! What an operator's tool asks of a Redis deployment (`lockctl`): which
//! locks exist, what one of them holds, and freeing one whatever holds it.
//! Reads go through one script per lock, so a lock's parts are read at one
//! instant; nothing here is on a lock call's path.

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisResult, Value};

use super::cluster::ClusterLink;
use super::{Connection, RedisBackend};
use crate::error::LockError;
use crate::key::LockKey;

static INSPECT: std::sync::LazyLock<redis::Script> = script!("inspect.lua");
static FORCE_UNLOCK: std::sync::LazyLock<redis::Script> = script!("force_unlock.lua");

/// How many keys one `SCAN` step asks the server to look at.
const SCAN_STEP: usize = 1000;

/// One lock key as the server has it, read in one step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Found {
    /// `string` (an exclusive or fair lock, a segment) or `zset` (a
    /// read-write lock, a semaphore); `none` once it is gone.
    pub(crate) redis_type: String,
    /// The server's clock, in ms since the epoch.
    pub(crate) now_ms: i64,
    /// The key's PTTL: -1 without an expiry (as a ZooKeeper child), -2
    /// when gone.
    pub(crate) pttl_ms: i64,
    /// The fence counter, if the lock ever issued a token.
    pub(crate) fence: Option<u64>,
    /// How many wait in a fair lock's line.
    pub(crate) in_line: u64,
    /// The string's value (the holder id, `+w` when waiters marked it).
    pub(crate) value: Option<String>,
    /// A sorted set's members with the server-clock ms their leases end
    /// (-1: never by time, as a ZooKeeper child).
    pub(crate) members: Vec<(String, i64)>,
}

impl Found {
    fn parse(reply: Value) -> Option<Found> {
        let items: Vec<Value> = redis::from_redis_value(reply).ok()?;
        let mut items = items.into_iter();
        let mut next = || items.next();
        let text = |v: Option<Value>| redis::from_redis_value::<String>(v?).ok();
        let int = |v: Option<Value>| redis::from_redis_value::<i64>(v?).ok();
        let redis_type = text(next())?;
        let now_ms = int(next())?;
        let pttl_ms = int(next())?;
        let fence = text(next())?.parse().ok();
        let in_line = u64::try_from(int(next())?).unwrap_or(0);
        let rest: Vec<Value> = std::iter::from_fn(next).collect();
        let (value, members) = match redis_type.as_str() {
            "string" => (rest.into_iter().next().and_then(|v| text(Some(v))), Vec::new()),
            _ => {
                let mut members = Vec::new();
                let mut rest = rest.into_iter();
                while let (Some(member), Some(score)) = (rest.next(), rest.next()) {
                    let score = text(Some(score)).and_then(|s| s.parse::<f64>().ok())?;
                    // Scores are whole milliseconds (the scripts write them).
                    #[allow(clippy::cast_possible_truncation)]
                    members.push((text(Some(member))?, score as i64));
                }
                (None, members)
            }
        };
        Some(Found {
            redis_type,
            now_ms,
            pttl_ms,
            fence,
            in_line,
            value,
            members,
        })
    }
}

/// What a connection adds for the tool: a scan of every master.
pub(crate) trait Scan: Connection {
    /// The keys matching `pattern` on each master, with the master's
    /// address (empty for the one node of a single-node connection).
    fn scan_masters(
        &self,
        pattern: &str,
    ) -> impl Future<Output = RedisResult<Vec<(String, Vec<String>)>>> + Send {
        let mut conn = self.clone();
        let pattern = pattern.to_owned();
        async move {
            let keys = scan(&mut conn, &pattern, |cmd, conn| {
                let cmd = cmd.clone();
                let mut conn = conn.clone();
                async move { cmd.query_async::<(u64, Vec<String>)>(&mut conn).await }
            })
            .await?;
            Ok(vec![(String::new(), keys)])
        }
    }
}

impl Scan for redis::aio::ConnectionManager {}
impl Scan for super::SentinelLink {}

impl Scan for ClusterLink {
    /// `SCAN` runs on one node: each master is scanned in turn, reached
    /// through the first slot of a range it serves.
    async fn scan_masters(&self, pattern: &str) -> RedisResult<Vec<(String, Vec<String>)>> {
        let mut conn = self.connection().await?;
        let slots: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await?;
        let mut masters: Vec<(String, u16)> = Vec::new();
        for range in slots {
            let Ok((start, _end, (host, port))) =
                redis::from_redis_value::<(u16, u16, (String, u16))>(trim_range(range))
            else {
                continue;
            };
            let address = format!("{host}:{port}");
            if !masters.iter().any(|(a, _)| *a == address) {
                masters.push((address, start));
            }
        }
        masters.sort();
        let mut found = Vec::new();
        for (address, slot) in masters {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
            let keys = scan(&mut conn, pattern, |cmd, conn| {
                let cmd = cmd.clone();
                let mut conn = conn.clone();
                let route = route.clone();
                async move { Ok(redis::from_redis_value(conn.route_command(cmd, route).await?)?) }
            })
            .await?;
            found.push((address, keys));
        }
        Ok(found)
    }
}

/// A `CLUSTER SLOTS` range cut to `start, end, master`: the master entry
/// also carries its node id and metadata, and replicas follow.
fn trim_range(range: Value) -> Value {
    match range {
        Value::Array(mut items) if items.len() >= 3 => {
            items.truncate(3);
            if let Value::Array(master) = &mut items[2] {
                master.truncate(2);
            }
            Value::Array(items)
        }
        other => other,
    }
}

/// Runs `SCAN 0 MATCH pattern COUNT n` to its end through `step`.
async fn scan<Conn, F, Fut>(conn: &mut Conn, pattern: &str, step: F) -> RedisResult<Vec<String>>
where
    F: Fn(&redis::Cmd, &Conn) -> Fut,
    Fut: Future<Output = RedisResult<(u64, Vec<String>)>>,
{
    let mut cursor = 0u64;
    let mut keys = Vec::new();
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_STEP);
        let (next, batch) = step(&cmd, conn).await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

impl<C: Scan> RedisBackend<C> {
    /// The keys under the client's prefix that match `pattern` (already a
    /// Redis glob), per master.
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<(String, Vec<String>)>, LockError> {
        let found = self
            .conn
            .scan_masters(pattern)
            .await
            .map_err(|e| LockError::backend(&self.node, None, e))?;
        Ok(found
            .into_iter()
            .map(|(address, keys)| {
                let node = if address.is_empty() {
                    self.node.clone()
                } else {
                    address
                };
                (node, keys)
            })
            .collect())
    }

    /// The lock `key` as the server has it now, or `None` when it is gone.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<Found>, LockError> {
        let reply: Value = INSPECT
            .key(&key.redis_key)
            .key(key.fence_key())
            .key(key.line_key())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| LockError::backend(&self.node, Some(&key.name), e))?;
        let found = Found::parse(reply.clone()).ok_or_else(|| {
            LockError::backend(
                &self.node,
                Some(&key.name),
                format!("unexpected reply to inspect: {reply:?}"),
            )
        })?;
        Ok((found.redis_type != "none").then_some(found))
    }

    /// Frees the lock `key` whatever holds it and wakes its waiters.
    /// `Ok(false)` when no lock was there; `KeyConflict` when the key holds
    /// a value this library did not write.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let announce = self.announce();
        let reply: Value = FORCE_UNLOCK
            .key(&key.redis_key)
            .key(&key.channel)
            .key(key.line_key())
            .key(key.alive_key())
            .arg(announce)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| LockError::backend(&self.node, Some(&key.name), e))?;
        match reply {
            Value::Int(freed) => Ok(freed == 1),
            Value::Array(items) => Err(LockError::KeyConflict {
                key: key.name.clone(),
                redis_key: key.redis_key.clone(),
                found_type: items
                    .get(1)
                    .and_then(|t| redis::from_redis_value_ref::<String>(t).ok())
                    .unwrap_or_else(|| "unknown".into()),
            }),
            other => Err(LockError::backend(
                &self.node,
                Some(&key.name),
                format!("unexpected reply to force unlock: {other:?}"),
            )),
        }
    }
}
