//! The MySQL backend's SQL, rendered once per client for its table name:
//! the statements of exclusive locks on the lock table, of shared locks on
//! the members table, and of fair locks' lines.

use std::time::Duration;

/// The longest full lock name (prefix, key, segment suffix) the table's
/// `name` column holds, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 2048;

/// What a freed, fenced row's expiry is set to: long past, so any clock
/// finds it free.
pub(super) const FREED: &str = "'2000-01-01 00:00:00'";

/// A gate's expiry: no clock reaches it, so an exclusive attempt always
/// finds the gate held.
pub(super) const GATE_EXPIRY: &str = "'9999-01-01 00:00:00'";

/// An exclusive attempt that finds this much lease left has met a gate.
pub(super) const GATE_LEFT: Duration = Duration::from_secs(5_000 * 365 * 24 * 3600);

/// The rows a kept lock's release sweeps (`sweepable`, `sweep`): an
/// exclusive holder's (`<hex>:<n>`, no kind in front), never fenced,
/// expired over a second ago, and not freed.
fn swept() -> String {
    format!(
        "fence = 0 AND holder LIKE '%:%' AND holder NOT LIKE '_:%' \
         AND expires_at < NOW(6) - INTERVAL 1 SECOND AND expires_at > {FREED}"
    )
}

/// The statements, rendered once for the client's table name.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) create: String,
    pub(super) acquire: String,
    pub(super) renew: Renewals,
    pub(super) still_held: String,
    pub(super) delete: String,
    pub(super) free_fenced: String,
    pub(super) keep: String,
    pub(super) sweepable: String,
    pub(super) sweep: String,
    /// Fails with "unknown column" on a table made before elections.
    /// Fails when the lock table does not exist (or may not be read).
    pub(super) exists: String,
    pub(super) has_record: String,
    pub(super) add_record: String,
    pub(super) proclaim: String,
    pub(super) leader: String,
}

impl Statements {
    pub(super) fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        Statements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 name VARBINARY({MAX_NAME_BYTES}) NOT NULL PRIMARY KEY, \
                 holder VARBINARY(255) NOT NULL, \
                 expires_at DATETIME(6) NOT NULL, \
                 fence BIGINT UNSIGNED NOT NULL DEFAULT 0, \
                 record MEDIUMBLOB NULL\
                 ) ENGINE=InnoDB"
            ),
            // Parameters: name, holder, ttl µs, fence step (0 or 1), then
            // holder, fence step, holder, holder, holder, ttl µs again for
            // the update.
            //
            // The update's assignments run left to right and each sees the
            // ones before it, so the order is the logic. On a live row of
            // another holder nothing changes (0 rows affected) and
            // `LAST_INSERT_ID(x)` hands back what is left of its lease, in
            // µs, in the reply's OK packet. Otherwise the counter moves
            // only on a takeover of an expired row (judged on the old
            // expiry) and is handed back the same way, the holder changes
            // on a takeover and stays on an "already mine", and the expiry
            // moves exactly when the holder is now ours. One statement,
            // one round trip, whatever it finds.
            //
            // An "already mine" (a late copy of an earlier attempt) never
            // shortens the lease: it may land after an extension. It still
            // moves the expiry, by a microsecond if nothing else, because
            // an update that changes nothing counts 0 rows, which is how
            // another holder's row shows.
            acquire: format!(
                "INSERT INTO {t} (name, holder, expires_at, fence) \
                 VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, LAST_INSERT_ID(?)) \
                 ON DUPLICATE KEY UPDATE \
                 fence = IF(expires_at > NOW(6) AND holder <> ?, \
                   fence + 0 * LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at)), \
                   LAST_INSERT_ID(IF(expires_at <= NOW(6), fence + ?, fence))), \
                 holder = IF(expires_at <= NOW(6) OR holder = ?, ?, holder), \
                 expires_at = IF(holder = ?, \
                   GREATEST(expires_at + INTERVAL 1 MICROSECOND, NOW(6) + INTERVAL ? MICROSECOND), \
                   expires_at)"
            ),
            renew: Renewals::new(&t, "holder"),
            still_held: format!("SELECT 1 FROM {t} WHERE name = ? AND holder = ? AND expires_at > NOW(6)"),
            delete: format!("DELETE FROM {t} WHERE name = ? AND holder = ? AND fence = 0"),
            free_fenced: format!(
                "UPDATE {t} SET holder = '', expires_at = {FREED} WHERE name = ? AND holder = ?"
            ),
            // Parameters: µs left of the hold, name, holder. Keeps the
            // lock held after its body (`hold_at_least`): its lease ends
            // then, shorter or longer than it was.
            keep: format!(
                "UPDATE {t} SET expires_at = NOW(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND holder = ? AND expires_at > NOW(6)"
            ),
            // Sent after a keep, in two steps: a plain read (no row
            // locks, so it holds no acquisition back) of up to 16 exclusive
            // rows that expired over a second ago, never fenced, then their
            // delete by name, which checks the same again on each row it
            // locks (one taken since is left alone). A kept row stays
            // until its hold ends, and a job whose key names its run
            // (`Tick`) never takes that key again, so without this each
            // run would leave a row for good. Fenced rows stay (their
            // counter must keep growing), and so do shared and fair locks'
            // rows (holders with a `r:`, `w:`, `p:` or `f:` kind in front,
            // and gates, which expire in the year 9999).
            sweepable: format!("SELECT name FROM {t} WHERE {} LIMIT 16", swept()),
            sweep: format!("DELETE FROM {t} WHERE name = ? AND {}", swept()),
            exists: format!("SELECT 1 FROM {t} LIMIT 0"),
            has_record: format!("SELECT record FROM {t} LIMIT 0"),
            add_record: format!("ALTER TABLE {t} ADD COLUMN record MEDIUMBLOB NULL"),
            // Parameters: holder, value, name, holder. An election's leader
            // says what it leads with, on its lock's row, if it still holds
            // it. The record is `<holder>\n<value>`: it names its term, so a
            // value an earlier term left on the row (a takeover keeps the
            // column) is never read as the current leader's. Rewriting the
            // same record changes no row: `still_held` then tells.
            proclaim: format!(
                "UPDATE {t} SET record = CONCAT(?, CHAR(10), ?) \
                 WHERE name = ? AND holder = ? AND expires_at > NOW(6)"
            ),
            // Parameters: name. Who leads an election: its lock's holder,
            // fence counter (every grant of an election's lock is fenced,
            // so it is the term's epoch), record and the µs left of its
            // lease; no row when nobody does.
            leader: format!(
                "SELECT holder, fence, record, TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) \
                 FROM {t} WHERE name = ? AND expires_at > NOW(6)"
            ),
        }
    }
}

