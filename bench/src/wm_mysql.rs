//! WM: the W1 and W3 shapes on MariaDB (the MySQL backend), each beside its
//! floor: the statements the backend sends, sent with `mysql_async`
//! directly on one connection.

use mysql_async::prelude::Queryable;

use super::*;

/// The backend's acquire statement (unfenced), as `backend/mysql/` sends
/// it; the floor sends it by hand.
const ACQUIRE: &str = "INSERT INTO distributed_locks (name, holder, expires_at, fence) \
     VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, LAST_INSERT_ID(0)) \
     ON DUPLICATE KEY UPDATE \
     fence = IF(expires_at > NOW(6) AND holder <> ?, \
       fence + 0 * LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at)), \
       LAST_INSERT_ID(IF(expires_at <= NOW(6), fence + 0, fence))), \
     holder = IF(expires_at <= NOW(6) OR holder = ?, ?, holder), \
     expires_at = IF(holder = ?, NOW(6) + INTERVAL ? MICROSECOND, expires_at)";
const RELEASE: &str = "DELETE FROM distributed_locks WHERE name = ? AND holder = ? AND fence = 0";

/// One floor attempt: whether the row is ours now.
async fn floor_try(conn: &mut mysql_async::Conn, name: &str, holder: &str) -> Result<bool, Error> {
    const TTL_US: u64 = 30_000_000;
    conn.exec_drop(
        ACQUIRE,
        (name, holder, TTL_US, holder, holder, holder, holder, TTL_US),
    )
    .await?;
    Ok(conn.affected_rows() > 0)
}

async fn floor_release(conn: &mut mysql_async::Conn, name: &str, holder: &str) -> Result<(), Error> {
    conn.exec_drop(RELEASE, (name, holder)).await?;
    Ok(())
}

/// The questions the server has answered so far (every statement counts).
async fn questions(url: &str) -> Result<f64, Error> {
    let mut conn = mysql_async::Conn::from_url(url).await?;
    let row: Option<(String, String)> = conn.query_first("SHOW GLOBAL STATUS LIKE 'Questions'").await?;
    conn.disconnect().await?;
    Ok(row.map_or(0.0, |(_, n)| n.parse().unwrap_or(0.0)))
}

/// Every WM workload on a MariaDB the bench starts.
pub(crate) async fn wm_mysql() -> Result<Vec<Report>, Error> {
    let server = tokio::task::block_in_place(lock_tests::MariaDb::start);
    let url = server.url();
    // The library creates the table; the floor reuses it.
    let locks = LockClient::mysql(&url).await?;
    let before = questions(&url).await?;
    let mut floor = wm0_floor_pairs(&url).await?;
    floor.extra.push((
        "questions_per_pair",
        (questions(&url).await? - before - 1.0) / MYSQL_PAIRS as f64,
    ));
    let before = questions(&url).await?;
    let mut w1 = w1_on(&locks, "WM1 MariaDB uncontended acquire+release", MYSQL_PAIRS).await?;
    w1.extra.push((
        "questions_per_pair",
        (questions(&url).await? - before - 1.0) / MYSQL_PAIRS as f64,
    ));
    let mut reports = vec![floor, w1];
    reports.push(wm3_floor(&url).await?);
    reports.push(wm3(&url, locks.clone(), "WM3 MariaDB 16 tasks x 1 key, one client").await?);
    for (poll_ms, name) in [
        (50, "WM2 MariaDB cross-client handoff, one waiter, poll 50ms"),
        (10, "WM2 MariaDB cross-client handoff, one waiter, poll 10ms"),
    ] {
        reports.push(wm2_handoff(&url, Duration::from_millis(poll_ms), name).await?);
    }
    for (poll_ms, name) in [
        (50, "WM3c MariaDB 4 clients x 4 tasks x 1 key, poll 50ms"),
        (10, "WM3c MariaDB 4 clients x 4 tasks x 1 key, poll 10ms"),
    ] {
        reports.push(wm3_clients(&url, Duration::from_millis(poll_ms), name).await?);
    }
    drop(server);
    Ok(reports)
}

const MYSQL_PAIRS: usize = 2_000;

