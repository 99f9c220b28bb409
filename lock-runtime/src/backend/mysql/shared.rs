//! Shared locks on MySQL / MariaDB: the sides of a read-write lock and the
//! permits of a semaphore.
//!
//! Each holder is a row of its own in the members table (`<table>_members`,
//! keyed by lock name and member), with its own lease, judged by the
//! server's clock. Members are named as on Redis: `r:<id>` a reader, `w:<id>`
//! a writer, `q:<id>` a waiting writer's claim, `p:<id>` a permit holder.
//!
//! Admission reads all of a lock's members and adds one, so two attempts
//! must not interleave: every change to a lock's members first locks its
//! *gate*, the lock's row in the main table, marked `#rw` or `#permits`
//! with an expiry at the end of time. An exclusive attempt on that name finds
//! the gate held and reports the conflict; the gate also carries the
//! writers' fencing counter. The last member's release deletes the gate, or
//! frees it like any fenced row when it holds a counter.
//!
//! Each operation is one transaction of a few statements; a dropped one is
//! rolled back by the driver before its connection is reused.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Transaction, TxOpts};

use super::table::{Attempted, MysqlBackend, as_micros, micros};
use crate::backend::contract::{AcquireReply, AcquireRequest, Failure};
use crate::key::LockKey;
use crate::timing::WRITER_CLAIM;

/// Whether `holder` names a member of a shared lock rather than an
/// exclusive holder (whose ids are hex, never `r`, `w` or `p`).
pub(super) fn is_member(holder: &str) -> bool {
    matches!(holder.as_bytes(), [b'r' | b'w' | b'p', b':', ..])
}

/// The gate marker for the shared lock `member` belongs to.
fn marker(member: &str) -> &'static str {
    if member.starts_with("p:") {
        "#permits"
    } else {
        "#rw"
    }
}

/// The kind a gate marker stands for, as conflicts name it.
pub(super) fn gate_kind(holder: &str) -> &'static str {
    if holder == "#permits" {
        "semaphore"
    } else {
        "read-write lock"
    }
}

/// What admission decided, from the members found.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// Already a member: an earlier attempt's reply was lost.
    Again,
    Admitted,
    /// Refused; this much is left of the first lease in the way.
    Refused(Duration),
}

/// The rules Redis applies in `acquire_shared.lua`: a reader yields to a
/// writer and to a writer's claim; a writer to every holder but not to
/// another writer's claim; a permit is one of at most `permits`. `members`
/// are the live ones, soonest lease end first.
fn admit(member: &str, permits: u32, members: &[(String, u64)]) -> Admission {
    if members.iter().any(|(m, _)| m == member) {
        return Admission::Again;
    }
    if permits > 0 {
        let full = members.len() >= usize::try_from(permits).unwrap_or(usize::MAX);
        return match members.first() {
            Some((_, left)) if full => Admission::Refused(micros(*left)),
            _ => Admission::Admitted,
        };
    }
    let reader = member.starts_with("r:");
    let in_the_way = members.iter().find(|(other, _)| {
        if reader {
            !other.starts_with("r:")
        } else {
            !other.starts_with("q:")
        }
    });
    match in_the_way {
        Some((_, left)) => Admission::Refused(micros(*left)),
        None => Admission::Admitted,
    }
}

impl MysqlBackend {
    /// The body of a shared acquisition, in `tx`; `Err` names the other
    /// kind of lock found on the name.
    pub(super) async fn admit_in(
        &self,
        tx: &mut Transaction<'_>,
        req: &AcquireRequest<'_>,
        permits: u32,
    ) -> Result<Attempted, mysql_async::Error> {
        let sql = &self.shared;
        let name = req.key.redis_key.as_str();
        let member = req.holder;
        let mark = marker(member);
        tx.exec_drop(&sql.open_gate, (name, mark)).await?;
        let gate: Option<(Vec<u8>, bool, u64)> = tx.exec_first(&sql.read_gate, (name,)).await?;
        let (holder, live, fence) = gate.unwrap_or_else(|| (mark.as_bytes().to_vec(), true, 0));
        if holder != mark.as_bytes() {
            if holder.first() == Some(&b'#') {
                return Ok(Err(gate_kind(&String::from_utf8_lossy(&holder))));
            }
            if live && !holder.is_empty() {
                return Ok(Err("exclusive lock"));
            }
            // A freed fenced row or an expired exclusive lease: the name
            // is free, and becomes this kind's.
            tx.exec_drop(&sql.mark_gate, (mark, name)).await?;
        }
        tx.exec_drop(&sql.expire_members, (name,)).await?;
        let members: Vec<(String, u64)> = tx.exec(&sql.list_members, (name,)).await?;
        let ttl_us = as_micros(req.ttl);
        let again = match admit(member, permits, &members) {
            Admission::Again => true,
            Admission::Admitted => false,
            Admission::Refused(left) => {
                let claim = member.strip_prefix("w:").map(|id| format!("q:{id}"));
                let claimed = match claim {
                    Some(claim) if req.waiting => {
                        tx.exec_drop(&sql.put_member, (name, claim, as_micros(WRITER_CLAIM)))
                            .await?;
                        true
                    }
                    _ => false,
                };
                return Ok(Ok(AcquireReply::Held {
                    pttl: Some(left),
                    claimed,
                    blocked_by: 0,
                }));
            }
        };
        tx.exec_drop(&sql.put_member, (name, member, ttl_us)).await?;
        if let Some(id) = member.strip_prefix("w:") {
            tx.exec_drop(&sql.delete_member, (name, format!("q:{id}")))
                .await?;
        }
        let token = if req.fencing && !again {
            tx.exec_drop(&sql.set_fence, (fence + 1, name)).await?;
            Some(fence + 1)
        } else {
            req.fencing.then_some(fence)
        };
        Ok(Ok(AcquireReply::acquired(token)))
    }