/// The statements of shared locks, rendered once for the client's table.
#[derive(Debug)]
pub(super) struct SharedStatements {
    pub(super) create: String,
    /// Fails when the members table does not exist (or may not be read).
    pub(super) exists: String,
    /// Fails with "unknown column" on a table made by an earlier version.
    pub(super) has_queued_at: String,
    pub(super) add_queued_at: String,
    pub(super) open_gate: String,
    pub(super) read_gate: String,
    pub(super) mark_gate: String,
    pub(super) set_fence: String,
    pub(super) drop_gate: String,
    pub(super) free_gate: String,
    pub(super) expire_members: String,
    pub(super) list_members: String,
    pub(super) count_members: String,
    pub(super) put_member: String,
    pub(super) delete_member: String,
    pub(super) renew: Renewals,
}

impl SharedStatements {
    pub(super) fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        let m = format!("`{table}_members`");
        SharedStatements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {m} (\
                 name VARBINARY({}) NOT NULL, \
                 member VARBINARY(255) NOT NULL, \
                 expires_at DATETIME(6) NOT NULL, \
                 queued_at DATETIME(6) NOT NULL DEFAULT '2000-01-01 00:00:00', \
                 PRIMARY KEY (name, member)\
                 ) ENGINE=InnoDB",
                MAX_NAME_BYTES
            ),
            exists: format!("SELECT 1 FROM {m} LIMIT 0"),
            has_queued_at: format!("SELECT queued_at FROM {m} LIMIT 0"),
            add_queued_at: format!(
                "ALTER TABLE {m} ADD COLUMN queued_at DATETIME(6) NOT NULL DEFAULT '2000-01-01 00:00:00'"
            ),
            // An upsert locks the row exclusively whether it inserts or
            // finds one, so attempts on one lock queue here; a read under
            // a shared lock, upgraded, would deadlock two of them.
            open_gate: format!(
                "INSERT INTO {t} (name, holder, expires_at, fence) VALUES (?, ?, {GATE_EXPIRY}, 0) \
                 ON DUPLICATE KEY UPDATE name = name"
            ),
            read_gate: format!(
                "SELECT holder, expires_at > NOW(6), fence FROM {t} WHERE name = ? FOR UPDATE"
            ),
            mark_gate: format!("UPDATE {t} SET holder = ?, expires_at = {GATE_EXPIRY} WHERE name = ?"),
            set_fence: format!("UPDATE {t} SET fence = ? WHERE name = ?"),
            drop_gate: format!("DELETE FROM {t} WHERE name = ? AND holder = ? AND fence = 0"),
            free_gate: format!(
                "UPDATE {t} SET holder = '', expires_at = {FREED} WHERE name = ? AND holder = ?"
            ),
            expire_members: format!("DELETE FROM {m} WHERE name = ? AND expires_at <= NOW(6)"),
            list_members: format!(
                "SELECT member, GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), 0) \
                 FROM {m} WHERE name = ? ORDER BY expires_at"
            ),
            count_members: format!("SELECT COUNT(*) FROM {m} WHERE name = ?"),
            put_member: format!(
                "INSERT INTO {m} (name, member, expires_at) VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE expires_at = GREATEST(expires_at, VALUES(expires_at))"
            ),
            delete_member: format!("DELETE FROM {m} WHERE name = ? AND member = ?"),
            renew: Renewals::new(&m, "member"),
        }
    }
}

