//! WG: the W1, W2-handoff and W3 shapes on PostgreSQL, each beside the
//! floors a user would write by hand with the same driver
//! (`tokio-postgres`): a `pg_try_advisory_lock` loop, and a lease row taken
//! with `INSERT … ON CONFLICT DO NOTHING` and deleted on release.

use tokio_postgres::NoTls;

use super::*;

/// A connection of its own, driven by a task of its own.
async fn connect(url: &str) -> Result<tokio_postgres::Client, Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The hand-written lease row: a table of its own, so that it never meets
/// the library's.
const LEASE_TABLE: &str = "CREATE TABLE IF NOT EXISTS floor_leases (\
     name text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL)";
const LEASE_TRY: &str = "INSERT INTO floor_leases (name, holder, expires_at) \
     VALUES ($1, $2, clock_timestamp() + interval '30 seconds') ON CONFLICT (name) DO NOTHING";
const LEASE_FREE: &str = "DELETE FROM floor_leases WHERE name = $1 AND holder = $2";

/// Every WG workload on a PostgreSQL the bench starts, or on the one at
/// `given` (`--pg-url`: a server with `pg_stat_statements`, say, to see
/// where the time goes); WG0 and WG1 alone with `uncontended_only`.
pub(crate) async fn wg_postgres(given: Option<&str>, uncontended_only: bool) -> Result<Vec<Report>, Error> {
    let server = given
        .is_none()
        .then(|| tokio::task::block_in_place(lock_tests::Postgres::start));
    let url = given
        .map(str::to_owned)
        .or_else(|| server.as_ref().map(lock_tests::Postgres::url))
        .unwrap_or_default();
    let locks = LockClient::postgres(&url).await?;
    let mut reports = Vec::new();
    // Floors and library in alternating rounds, so that each sees the
    // same machine; a commit's fsync here varies by a fifth from one
    // minute to the next, so the ratio to the lease row is the median of
    // the rounds' ratios, as W1's is.
    let mut ratios = Vec::with_capacity(WG1_ROUNDS);
    for round in 0..WG1_ROUNDS {
        reports.push(wg0_advisory_pairs(&url).await?);
        let floor = wg0_lease_pairs(&url).await?;
        let mut ours = w1_on(&locks, "WG1 PostgreSQL uncontended acquire+release", PG_PAIRS).await?;
        ratios.push(ours.p50() / floor.p50());
        if round + 1 == WG1_ROUNDS {
            ours.extra.push((
                "median_round_p50_ratio_to_lease_row",
                median(std::mem::take(&mut ratios)),
            ));
        }
        reports.push(floor);
        reports.push(ours);
    }
    if uncontended_only {
        return Ok(reports);
    }
    reports.push(wg2_floor_handoff(&url).await?);
    reports.push(wg2_handoff(&url).await?);
    reports.push(wg3_floor(&url, FloorLock::Advisory).await?);
    reports.push(wg3_floor(&url, FloorLock::LeaseRow).await?);
    reports.push(
        wg3(
            &url,
            vec![locks.clone()],
            WG3_TASKS,
            "WG3 PostgreSQL 16 tasks x 1 key, one client",
        )
        .await?,
    );
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(LockClient::postgres(&url).await?);
    }
    reports.push(
        wg3(
            &url,
            clients,
            WG3_TASKS / 4,
            "WG3c PostgreSQL 4 clients x 4 tasks x 1 key",
        )
        .await?,
    );
    drop(server);
    Ok(reports)
}

const PG_PAIRS: usize = 800;
const WG1_ROUNDS: usize = 5;

