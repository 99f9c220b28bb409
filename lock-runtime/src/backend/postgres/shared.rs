//! Shared locks on PostgreSQL: the sides of a read-write lock and the
//! permits of a semaphore, with the MySQL backend's layout and rules.
//!
//! Each holder is a row of its own in the members table (`<table>_members`,
//! keyed by lock name and member), with its own lease, judged by the
//! server's clock. Members are named as on Redis: `r:<id>` a reader, `w:<id>`
//! a writer, `q:<id>` a waiting writer's claim, `p:<id>` a permit holder.
//!
//! Admission reads all of a lock's members and adds one, so two attempts
//! must not interleave: every change to a lock's members first locks its
//! *gate*, the lock's row in the main table (`SELECT … FOR UPDATE`), marked
//! `#rw` or `#permits` with the expiry `infinity`. An exclusive attempt on
//! that name finds the gate and reports the conflict; the gate also carries
//! the writers' fencing counter. The last member's release deletes the
//! gate, or frees it like any fenced row when it holds a counter.
//!
//! Each operation is one transaction of a few statements; a dropped one is
//! rolled back before its connection is reused.

use std::time::Duration;

use deadpool_postgres::{GenericClient, PoolError, Transaction};

use super::table::{Attempted, PostgresBackend, as_micros, micros};
use crate::backend::contract::{AcquireReply, AcquireRequest, Failure};
use crate::backend::members::{Admission, admit, marker};
pub(super) use crate::backend::members::{gate_kind, is_member};
use crate::key::LockKey;
use crate::timing::WRITER_CLAIM;

impl PostgresBackend {
    /// One attempt at a side of a read-write lock (`permits` 0) or a
    /// permit, in a transaction; another kind of lock found on the name is
    /// a conflict.
    pub(super) async fn acquire_shared(
        &self,
        req: &AcquireRequest<'_>,
        permits: u32,
    ) -> Result<AcquireReply, Failure> {
        Self::check_name(req.key, &req.key.redis_key)?;
        let outcome = self
            .run(req.key, "acquire", || async {
                let mut attempt = self.attempt(req.holder).await?;
                let tx = attempt.connection().transaction().await?;
                let reply = self.admit_in(&tx, req, permits).await?;
                tx.commit().await?;
                attempt.answered();
                Ok(reply)
            })
            .await?;
        outcome.map_err(|found| super::table::conflict(req.key, found))
    }

    async fn admit_in(
        &self,
        tx: &Transaction<'_>,
        req: &AcquireRequest<'_>,
        permits: u32,
    ) -> Result<Attempted, PoolError> {
        let sql = &self.members;
        let name = req.key.redis_key.as_str();
        let member = req.holder;
        let mark = marker(member);
        tx.execute(&tx.prepare_cached(&sql.open_gate).await?, &[&name, &mark])
            .await?;
        let gate = tx
            .query_opt(&tx.prepare_cached(&sql.read_gate).await?, &[&name])
            .await?;
        let (holder, live, fence): (String, bool, i64) = match gate {
            Some(row) => (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?),
            None => (mark.to_owned(), true, 0),
        };
        if holder != mark {
            if holder.starts_with('#') {
                return Ok(Err(gate_kind(&holder)));
            }
            if live && !holder.is_empty() {
                return Ok(Err("exclusive lock"));
            }
            // A freed fenced row or an expired exclusive lease: the name
            // is free, and becomes this kind's.
            tx.execute(&tx.prepare_cached(&sql.mark_gate).await?, &[&mark, &name])
                .await?;
        }
        tx.execute(&tx.prepare_cached(&sql.expire_members).await?, &[&name])
            .await?;
        let members: Vec<(String, Duration)> = tx
            .query(&tx.prepare_cached(&sql.list_members).await?, &[&name])
            .await?
            .iter()
            .map(|row| Ok((row.try_get(0)?, micros(row.try_get(1)?))))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        let put = tx.prepare_cached(&sql.put_member).await?;
        let again = match admit(member, permits, &members) {
            Admission::Again => true,
            Admission::Admitted => false,
            Admission::Refused(left) => {
                let claim = member.strip_prefix("w:").map(|id| format!("q:{id}"));
                let claimed = match claim {
                    Some(claim) if req.waiting => {
                        tx.execute(&put, &[&name, &claim, &as_micros(WRITER_CLAIM)])
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
        tx.execute(&put, &[&name, &member, &as_micros(req.ttl)]).await?;
        if let Some(id) = member.strip_prefix("w:") {
            let claim = format!("q:{id}");
            tx.execute(&tx.prepare_cached(&sql.delete_member).await?, &[&name, &claim])
                .await?;
        }
        let fence = u64::try_from(fence).unwrap_or(0);
        let token = if req.fencing && !again {
            let next = i64::try_from(fence + 1).unwrap_or(i64::MAX);
            tx.execute(&tx.prepare_cached(&sql.set_fence).await?, &[&next, &name])
                .await?;
            Some(fence + 1)
        } else {
            req.fencing.then_some(fence)
        };
        Ok(Ok(AcquireReply::acquired(token)))
    }

    /// Ends `member`'s lease (and a writer's claim), and announces it; the
    /// last member out closes the gate. `Ok(false)`: it was no longer a
    /// member.
    pub(super) async fn release_member(&self, key: &LockKey, member: &str) -> Result<bool, Failure> {
        let sql = &self.members;
        let name = key.redis_key.as_str();
        let mark = marker(member);
        self.run(key, "release", || async {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await?;
            // The gate first, as every attempt takes it: no attempt can
            // admit a member between the count below and the gate's end.
            tx.query_opt(&tx.prepare_cached(&sql.read_gate).await?, &[&name])
                .await?;
            let delete = tx.prepare_cached(&sql.delete_member).await?;
            let was_member = tx.execute(&delete, &[&name, &member]).await? > 0;
            if let Some(id) = member.strip_prefix("w:") {
                let claim = format!("q:{id}");
                tx.execute(&delete, &[&name, &claim]).await?;
            }
            let left: i64 = tx
                .query_one(&tx.prepare_cached(&sql.count_members).await?, &[&name])
                .await?
                .try_get(0)?;
            if left == 0 {
                let dropped = tx
                    .execute(&tx.prepare_cached(&sql.drop_gate).await?, &[&name, &mark])
                    .await?;
                if dropped == 0 {
                    // It keeps a fencing counter.
                    tx.execute(&tx.prepare_cached(&sql.free_gate).await?, &[&name, &mark])
                        .await?;
                }
            }
            if was_member {
                self.announce(&tx, key, member).await?;
            }
            tx.commit().await?;
            Ok(was_member)
        })
        .await
    }

    /// Tells the listening clients, when `tx` commits, that `holder` left
    /// lock `key`.
    pub(super) async fn announce(
        &self,
        tx: &Transaction<'_>,
        key: &LockKey,
        holder: &str,
    ) -> Result<(), PoolError> {
        let payload = format!("{holder} {}", key.channel);
        tx.query_one(
            &tx.prepare_cached(&self.members.notify).await?,
            &[&self.sql.channel, &payload],
        )
        .await?;
        Ok(())
    }
}