/// How many leases one renewal statement names: a batch is cut into
/// statements of at most the last, each padded to the next size up by
/// naming its leases again, so that a connection prepares five statements,
/// not one per batch length.
pub(super) const RENEWAL_SIZES: [usize; 5] = [1, 4, 16, 64, 256];

/// The renewal statements of one table, a pair per size of
/// [`RENEWAL_SIZES`].
#[derive(Debug)]
pub(super) struct Renewals {
    /// Parameters: ttl µs, the names, then each lease's name and holder.
    /// Lengthens the live leases named, never shortens one. Only rows it
    /// changes count in its reply, so when the count falls short of the
    /// leases named, `held` says which are still held (a lease already
    /// longer than asked, as an extension leaves it, changes nothing).
    pub(super) lengthen: Vec<String>,
    /// Parameters: the names, then each lease's name and holder. The live
    /// leases among them.
    pub(super) held: Vec<String>,
}

impl Renewals {
    /// `holder` is the column naming a lease's holder in `table`.
    fn new(table: &str, holder: &str) -> Self {
        // `name IN` lets the server look the rows up by primary key; the
        // pairs then pick out the holders.
        let leases = |n: usize| {
            format!(
                "name IN ({}) AND (name, {holder}) IN ({}) AND expires_at > NOW(6)",
                vec!["?"; n].join(", "),
                vec!["(?, ?)"; n].join(", ")
            )
        };
        Renewals {
            lengthen: RENEWAL_SIZES
                .iter()
                .map(|&n| {
                    format!(
                        "UPDATE {table} SET expires_at = GREATEST(expires_at, NOW(6) + INTERVAL ? MICROSECOND) \
                         WHERE {}",
                        leases(n)
                    )
                })
                .collect(),
            held: RENEWAL_SIZES
                .iter()
                .map(|&n| format!("SELECT name, {holder} FROM {table} WHERE {}", leases(n)))
                .collect(),
        }
    }
}

/// The statements of fair locks, rendered once for the client's table.
#[derive(Debug)]
pub(super) struct FairStatements {
    pub(super) open: String,
    pub(super) read: String,
    pub(super) take: String,
    pub(super) lapse: String,
    pub(super) first: String,
    pub(super) stand: String,
    pub(super) leave: String,
}

impl FairStatements {
    pub(super) fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        let m = format!("`{table}_members`");
        FairStatements {
            // An upsert locks the row whether it inserts or finds one.
            open: format!(
                "INSERT INTO {t} (name, holder, expires_at, fence) VALUES (?, '', {FREED}, 0) \
                 ON DUPLICATE KEY UPDATE name = name"
            ),
            read: format!(
                "SELECT holder, GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), 0), fence \
                 FROM {t} WHERE name = ? FOR UPDATE"
            ),
            take: format!(
                "UPDATE {t} SET holder = ?, \
                 expires_at = GREATEST(expires_at, NOW(6) + INTERVAL ? MICROSECOND), fence = ? \
                 WHERE name = ?"
            ),
            lapse: format!("DELETE FROM {m} WHERE name = ? AND expires_at <= NOW(6)"),
            first: format!(
                "SELECT member, GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), 0) \
                 FROM {m} WHERE name = ? ORDER BY queued_at, member LIMIT 1"
            ),
            stand: format!(
                "INSERT INTO {m} (name, member, expires_at, queued_at) \
                 VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, NOW(6)) \
                 ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)"
            ),
            leave: format!("DELETE FROM {m} WHERE name = ? AND member = ?"),
        }
    }
}
