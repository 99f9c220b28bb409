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

/// The floor's acquire + release: SET NX PX, then compare-and-delete, on
/// either a bare multiplexed connection or one that reconnects.
pub(crate) async fn floor_pair<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
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

/// `pairs` floor pairs on `key`, one after another, each holder
/// `{holder_prefix}{i}`; returns each pair's latency.
pub(crate) async fn timed_floor_pairs(
    conn: &mut MultiplexedConnection,
    release: &redis::Script,
    key: &str,
    holder_prefix: &str,
    pairs: usize,
) -> Result<Vec<Duration>, Error> {
    let mut latencies = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let t = Instant::now();
        floor_pair(conn, release, key, &format!("{holder_prefix}{i}")).await?;
        latencies.push(t.elapsed());
    }
    Ok(latencies)
}

/// W0: the W1 shape with no library logic.
pub(crate) async fn w0_pairs(url: &str) -> Result<Report, Error> {
    let mut conn = raw_connection(url).await?;
    let release = redis::Script::new(COMPARE_AND_DELETE);
    let start = Instant::now();
    let latencies = timed_floor_pairs(&mut conn, &release, "w0", "floor:", SEQUENTIAL_PAIRS).await?;
    Ok(Report {
        workload: "W0 floor pair (SET NX PX + compare-and-delete)",
        ops: SEQUENTIAL_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// The floor's lock for W3: `SET NX PX` tried every millisecond until it
/// succeeds, released by compare-and-delete: what a user writes by hand.
#[derive(Clone)]
pub(crate) struct FloorLocker {
    conn: MultiplexedConnection,
    release: Arc<redis::Script>,
    next: Arc<AtomicUsize>,
}

impl FloorLocker {
    pub(crate) async fn connect(url: &str) -> Result<Self, Error> {
        Ok(FloorLocker {
            conn: raw_connection(url).await?,
            release: Arc::new(redis::Script::new(COMPARE_AND_DELETE)),
            next: Arc::default(),
        })
    }
}

impl Locker for FloorLocker {
    type Guard = (String, String);

    async fn take(&self, key: &str) -> Result<Self::Guard, Error> {
        let holder = format!("floor:{}", self.next.fetch_add(1, Ordering::Relaxed));
        let mut conn = self.conn.clone();
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&holder)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await?;
            if set.is_some() {
                return Ok((key.to_owned(), holder));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn give(&self, (key, holder): Self::Guard) -> Result<(), Error> {
        let _: i64 = self
            .release
            .key(key)
            .arg(holder)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

/// The server's CPU time so far (`INFO cpu`: user + system, every thread).
pub(crate) async fn server_cpu(conn: &mut MultiplexedConnection) -> Result<Duration, Error> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let seconds: f64 = info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum();
    Ok(Duration::from_secs_f64(seconds))
}
