//! WE: the W1, W2-handoff and W3 shapes on etcd, each beside the floor a
//! user would write by hand with the same driver (`etcd-client`): a key put
//! in a transaction only if it is absent, on a lease granted once, deleted
//! on release, and the put tried again on conflict.

use etcd_client as etcd;

use super::*;

/// Every WE workload on an etcd member the bench starts.
pub(crate) async fn we_etcd() -> Result<Vec<Report>, Error> {
    let server = tokio::task::block_in_place(lock_tests::Etcd::start);
    let endpoints = server.endpoints();
    let locks = client(&endpoints).await?;
    let mut reports = Vec::new();
    // Floor and library in alternating rounds, so that each sees the same
    // machine (a commit's fsync varies from one minute to the next); the
    // ratio is the median of the rounds' ratios.
    let mut ratios = Vec::with_capacity(WE1_ROUNDS);
    for round in 0..WE1_ROUNDS {
        let floor = we0_floor_pairs(&endpoints).await?;
        let mut ours = w1_on(&locks, "WE1 etcd uncontended acquire+release", ETCD_PAIRS).await?;
        ratios.push(ours.p50() / floor.p50());
        if round + 1 == WE1_ROUNDS {
            ours.extra.push((
                "median_round_p50_ratio_to_floor",
                median(std::mem::take(&mut ratios)),
            ));
        }
        reports.push(floor);
        reports.push(ours);
    }
    reports.push(we2_floor_handoff(&endpoints).await?);
    reports.push(we2_handoff(&endpoints).await?);
    reports.push(we3_floor(&endpoints).await?);
    reports.push(
        we3(
            &endpoints,
            vec![locks.clone()],
            WE3_TASKS,
            "WE3 etcd 16 tasks x 1 key, one client",
        )
        .await?,
    );
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&endpoints).await?);
    }
    reports.push(
        we3(
            &endpoints,
            clients,
            WE3_TASKS / 4,
            "WE3c etcd 4 clients x 4 tasks x 1 key",
        )
        .await?,
    );
    drop(server);
    Ok(reports)
}

const ETCD_PAIRS: usize = 400;
const WE1_ROUNDS: usize = 5;

async fn client(endpoints: &[String]) -> Result<LockClient, Error> {
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    Ok(LockClient::etcd(&endpoints).await?)
}

/// The floor's driver client and the lease its keys go on: one lease,
/// granted once (every run here is shorter than its minute).
async fn floor_client(endpoints: &[String]) -> Result<(etcd::Client, i64), Error> {
    let mut client = etcd::Client::connect(endpoints, None).await?;
    let lease = client.lease_grant(60, None).await?.id();
    Ok((client, lease))
}

/// The floor's attempt: puts `key` on `lease` if it is absent; whether it was.
async fn floor_try(client: &mut etcd::Client, key: &str, lease: i64) -> Result<bool, Error> {
    let txn = etcd::Txn::new()
        .when([etcd::Compare::create_revision(key, etcd::CompareOp::Equal, 0)])
        .and_then([etcd::TxnOp::put(
            key,
            "",
            Some(etcd::PutOptions::new().with_lease(lease)),
        )]);
    Ok(client.txn(txn).await?.succeeded())
}

