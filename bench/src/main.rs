//! Measures the lock's hot paths against the physical floor: the same Redis
//! operations sent with the `redis` crate directly. Run in release mode:
//!
//! ```sh
//! cargo run --release -p lock-bench            # starts its own redis-server
//! cargo run --release -p lock-bench -- --url redis://127.0.0.1:6379/
//! ```
//!
//! Prints one JSON line per workload, then a markdown table.

use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use lock_tests::{RedisServer, commands_between};
use redis::AsyncCommands;

const PAIRS: usize = 20_000;

/// Owner-checked delete: the floor's release, as any Redis lock must do it.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

struct Report {
    workload: &'static str,
    ops: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    extra: Vec<(&'static str, String)>,
}

impl Report {
    fn percentile_us(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[index].as_secs_f64() * 1e6
    }

    fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    fn json(&self) -> String {
        let mut fields = vec![
            format!("\"workload\":\"{}\"", self.workload),
            format!("\"ops\":{}", self.ops),
            format!("\"ops_per_s\":{:.0}", self.per_second()),
            format!("\"p50_us\":{:.1}", self.percentile_us(0.50)),
            format!("\"p99_us\":{:.1}", self.percentile_us(0.99)),
        ];
        fields.extend(self.extra.iter().map(|(k, v)| format!("\"{k}\":{v}")));
        format!("{{{}}}", fields.join(","))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let given_url = args
        .iter()
        .position(|a| a == "--url")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let server = given_url.is_none().then(RedisServer::start);
    let url = given_url.unwrap_or_else(|| server.as_ref().map(RedisServer::url).unwrap_or_default());

    let reports = vec![
        w0_floor(&url).await?,
        w1_uncontended(&url).await?,
        w5_reentry(&url, server.as_ref()).await?,
    ];
    for r in &reports {
        println!("{}", r.json());
    }
    println!();
    println!("| workload | ops | ops/s | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    for r in &reports {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} |",
            r.workload,
            r.ops,
            r.per_second(),
            r.percentile_us(0.50),
            r.percentile_us(0.99)
        );
    }
    if let [w0, w1, ..] = reports.as_slice() {
        println!(
            "\nW1/W0 p50 ratio: {:.2} (target <= 1.15)",
            w1.percentile_us(0.5) / w0.percentile_us(0.5)
        );
    }
    Ok(())
}

/// W0: SET NX PX, then the compare-and-delete script, with no library logic.
async fn w0_floor(url: &str) -> Result<Report, Box<dyn std::error::Error>> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let release = redis::Script::new(COMPARE_AND_DELETE);
    let mut latencies = Vec::with_capacity(PAIRS);
    let start = Instant::now();
    for i in 0..PAIRS {
        let t = Instant::now();
        let holder = format!("floor:{i}");
        let set: Option<String> = redis::cmd("SET")
            .arg("floor")
            .arg(&holder)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await?;
        assert!(set.is_some(), "the floor's key is free");
        let _: i64 = release.key("floor").arg(&holder).invoke_async(&mut conn).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "W0 floor (SET NX PX + compare-and-delete)",
        ops: PAIRS,
        elapsed: start.elapsed(),
        latencies,
        extra: vec![],
    })
}

/// W1: one task, one key, sequential acquire + release through the library.
async fn w1_uncontended(url: &str) -> Result<Report, Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let mut latencies = Vec::with_capacity(PAIRS);
    let start = Instant::now();
    for _ in 0..PAIRS {
        let t = Instant::now();
        locks.lock("w1").acquire().await?.release().await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "W1 uncontended acquire+release",
        ops: PAIRS,
        elapsed: start.elapsed(),
        latencies,
        extra: vec![],
    })
}

/// W5: nested acquire + release inside a held lock: should cost no command.
async fn w5_reentry(url: &str, server: Option<&RedisServer>) -> Result<Report, Box<dyn std::error::Error>> {
    const NESTED: usize = 1_000_000;
    let locks = LockClient::connect(url).await?;
    let mut data = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = data.set("w5:probe", 1).await?;
    let (elapsed, sent) = locks
        .lock("w5")
        .run(async {
            let before = server.map(RedisServer::command_calls);
            let start = Instant::now();
            for _ in 0..NESTED {
                locks.lock("w5").run(async {}).await?;
            }
            let elapsed = start.elapsed();
            let sent = before
                .map(|b| commands_between(&b, &server.map(RedisServer::command_calls).unwrap_or_default()));
            Ok::<_, lock_runtime::LockError>((elapsed, sent))
        })
        .await??;
    let commands = sent.map_or("null".to_owned(), |s| s.values().sum::<u64>().to_string());
    Ok(Report {
        workload: "W5 nested re-entry",
        ops: NESTED,
        elapsed,
        latencies: vec![],
        extra: vec![
            (
                "ns_per_pair",
                format!("{:.0}", elapsed.as_nanos() as f64 / NESTED as f64),
            ),
            ("commands_sent", commands),
        ],
    })
}
