//! What an operator's tool asks of the ZooKeeper locks (`lockctl`): which
//! locks have a queue, who in a queue holds the lock, and freeing one
//! whatever holds it. Nothing here is on a lock call's path.
//!
//! A queue is read as the lock calls read it: its children in sequence
//! order, each child's name telling its holder's kind (`r:`, `w:`, `p:`,
//! `f:`, or none), a permit holder's child holding its permit count, so
//! that the same rule ([`in_the_way`]) says which children hold the lock
//! and which wait. The answers take the shape the Redis backend reads
//! ([`Found`]). A holder has no time left of its own: its child lives as
//! long as its session, which its client keeps alive.

use std::collections::BTreeSet;

use percent_encoding::percent_decode_str;
use zookeeper_client as zk;

use super::ZooKeeperBackend;
use crate::backend::Found;
use crate::backend::glob::{self, Glob};
use crate::backend::queue::{InTheWay, in_the_way};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

/// One child of a lock's queue, as read.
struct InLine {
    /// Its node name, `<holder>_<sequence>`.
    name: String,
    /// The holder id, its name without the sequence.
    holder: String,
    /// Its data: a permit holder's count, an election leader's value.
    data: Vec<u8>,
    czxid: i64,
}

impl InLine {
    /// The kind its holder asked for, from its name (and a permit count
    /// from its data; a child without one is read as one permit, which
    /// shows fewer holders, never more).
    fn kind(&self) -> Kind {
        match self.holder.get(..2) {
            Some("r:") => Kind::Read,
            Some("w:") => Kind::Write,
            Some("p:") => Kind::Permits(
                std::str::from_utf8(&self.data)
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1),
            ),
            _ => Kind::Exclusive,
        }
    }
}

/// Which children of `line` hold the lock, by the rule the lock calls use.
fn holding(line: &[InLine]) -> Vec<bool> {
    let names: Vec<&str> = line.iter().map(|c| c.name.as_str()).collect();
    line.iter()
        .enumerate()
        .map(|(i, child)| in_the_way(child.kind(), &names[..i]) == InTheWay::Nothing)
        .collect()
}

/// The children of `line` that hold the lock, in line order.
fn holders(line: &[InLine]) -> Vec<&InLine> {
    line.iter()
        .zip(holding(line))
        .filter_map(|(child, held)| held.then_some(child))
        .collect()
}