/// WE0: the floor's uncontended pair: a put-if-absent transaction and a
/// delete.
async fn we0_floor_pairs(endpoints: &[String]) -> Result<Report, Error> {
    let (mut client, lease) = floor_client(endpoints).await?;
    let mut latencies = Vec::with_capacity(ETCD_PAIRS);
    let start = Instant::now();
    for _ in 0..ETCD_PAIRS {
        let t = Instant::now();
        if !floor_try(&mut client, "we0", lease).await? {
            return Err("the floor's key was not free".into());
        }
        client.delete("we0", None).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "WE0 etcd floor pair (put-if-absent txn with a lease + delete)",
        ops: ETCD_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

const HANDOFFS: usize = 40;
/// How long the holder keeps the lock while the waiter waits: 50 to 150
/// ms at random, so that the floor's retries meet releases at every phase.
fn hold() -> Duration {
    Duration::from_millis(rand::random_range(50..=150))
}

/// WE2 floor: the waiter, on a client of its own, tries again every 10 ms:
/// release to acquisition.
async fn we2_floor_handoff(endpoints: &[String]) -> Result<Report, Error> {
    let (mut holder, holder_lease) = floor_client(endpoints).await?;
    let mut handoffs = Vec::with_capacity(HANDOFFS);
    let start = Instant::now();
    for _ in 0..HANDOFFS {
        if !floor_try(&mut holder, "we2", holder_lease).await? {
            return Err("the floor's key was not free".into());
        }
        let endpoints = endpoints.to_vec();
        let waiting = tokio::spawn(async move {
            let (mut waiter, lease) = floor_client(&endpoints).await?;
            loop {
                if floor_try(&mut waiter, "we2", lease).await? {
                    let acquired = Instant::now();
                    waiter.delete("we2", None).await?;
                    return Ok::<_, Error>(acquired);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        tokio::time::sleep(hold()).await;
        let released = Instant::now();
        holder.delete("we2", None).await?;
        let acquired = waiting.await??;
        handoffs.push(acquired.saturating_duration_since(released));
    }
    Ok(Report {
        workload: "WE2 etcd floor cross-client handoff, put-if-absent retried every 10ms",
        ops: HANDOFFS,
        elapsed: start.elapsed(),
        latencies: handoffs,
        ..Report::default()
    })
}

/// WE2: a holder in one client releases while a waiter of another client
/// waits: its watch on the holder's key tells it.
async fn we2_handoff(endpoints: &[String]) -> Result<Report, Error> {
    let holder = client(endpoints).await?;
    let waiter = client(endpoints).await?;
    let mut handoffs = Vec::with_capacity(HANDOFFS);
    let start = Instant::now();
    for _ in 0..HANDOFFS {
        let guard = holder.lock("we2").acquire().await?;
        let waiter = waiter.clone();
        let waiting = tokio::spawn(async move {
            let guard = waiter.lock("we2").wait(Duration::from_secs(10)).acquire().await?;
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
        workload: "WE2 etcd cross-client handoff (a watch on the key before)",
        ops: HANDOFFS,
        elapsed: start.elapsed(),
        latencies: handoffs,
        ..Report::default()
    })
}

const WE3_TASKS: usize = 16;
const WE3_INCREMENTS: usize = 25;

/// The counter the W3 shapes increment under the lock (a get, then a put
/// of one more), reset to 0.
async fn reset_counter(endpoints: &[String]) -> Result<etcd::Client, Error> {
    let mut data = etcd::Client::connect(endpoints, None).await?;
    data.put("we3-counter", "0", None).await?;
    Ok(data)
}

async fn increment(data: &mut etcd::Client) -> Result<(), Error> {
    let n = counter(data).await?;
    data.put("we3-counter", (n + 1).to_string(), None).await?;
    Ok(())
}

async fn counter(data: &mut etcd::Client) -> Result<u64, Error> {
    let reply = data.get("we3-counter", None).await?;
    let value = reply
        .kvs()
        .first()
        .map_or("0", |kv| kv.value_str().unwrap_or("0"));
    Ok(value.parse()?)
}

/// WE3 floor: 16 tasks, each with its own client and lease, try the key
/// and on conflict sleep 1–2 ms before trying again: the tightest loop a
/// user would write by hand.
async fn we3_floor(endpoints: &[String]) -> Result<Report, Error> {
    let mut data = reset_counter(endpoints).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..WE3_TASKS)
        .map(|_| {
            let (endpoints, mut data) = (endpoints.to_vec(), data.clone());
            tokio::spawn(async move {
                let (mut client, lease) = floor_client(&endpoints).await?;
                let mut waits = Vec::new();
                for _ in 0..WE3_INCREMENTS {
                    let asked = Instant::now();
                    while !floor_try(&mut client, "we3", lease).await? {
                        let pause = 1_000 + rand::random_range(0..1_000);
                        tokio::time::sleep(Duration::from_micros(pause)).await;
                    }
                    waits.push(asked.elapsed());
                    increment(&mut data).await?;
                    client.delete("we3", None).await?;
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
        workload: "WE3 etcd floor 16 clients x 1 key, put-if-absent retried every 1-2ms",
        ops: WE3_TASKS * WE3_INCREMENTS,
        elapsed,
        latencies: waits,
        extra: vec![("final_counter", counter(&mut data).await? as f64)],
    })
}

/// WE3 and WE3c: the clients' tasks increment the counter under the lock.
async fn we3(
    endpoints: &[String],
    clients: Vec<LockClient>,
    tasks_each: usize,
    workload: &'static str,
) -> Result<Report, Error> {
    let mut data = reset_counter(endpoints).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for locks in &clients {
        for _ in 0..tasks_each {
            let (locks, mut data) = (locks.clone(), data.clone());
            tasks.push(tokio::spawn(async move {
                let mut waits = Vec::new();
                for _ in 0..WE3_INCREMENTS {
                    let asked = Instant::now();
                    let guard = locks.lock("we3").wait(Duration::from_secs(60)).acquire().await?;
                    waits.push(asked.elapsed());
                    increment(&mut data).await?;
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
        ops: clients.len() * tasks_each * WE3_INCREMENTS,
        elapsed,
        latencies: waits,
        extra: vec![("final_counter", counter(&mut data).await? as f64)],
    })
}
