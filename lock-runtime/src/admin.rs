//! An operator's view of the locks on a client's servers: which are held,
//! by whom, for how long, and a way to free one whose holder is stuck. The
//! `lockctl` tool is a command line over this; it reads through the same
//! backend code (and the same scripts) as the lock calls.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::Found;
use crate::error::LockError;
use crate::key::LockKey;
use crate::shared::ClientInner;

/// How many locks `list` reads at once.
const READ_BATCH: usize = 256;

/// What kind of lock a key is, as the server shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeldKind {
    /// One holder at a time.
    Exclusive,
    /// An exclusive lock handed to its waiters in order (`fair`).
    Fair,
    /// A read-write lock (`mode`): readers, or one writer.
    ReadWrite,
    /// A semaphore (`permits`).
    Permits,
    /// One segment (`key#i`) of a segmented lock (`segments`).
    Segment,
    /// An election's term (`LockClient::election`): its holder is the
    /// leader, its fence the term's epoch.
    Election,
}

impl HeldKind {
    /// The kind as the attribute spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            HeldKind::Exclusive => "exclusive",
            HeldKind::Fair => "fair",
            HeldKind::ReadWrite => "read-write",
            HeldKind::Permits => "permits",
            HeldKind::Segment => "segment",
            HeldKind::Election => "election",
        }
    }
}

/// One holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The holder id (`<process>:<n>`, with its side in front for a shared
    /// or fair lock: `r:`, `w:`, `p:`, `f:`). The same process has the same
    /// 32 hex digits in every id.
    pub id: String,
    /// `holder`, `reader`, `writer`, `permit`, or `leader` (an election's).
    pub role: &'static str,
    /// What is left of its lease by the server's clock; `None` on
    /// ZooKeeper, where a holder's node lives as long as its session, or
    /// when a Redis key has no expiry (never written so by this library).
    pub time_left: Option<Duration>,
}

/// One lock as a server has it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's key as callers render it (`stock:42`, or `stock:42#3` for
    /// a segment; `scheduler (election)` for an election's term).
    pub key: String,
    /// The server that has it (a master's address on a cluster or a
    /// Redlock), passwords redacted.
    pub node: String,
    /// What kind of lock it is.
    pub kind: HeldKind,
    /// Who holds it now; empty for a read-write lock that only a waiting
    /// writer's claim keeps.
    pub holders: Vec<LockHolder>,
    /// The fencing counter: the last token issued on this key, if any (on
    /// etcd, the newest token among the holders: their keys' create
    /// revisions).
    pub fence: Option<u64>,
    /// Whether someone waits for it, as far as the server knows: a waiter
    /// marked an exclusive lock, a writer's claim holds readers back, or a
    /// fair lock has a line.
    pub waiters: bool,
    /// How many wait in a fair lock's line (on etcd, where every lock is a
    /// line, how many wait behind the holders of any lock).
    pub in_line: u64,
    /// An election's: the value its leader proclaimed (`None` for a lock,
    /// or before the leader's first proclamation lands).
    pub value: Option<String>,
}

/// An operator's handle on a client's locks: see [`LockClient::admin`](crate::LockClient::admin).
#[derive(Debug)]
pub struct LockAdmin<'c> {
    client: &'c Arc<ClientInner>,
}

impl<'c> LockAdmin<'c> {
    pub(crate) fn new(client: &'c Arc<ClientInner>) -> Self {
        LockAdmin { client }
    }

    /// Every lock whose key matches `pattern` (a Redis glob over keys as
    /// callers render them: `stock:*`; `None` for all), on every node
    /// (every master of a cluster or a Redlock), sorted by key then node.
    pub async fn list(&self, pattern: Option<&str>) -> Result<Vec<LockInfo>, LockError> {
        let pattern = pattern.unwrap_or("*");
        if pattern.contains(['{', '}']) {
            return Err(LockError::InvalidRequest {
                key: pattern.to_owned(),
                reason: "a pattern cannot contain braces: lock keys never do".into(),
            });
        }
        let prefix = &self.client.config.prefix;
        let glob = format!("{}{{{pattern}}}*", escape_glob(prefix));
        let mut locks = Vec::new();
        for (node, keys) in self.client.backend.scan_keys(&glob).await? {
            let keys: Vec<LockKey> = keys.iter().filter_map(|k| lock_key(prefix, k)).collect();
            // Read where each was found (the master that has it), a batch
            // at a time: the reads share the connection, so a batch costs
            // about one round trip, not one per lock.
            for batch in keys.chunks(READ_BATCH) {
                let reads = batch.iter().map(|key| self.read(key, Some(&node)));
                for mut info in futures_util::future::try_join_all(reads)
                    .await?
                    .into_iter()
                    .flatten()
                {
                    info.node.clone_from(&node);
                    locks.push(info);
                }
            }
        }
        locks.sort_by(|a: &LockInfo, b: &LockInfo| (&a.key, &a.node).cmp(&(&b.key, &b.node)));
        Ok(locks)
    }

