//! The PostgreSQL backend's SQL, rendered once per client for its table
//! name. Every expiry is computed and compared with `clock_timestamp()`,
//! the database's clock at the moment the statement runs (not `now()`,
//! which stops at the transaction's start).

/// The longest full lock name (prefix, key, segment suffix) accepted, in
/// bytes: far below what a `text` primary key can index (about 2.7 kB).
pub(crate) const MAX_NAME_BYTES: usize = 2048;

/// A lease of `$n` microseconds from the database's clock.
fn lease(param: &str) -> String {
    format!("clock_timestamp() + {param}::bigint * interval '1 microsecond'")
}

/// What is left of row `l`'s lease, in whole microseconds, never negative;
/// -1 for a shared lock's gate, whose expiry is `infinity`. A freed row's
/// expiry is `-infinity`: no timestamp can be subtracted from either, so
/// the subtraction starts from the clock at the latest. (The acquire
/// statement reads a freed row here when another caller took it after
/// this statement's snapshot was made.)
const LEFT_US: &str = "CASE WHEN l.expires_at = 'infinity' THEN -1 ELSE greatest(0, (extract(epoch from \
     (greatest(l.expires_at, clock_timestamp()) - clock_timestamp())) * 1000000)::bigint) END";

/// The rows a kept lock's release sweeps (`keep`): an exclusive holder's
/// (`<hex>:<n>`, no kind in front), never fenced, expired over a second
/// ago.
const SWEPT: &str = "fence = 0 AND holder LIKE '%:%' AND holder NOT LIKE '_:%' \
     AND expires_at < clock_timestamp() - interval '1 second' AND expires_at > '-infinity'";

/// A shared lock's gate: the lock's row in the main table, whose expiry no
/// clock reaches.
pub(super) const GATE_EXPIRY: &str = "'infinity'";

/// The statements, rendered once for the client's table name.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) create: String,
    /// Fails with "undefined column" on a table made by an earlier version.
    pub(super) has_waiting: String,
    pub(super) add_waiting: String,
    /// Fails with "undefined column" on a table made before elections.
    pub(super) has_record: String,
    pub(super) add_record: String,
    pub(super) proclaim: String,
    pub(super) leader: String,
    pub(super) acquire: String,
    pub(super) take_free: String,
    pub(super) renew_many: String,
    pub(super) release: String,
    pub(super) release_unfenced: String,
    pub(super) mark: String,
    pub(super) hand_over: String,
    pub(super) keep: String,
    pub(super) sweep: String,
    /// The notification channel releases are announced on: the table's
    /// name, so that clients of one table hear each other.
    pub(super) channel: String,
    pub(super) listen: String,
}

