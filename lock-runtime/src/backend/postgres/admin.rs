//! What an operator's tool asks of the lock table (`lockctl`): which locks
//! are held, what one of them holds, and freeing one whatever holds it.
//! Each is one statement (a read) or one transaction (a forced release),
//! judged by the database's clock; nothing here is on a lock call's path.
//!
//! The answers take the shape the Redis backend reads ([`Found`]), so one
//! description serves every backend: an exclusive or fair lock is a single
//! holder with what is left of its lease, a read-write lock or a semaphore
//! a set of members with the instants their leases end.

use deadpool_postgres::{GenericClient, PoolError};

use super::table::PostgresBackend;
use crate::backend::members::found_in_table;
use crate::backend::{Found, glob};
use crate::error::LockError;
use crate::key::LockKey;
use crate::redact::redact_secrets;

/// A lock name's parts, read in one statement: the row's holder, what is
/// left of its lease in ms (-1 for a shared lock's gate, -2 when it
/// ended), its fence counter, the database's clock in ms since the epoch,
/// the members (holders of a shared lock, or a fair lock's line) with
/// the ms their leases end, and whether a waiter marked the row.
fn inspect_sql(table: &str) -> String {
    let t = format!("\"{table}\"");
    let m = format!("\"{table}_members\"");
    let epoch_ms = |at: &str| format!("(extract(epoch from {at}) * 1000)::bigint");
    format!(
        "SELECT l.holder, \
           CASE WHEN l.expires_at = 'infinity' THEN -1 \
                WHEN l.expires_at <= clock_timestamp() THEN -2 \
                ELSE ceil(extract(epoch from (l.expires_at - clock_timestamp())) * 1000)::bigint END, \
           l.fence, {now}, \
           array(SELECT m.member FROM {m} m WHERE m.name = l.name ORDER BY m.expires_at, m.member), \
           array(SELECT {ends} FROM {m} m WHERE m.name = l.name ORDER BY m.expires_at, m.member), \
           l.waiting \
         FROM {t} l WHERE l.name = $1",
        now = epoch_ms("clock_timestamp()"),
        ends = epoch_ms("m.expires_at"),
    )
}

/// `pattern`, a Redis glob (`*`, `?`, `[…]`, `\` escapes), as an anchored
/// PostgreSQL regular expression, so that `list` filters on the server as
/// Redis's `SCAN MATCH` does; `None` for an unclosed `[`. Every ASCII
/// character but letters and digits is escaped with `\`, which an
/// advanced regular expression reads as that character, inside brackets
/// too.
fn glob_regex(pattern: &str) -> Option<String> {
    fn literal(re: &mut String, c: char) {
        if c.is_ascii() && !c.is_ascii_alphanumeric() {
            re.push('\\');
        }
        re.push(c);
    }
    let mut re = String::from("^");
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            '\\' => literal(&mut re, chars.next()?),
            '[' => {
                re.push('[');
                let mut first = true;
                loop {
                    match chars.next()? {
                        ']' if !first => break,
                        '^' if first => re.push('^'),
                        '-' if !first => re.push('-'),
                        '\\' => literal(&mut re, chars.next()?),
                        c => literal(&mut re, c),
                    }
                    first = false;
                }
                re.push(']');
            }
            c => literal(&mut re, c),
        }
    }
    re.push('$');
    Some(re)
}

