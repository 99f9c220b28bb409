#!/usr/bin/env python3
"""Every owner condition and lease cap is proven by a named test (issues
#37 and #57).

Each entry below removes one owner condition from the runtime (a script, an
SQL statement, the ZooKeeper or etcd backend), or one cap that keeps a lease
within what the server promises (a ZooKeeper session, an etcd lease), and
names the test that must fail without it. For each, this script applies the
removal, runs that one test, expects it to fail by an assertion (not a
compile error), and puts the file back. Run it on demand, not in every CI
run (each entry rebuilds the runtime):

    python3 tests/owner-conditions.py            # every entry
    python3 tests/owner-conditions.py R1 M1      # some
    python3 tests/owner-conditions.py --check    # only that every entry
                                                 # still names code once
                                                 # and a test that exists

It prints one line per entry and exits non-zero if a removal went unnoticed.
`--check` builds nothing; the `servers` binary runs it in every test run
(`owner_checks::the_mutant_list_names_code_and_tests_that_exist`), so a
change that rewrites a condition or renames its test updates this list.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = "lock-runtime/src/backend/redis/scripts"
MYSQL = "lock-runtime/src/backend/mysql/sql.rs"
ZOOKEEPER = "lock-runtime/src/backend/zookeeper/mod.rs"
QUEUE = "lock-runtime/src/backend/queue.rs"
ETCD = "lock-runtime/src/backend/etcd/mod.rs"
MEMORY = "lock-runtime/src/backend/memory/mod.rs"
MYSQL_SHARED = "lock-runtime/src/backend/mysql/shared.rs"
MYSQL_FAIR = "lock-runtime/src/backend/mysql/fair.rs"
POSTGRES = "lock-runtime/src/backend/postgres/sql.rs"
MEMBERS = "lock-runtime/src/backend/members.rs"
LEASE = "lock-runtime/src/lease.rs"
BACKENDS = "lock-runtime/src/backend/mod.rs"

# (id, file, the condition as written, the same line without it,
#  test module of the `servers` binary, test name)
MUTANTS = [
    ("R1", f"{SCRIPTS}/hand_over.lua",
     "if current == ARGV[1] then", "if true then",
     "handoff", "a_stale_holder_hands_over_nothing_of_a_lock_another_client_took"),
    ("R2", f"{SCRIPTS}/renew_many.lua",
     "if current == holder or current == holder .. '+w' then", "if true then",
     "stale_holder", "on_redis::a_stale_watchdog_renewal_leaves_the_other_holders_lock"),
    ("R3", f"{SCRIPTS}/renew_many.lua",
     "if current == holder or current == holder .. '+w' then", "if true then",
     "stale_holder", "on_redis::a_stale_nested_extension_leaves_the_other_holders_lock"),
    ("R4", f"{SCRIPTS}/release_one.lua",
     "if current == ARGV[2] then\n  redis.call('DEL', KEYS[1])",
     "if true then\n  redis.call('DEL', KEYS[1])",
     "stale_holder", "on_redis::a_stale_release_leaves_the_other_holders_lock"),
    ("R5", f"{SCRIPTS}/release.lua",
     "  if redis.pcall('GET', KEYS[1]) == ARGV[1] then\n    redis.call('DEL', KEYS[1])\n    released = 1",
     "  if true then\n    redis.call('DEL', KEYS[1])\n    released = 1",
     "stale_holder", "on_redis::a_stale_release_of_a_fair_lock_leaves_the_other_holders_lock"),
    ("R6", f"{SCRIPTS}/release_many.lua",
     "if value == ARGV[1] or value == ARGV[1] .. '+w' then", "if true then",
     "stale_holder", "on_redis::a_stale_give_back_of_several_keys_leaves_the_other_holders_lock"),
    ("R7", f"{SCRIPTS}/release_segments.lua",
     "if values[i] == ARGV[1] or values[i] == ARGV[1] .. '+w' then", "if true then",
     "stale_holder", "on_redis::a_stale_give_back_of_segments_leaves_the_other_holders_lock"),
    ("R8", f"{SCRIPTS}/renew_many.lua",
     "local ends = redis.pcall('ZSCORE', key, member)",
     "local ends = redis.pcall('ZSCORE', key, member) or '1e300'",
     "stale_holder", "on_redis::a_stale_reader_renewal_leaves_the_writers_lock"),
    ("R9", f"{SCRIPTS}/renew_many.lua",
     "local ends = redis.pcall('ZSCORE', key, member)",
     "local ends = redis.pcall('ZSCORE', key, member) or '1e300'",
     "stale_holder", "on_redis::a_stale_permit_renewal_leaves_the_other_permit_holder"),
    ("R10", f"{SCRIPTS}/renew_many.lua",
     "local ends = redis.pcall('ZSCORE', key, member)",
     "local ends = redis.pcall('ZSCORE', key, member) or '1e300'",
     "stale_holder", "on_redis::a_stale_reader_extension_leaves_the_writers_lock"),
    ("R11", f"{SCRIPTS}/coalesced.lua",
     "  if current == holder then\n    redis.call('DEL', key)",
     "  if true then\n    redis.call('DEL', key)",
     "coalescing", "a_stale_release_in_a_coalesced_call_leaves_the_other_holders_lock"),
    ("RL1", "lock-runtime/src/backend/redis/redlock.rs",
     "if handed >= self.quorum() {", "if handed >= 1 {",
     "redlock", "a_redlock_handed_on_a_minority_of_masters_is_not_handed"),
    # No M1. It removed the renewal's check; once renewals became
    # `GREATEST` statements its text matched `keep`'s instead, still named
    # with the watchdog's test, which never sends a keep. Aimed at the
    # renewal again, that test did not see the removal (its rival holds
    # 20 s, and `GREATEST` leaves a longer lease as it was); M2 removes
    # the same check, and its extension test, asking past the rival's
    # lease, does. `keep`'s check, on every backend, and an election's
    # `proclaim` have no stale-holder test yet, so no entry.
    # M2 and M7: one condition since renewals name up to 256 leases per
    # statement: the lock table's and the members table's renewals (and
    # their reads of what is still held) share it, each with its test.
    ("M2", MYSQL,
     '"name IN ({}) AND (name, {holder}) IN ({}) AND expires_at > NOW(6)"',
     '"name IN ({}) AND ((name, {holder}) IN ({}) OR TRUE) AND expires_at > NOW(6)"',
     "stale_holder", "on_mysql::a_stale_nested_extension_leaves_the_other_holders_lock"),
    ("M3", MYSQL,
     'delete: format!("DELETE FROM {t} WHERE name = ? AND holder = ? AND fence = 0")',
     'delete: format!("DELETE FROM {t} WHERE name = ? AND (holder = ? OR TRUE) AND fence = 0")',
     "stale_holder", "on_mysql::a_stale_unfenced_release_leaves_the_other_holders_lock"),
    ("M4", MYSQL,
     'free_fenced: format!(\n                "UPDATE {t} SET holder = \'\', expires_at = {FREED} WHERE name = ? AND holder = ?',
     'free_fenced: format!(\n                "UPDATE {t} SET holder = \'\', expires_at = {FREED} WHERE name = ? AND (holder = ? OR TRUE)',
     "stale_holder", "on_mysql::a_stale_release_leaves_the_other_holders_lock"),
    ("M5", MYSQL,
     'still_held: format!("SELECT 1 FROM {t} WHERE name = ? AND holder = ? AND',
     'still_held: format!("SELECT 1 FROM {t} WHERE name = ? AND (holder = ? OR TRUE) AND',
     "stale_holder", "on_mysql::a_stale_watchdog_renewal_leaves_the_other_holders_lock"),
    ("Z1", ZOOKEEPER,
     "Ok(None) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),",
     "Ok(None) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(true),",
     "stale_holder", "on_zookeeper::a_stale_watchdog_renewal_leaves_the_other_holders_lock"),
    ("A1", f"{SCRIPTS}/acquire.lua",
     "if current == holder or current == holder .. '+w' then", "if true then",
     "behaviour", "redis::mutual_exclusion"),
    ("A2", f"{SCRIPTS}/acquire_fair.lua",
     "if current == holder then\n  -- An earlier attempt", "if current then\n  -- An earlier attempt",
     "fair", "redis::a_held_fair_lock_is_refused_to_everyone_else"),
    ("A3", f"{SCRIPTS}/acquire_many.lua",
     "if value == holder or value == holder .. '+w' then", "if value then",
     "several_keys", "redis::a_set_is_taken_whole_or_not_at_all"),
    ("A4", f"{SCRIPTS}/acquire_segment.lua",
     "if values[i] == holder or values[i] == holder .. '+w' then", "if values[i] then",
     "kinds", "segments::redis::segments_exclude_like_locks"),
    ("A5", f"{SCRIPTS}/acquire_shared.lua",
     "local admitted = redis.call('ZSCORE', KEYS[1], member) ~= false",
     "local admitted = true",
     "kinds", "read_write::redis::a_writer_never_overlaps_anyone"),
    ("M6", MYSQL,
     "holder = IF(expires_at <= NOW(6) OR holder = ?, ?, holder)",
     "holder = IF(expires_at <= NOW(6) OR (holder = ? OR TRUE), ?, holder)",
     "behaviour", "mysql::mutual_exclusion"),
    # No M8: the members' own "still held" read went with that change.
    ("M7", MYSQL,
     '"name IN ({}) AND (name, {holder}) IN ({}) AND expires_at > NOW(6)"',
     '"name IN ({}) AND ((name, {holder}) IN ({}) OR TRUE) AND expires_at > NOW(6)"',
     "stale_holder", "on_mysql::a_stale_reader_extension_leaves_the_writers_lock"),
    ("M9", MEMBERS,
     '!other.starts_with("r:")\n        } else {', 'false\n        } else {',
     "kinds", "read_write::mysql::a_writer_never_overlaps_anyone"),
    ("M10", MEMBERS,
     "let full = members.len() >= ", "let full = false && members.len() >= ",
     "kinds", "permits::mysql::permits_are_counted_across_clients"),
    ("M11", MYSQL_FAIR,
     "let free = left == 0;", "let free = true;",
     "fair", "mysql::a_held_fair_lock_is_refused_to_everyone_else"),
    ("M12", MYSQL_FAIR,
     "let my_turn = first", "let my_turn = true || first",
     "fair", "mysql::waiters_get_the_lock_in_arrival_order"),
    ("Z2", QUEUE,
     'Kind::Read => last_not("r:").map_or', 'Kind::Read => None.map_or',
     "kinds", "read_write::zookeeper::a_writer_never_overlaps_anyone"),
    ("Z3", QUEUE,
     "None if ahead.len() >= ", "None if false && ahead.len() >= ",
     "kinds", "permits::zookeeper::permits_are_counted_across_clients"),
    ("E1", ETCD,
     ".is_some_and(|kv| kv.lease() == lease.id && kv.value() == holder.as_bytes())",
     ".is_none_or(|kv| kv.lease() != 0)",
     "stale_holder", "on_etcd::a_stale_watchdog_renewal_leaves_the_other_holders_lock"),
    ("E2", ETCD,
     ".delete(only.path.as_str(), None)",
     ".delete(&only.path[..=only.path.rfind('/').unwrap_or(0)], Some(etcd::DeleteOptions::new().with_prefix()))",
     "stale_holder", "on_etcd::a_stale_release_leaves_the_other_holders_lock"),
    ("Z4", ZOOKEEPER,
     "if line[i].1.starts_with(ours_prefix) && line[i].1 != name {",
     "if line[i].1 != name {",
     "behaviour", "zookeeper::mutual_exclusion"),
    ("I1", MEMORY,
     "let owned = lease.holder == holder && lease.expires > now;",
     "let owned = lease.expires > now;",
     "stale_holder", "on_memory::a_stale_release_leaves_the_other_holders_lock"),
    # No P1 or P6: they removed the watchdog's renewal check, now the same
    # statement and removal as P2's and P7's (renewals and extensions share
    # `renew_many`), and went unnoticed by the watchdog's tests, whose
    # rivals hold longer than the renewal asks (`greatest` keeps theirs).
    ("P2", POSTGRES,
     "WHERE l.name = r.name AND l.holder = r.holder AND",
     "WHERE l.name = r.name AND (l.holder = r.holder OR TRUE) AND",
     "stale_holder", "on_postgres::a_stale_nested_extension_leaves_the_other_holders_lock"),
    ("P3", POSTGRES,
     "WHERE name = $1 AND holder = $2 AND fence = 0 RETURNING waiting",
     "WHERE name = $1 AND (holder = $2 OR TRUE) AND fence = 0 RETURNING waiting",
     "stale_holder", "on_postgres::a_stale_unfenced_release_leaves_the_other_holders_lock"),
    ("P4", POSTGRES,
     "WHERE name = $1 AND holder = $2 AND fence <> 0 RETURNING waiting",
     "WHERE name = $1 AND (holder = $2 OR TRUE) AND fence <> 0 RETURNING waiting",
     "stale_holder", "on_postgres::a_stale_release_leaves_the_other_holders_lock"),
    ("P5", POSTGRES,
     "WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder",
     "WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder OR TRUE",
     "behaviour", "postgres::mutual_exclusion"),
    ("P7", POSTGRES,
     "WHERE l.name = r.name AND l.member = r.member AND",
     "WHERE l.name = r.name AND (l.member = r.member OR TRUE) AND",
     "stale_holder", "on_postgres::a_stale_reader_extension_leaves_the_writers_lock"),
    ("P8", POSTGRES,
     "WHERE name = $1 AND holder = $2 AND expires_at > clock_timestamp() \\\n                 RETURNING fence",
     "WHERE name = $1 AND (holder = $2 OR TRUE) AND expires_at > clock_timestamp() \\\n                 RETURNING fence",
     "postgres", "a_stale_holder_hands_over_nothing_of_a_lock_another_client_took"),
    # Caps: a lease is trusted no longer than the server keeps it.
    ("C1", ZOOKEEPER,
     "Duration::from_millis(self.granted_ms.load(Ordering::Relaxed)).min(self.asked_timeout)",
     "self.asked_timeout",
     "zookeeper", "a_lease_is_trusted_for_the_session_granted_not_the_one_asked"),
    ("C2", BACKENDS,
     "AnyBackend::ZooKeeper(b) => ttl.min(b.lease_cap()),",
     "AnyBackend::ZooKeeper(_) => ttl,",
     "zookeeper", "a_session_cut_off_stops_its_body_before_the_session_can_expire"),
    ("C3", LEASE,
     "let ttl = client.backend.lease_for(ttl);\n    if state.covers(ttl)",
     "if state.covers(ttl)",
     "zookeeper", "a_nested_call_is_trusted_no_longer_than_the_session"),
    ("C4", LEASE,
     "let ttl = client.backend.lease_for(ttl);\n    if state.covers(ttl)",
     "if state.covers(ttl)",
     "etcd", "a_nested_call_is_trusted_no_longer_than_two_thirds_of_the_etcd_lease"),
    ("C6", BACKENDS,
     "AnyBackend::Etcd(b) => ttl.min(b.lease_cap()),",
     "AnyBackend::Etcd(_) => ttl,",
     "etcd", "a_lease_is_trusted_for_two_thirds_of_the_etcd_lease_at_most"),
    ("C5", ETCD,
     "self.asked_ttl * 2 / 3",
     "self.asked_ttl * 2",
     "etcd", "a_nested_call_is_trusted_no_longer_than_two_thirds_of_the_etcd_lease"),
]


def run(mutant):
    ident, path, condition, removed, module, test = mutant
    # The tests are modules of one binary (tests/tests/servers/).
    name = f"{module}::{test}"
    file = ROOT / path
    original = file.read_text()
    if original.count(condition) != 1:
        return f"{ident}: the condition is not found once in {path}: update this list"
    file.write_text(original.replace(condition, removed))
    try:
        result = subprocess.run(
            ["cargo", "test", "-q", "-p", "lock-tests", "--test", "servers", "--", "--exact", name],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )
    finally:
        file.write_text(original)
    output = result.stdout + result.stderr
    if "running 0 tests" in output or " 0 passed; 0 failed" in output:
        return f"{ident}: no test named {name}: update this list"
    if result.returncode == 0:
        return f"{ident}: NOT CAUGHT: {path}: `{condition.strip()}` removed, {name} passed"
    if "test result: FAILED" not in output:
        return f"{ident}: the mutant did not build or run: {path}\n{output[-2000:]}"
    return None


def check():
    """Every entry's condition is in its file once, and its test exists."""
    sources = "".join(p.read_text() for p in (ROOT / "tests/tests/servers").glob("*.rs"))
    problems = []
    for ident, path, condition, _, module, test in MUTANTS:
        file = ROOT / path
        found = file.read_text().count(condition) if file.exists() else 0
        if found != 1:
            problems.append(f"{ident}: the condition is found {found} times in {path}, not once")
        module_file = ROOT / "tests/tests/servers" / f"{module}.rs"
        name = test.rsplit("::", 1)[-1]
        if not module_file.exists() or not re.search(rf"\bfn {name}\b", sources):
            problems.append(f"{ident}: no test {module}::{test} in tests/tests/servers/")
    for problem in problems:
        print(problem, flush=True)
    print(f"{len(MUTANTS)} entries, {len(problems)} problems: update this list" if problems
          else f"{len(MUTANTS)} entries, each naming code found once and a test that exists", flush=True)
    return 1 if problems else 0


def main():
    if sys.argv[1:] == ["--check"]:
        return check()
    chosen = [m for m in MUTANTS if len(sys.argv) == 1 or m[0] in sys.argv[1:]]
    problems = 0
    for mutant in chosen:
        problem = run(mutant)
        if problem:
            problems += 1
            print(problem, flush=True)
        else:
            ident, path, condition, _, module, test = mutant
            print(f"{ident}: caught: {path}: `{condition.strip().splitlines()[0]}` -> {module}::{test}", flush=True)
    print(f"{len(chosen) - problems} caught, {problems} not", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
