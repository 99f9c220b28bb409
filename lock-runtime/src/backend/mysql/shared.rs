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
use crate::backend::members::{Admission, admit, marker};
pub(super) use crate::backend::members::{gate_kind, is_member};
use crate::key::LockKey;
use crate::timing::WRITER_CLAIM;

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
        let members: Vec<(String, Duration)> =
            members.into_iter().map(|(m, left)| (m, micros(left))).collect();
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
