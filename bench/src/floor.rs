//! W0, the floor: the same Redis operations sent with the `redis` crate
//! directly (`SET NX PX` and an owner-checked delete), no library logic.

use super::*;

/// Owner-checked delete: the floor's release, as any Redis lock must do it.
pub(crate) const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

pub(crate) async fn raw_connection(url: &str) -> Result<MultiplexedConnection, Error> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// W0: one GET: the single round trip every ratio for handoffs is taken
/// against.
pub(crate) async fn w0_round_trip(url: &str) -> Result<Report, Error> {
    let mut conn = raw_connection(url).await?;
    let mut latencies = Vec::with_capacity(SEQUENTIAL_PAIRS);
    let start = Instant::now();
    for _ in 0..SEQUENTIAL_PAIRS {
        let t = Instant::now();
        let _: Option<String> = conn.get("w0:rtt").await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "W0 round trip (GET)",
        ops: SEQUENTIAL_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// The floor's acquire + release: SET NX PX, then compare-and-delete.
pub(crate) async fn floor_pair(
    conn: &mut MultiplexedConnection,
    release: &redis::Script,
    key: &str,
    holder: &str,
) -> Result<(), Error> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(holder)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await?;
    if set.is_none() {
        return Err(format!("floor key {key} was not free").into());
    }
    let _: i64 = release.key(key).arg(holder).invoke_async(conn).await?;
    Ok(())
}

/// W0: the W1 shape with no library logic.
pub(crate) async fn w0_pairs(url: &str) -> Result<Report, Error> {
    let mut conn = raw_connection(url).await?;
    let release = redis::Script::new(COMPARE_AND_DELETE);
    let mut latencies = Vec::with_capacity(SEQUENTIAL_PAIRS);
    let start = Instant::now();
    for i in 0..SEQUENTIAL_PAIRS {
        let t = Instant::now();
        floor_pair(&mut conn, &release, "w0", &format!("floor:{i}")).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "W0 floor pair (SET NX PX + compare-and-delete)",
        ops: SEQUENTIAL_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}