impl Statements {
    pub(super) fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        Statements {
            channel: table.to_owned(),
            listen: format!("LISTEN {t}"),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 name text PRIMARY KEY, \
                 holder text NOT NULL, \
                 expires_at timestamptz NOT NULL, \
                 fence bigint NOT NULL DEFAULT 0, \
                 waiting boolean NOT NULL DEFAULT false, \
                 record text)"
            ),
            has_waiting: format!("SELECT waiting FROM {t} LIMIT 0"),
            add_waiting: format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS waiting boolean NOT NULL DEFAULT false"
            ),
            has_record: format!("SELECT record FROM {t} LIMIT 0"),
            add_record: format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS record text"),
            // Parameters: name, holder, value. An election's leader says
            // what it leads with, on its lock's row, if it still holds it.
            // The record is `<holder>\n<value>`: it names its term, so a
            // value left on the row by an earlier term (a takeover keeps
            // the column) is never read as the current leader's.
            proclaim: format!(
                "UPDATE {t} SET record = $2 || chr(10) || $3 \
                 WHERE name = $1 AND holder = $2 AND expires_at > clock_timestamp() RETURNING 1"
            ),
            // Parameters: name. Who leads an election: its lock's holder,
            // fence counter (every grant of an election's lock is fenced,
            // so it is the term's epoch), record and the µs left of its
            // lease; no row when nobody does.
            leader: format!(
                "SELECT l.holder, l.fence, l.record, {LEFT_US} FROM {t} l \
                 WHERE l.name = $1 AND l.expires_at > clock_timestamp()"
            ),
            // Parameters: name, holder, ttl µs, fence step (0 or 1).
            //
            // One round trip whatever it finds. The upsert takes the row
            // when it is missing, expired, or already this holder's (an
            // earlier attempt applied and its reply was lost); the fence
            // counter moves on every taking but "already mine". On another
            // holder's live row the update's condition fails, nothing
            // changes, and the second half reports what is left of its
            // lease. "Already mine" never shortens the lease: it may be a
            // late copy of an attempt, landing after an extension. (A row
            // inserted by a transaction that committed after this
            // statement's snapshot is not seen there: then no row comes
            // back, and the caller looks again shortly.)
            acquire: format!(
                "WITH taken AS (\
                   INSERT INTO {t} AS l (name, holder, expires_at, fence) \
                   VALUES ($1, $2, {lease}, $4::bigint) \
                   ON CONFLICT (name) DO UPDATE SET \
                     fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp() \
                       THEN l.fence ELSE l.fence + $4::bigint END, \
                     waiting = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp() \
                       THEN l.waiting ELSE false END, \
                     holder = EXCLUDED.holder, \
                     expires_at = CASE WHEN l.holder = EXCLUDED.holder \
                       THEN greatest(l.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END \
                   WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder \
                   RETURNING fence) \
                 SELECT true, fence, '', true FROM taken \
                 UNION ALL \
                 SELECT false, {LEFT_US}, l.holder, l.waiting FROM {t} l \
                 WHERE l.name = $1 AND NOT EXISTS (SELECT 1 FROM taken)",
                lease = lease("$3"),
            ),
            // Parameters: name, holder, ttl µs. The common case of
            // `acquire`, a lock with no row, at a third of its server
            // time: a plain insert that takes the row if there is none and
            // does nothing at all (no write, no commit to wait for) if
            // there is one. One row inserted: taken, never fenced; none:
            // `acquire` decides. Not tried for a fenced lock, whose row
            // outlives its holders.
            take_free: format!(
                "INSERT INTO {t} (name, holder, expires_at) VALUES ($1, $2, {lease}) \
                 ON CONFLICT (name) DO NOTHING",
                lease = lease("$3"),
            ),
            // Parameters: names, holders, ttls µs (arrays, one element per
            // lease): every lease renewed in one statement (one lease too);
            // the rows it returns are the leases still held. A lease only
            // lengthens (a renewal sent before an extension may land after
            // it), and one that already ended is not brought back: someone
            // may have taken it since.
            renew_many: format!(
                "UPDATE {t} AS l SET expires_at = \
                   greatest(l.expires_at, clock_timestamp() + r.ttl * interval '1 microsecond') \
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(name, holder, ttl) \
                 WHERE l.name = r.name AND l.holder = r.holder AND l.expires_at > clock_timestamp() \
                 RETURNING l.name, l.holder"
            ),
            // Parameters: name, holder, the waiters' channel, the
            // notification channel. A row that was never fenced goes; a
            // fenced one stays, freed, so that its counter keeps growing
            // across holders. A release that someone waits for (the row
            // is marked, or it is a fair lock's, whose line the next
            // attempt reads) is announced to the clients listening
            // (`holder channel`; delivered when the statement commits): a
            // notification costs the server a queue entry and a signal to
            // every listener, a sixth of an uncontended lock's time, so a
            // release nobody waits for sends none. Returns how many of the
            // holder's rows there were (0 or 1). One name a statement:
            // unpacking arrays of names costs the server a third more
            // (pgbench, commits not waiting for the disk: 25 µs of 75),
            // and several names are sent together on one connection.
            release: format!(
                "WITH gone AS (\
                   DELETE FROM {t} WHERE name = $1 AND holder = $2 AND fence = 0 RETURNING waiting), \
                 freed AS (\
                   UPDATE {t} SET holder = '', expires_at = '-infinity' \
                   WHERE name = $1 AND holder = $2 AND fence <> 0 RETURNING waiting), \
                 done AS (SELECT waiting FROM gone UNION ALL SELECT waiting FROM freed), \
                 told AS (\
                   SELECT pg_notify($4, $2 || ' ' || $3) FROM done \
                   WHERE waiting OR left($2, 2) = 'f:') \
                 SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM told)"
            ),
            // Parameters: as `release`. The common case of `release`, a
            // row that was never fenced, in one plain delete (half the
            // server time of the whole), announced as `release` announces
            // it. No row comes back when the row is fenced or not this
            // holder's: then `release` decides.
            release_unfenced: format!(
                "DELETE FROM {t} WHERE name = $1 AND holder = $2 AND fence = 0 \
                 RETURNING CASE WHEN waiting OR left($2, 2) = 'f:' THEN pg_notify($4, $2 || ' ' || $3) IS NULL END"
            ),
            // Parameters: name, the holder a waiter found there. Marks the
            // row so that its release is announced: a waiter's first
            // attempt that finds it unmarked sends this. No row comes back
            // when the holder changed meanwhile (the waiter looks again at
            // once). The commit is not waited for on disk: a mark lost in
            // a crash only costs a waiter its wake-up, and waiters look
            // again within a poll anyway.
            mark: format!(
                "WITH quiet AS (SELECT set_config('synchronous_commit', 'off', true)) \
                 UPDATE {t} l SET waiting = true FROM quiet \
                 WHERE l.name = $1 AND l.holder = $2 AND l.expires_at > clock_timestamp() \
                 RETURNING true"
            ),
            // Parameters: name, giver, taker, ttl µs, fence step (0 or
            // 1). Gives the lock from its holder to a waiter of the same
            // client in one statement, if the giver still holds it: no
            // release, no announcement, no attempt of the waiter's own.
            // The row's mark stays, so that waiters elsewhere still hear
            // the release that ends the run. Returns the fence counter, or
            // no row when the lock was not the giver's (nothing written).
            hand_over: format!(
                "UPDATE {t} SET holder = $3, expires_at = {}, fence = fence + $5::bigint \
                 WHERE name = $1 AND holder = $2 AND expires_at > clock_timestamp() \
                 RETURNING fence",
                lease("$4")
            ),
            // Parameters: name, holder, µs left of the hold. Keeps the
            // lock held after its body (`hold_at_least`): its lease ends
            // then, shorter or longer than it was, unannounced. Returns the
            // row when it was still the holder's.
            keep: format!(
                "UPDATE {t} SET expires_at = {} \
                 WHERE name = $1 AND holder = $2 AND expires_at > clock_timestamp() RETURNING 1",
                lease("$3")
            ),
            // Sent after a keep, on its own (its failure must not fail the
            // keep): up to 16 exclusive rows that expired over a second
            // ago, never fenced, go. A kept row stays until its hold ends,
            // and a job whose key names its run (`Tick`) never takes that
            // key again, so without this each run would leave a row for
            // good. Rows another statement has locked are left for the
            // next sweep; fenced rows stay (their counter must keep
            // growing), and so do shared and fair locks' rows (holders
            // with a `r:`, `w:`, `p:` or `f:` kind in front, and gates
            // without one).
            sweep: format!(
                "DELETE FROM {t} WHERE name IN (\
                   SELECT name FROM {t} WHERE {SWEPT} LIMIT 16 FOR UPDATE SKIP LOCKED) \
                 AND {SWEPT}"
            ),
        }
    }
}

