//! What an operator's tool asks of the etcd locks (`lockctl`): which locks
//! have a line, who in a line holds the lock, and freeing one whatever
//! holds it. Nothing here is on a lock call's path.
//!
//! A line is read as the lock calls read it: in create-revision order,
//! each key's name telling its kind (`r:`, `w:`, `p:<permits>:`, or none),
//! so that the same rule ([`in_the_way`]) says which keys hold the lock
//! and which wait. The answers take the shape the Redis backend reads
//! ([`Found`]).

use std::collections::{BTreeSet, HashMap};

use etcd_client as etcd;
use percent_encoding::percent_decode_str;

use super::EtcdBackend;
use crate::backend::Found;
use crate::backend::glob::{self, Glob};
use crate::backend::queue::{InTheWay, in_the_way};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

/// How many keys one read of the whole root returns at most.
const PAGE: i64 = 1000;

/// One key in a lock's line.
struct InLine {
    /// Its name within the line: `<side><lease>:<slot>`.
    name: String,
    /// Its value: the holder id.
    holder: String,
    create_revision: i64,
    lease: i64,
}

/// The kind of lock a key in a line was put for, from its name.
fn kind_of(name: &str) -> Kind {
    if name.starts_with("r:") {
        Kind::Read
    } else if name.starts_with("w:") {
        Kind::Write
    } else if let Some(rest) = name.strip_prefix("p:") {
        // `p:<permits>:<lease>:<slot>`; a name without its count is read
        // as one permit, which shows fewer holders, never more.
        Kind::Permits(
            rest.split_once(':')
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or(1),
        )
    } else {
        Kind::Exclusive
    }
}

/// Which keys of `line` hold the lock, by the rule the lock calls use.
fn holding(line: &[InLine]) -> Vec<bool> {
    let names: Vec<&str> = line.iter().map(|k| k.name.as_str()).collect();
    (0..names.len())
        .map(|i| in_the_way(kind_of(names[i]), &names[..i]) == InTheWay::Nothing)
        .collect()
}

/// The keys of `line` that hold the lock, in line order.
fn holders(line: &[InLine]) -> Vec<&InLine> {
    line.iter()
        .zip(holding(line))
        .filter(|(_, held)| *held)
        .map(|(entry, _)| entry)
        .collect()
}

