//! What an operator's tool asks of the MySQL / MariaDB lock table
//! (`lockctl`): which locks are held, what one of them holds, and freeing
//! one whatever holds it, judged by the database's clock (`NOW(6)`), as on
//! PostgreSQL (`backend/postgres/admin.rs`). Nothing here is on a lock
//! call's path.
//!
//! The answers take the shape the Redis backend reads ([`Found`]). Waiters
//! on this backend poll, so a forced release announces nothing: they find
//! the lock free at their next look.

use std::future::Future;

use mysql_async::TxOpts;
use mysql_async::prelude::Queryable;

use super::sql::{FREED, GATE_EXPIRY};
use super::table::MysqlBackend;
use crate::backend::Found;
use crate::backend::glob::{self, Glob};
use crate::backend::members::found_in_table;
use crate::error::LockError;
use crate::key::LockKey;
use crate::redact::redact_secrets;

/// How many names `list` reads from the table at a time.
const PAGE: usize = 1000;

impl MysqlBackend {
    /// Runs an operator's `work` within the command timeout.
    async fn admin<T, Fut>(&self, key: Option<&str>, work: Fut) -> Result<T, LockError>
    where
        Fut: Future<Output = Result<T, mysql_async::Error>>,
    {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(LockError::backend(
                &self.node,
                key,
                redact_secrets(&e.to_string(), &self.url),
            )),
            Err(_) => Err(LockError::backend(
                &self.node,
                key,
                format!("no answer within {}ms", self.timeout.as_millis()),
            )),
        }
    }

    /// The names of the live locks (a lease not ended, or a shared lock's
    /// gate) that match the Redis glob `pattern`, on this database. The
    /// pattern is matched here: MySQL 8 and MariaDB read regular
    /// expressions differently (ICU and PCRE), and a pattern must select
    /// the same locks on every backend.
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<(String, Vec<String>)>, LockError> {
        let glob = Glob::parse(pattern).ok_or_else(|| glob::unclosed(pattern))?;
        let sql = format!(
            "SELECT name FROM `{}` WHERE expires_at > NOW(6) AND name > ? ORDER BY name LIMIT {PAGE}",
            self.table
        );
        let mut names = Vec::new();
        let mut after: Vec<u8> = Vec::new();
        loop {
            let page: Vec<Vec<u8>> = self
                .admin(None, async {
                    let conn = &mut self.pool.get_conn().await?;
                    conn.exec(&sql, (&after,)).await
                })
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            after.clone_from(last);
            let full = page.len() == PAGE;
            names.extend(
                page.into_iter()
                    .filter_map(|name| String::from_utf8(name).ok())
                    .filter(|name| glob.matches(name)),
            );
            if !full {
                break;
            }
        }
        Ok(vec![(self.node.clone(), names)])
    }

    /// The lock `key` as the database has it now, or `None` when it is free.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<Found>, LockError> {
        let t = format!("`{}`", self.table);
        let m = format!("`{}_members`", self.table);
        let name = key.redis_key.as_str();
        // The row's holder, what is left of its lease in ms (-1 for a
        // shared lock's gate, -2 when it ended), its fence counter and the
        // database's clock in ms since the epoch; then the members
        // (holders of a shared lock, or a fair lock's line) with the ms
        // their leases end. One transaction: one view of both tables.
        type Row = (Vec<u8>, i64, u64, i64);
        let (row, members): (Option<Row>, Vec<(Vec<u8>, i64)>) = self
            .admin(Some(&key.name), async {
                let conn = &mut self.pool.get_conn().await?;
                let mut tx = conn.start_transaction(TxOpts::default()).await?;
                let row: Option<Row> = tx
                    .exec_first(
                        format!(
                            "SELECT holder, \
                               CASE WHEN expires_at >= {GATE_EXPIRY} THEN -1 \
                                    WHEN expires_at <= NOW(6) THEN -2 \
                                    ELSE CEIL(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) / 1000) END, \
                               fence, FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) \
                             FROM {t} WHERE name = ?"
                        ),
                        (name,),
                    )
                    .await?;
                let members = tx
                    .exec(
                        format!(
                            "SELECT member, FLOOR(UNIX_TIMESTAMP(expires_at) * 1000) FROM {m} \
                             WHERE name = ? ORDER BY expires_at, member"
                        ),
                        (name,),
                    )
                    .await?;
                tx.commit().await?;
                Ok((row, members))
            })
            .await?;
        let Some((holder, left_ms, fence, now_ms)) = row else {
            return Ok(None);
        };
        let members: Vec<(String, i64)> = members
            .into_iter()
            .map(|(member, ends)| (String::from_utf8_lossy(&member).into_owned(), ends))
            .collect();
        Ok(found_in_table(
            String::from_utf8_lossy(&holder).into_owned(),
            left_ms,
            Some(fence).filter(|f| *f > 0),
            now_ms,
            members,
            // MySQL's waiters poll: nothing is marked.
            false,
        ))
    }

    /// Frees the lock `key` whatever holds it: `false` when it was free. A
    /// fair lock's line stays (its first waiter is next); a shared lock's
    /// members all go. The fence counter stays, so tokens keep growing.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let t = format!("`{}`", self.table);
        let m = format!("`{}_members`", self.table);
        let name = key.redis_key.as_str();
        self.admin(Some(&key.name), async {
            let conn = &mut self.pool.get_conn().await?;
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            let row: Option<(Vec<u8>, bool, u64)> = tx
                .exec_first(
                    format!("SELECT holder, expires_at > NOW(6), fence FROM {t} WHERE name = ? FOR UPDATE"),
                    (name,),
                )
                .await?;
            let Some((holder, live, fence)) = row else {
                return Ok(false);
            };
            if holder.is_empty() || !live {
                return Ok(false);
            }
            if holder.first() == Some(&b'#') {
                tx.exec_drop(format!("DELETE FROM {m} WHERE name = ?"), (name,))
                    .await?;
            }
            if fence == 0 {
                tx.exec_drop(format!("DELETE FROM {t} WHERE name = ?"), (name,))
                    .await?;
            } else {
                tx.exec_drop(
                    format!("UPDATE {t} SET holder = '', expires_at = {FREED} WHERE name = ?"),
                    (name,),
                )
                .await?;
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }
}
