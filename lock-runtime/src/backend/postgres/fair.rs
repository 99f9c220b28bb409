//! Fair locks on PostgreSQL: an exclusive lock (a row of the main table, as
//! any exclusive lock) handed to its waiters in the order they came, with
//! the MySQL backend's layout.
//!
//! The line is the lock's rows in the members table, one per waiter (member
//! = the waiter's `f:` holder id), ordered by `queued_at`, the server-clock
//! instant of the waiter's first attempt. A place lapses at its
//! `expires_at` unless the waiter's next attempt renews it, so a dead
//! waiter delays the line by at most the client's `fair_waiter_timeout`.
//! Every attempt locks the lock's row first (inserting a free one if
//! missing), so the line and the lock are judged together, in one
//! transaction.

use deadpool_postgres::{GenericClient, PoolError, Transaction};

use super::shared::gate_kind;
use super::table::{Attempted, PostgresBackend, as_micros, conflict, micros};
use crate::backend::contract::{AcquireReply, AcquireRequest, Failure};
use crate::key::LockKey;

impl PostgresBackend {
    /// One attempt at a fair lock, in a transaction.
    pub(super) async fn acquire_fair(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        Self::check_name(req.key, &req.key.redis_key)?;
        let outcome = self
            .run(req.key, "acquire", || async {
                let mut attempt = self.attempt(req.holder).await?;
                let tx = attempt.connection().transaction().await?;
                let reply = self.fair_in(&tx, req).await?;
                tx.commit().await?;
                attempt.answered();
                Ok(reply)
            })
            .await?;
        outcome.map_err(|found| conflict(req.key, found))
    }

    async fn fair_in(&self, tx: &Transaction<'_>, req: &AcquireRequest<'_>) -> Result<Attempted, PoolError> {
        let sql = &self.members;
        let name = req.key.redis_key.as_str();
        let me = req.holder;
        tx.execute(&tx.prepare_cached(&sql.open_line).await?, &[&name])
            .await?;
        let row = tx
            .query_opt(&tx.prepare_cached(&sql.read_line_lock).await?, &[&name])
            .await?;
        let (holder, left, fence): (String, i64, i64) = match row {
            Some(row) => (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?),
            None => (String::new(), 0, 0),
        };
        if holder.starts_with('#') {
            return Ok(Err(gate_kind(&holder)));
        }
        let ttl_us = as_micros(req.ttl);
        let step = i64::from(req.fencing);
        let take = tx.prepare_cached(&sql.take).await?;
        let leave = tx.prepare_cached(&sql.delete_member).await?;
        let token = |fence: i64| req.fencing.then_some(u64::try_from(fence).unwrap_or(0));
        if left > 0 && holder == me {
            // An earlier attempt was applied, its reply lost: the lease
            // only lengthens (this may be a late copy, after an
            // extension), and that attempt's token stands.
            tx.execute(&take, &[&me, &ttl_us, &fence, &name]).await?;
            return Ok(Ok(AcquireReply::acquired(token(fence))));
        }
        tx.execute(&tx.prepare_cached(&sql.expire_members).await?, &[&name])
            .await?;
        let first = tx
            .query_opt(&tx.prepare_cached(&sql.first).await?, &[&name])
            .await?;
        let first: Option<(String, i64)> = match first {
            Some(row) => Some((row.try_get(0)?, row.try_get(1)?)),
            None => None,
        };
        let free = left == 0;
        let my_turn = first.as_ref().is_none_or(|(member, _)| member == me);
        if free && my_turn {
            tx.execute(&take, &[&me, &ttl_us, &(fence + step), &name]).await?;
            tx.execute(&leave, &[&name, &me]).await?;
            return Ok(Ok(AcquireReply::acquired(token(fence + step))));
        }
        if req.waiting {
            tx.execute(
                &tx.prepare_cached(&sql.stand).await?,
                &[&name, &me, &as_micros(req.waiter_timeout)],
            )
            .await?;
        } else {
            // A last try, or a caller that does not wait: no place kept.
            tx.execute(&leave, &[&name, &me]).await?;
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
            let client = self.pool.get().await?;
            let statement = client.prepare_cached(&self.members.delete_member).await?;
            Ok(client.execute(&statement, &[&name, &holder]).await? > 0)
        })
        .await
    }
}
