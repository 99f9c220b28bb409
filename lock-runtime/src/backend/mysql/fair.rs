//! Fair locks on MySQL / MariaDB: an exclusive lock (a row of the main
//! table, as any exclusive lock) handed to its waiters in the order they
//! came.
//!
//! The line is the lock's rows in the members table, one per waiter (member
//! = the waiter's `f:` holder id), ordered by `queued_at`, the server-clock
//! instant of the waiter's first attempt. A place lapses at its
//! `expires_at` unless the waiter's next attempt renews it, so a dead
//! waiter delays the line by at most the client's `fair_waiter_timeout`.
//! Every attempt locks the lock's row first (inserting a free one if
//! missing), so the line and the lock are judged together, in one
//! transaction.

use mysql_async::Transaction;
use mysql_async::prelude::Queryable;

use super::shared::gate_kind;
use super::table::{Attempted, MysqlBackend, as_micros, micros};
use crate::backend::contract::{AcquireReply, AcquireRequest, Failure};
use crate::key::LockKey;

impl MysqlBackend {
    /// The body of a fair attempt, in `tx`; `Err` names the shared lock
    /// found on the name.
    pub(super) async fn fair_in(
        &self,
        tx: &mut Transaction<'_>,
        req: &AcquireRequest<'_>,
    ) -> Result<Attempted, mysql_async::Error> {
        let sql = &self.fair;
        let name = req.key.redis_key.as_str();
        let me = req.holder;
        tx.exec_drop(&sql.open, (name,)).await?;
        let row: Option<(Vec<u8>, u64, u64)> = tx.exec_first(&sql.read, (name,)).await?;
        let (holder, left, fence) = row.unwrap_or_default();
        if holder.first() == Some(&b'#') {
            return Ok(Err(gate_kind(&String::from_utf8_lossy(&holder))));
        }
        let ttl_us = as_micros(req.ttl);
        let step = u64::from(req.fencing);
        if left > 0 && holder == me.as_bytes() {
            // An earlier attempt was applied, its reply lost: the lease
            // only lengthens (this may be a late copy, after an
            // extension), and that attempt's token stands.
            tx.exec_drop(&sql.take, (me, ttl_us, fence, name)).await?;
            return Ok(Ok(AcquireReply::acquired(req.fencing.then_some(fence))));
        }
        tx.exec_drop(&sql.lapse, (name,)).await?;
        let first: Option<(Vec<u8>, u64)> = tx.exec_first(&sql.first, (name,)).await?;
        let free = left == 0;
        let my_turn = first.as_ref().is_none_or(|(member, _)| member == me.as_bytes());
        if free && my_turn {
            tx.exec_drop(&sql.take, (me, ttl_us, fence + step, name)).await?;
            tx.exec_drop(&sql.leave, (name, me)).await?;
            return Ok(Ok(AcquireReply::acquired(req.fencing.then_some(fence + step))));
        }
        if req.waiting {
            tx.exec_drop(&sql.stand, (name, me, as_micros(req.waiter_timeout)))
                .await?;
        } else {
            // A last try, or a caller that does not wait: no place kept.
            tx.exec_drop(&sql.leave, (name, me)).await?;
        }
        // Held: what is left of the lease; free but owed to an earlier
        // waiter: what is left of that waiter's place.
        let wait_us = if free {
            first.map_or(0, |(_, place)| place)
        } else {
            left
        };
        Ok(Ok(AcquireReply::Held {
            pttl: Some(micros(wait_us)),
            claimed: req.waiting,
            blocked_by: 0,
        }))
    }

    /// Takes `holder` (a fair lock's waiter that stops waiting) out of the
    /// line of `key`. `Ok(true)` if it stood in it.
    pub(super) async fn leave_line(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        let name = key.redis_key.as_str();
        self.run(key, "release", || async {
            let conn = &mut self.pool.get_conn().await?;
            conn.exec_drop(&self.fair.leave, (name, holder)).await?;
            Ok(conn.affected_rows() > 0)
        })
        .await
    }
}