    /// Ends `member`'s lease (and a writer's claim); the last member out
    /// closes the gate. `Ok(false)`: it was no longer a member.
    pub(super) async fn release_member(&self, key: &LockKey, member: &str) -> Result<bool, Failure> {
        let sql = &self.shared;
        let name = key.redis_key.as_str();
        let mark = marker(member);
        self.run(key, "release", || async {
            let conn = &mut self.pool.get_conn().await?;
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            // The gate first, as every attempt takes it: no attempt can
            // admit a member between the count below and the gate's end.
            let _: Option<(Vec<u8>, bool, u64)> = tx.exec_first(&sql.read_gate, (name,)).await?;
            tx.exec_drop(&sql.delete_member, (name, member)).await?;
            let was_member = tx.affected_rows() > 0;
            if let Some(id) = member.strip_prefix("w:") {
                tx.exec_drop(&sql.delete_member, (name, format!("q:{id}")))
                    .await?;
            }
            let left: Option<u64> = tx.exec_first(&sql.count_members, (name,)).await?;
            if left == Some(0) {
                tx.exec_drop(&sql.drop_gate, (name, mark)).await?;
                if tx.affected_rows() == 0 {
                    // It keeps a fencing counter.
                    tx.exec_drop(&sql.free_gate, (name, mark)).await?;
                }
            }
            tx.commit().await?;
            Ok(was_member)
        })
        .await
    }

    /// Sets (or only lengthens) `member`'s lease if it is still one.
    pub(super) async fn renew_member(
        &self,
        key: &LockKey,
        member: &str,
        ttl: Duration,
        extend_only: bool,
    ) -> Result<bool, Failure> {
        let sql = &self.shared;
        let statement = if extend_only { &sql.extend } else { &sql.renew };
        let name = key.redis_key.as_str();
        self.run(key, "renew", || async {
            let conn = &mut self.pool.get_conn().await?;
            conn.exec_drop(statement, (as_micros(ttl), name, member)).await?;
            if conn.affected_rows() > 0 {
                return Ok(true);
            }
            let held: Option<i64> = conn.exec_first(&sql.still_held, (name, member)).await?;
            Ok(held.is_some())
        })
        .await
    }

    /// The kind of shared lock whose gate an exclusive attempt met.
    pub(super) async fn gate_found(&self, key: &LockKey) -> Result<&'static str, Failure> {
        let sql = format!("SELECT holder FROM `{}` WHERE name = ?", self.table);
        let name = key.redis_key.as_str();
        let holder: Option<Vec<u8>> = self
            .run(key, "acquire", || async {
                self.pool
                    .get_conn()
                    .await?
                    .exec_first(sql.as_str(), (name,))
                    .await
            })
            .await?;
        Ok(gate_kind(&String::from_utf8_lossy(&holder.unwrap_or_default())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(members: &[&str]) -> Vec<(String, u64)> {
        members.iter().map(|m| ((*m).to_owned(), 1_000_000)).collect()
    }

    #[test]
    fn readers_share_and_yield_to_writers_and_claims() {
        assert_eq!(admit("r:a:1", 0, &live(&["r:b:1"])), Admission::Admitted);
        assert!(matches!(
            admit("r:a:1", 0, &live(&["w:b:1"])),
            Admission::Refused(_)
        ));
        assert!(matches!(
            admit("r:a:1", 0, &live(&["q:b:1"])),
            Admission::Refused(_)
        ));
    }

    #[test]
    fn a_writer_yields_to_holders_but_not_to_claims() {
        assert!(matches!(
            admit("w:a:1", 0, &live(&["r:b:1"])),
            Admission::Refused(_)
        ));
        assert_eq!(admit("w:a:1", 0, &live(&["q:b:1", "q:a:1"])), Admission::Admitted);
        assert_eq!(admit("w:a:1", 0, &live(&["w:a:1"])), Admission::Again);
    }

    #[test]
    fn permits_count_holders() {
        assert_eq!(admit("p:a:1", 2, &live(&["p:b:1"])), Admission::Admitted);
        assert!(matches!(
            admit("p:a:1", 2, &live(&["p:b:1", "p:c:1"])),
            Admission::Refused(_)
        ));
    }

    #[test]
    fn members_are_told_from_exclusive_holders() {
        assert!(is_member("r:ab:1") && is_member("w:ab:1") && is_member("p:ab:1"));
        assert!(!is_member("ab12:3") && !is_member("q:ab:1"));
    }
}