/// The statements of shared locks (read-write, permits) and of fair locks'
/// lines, on the members table, rendered once for the client's table.
#[derive(Debug)]
pub(super) struct MemberStatements {
    pub(super) create: String,
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
    pub(super) renew_many: String,
    pub(super) notify: String,
    pub(super) open_line: String,
    pub(super) read_line_lock: String,
    pub(super) take: String,
    pub(super) first: String,
    pub(super) stand: String,
}

impl MemberStatements {
    pub(super) fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        let m = format!("\"{table}_members\"");
        MemberStatements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {m} (\
                 name text NOT NULL, \
                 member text NOT NULL, \
                 expires_at timestamptz NOT NULL, \
                 queued_at timestamptz NOT NULL DEFAULT '-infinity', \
                 PRIMARY KEY (name, member))"
            ),
            // The gate is inserted if missing and locked, in one statement:
            // every change to a lock's members holds it, so two attempts
            // never interleave. (Not `DO NOTHING` and a `FOR UPDATE` after:
            // a gate the last member's release deleted meanwhile would
            // leave that read with no row, and no lock.)
            open_gate: format!(
                "INSERT INTO {t} (name, holder, expires_at, fence) VALUES ($1, $2, {GATE_EXPIRY}, 0) \
                 ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name"
            ),
            read_gate: format!(
                "SELECT holder, expires_at > clock_timestamp(), fence FROM {t} WHERE name = $1 FOR UPDATE"
            ),
            mark_gate: format!("UPDATE {t} SET holder = $1, expires_at = {GATE_EXPIRY} WHERE name = $2"),
            set_fence: format!("UPDATE {t} SET fence = $1 WHERE name = $2"),
            drop_gate: format!("DELETE FROM {t} WHERE name = $1 AND holder = $2 AND fence = 0"),
            free_gate: format!(
                "UPDATE {t} SET holder = '', expires_at = '-infinity' WHERE name = $1 AND holder = $2"
            ),
            expire_members: format!("DELETE FROM {m} WHERE name = $1 AND expires_at <= clock_timestamp()"),
            list_members: format!("SELECT member, {LEFT_US} FROM {m} l WHERE name = $1 ORDER BY expires_at"),
            count_members: format!("SELECT count(*) FROM {m} WHERE name = $1"),
            put_member: format!(
                "INSERT INTO {m} AS l (name, member, expires_at) VALUES ($1, $2, {}) \
                 ON CONFLICT (name, member) DO UPDATE \
                 SET expires_at = greatest(l.expires_at, EXCLUDED.expires_at)",
                lease("$3")
            ),
            delete_member: format!("DELETE FROM {m} WHERE name = $1 AND member = $2"),
            renew_many: format!(
                "UPDATE {m} AS l SET expires_at = \
                   greatest(l.expires_at, clock_timestamp() + r.ttl * interval '1 microsecond') \
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(name, member, ttl) \
                 WHERE l.name = r.name AND l.member = r.member AND l.expires_at > clock_timestamp() \
                 RETURNING l.name, l.member"
            ),
            // Parameters: the notification channel, `holder channel`.
            notify: "SELECT pg_notify($1, $2)".into(),
            // Inserted if missing and locked, as `open_gate`.
            open_line: format!(
                "INSERT INTO {t} (name, holder, expires_at, fence) VALUES ($1, '', '-infinity', 0) \
                 ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name"
            ),
            read_line_lock: format!("SELECT holder, {LEFT_US}, fence FROM {t} l WHERE name = $1 FOR UPDATE"),
            take: format!(
                "UPDATE {t} SET holder = $1, expires_at = greatest(expires_at, {}), fence = $3 WHERE name = $4",
                lease("$2")
            ),
            first: format!(
                "SELECT member, {LEFT_US} FROM {m} l WHERE name = $1 ORDER BY queued_at, member LIMIT 1"
            ),
            stand: format!(
                "INSERT INTO {m} (name, member, expires_at, queued_at) \
                 VALUES ($1, $2, {}, clock_timestamp()) \
                 ON CONFLICT (name, member) DO UPDATE SET expires_at = EXCLUDED.expires_at",
                lease("$3")
            ),
        }
    }
}