/// WG0a: `pg_try_advisory_lock` + `pg_advisory_unlock` on one connection:
/// no lease, no fencing, gone with the session (the floor's weaknesses).
async fn wg0_advisory_pairs(url: &str) -> Result<Report, Error> {
    let conn = connect(url).await?;
    let try_lock = conn.prepare("SELECT pg_try_advisory_lock(hashtext($1))").await?;
    let unlock = conn.prepare("SELECT pg_advisory_unlock(hashtext($1))").await?;
    let mut latencies = Vec::with_capacity(PG_PAIRS);
    let start = Instant::now();
    for _ in 0..PG_PAIRS {
        let t = Instant::now();
        let got: bool = conn.query_one(&try_lock, &[&"wg0"]).await?.get(0);
        if !got {
            return Err("the floor's advisory lock was not free".into());
        }
        conn.query_one(&unlock, &[&"wg0"]).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "WG0a PostgreSQL floor pair (pg_try_advisory_lock + unlock)",
        ops: PG_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// WG0b: a lease row by hand: insert if absent, delete by holder.
async fn wg0_lease_pairs(url: &str) -> Result<Report, Error> {
    let conn = connect(url).await?;
    conn.batch_execute(LEASE_TABLE).await?;
    let try_lease = conn.prepare(LEASE_TRY).await?;
    let free = conn.prepare(LEASE_FREE).await?;
    let mut latencies = Vec::with_capacity(PG_PAIRS);
    let start = Instant::now();
    for i in 0..PG_PAIRS {
        let holder = format!("floor:{i}");
        let t = Instant::now();
        if conn.execute(&try_lease, &[&"wg0", &holder]).await? == 0 {
            return Err("the floor's lease row was not free".into());
        }
        conn.execute(&free, &[&"wg0", &holder]).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "WG0b PostgreSQL floor pair (INSERT .. ON CONFLICT DO NOTHING + DELETE)",
        ops: PG_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

const HANDOFFS: usize = 40;
/// How long the holder keeps the lock while the waiter waits: 50 to 150
/// ms at random, so that the floor's 100 ms polls meet releases at every
/// phase (a fixed 100 ms would line its polls up with them).
fn hold() -> Duration {
    Duration::from_millis(rand::random_range(50..=150))
}

/// WG2 floor: the waiter, on a connection of its own, tries
/// `pg_try_advisory_lock` every 100 ms (ShedLock's and Spring's polling):
/// release to acquisition.
async fn wg2_floor_handoff(url: &str) -> Result<Report, Error> {
    let holder = connect(url).await?;
    let mut handoffs = Vec::with_capacity(HANDOFFS);
    let start = Instant::now();
    for _ in 0..HANDOFFS {
        holder
            .query_one("SELECT pg_advisory_lock(hashtext('wg2'))", &[])
            .await?;
        let waiter_url = url.to_owned();
        let waiting = tokio::spawn(async move {
            let waiter = connect(&waiter_url).await?;
            loop {
                let got: bool = waiter
                    .query_one("SELECT pg_try_advisory_lock(hashtext('wg2'))", &[])
                    .await?
                    .get(0);
                if got {
                    let acquired = Instant::now();
                    waiter
                        .query_one("SELECT pg_advisory_unlock(hashtext('wg2'))", &[])
                        .await?;
                    return Ok::<_, Error>(acquired);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        tokio::time::sleep(hold()).await;
        let released = Instant::now();
        holder
            .query_one("SELECT pg_advisory_unlock(hashtext('wg2'))", &[])
            .await?;
        let acquired = waiting.await??;
        handoffs.push(acquired.saturating_duration_since(released));
    }
    Ok(Report {
        workload: "WG2 PostgreSQL floor cross-connection handoff, advisory lock polled every 100ms",
        ops: HANDOFFS,
        elapsed: start.elapsed(),
        latencies: handoffs,
        ..Report::default()
    })
}

/// WG2: a holder in one client releases while a waiter of another client
/// (another process, to the lock) waits: it hears the release (`NOTIFY`).
async fn wg2_handoff(url: &str) -> Result<Report, Error> {
    let holder = LockClient::postgres(url).await?;
    let waiter = LockClient::postgres(url).await?;
    let mut handoffs = Vec::with_capacity(HANDOFFS);
    let start = Instant::now();
    for _ in 0..HANDOFFS {
        let guard = holder.lock("wg2").acquire().await?;
        let waiter = waiter.clone();
        let waiting = tokio::spawn(async move {
            let guard = waiter.lock("wg2").wait(Duration::from_secs(10)).acquire().await?;
            let acquired = Instant::now();
            guard.release().await?;
            Ok::<_, Error>(acquired)
        });
        tokio::time::sleep(hold()).await;
        let released = Instant::now();
        guard.release().await?;
        let acquired = waiting.await??;
        handoffs.push(acquired.saturating_duration_since(released));
    }
    Ok(Report {
        workload: "WG2 PostgreSQL cross-client handoff (LISTEN/NOTIFY)",
        ops: HANDOFFS,
        elapsed: start.elapsed(),
        latencies: handoffs,
        ..Report::default()
    })
}

const WG3_TASKS: usize = 16;
const WG3_INCREMENTS: usize = 50;

/// A counter row the W3 shapes increment under the lock (SELECT, then
/// UPDATE + 1), reset to 0; the connection that does it.
async fn reset_counter(url: &str) -> Result<Arc<tokio_postgres::Client>, Error> {
    let data = connect(url).await?;
    data.batch_execute(
        "CREATE TABLE IF NOT EXISTS bench_counter (id int PRIMARY KEY, n bigint NOT NULL); \
         INSERT INTO bench_counter VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET n = 0",
    )
    .await?;
    Ok(Arc::new(data))
}

async fn increment(data: &tokio_postgres::Client) -> Result<(), Error> {
    let n: i64 = data
        .query_one("SELECT n FROM bench_counter WHERE id = 1", &[])
        .await?
        .get(0);
    data.execute("UPDATE bench_counter SET n = $1 WHERE id = 1", &[&(n + 1)])
        .await?;
    Ok(())
}

async fn counter(data: &tokio_postgres::Client) -> Result<f64, Error> {
    let n: i64 = data
        .query_one("SELECT n FROM bench_counter WHERE id = 1", &[])
        .await?
        .get(0);
    Ok(n as f64)
}

/// The lock a WG3 floor takes by hand.
#[derive(Clone, Copy)]
enum FloorLock {
    /// `pg_try_advisory_lock`: held in the server's memory, nothing
    /// written, gone with the session; no lease, no fencing.
    Advisory,
    /// The lease row (WG0b's): a commit to take it and one to free it, as
    /// the library's.
    LeaseRow,
}

/// WG3 floor: 16 tasks, each with its own connection, try the lock and on
/// failure sleep 1–2 ms before trying again: the tightest loop a user
/// would write by hand.
async fn wg3_floor(url: &str, lock: FloorLock) -> Result<Report, Error> {
    let data = reset_counter(url).await?;
    data.batch_execute(LEASE_TABLE).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..WG3_TASKS)
        .map(|task| {
            let (url, data) = (url.to_owned(), Arc::clone(&data));
            tokio::spawn(async move {
                let conn = connect(&url).await?;
                // The advisory lock's key is the name alone; the lease row
                // is the name's, held by this task.
                let (take, free, holder) = match lock {
                    FloorLock::Advisory => (
                        "SELECT pg_try_advisory_lock(hashtext($1 || $2))",
                        "SELECT pg_advisory_unlock(hashtext($1 || $2))",
                        String::new(),
                    ),
                    FloorLock::LeaseRow => (LEASE_TRY, LEASE_FREE, format!("floor:{task}")),
                };
                let (take, free) = (conn.prepare(take).await?, conn.prepare(free).await?);
                let args: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&"wg3", &holder];
                let mut waits = Vec::new();
                for _ in 0..WG3_INCREMENTS {
                    let asked = Instant::now();
                    loop {
                        let got = match lock {
                            FloorLock::Advisory => conn.query_one(&take, &args).await?.get::<_, bool>(0),
                            FloorLock::LeaseRow => conn.execute(&take, &args).await? == 1,
                        };
                        if got {
                            break;
                        }
                        let pause = 1_000 + rand::random_range(0..1_000);
                        tokio::time::sleep(Duration::from_micros(pause)).await;
                    }
                    waits.push(asked.elapsed());
                    increment(&data).await?;
                    conn.execute(&free, &args).await?;
                }
                Ok::<_, Error>(waits)
            })
        })
        .collect();
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await??);
    }
    let elapsed = start.elapsed();
    Ok(Report {
        workload: match lock {
            FloorLock::Advisory => {
                "WG3 PostgreSQL floor 16 connections x 1 key, advisory lock retried every 1-2ms"
            }
            FloorLock::LeaseRow => {
                "WG3 PostgreSQL floor 16 connections x 1 key, lease row retried every 1-2ms"
            }
        },
        ops: WG3_TASKS * WG3_INCREMENTS,
        elapsed,
        latencies: waits,
        extra: vec![("final_counter", counter(&data).await?)],
    })
}

/// WG3 and WG3c: the clients' tasks increment the counter under the lock.
async fn wg3(
    url: &str,
    clients: Vec<LockClient>,
    tasks_each: usize,
    workload: &'static str,
) -> Result<Report, Error> {
    let data = reset_counter(url).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for locks in &clients {
        for _ in 0..tasks_each {
            let (locks, data) = (locks.clone(), Arc::clone(&data));
            tasks.push(tokio::spawn(async move {
                let mut waits = Vec::new();
                for _ in 0..WG3_INCREMENTS {
                    let asked = Instant::now();
                    let guard = locks.lock("wg3").wait(Duration::from_secs(60)).acquire().await?;
                    waits.push(asked.elapsed());
                    increment(&data).await?;
                    guard.release().await?;
                }
                Ok::<_, Error>(waits)
            }));
        }
    }
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await??);
    }
    let elapsed = start.elapsed();
    Ok(Report {
        workload,
        ops: clients.len() * tasks_each * WG3_INCREMENTS,
        elapsed,
        latencies: waits,
        extra: vec![("final_counter", counter(&data).await?)],
    })
}