impl ZooKeeperBackend {
    /// Runs an operator's `work` within the command timeout; a refusal by
    /// the nodes' ACL says what the tool lacks.
    async fn admin<T>(
        &self,
        key: Option<&LockKey>,
        work: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, LockError> {
        let name = key.map(|k| k.name.as_str());
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(zk::Error::NoAuth)) => Err(LockError::backend(
                &self.connect,
                name,
                "the lock nodes' ACL refused this client: give it the services' ZooKeeper identity",
            )),
            Ok(Err(e)) => Err(LockError::backend(&self.connect, name, e.to_string())),
            Err(_) => Err(LockError::backend(
                &self.connect,
                name,
                format!("no answer within {}ms", self.timeout.as_millis()),
            )),
        }
    }

    /// The children of `key`'s queue in sequence order, with their data
    /// and creation zxids; a child gone between the listing and its read
    /// has left the line. The reads are sent together: the client
    /// pipelines them on its one connection, one round trip for the line.
    async fn read_line(&self, client: &zk::Client, key: &LockKey) -> Result<Vec<InLine>, zk::Error> {
        let queue = self.queue(key);
        let reads = self.line(client, &queue).await?.into_iter().map(|(_, name)| {
            let path = format!("{queue}/{name}");
            async move {
                match client.get_data(&path).await {
                    Ok((data, stat)) => Ok(Some(InLine {
                        holder: name
                            .rsplit_once('_')
                            .map_or(name.as_str(), |(holder, _)| holder)
                            .to_owned(),
                        name,
                        data,
                        czxid: stat.czxid,
                    })),
                    Err(zk::Error::NoNode) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        });
        let read = futures_util::future::try_join_all(reads).await?;
        Ok(read.into_iter().flatten().collect())
    }

    /// The names (`P{K}`, `P{K}#i`, `P{K}:leader`) of the locks with a
    /// queue under the root, that match the Redis glob `pattern`. An
    /// empty queue is listed until the server reaps it; `inspect` finds
    /// it free.
    ///
    /// ZooKeeper lists a node's children in one reply, which the server
    /// bounds (`jute.maxbuffer`, 1 MiB by default): some 30,000 locks
    /// under one root at once.
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<(String, Vec<String>)>, LockError> {
        let glob = Glob::parse(pattern).ok_or_else(|| glob::unclosed(pattern))?;
        let client = self.client().await.map_err(|f| f.error)?;
        let children = self
            .admin(None, async {
                match client.list_children(&self.root).await {
                    Err(zk::Error::NoNode) => Ok(Vec::new()),
                    listed => listed,
                }
            })
            .await?;
        let names: BTreeSet<String> = children
            .iter()
            .filter_map(|encoded| percent_decode_str(encoded).decode_utf8().ok())
            .filter(|name| glob.matches(name))
            .map(|name| name.into_owned())
            .collect();
        Ok(vec![(self.node().to_owned(), names.into_iter().collect())])
    }

    /// The lock `key` as the ensemble has it now, or `None` when its queue
    /// is empty. The fence is the newest creation zxid among the holders:
    /// the token the latest of them was given.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<Found>, LockError> {
        let client = self.client().await.map_err(|f| f.error)?;
        let line = self.admin(Some(key), self.read_line(&client, key)).await?;
        let Some(head) = line.first() else {
            return Ok(None);
        };
        let holders = holders(&line);
        let fence = holders.iter().filter_map(|c| u64::try_from(c.czxid).ok()).max();
        let shared = matches!(head.kind(), Kind::Read | Kind::Write | Kind::Permits(_));
        Ok(Some(Found {
            redis_type: if shared { "zset" } else { "string" }.into(),
            now_ms: 0,
            // No expiry: a child ends with its session.
            pttl_ms: -1,
            fence,
            in_line: u64::try_from(line.len() - holders.len()).unwrap_or(u64::MAX),
            value: (!shared).then(|| head.holder.clone()),
            members: if shared {
                holders.iter().map(|c| (c.holder.clone(), -1)).collect()
            } else {
                Vec::new()
            },
        }))
    }

    /// Frees the lock `key` whatever holds it: deletes the children that
    /// hold it. A child's name is never used twice (its sequence number
    /// is the queue's), so a holder that left and joined again in between
    /// is not cut off. The waiter behind each watches it, and takes its
    /// turn; a holder learns at its next renewal that its child is gone.
    /// `false` when the queue had no holder.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let client = self.client().await.map_err(|f| f.error)?;
        let queue = self.queue(key);
        // Holders that left between the read and the deletion: read again;
        // a few rounds settle any line but one in constant churn.
        for _ in 0..5 {
            let line = self.admin(Some(key), self.read_line(&client, key)).await?;
            let holders = holders(&line);
            if holders.is_empty() {
                return Ok(false);
            }
            let mut freed = false;
            for child in holders {
                let path = format!("{queue}/{}", child.name);
                freed |= self
                    .admin(Some(key), async {
                        match client.delete(&path, None).await {
                            Ok(()) => Ok(true),
                            Err(zk::Error::NoNode) => Ok(false),
                            Err(e) => Err(e),
                        }
                    })
                    .await?;
            }
            if freed {
                return Ok(true);
            }
        }
        Err(LockError::backend(
            &self.connect,
            Some(&key.name),
            "the lock's queue kept changing while it was being freed; try again",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(children: &[(&str, &str)]) -> Vec<InLine> {
        children
            .iter()
            .enumerate()
            .map(|(i, (holder, data))| InLine {
                name: format!("{holder}_{i:010}"),
                holder: (*holder).to_owned(),
                data: data.as_bytes().to_vec(),
                czxid: i64::try_from(i).unwrap_or(0),
            })
            .collect()
    }

    #[test]
    fn a_queue_holds_as_the_lock_calls_judge_it() {
        assert_eq!(holding(&line(&[("1a:0", ""), ("1b:0", "")])), [true, false]);
        assert_eq!(
            holding(&line(&[
                ("r:1a:0", ""),
                ("r:1b:0", ""),
                ("w:1c:0", ""),
                ("r:1d:0", "")
            ])),
            [true, true, false, false]
        );
        assert_eq!(
            holding(&line(&[("p:1a:0", "2"), ("p:1b:0", "2"), ("p:1c:0", "2")])),
            [true, true, false]
        );
        assert_eq!(
            holding(&line(&[("f:1a:0", ""), ("f:1b:0", ""), ("f:1c:0", "")])),
            [true, false, false]
        );
    }

    #[test]
    fn a_permit_without_its_count_is_read_as_one() {
        assert_eq!(line(&[("p:1a:0", "3")])[0].kind(), Kind::Permits(3));
        assert_eq!(line(&[("p:1a:0", "")])[0].kind(), Kind::Permits(1));
        assert_eq!(line(&[("p:1a:0", "x")])[0].kind(), Kind::Permits(1));
        assert_eq!(line(&[("r:1a:0", "")])[0].kind(), Kind::Read);
        assert_eq!(line(&[("1a:0", "leader value")])[0].kind(), Kind::Exclusive);
    }
}