    /// The lock `key` (`name#i` for segment `i` of a segmented lock,
    /// `name (election)` for an election's term, as `list` shows them) on
    /// each node that has it: empty when it is free.
    pub async fn inspect(&self, key: &str) -> Result<Vec<LockInfo>, LockError> {
        let mut found = Vec::new();
        for candidate in self.term_named(key).into_iter().chain(self.candidates(key)?) {
            found = self.read(&candidate, None).await?;
            if !found.is_empty() {
                break;
            }
        }
        Ok(found)
    }

    /// Frees the lock `key` whatever holds it, and wakes its waiters. Its
    /// holder learns it lost the lock at its next renewal (a third of its
    /// ttl at most), and its body is cancelled then; the fence counter is
    /// kept, so tokens still grow. Returns how many nodes had the lock (0
    /// when it was free). A key holding something this library did not
    /// write is left alone: [`LockError::KeyConflict`].
    pub async fn force_unlock(&self, key: &str) -> Result<usize, LockError> {
        for candidate in self.candidates(key)? {
            let freed = self.client.backend.force_unlock(&candidate).await?;
            if freed > 0 {
                tracing::warn!(key = %candidate.name, nodes = freed, "lock freed by force");
                return Ok(freed);
            }
        }
        Ok(0)
    }

    /// The election term `key` names as [`list`](Self::list) shows one
    /// (`NAME (election)`), read before a lock so named. Only `inspect`
    /// looks for it: freeing a term by force is not offered.
    fn term_named(&self, key: &str) -> Option<LockKey> {
        let name = key.strip_suffix(" (election)")?;
        LockKey::election(&self.client.config.prefix, name).ok()
    }

    /// `key` as a plain lock, then, when it ends in `#i`, as segment `i`.
    fn candidates(&self, key: &str) -> Result<Vec<LockKey>, LockError> {
        let prefix = &self.client.config.prefix;
        let mut candidates = vec![LockKey::new(prefix, key.to_owned())?];
        if let Some((base, i)) = key.rsplit_once('#')
            && let Ok(i) = i.parse::<u32>()
            && let Ok(lock) = LockKey::new(prefix, base.to_owned())
        {
            candidates.push(lock.segment(i));
        }
        Ok(candidates)
    }

    /// The lock `key` on each node that has it (on a Redlock, on `node`
    /// only, when given).
    async fn read(&self, key: &LockKey, node: Option<&str>) -> Result<Vec<LockInfo>, LockError> {
        let found = self.client.backend.inspect(key, node).await?;
        let mut infos: Vec<LockInfo> = found
            .into_iter()
            .filter_map(|(node, found)| describe(key, node, found))
            .collect();
        if key.is_election() && !infos.is_empty() {
            // The term's lock read as any lock's, and what the leader
            // proclaimed from the election's record.
            let record = match self.client.backend.leader(key).await {
                Ok(record) => record,
                // The listing still shows the term, without its value.
                Err(failure) => {
                    tracing::debug!(key = %key.name, error = %failure.error, "reading an election's record failed");
                    None
                }
            };
            for info in &mut infos {
                info.kind = HeldKind::Election;
                for holder in &mut info.holders {
                    holder.role = "leader";
                }
                info.value = record
                    .as_ref()
                    .filter(|r| info.holders.iter().any(|h| h.id == r.holder))
                    .and_then(|r| r.value.clone());
            }
        }
        Ok(infos)
    }
}