impl PostgresBackend {
    /// Runs an operator's `work` within the command timeout.
    async fn admin<T, Fut>(&self, key: Option<&str>, work: Fut) -> Result<T, LockError>
    where
        Fut: Future<Output = Result<T, PoolError>>,
    {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(LockError::backend(
                &self.node,
                key,
                redact_secrets(&super::table::describe(&e), &self.url),
            )),
            Err(_) => Err(LockError::backend(
                &self.node,
                key,
                format!("no answer within {}ms", self.timeout.as_millis()),
            )),
        }
    }

    /// The names of the live locks (a lease not ended, or a shared lock's
    /// gate) that match the Redis glob `pattern`, on this database.
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<(String, Vec<String>)>, LockError> {
        let regex = glob_regex(pattern).ok_or_else(|| glob::unclosed(pattern))?;
        let sql = format!(
            "SELECT name FROM \"{}\" WHERE expires_at > clock_timestamp() AND name ~ $1 ORDER BY name",
            self.table
        );
        let names = self
            .admin(None, async {
                let client = self.pool.get().await?;
                let rows = client.query(&sql, &[&regex]).await?;
                rows.iter()
                    .map(|row| row.try_get::<_, String>(0))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(PoolError::Backend)
            })
            .await?;
        Ok(vec![(self.node.clone(), names)])
    }

    /// The lock `key` as the database has it now, or `None` when it is free.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<Found>, LockError> {
        let sql = inspect_sql(&self.table);
        let name = key.redis_key.as_str();
        let row = self
            .admin(Some(&key.name), async {
                let client = self.pool.get().await?;
                Ok(client.query_opt(&sql, &[&name]).await?)
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = || -> Result<_, tokio_postgres::Error> {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, i64>(2)?,
                row.try_get::<_, i64>(3)?,
                row.try_get::<_, Vec<String>>(4)?,
                row.try_get::<_, Vec<i64>>(5)?,
                row.try_get::<_, bool>(6)?,
            ))
        };
        let (holder, left_ms, fence, now_ms, members, ends, marked) = read()
            .map_err(|e| LockError::backend(&self.node, Some(&key.name), format!("unexpected row: {e}")))?;
        Ok(found_in_table(
            holder,
            left_ms,
            u64::try_from(fence).ok().filter(|f| *f > 0),
            now_ms,
            members.into_iter().zip(ends).collect(),
            marked,
        ))
    }

    /// Frees the lock `key` whatever holds it, and wakes its waiters:
    /// `false` when it was free. A fair lock's line stays (its first
    /// waiter is next); a shared lock's members all go. The fence counter
    /// stays, so tokens keep growing.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let t = format!("\"{}\"", self.table);
        let m = format!("\"{}_members\"", self.table);
        let name = key.redis_key.as_str();
        self.admin(Some(&key.name), async {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await?;
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT holder, expires_at > clock_timestamp(), fence FROM {t} WHERE name = $1 FOR UPDATE"
                    ),
                    &[&name],
                )
                .await?;
            let Some(row) = row else {
                return Ok(false);
            };
            let (holder, live, fence): (String, bool, i64) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            if holder.is_empty() || !live {
                return Ok(false);
            }
            let gate = holder.starts_with('#');
            if gate {
                tx.execute(&format!("DELETE FROM {m} WHERE name = $1"), &[&name])
                    .await?;
            }
            if fence == 0 {
                tx.execute(&format!("DELETE FROM {t} WHERE name = $1"), &[&name])
                    .await?;
            } else {
                tx.execute(
                    &format!("UPDATE {t} SET holder = '', expires_at = '-infinity' WHERE name = $1"),
                    &[&name],
                )
                .await?;
            }
            // As a release announces it: `f:` makes a fair lock's line
            // look again, `w:` wakes every waiter of the lock.
            let forced = if holder.starts_with("f:") { "f:forced" } else { "w:forced" };
            let note = format!("{forced} {}", key.channel);
            tx.execute("SELECT pg_notify($1, $2)", &[&self.sql.channel, &note])
                .await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::glob_regex;

    #[test]
    fn a_glob_becomes_an_anchored_regex_with_every_symbol_escaped() {
        assert_eq!(
            glob_regex("lock:{stock:*}*").as_deref(),
            Some("^lock\\:\\{stock\\:.*\\}.*$")
        );
        assert_eq!(glob_regex("a?b").as_deref(), Some("^a.b$"));
        assert_eq!(glob_regex("a\\*b").as_deref(), Some("^a\\*b$"));
        assert_eq!(glob_regex("[^a-c.]x").as_deref(), Some("^[^a-c\\.]x$"));
        assert_eq!(glob_regex("[]]").as_deref(), Some("^[\\]]$"));
        assert_eq!(glob_regex("é(").as_deref(), Some("^é\\($"));
    }

    #[test]
    fn an_unclosed_bracket_or_a_trailing_escape_is_refused() {
        assert_eq!(glob_regex("stock[12"), None);
        assert_eq!(glob_regex("stock\\"), None);
    }
}