/// WM0: the W1 shape with the backend's statements sent by hand.
async fn wm0_floor_pairs(url: &str) -> Result<Report, Error> {
    let mut conn = mysql_async::Conn::from_url(url).await?;
    let mut latencies = Vec::with_capacity(MYSQL_PAIRS);
    let start = Instant::now();
    for i in 0..MYSQL_PAIRS {
        let holder = format!("floor:{i}");
        let t = Instant::now();
        if !floor_try(&mut conn, "lock:{wm0}", &holder).await? {
            return Err("the floor's key was not free".into());
        }
        floor_release(&mut conn, "lock:{wm0}", &holder).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "WM0 MariaDB floor pair (INSERT .. ON DUPLICATE KEY UPDATE + DELETE)",
        ops: MYSQL_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// WM2: a holder in one client releases while one waiter of another
/// client (another process, to the lock) polls: release to acquisition,
/// and the statements the waiting cost the database per second.
async fn wm2_handoff(url: &str, poll: Duration, workload: &'static str) -> Result<Report, Error> {
    const HANDOFFS: usize = 40;
    let holder = LockClient::mysql(url).await?;
    let waiter = LockClient::builder().poll_interval(poll).mysql(url).await?;
    let mut handoffs = Vec::with_capacity(HANDOFFS);
    let mut waiting = Duration::ZERO;
    let before = questions(url).await?;
    let start = Instant::now();
    for _ in 0..HANDOFFS {
        let guard = holder.lock("wm2").acquire().await?;
        let waiter = waiter.clone();
        let waiting_task = tokio::spawn(async move {
            let guard = waiter.lock("wm2").wait(Duration::from_secs(10)).acquire().await?;
            let acquired = Instant::now();
            guard.release().await?;
            Ok::<_, Error>(acquired)
        });
        // The waiter polls while the holder works for 100 ms.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        guard.release().await?;
        let acquired = waiting_task.await??;
        handoffs.push(acquired.saturating_duration_since(released));
        waiting += Duration::from_millis(100);
    }
    let elapsed = start.elapsed();
    let asked = questions(url).await? - before;
    Ok(Report {
        workload,
        ops: HANDOFFS,
        elapsed,
        latencies: handoffs,
        extra: vec![
            // Each handoff's own statements (holder: 2, waiter: 2) are a
            // small share; the rest is the waiter's polling.
            ("questions_per_waiting_s", asked / waiting.as_secs_f64()),
        ],
    })
}

const WM3_TASKS: usize = 16;
const WM3_INCREMENTS: usize = 50;

/// A counter row the W3 shapes increment under the lock (SELECT, then
/// UPDATE + 1), reset to 0.
async fn reset_counter(url: &str) -> Result<mysql_async::Pool, Error> {
    let pool = mysql_async::Pool::new(url);
    let mut conn = pool.get_conn().await?;
    conn.query_drop("CREATE TABLE IF NOT EXISTS bench_counter (id INT PRIMARY KEY, n BIGINT NOT NULL)")
        .await?;
    conn.query_drop("REPLACE INTO bench_counter VALUES (1, 0)")
        .await?;
    Ok(pool)
}

async fn increment(pool: &mysql_async::Pool) -> Result<(), Error> {
    let mut conn = pool.get_conn().await?;
    let n: Option<u64> = conn
        .query_first("SELECT n FROM bench_counter WHERE id = 1")
        .await?;
    conn.exec_drop(
        "UPDATE bench_counter SET n = ? WHERE id = 1",
        (n.unwrap_or(0) + 1,),
    )
    .await?;
    Ok(())
}

async fn counter(pool: &mysql_async::Pool) -> Result<f64, Error> {
    let mut conn = pool.get_conn().await?;
    let n: Option<u64> = conn
        .query_first("SELECT n FROM bench_counter WHERE id = 1")
        .await?;
    Ok(n.unwrap_or(0) as f64)
}

/// WM3 floor: 16 tasks, each with its own connection, try the row and on
/// failure sleep 1–2 ms before trying again: the tightest loop a user would
/// write by hand.
async fn wm3_floor(url: &str) -> Result<Report, Error> {
    let data = reset_counter(url).await?;
    let before = questions(url).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..WM3_TASKS)
        .map(|task| {
            let (url, data) = (url.to_owned(), data.clone());
            tokio::spawn(async move {
                let mut conn = mysql_async::Conn::from_url(url.as_str()).await?;
                let holder = format!("floor-task:{task}");
                let mut waits = Vec::new();
                for _ in 0..WM3_INCREMENTS {
                    let asked = Instant::now();
                    while !floor_try(&mut conn, "lock:{wm3}", &holder).await? {
                        let pause = 1_000 + rand_micros(1_000);
                        tokio::time::sleep(Duration::from_micros(pause)).await;
                    }
                    waits.push(asked.elapsed());
                    increment(&data).await?;
                    floor_release(&mut conn, "lock:{wm3}", &holder).await?;
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
    let asked = questions(url).await? - before;
    Ok(Report {
        workload: "WM3 MariaDB floor 16 connections x 1 key, retry every 1-2ms",
        ops: WM3_TASKS * WM3_INCREMENTS,
        elapsed,
        latencies: waits,
        extra: vec![
            ("final_counter", counter(&data).await?),
            ("questions_per_s", asked / elapsed.as_secs_f64()),
        ],
    })
}

/// WM3: 16 tasks of one client increment the counter under the lock; a
/// release wakes the next local waiter at once.
async fn wm3(url: &str, locks: LockClient, workload: &'static str) -> Result<Report, Error> {
    wm3_on(url, vec![locks], WM3_TASKS, workload).await
}

/// WM3c: 4 clients (as 4 processes would be) x 4 tasks: a release is seen
/// by another client's waiters only by polling, so the handoff costs about
/// the poll interval, and each waiter queries the database once per poll.
async fn wm3_clients(url: &str, poll: Duration, workload: &'static str) -> Result<Report, Error> {
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(LockClient::builder().poll_interval(poll).mysql(url).await?);
    }
    wm3_on(url, clients, WM3_TASKS / 4, workload).await
}

async fn wm3_on(
    url: &str,
    clients: Vec<LockClient>,
    tasks_each: usize,
    workload: &'static str,
) -> Result<Report, Error> {
    let data = reset_counter(url).await?;
    let before = questions(url).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for locks in &clients {
        for _ in 0..tasks_each {
            let (locks, data) = (locks.clone(), data.clone());
            tasks.push(tokio::spawn(async move {
                let mut waits = Vec::new();
                for _ in 0..WM3_INCREMENTS {
                    let asked = Instant::now();
                    let guard = locks.lock("wm3").wait(Duration::from_secs(60)).acquire().await?;
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
    let asked = questions(url).await? - before;
    Ok(Report {
        workload,
        ops: clients.len() * tasks_each * WM3_INCREMENTS,
        elapsed,
        latencies: waits,
        extra: vec![
            ("final_counter", counter(&data).await?),
            ("questions_per_s", asked / elapsed.as_secs_f64()),
        ],
    })
}

fn rand_micros(below: u64) -> u64 {
    rand::random_range(0..below)
}
