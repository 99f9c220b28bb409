//! WZ: the W1 and W3 shapes on ZooKeeper, each beside its floor: the znode
//! operations the backend sends (create an ephemeral sequential child,
//! list the queue, watch the child before ours, delete ours), sent with
//! `zookeeper-client` directly on one session.

use zookeeper_client as zk;

use super::*;

const ZK_PAIRS: usize = 2_000;
const WZ3_TASKS: usize = 16;
const WZ3_INCREMENTS: usize = 50;
/// Where the floor's queues live: beside the library's, not inside them.
const FLOOR_ROOT: &str = "/floor";

/// Every WZ workload on a standalone ZooKeeper the bench starts.
pub(crate) async fn wz_zookeeper() -> Result<Vec<Report>, Error> {
    let server = tokio::task::block_in_place(lock_tests::ZooKeeper::start);
    let connect = server.connect_string();
    let session = zk::Client::connect(&connect).await?;
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    session.mkdir(&format!("{FLOOR_ROOT}/wz0"), &persistent).await?;
    session.mkdir(&format!("{FLOOR_ROOT}/wz3"), &persistent).await?;
    session.mkdir("/counter", &persistent).await?;
    let locks = LockClient::zookeeper(&connect).await?;
    let mut reports = vec![wz0_floor_pairs(&session).await?];
    reports.push(w1_on(&locks, "WZ1 ZooKeeper uncontended acquire+release", ZK_PAIRS).await?);
    reports.push(wz3_floor(&session).await?);
    reports.push(wz3(&session, &locks).await?);
    drop(server);
    Ok(reports)
}

/// Joins the queue at `dir` and waits for its turn, the recipe by hand:
/// returns the path of our child.
async fn floor_lock(session: &zk::Client, dir: &str) -> Result<String, Error> {
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, sequence) = session.create(&format!("{dir}/n_"), &[], &ephemeral).await?;
    let ours = format!("n_{sequence}");
    loop {
        let mut line = session.list_children(dir).await?;
        line.sort_unstable();
        let at = line.iter().position(|n| *n == ours).ok_or("our child vanished")?;
        if at == 0 {
            return Ok(format!("{dir}/{ours}"));
        }
        let (stat, watcher) = session
            .check_and_watch_stat(&format!("{dir}/{}", line[at - 1]))
            .await?;
        if stat.is_some() {
            watcher.changed().await;
        }
    }
}

/// WZ0: the W1 shape with the backend's znode operations sent by hand.
async fn wz0_floor_pairs(session: &zk::Client) -> Result<Report, Error> {
    let dir = format!("{FLOOR_ROOT}/wz0");
    let mut latencies = Vec::with_capacity(ZK_PAIRS);
    let start = Instant::now();
    for _ in 0..ZK_PAIRS {
        let t = Instant::now();
        let path = floor_lock(session, &dir).await?;
        session.delete(&path, None).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "WZ0 ZooKeeper floor pair (create + list + delete)",
        ops: ZK_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// The counter the W3 shapes increment under the lock: read the node's
/// data, write it back plus one.
async fn increment(session: &zk::Client) -> Result<(), Error> {
    let (data, _) = session.get_data("/counter").await?;
    let n: u64 = std::str::from_utf8(&data)?.parse().unwrap_or(0);
    session
        .set_data("/counter", (n + 1).to_string().as_bytes(), None)
        .await?;
    Ok(())
}

async fn counter(session: &zk::Client) -> Result<f64, Error> {
    let (data, _) = session.get_data("/counter").await?;
    Ok(std::str::from_utf8(&data)?.parse().unwrap_or(0.0))
}

/// WZ3 floor: 16 tasks on one session take the queue by hand, each
/// watching the child before its own.
async fn wz3_floor(session: &zk::Client) -> Result<Report, Error> {
    session.set_data("/counter", b"0", None).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..WZ3_TASKS)
        .map(|_| {
            let session = session.clone();
            tokio::spawn(async move {
                let dir = format!("{FLOOR_ROOT}/wz3");
                let mut waits = Vec::new();
                for _ in 0..WZ3_INCREMENTS {
                    let asked = Instant::now();
                    let path = floor_lock(&session, &dir).await?;
                    waits.push(asked.elapsed());
                    increment(&session).await?;
                    session.delete(&path, None).await?;
                }
                Ok::<_, Error>(waits)
            })
        })
        .collect();
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await??);
    }
    Ok(Report {
        workload: "WZ3 ZooKeeper floor 16 tasks x 1 key, one session",
        ops: WZ3_TASKS * WZ3_INCREMENTS,
        elapsed: start.elapsed(),
        latencies: waits,
        extra: vec![("final_counter", counter(session).await?)],
    })
}

/// WZ3: 16 tasks of one client increment the counter under the lock.
async fn wz3(session: &zk::Client, locks: &LockClient) -> Result<Report, Error> {
    session.set_data("/counter", b"0", None).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..WZ3_TASKS)
        .map(|_| {
            let (session, locks) = (session.clone(), locks.clone());
            tokio::spawn(async move {
                let mut waits = Vec::new();
                for _ in 0..WZ3_INCREMENTS {
                    let asked = Instant::now();
                    let guard = locks.lock("wz3").wait(Duration::from_secs(60)).acquire().await?;
                    waits.push(asked.elapsed());
                    increment(&session).await?;
                    guard.release().await?;
                }
                Ok::<_, Error>(waits)
            })
        })
        .collect();
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await??);
    }
    Ok(Report {
        workload: "WZ3 ZooKeeper 16 tasks x 1 key, one client",
        ops: WZ3_TASKS * WZ3_INCREMENTS,
        elapsed: start.elapsed(),
        latencies: waits,
        extra: vec![("final_counter", counter(session).await?)],
    })
}