impl EtcdBackend {
    /// Runs an operator's `work` within the command timeout.
    async fn admin<T>(
        &self,
        key: Option<&LockKey>,
        work: impl Future<Output = Result<T, etcd::Error>>,
    ) -> Result<T, LockError> {
        let name = key.map(|k| k.name.as_str());
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(LockError::backend(&self.node, name, e.to_string())),
            Err(_) => Err(LockError::backend(
                &self.node,
                name,
                format!("no answer within {}ms", self.timeout.as_millis()),
            )),
        }
    }

    /// The line of `key`, in create-revision order.
    async fn read_line(&self, client: &mut etcd::Client, key: &LockKey) -> Result<Vec<InLine>, etcd::Error> {
        let queue = self.queue(key);
        let options = etcd::GetOptions::new()
            .with_prefix()
            .with_sort(etcd::SortTarget::Create, etcd::SortOrder::Ascend);
        let reply = client.get(queue.as_str(), Some(options)).await?;
        Ok(reply
            .kvs()
            .iter()
            .map(|kv| InLine {
                name: String::from_utf8_lossy(kv.key().get(queue.len()..).unwrap_or_default()).into_owned(),
                holder: String::from_utf8_lossy(kv.value()).into_owned(),
                create_revision: kv.create_revision(),
                lease: kv.lease(),
            })
            .collect())
    }

    /// The names (`P{K}`, `P{K}#i`) of the locks with a line, that match
    /// the Redis glob `pattern`.
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<(String, Vec<String>)>, LockError> {
        let glob = Glob::parse(pattern).ok_or_else(|| glob::unclosed(pattern))?;
        let mut client = self.client().await.map_err(|f| f.error)?;
        let root = format!("{}/", self.root);
        // The range `<root>/` to `<root>0`: `0` follows `/` in ASCII.
        let end = format!("{}0", self.root);
        let mut names = BTreeSet::new();
        let mut from = root.clone().into_bytes();
        loop {
            let options = etcd::GetOptions::new()
                .with_range(end.as_str())
                .with_keys_only()
                .with_limit(PAGE);
            let reply = self.admin(None, client.get(from.clone(), Some(options))).await?;
            for kv in reply.kvs() {
                let lock = String::from_utf8_lossy(kv.key().get(root.len()..).unwrap_or_default())
                    .rsplit_once('/')
                    // A tombstone is no lock's (see `Doomed`).
                    .filter(|(encoded, _)| !encoded.ends_with(super::TOMBSTONES))
                    .and_then(|(encoded, _)| percent_decode_str(encoded).decode_utf8().ok())
                    .map(|name| name.into_owned());
                names.extend(lock.filter(|name| glob.matches(name)));
            }
            match reply.kvs().last() {
                // Next page: from just past the last key read.
                Some(last) if reply.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(vec![(self.node.clone(), names.into_iter().collect())])
    }

    /// The lock `key` as the cluster has it now, or `None` when its line is
    /// empty.
    ///
    /// A holder's time left is its etcd lease's (whole seconds, as etcd
    /// counts them); the lock's lease within it is the holder's own and
    /// never longer. The fence is the newest create revision among the
    /// holders: the token the latest of them was given.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<Found>, LockError> {
        let mut client = self.client().await.map_err(|f| f.error)?;
        let line = self.admin(Some(key), self.read_line(&mut client, key)).await?;
        let Some(head) = line.first() else {
            return Ok(None);
        };
        let holders = holders(&line);
        let mut left_ms: HashMap<i64, i64> = HashMap::new();
        for entry in &holders {
            if left_ms.contains_key(&entry.lease) {
                continue;
            }
            let reply = self
                .admin(Some(key), client.lease_time_to_live(entry.lease, None))
                .await?;
            // etcd's -1 for a lease that has ended; the Redis shape's -2.
            let ms = if reply.ttl() < 0 { -2 } else { reply.ttl() * 1000 };
            left_ms.insert(entry.lease, ms);
        }
        let left = |entry: &InLine| left_ms.get(&entry.lease).copied().unwrap_or(-2);
        let waiting = line.len() - holders.len();
        let fence = holders
            .iter()
            .filter_map(|e| u64::try_from(e.create_revision).ok())
            .max();
        let shared = matches!(kind_of(&head.name), Kind::Read | Kind::Write | Kind::Permits(_));
        Ok(Some(Found {
            redis_type: if shared { "zset" } else { "string" }.into(),
            // Members' ends are given as time left: the clock starts now.
            now_ms: 0,
            pttl_ms: left(head),
            fence,
            in_line: u64::try_from(waiting).unwrap_or(u64::MAX),
            value: (!shared).then(|| head.holder.clone()),
            members: if shared {
                holders.iter().map(|e| (e.holder.clone(), left(e))).collect()
            } else {
                Vec::new()
            },
        }))
    }

    /// Frees the lock `key` whatever holds it: deletes the keys that hold
    /// it, each only if it is still the key that was read (so a holder that
    /// left and joined again in between is not cut off). The waiters
    /// behind watch those deletions and take their turn; the holders learn
    /// at their next renewal that their key is gone. `false` when the line
    /// had no holder.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let mut client = self.client().await.map_err(|f| f.error)?;
        let queue = self.queue(key);
        // A line that changes between the read and the deletion is read
        // again; a few rounds settle any line but one in constant churn.
        for _ in 0..5 {
            let line = self.admin(Some(key), self.read_line(&mut client, key)).await?;
            let holders = holders(&line);
            if holders.is_empty() {
                return Ok(false);
            }
            let path = |e: &InLine| format!("{queue}{}", e.name);
            let unchanged: Vec<etcd::Compare> = holders
                .iter()
                .map(|e| etcd::Compare::create_revision(path(e), etcd::CompareOp::Equal, e.create_revision))
                .collect();
            let deletes: Vec<etcd::TxnOp> = holders
                .iter()
                .map(|e| etcd::TxnOp::delete(path(e), None))
                .collect();
            let txn = etcd::Txn::new().when(unchanged).and_then(deletes);
            if self.admin(Some(key), client.txn(txn)).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(LockError::backend(
            &self.node,
            Some(&key.name),
            "the lock's line kept changing while it was being freed; try again",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(names: &[&str]) -> Vec<InLine> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| InLine {
                name: (*name).to_owned(),
                holder: String::new(),
                create_revision: i64::try_from(i).unwrap_or(0),
                lease: 1,
            })
            .collect()
    }

    #[test]
    fn a_line_holds_as_the_lock_calls_judge_it() {
        assert_eq!(holding(&line(&["1a:0", "1b:0"])), [true, false]);
        assert_eq!(
            holding(&line(&["r:1a:0", "r:1b:0", "w:1c:0", "r:1d:0"])),
            [true, true, false, false]
        );
        assert_eq!(
            holding(&line(&["p:2:1a:0", "p:2:1b:0", "p:2:1c:0"])),
            [true, true, false]
        );
        assert_eq!(
            holding(&line(&["f:1a:0", "f:1b:0", "f:1c:0"])),
            [true, false, false]
        );
    }

    #[test]
    fn a_key_name_tells_its_kind() {
        assert_eq!(kind_of("p:3:1a:0"), Kind::Permits(3));
        assert_eq!(kind_of("p:1a:0"), Kind::Permits(1));
        assert_eq!(kind_of("r:1a:0"), Kind::Read);
        assert_eq!(kind_of("w:1a:0"), Kind::Write);
        assert_eq!(kind_of("1a:0"), Kind::Exclusive);
    }
}