/// Who holds lock `key` (as a `Timeout` names it), for the trace of a call
/// that skipped its body: their holder ids, or why they could not be read.
pub(crate) async fn holders_found(client: &Arc<ClientInner>, key: &str) -> String {
    match LockAdmin::new(client).inspect(key).await {
        Ok(found) => {
            let ids: Vec<String> = found
                .into_iter()
                .flat_map(|info| info.holders)
                .map(|holder| holder.id)
                .collect();
            if ids.is_empty() {
                // Released between the attempt and this read.
                "none now".to_owned()
            } else {
                ids.join(",")
            }
        }
        Err(e) => format!("unknown ({e})"),
    }
}

/// The lock a Redis key is, if it is one: `P{K}`, a segment `P{K}#i` or
/// an election's term `P{K}:leader`, not a lock's fence counter, line or
/// waiters' places, nor an election's record.
fn lock_key(prefix: &str, redis_key: &str) -> Option<LockKey> {
    let tagged = redis_key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (name, rest) = tagged.split_once('}')?;
    if rest == ":leader" {
        return LockKey::election(prefix, name).ok();
    }
    let lock = LockKey::new(prefix, name.to_owned()).ok()?;
    if rest.is_empty() {
        return Some(lock);
    }
    let i = rest.strip_prefix('#')?.parse::<u32>().ok()?;
    Some(lock.segment(i))
}

/// The prefix as a Redis glob that matches only itself.
fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// What the server's reading of `key` says, as an operator reads it; `None`
/// for a key that is no lock of this library's.
fn describe(key: &LockKey, node: String, found: Found) -> Option<LockInfo> {
    let left = |ms: i64| u64::try_from(ms).ok().map(Duration::from_millis);
    let segment = !key.redis_key.ends_with('}') && !key.is_election();
    let (kind, holders, waiters) = match found.redis_type.as_str() {
        "string" => {
            let value = found.value?;
            let (id, marked) = match value.strip_suffix("+w") {
                Some(id) => (id.to_owned(), true),
                None => (value, false),
            };
            let kind = if id.starts_with("f:") {
                HeldKind::Fair
            } else if segment {
                HeldKind::Segment
            } else {
                HeldKind::Exclusive
            };
            let holder = LockHolder {
                id,
                role: "holder",
                time_left: left(found.pttl_ms),
            };
            (kind, vec![holder], marked || found.in_line > 0)
        }
        "zset" => {
            let mut kind = HeldKind::ReadWrite;
            let mut claimed = false;
            let mut holders = Vec::new();
            for (member, ends) in found.members {
                let role = match member.get(..2) {
                    Some("r:") => "reader",
                    Some("w:") => "writer",
                    Some("p:") => {
                        kind = HeldKind::Permits;
                        "permit"
                    }
                    _ => {
                        claimed = true;
                        continue;
                    }
                };
                // A member whose lease ended is no holder (the next
                // attempt on the key sweeps it); -1 is none that ends by
                // time (a ZooKeeper child, which ends with its session).
                let time_left = match ends {
                    -1 => None,
                    ends if ends <= found.now_ms => continue,
                    ends => left(ends - found.now_ms),
                };
                holders.push(LockHolder {
                    id: member,
                    role,
                    time_left,
                });
            }
            // A writer's claim (Redis, PostgreSQL), or keys waiting in
            // the line behind the holders (etcd).
            (kind, holders, claimed || found.in_line > 0)
        }
        _ => return None,
    };
    Some(LockInfo {
        key: key.name.clone(),
        node,
        kind,
        holders,
        fence: found.fence,
        waiters,
        in_line: found.in_line,
        value: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_locks_and_segments_are_lock_keys() {
        let name = |k: &str| lock_key("lock:", k).map(|k| k.name);
        assert_eq!(name("lock:{stock:1}").as_deref(), Some("stock:1"));
        assert_eq!(name("lock:{stock:1}#7").as_deref(), Some("stock:1#7"));
        assert_eq!(name("lock:{jobs}:leader").as_deref(), Some("jobs (election)"));
        for aux in [
            "lock:{a}:fence",
            "lock:{a}:leader:fence",
            "lock:{a}:leader:value",
            "lock:{a}:line",
            "lock:{a}:alive",
            "lock:{a}#x",
            "other:{a}",
            "lock:a",
        ] {
            assert_eq!(name(aux), None, "{aux}");
        }
    }

    #[test]
    fn a_prefix_with_glob_characters_matches_only_itself() {
        assert_eq!(escape_glob(r"a*b?[c]\"), r"a\*b\?\[c\]\\");
    }
}
