//! Measures the lock's hot paths against the physical floor: the same Redis
//! operations sent with the `redis` crate directly, in the same run. Release
//! mode only:
//!
//! ```sh
//! cargo run --release -p lock-bench                 # starts its own redis-server
//! cargo run --release -p lock-bench -- --pin        # redis on CPU 1, the bench on CPU 0
//! cargo run --release -p lock-bench -- --url redis://127.0.0.1:6379/
//! cargo run --release -p lock-bench -- --only W1 --recorder   # metrics recorded
//! cargo run --release -p lock-bench -- --plot target/bench-plots  # SVG charts
//! cargo run --release -p lock-bench -- --only WM    # MariaDB (MySQL backend)
//! cargo run --release -p lock-bench -- --only WZ    # ZooKeeper
//! cargo run --release -p lock-bench -- --only WG    # PostgreSQL
//! cargo run --release -p lock-bench -- --only WG1 --pg-url postgres://…   # WG0+WG1 there
//! cargo run --release -p lock-bench -- --only WE    # etcd
//! cargo run --release -p lock-bench -- --only WL    # elections' failover, every backend
//! cargo run --release -p lock-bench -- --only W1,W2,W3,W4,WP   # against rslock 0.10
//! cargo run --release -p lock-bench -- --pin --only WSF,WSB,WSC   # renewals under load, leases per core
//! cargo run --release -p lock-bench -- --only WSG,WSM   # renewals under load on PostgreSQL, MariaDB
//! cargo run --release -p lock-bench -- --only WSZ,WSE   # the same on ZooKeeper, etcd
//! ```
//!
//! Prints one JSON line per workload as it finishes, then a markdown table
//! and each target as a ratio.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use lock_tests::{RedisServer, commands_between};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Allocations are counted only while W1a measures (`allocations.rs`).
#[global_allocator]
static ALLOCATOR: allocations::CountedWhenAsked = allocations::CountedWhenAsked;

const SEQUENTIAL_PAIRS: usize = 20_000;
const W2_TASKS: usize = 64;
const W2_MAX_PAIRS: usize = 200_000;
const W2_MAX_TIME: Duration = Duration::from_secs(10);
/// W2 and its floors run in rotating rounds, each a third of the budget,
/// so that all see the same machine: on two shared cores, back-to-back
/// single runs differed by 20%.
const W2_ROUNDS: usize = 3;
const W3_TASKS: usize = 16;
const W3_INCREMENTS: usize = 125;
const W5_NESTED: usize = 1_000_000;
const W6_LOCKS: usize = 10_000;
const W6_TTL: Duration = Duration::from_secs(3);
const W6_HOLD: Duration = Duration::from_secs(10);

mod allocations;
mod floor;
mod plot;
mod report;
mod w1_accounting;
mod w1_uncontended;
mod w2_independent_keys;
mod w3_contended;
mod w4_scale_out;
mod w5_reentry;
mod w6_watchdog;
mod w7_transfer;
mod we_etcd;
mod wg_postgres;
mod wk_kinds;
mod wl_leader;
mod wm_mysql;
mod wp_rslock;
mod wr_replica_acks;
mod ws_flood;
mod ws_scale;
mod wz_zookeeper;

use floor::*;
use report::*;
use w1_accounting::*;
use w1_uncontended::*;
use w2_independent_keys::*;
use w3_contended::*;
use w4_scale_out::*;
use w5_reentry::*;
use w6_watchdog::*;
use w7_transfer::*;
use we_etcd::*;
use wg_postgres::*;
use wk_kinds::*;
use wl_leader::*;
use wm_mysql::*;
use wp_rslock::*;
use wr_replica_acks::*;
use ws_flood::*;
use ws_scale::*;
use wz_zookeeper::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, url, tasks, increments] = args.as_slice()
        && flag == "--w3-worker"
    {
        return w3_worker(url, tasks.parse()?, increments.parse()?).await;
    }
    if let [_, flag, kind, target] = args.as_slice()
        && flag == "--wl-candidate"
    {
        return wl_candidate(kind, target).await;
    }
    let given_url = args
        .iter()
        .position(|a| a == "--url")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let pin = args.iter().any(|a| a == "--pin");
    // `--recorder`: the library's metrics go to a Prometheus recorder (no
    // HTTP listener), to measure what recording costs the hot path.
    if args.iter().any(|a| a == "--recorder") {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::set_global_recorder(recorder).map_err(|_| "a recorder was already installed")?;
        println!("{{\"recorder\":\"prometheus\"}}");
    }
    let server = given_url.is_none().then(RedisServer::start);
    let url = given_url.unwrap_or_else(|| server.as_ref().map(RedisServer::url).unwrap_or_default());
    if pin {
        pin_cpus(server.as_ref())?;
    }

    // `--only W2` runs the workloads whose names start with W2 (profiling).
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    // A comma-separated list (`--only W0,W1,W3`) runs each.
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|prefix| name.starts_with(prefix)))
    };
    let mut reports = Vec::new();
    macro_rules! run {
        ($name:literal, $workload:expr) => {{
            if wanted($name) {
                let report = $workload.await?;
                println!("{}", report.json());
                reports.push(report);
            }
        }};
    }
    run!("W0", w0_round_trip(&url));
    run!("W0", w0_pairs(&url));
    run!("W1", w1_uncontended(&url));
    run!("W1m", w1_in_process());
    if wanted("W1a") {
        for report in w1_accounting(&url).await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("W2") {
        let (w2_floor, w2_managed_floor, w2) = w2_independent_keys(&url).await?;
        for report in [w2_floor, w2_managed_floor, w2] {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    run!(
        "W3",
        w3_locker(
            FloorLocker::connect(&url).await?,
            &url,
            "W3 floor, 16 tasks x 1 key, poll 1 ms"
        )
    );
    run!("W3", w3_contended(&url));
    run!("W3", w3_processes(&url));
    if wanted("W4") {
        for report in w4_scale_out().await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    run!("W5", w5_reentry(&url, server.as_ref()));
    run!("W6", w6_watchdog(&url, server.as_ref()));
    run!("WS", ws_many_tasks(&url));
    run!("WS", ws_held(&url, server.as_ref()));
    if wanted("W7") {
        for report in w7_transfer(&url).await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("WK") {
        for report in wk_kinds(&url).await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("WP") {
        for report in wp_rslock(&url).await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("WM") {
        for report in wm_mysql().await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    // `--only WG1`: PostgreSQL's uncontended rounds alone.
    let wg1_only = only.as_deref().is_some_and(|o| o.split(',').any(|p| p == "WG1"));
    if wanted("WG") || wg1_only {
        let given = args
            .iter()
            .position(|a| a == "--pg-url")
            .and_then(|i| args.get(i + 1));
        for report in wg_postgres(given.map(String::as_str), wg1_only).await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("WE") {
        for report in we_etcd().await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("WZ") {
        for report in wz_zookeeper().await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("WR") {
        for report in wr_replica_acks().await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    if wanted("WL") {
        for report in wl_leader(&url).await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    // Last: they install a recorder of the library's metrics (for the
    // renewal lag), which the workloads above must not pay for.
    if ["WSF", "WSG", "WSM", "WSZ", "WSE", "WSB", "WSC"]
        .into_iter()
        .any(wanted)
    {
        let lags = Lags::install();
        run!("WSF", ws_flood(&url, &lags));
        run!("WSG", ws_flood_postgres(&lags));
        run!("WSM", ws_flood_mysql(&lags));
        run!("WSZ", ws_flood_zookeeper(&lags));
        run!("WSE", ws_flood_etcd(&lags));
        run!("WSB", ws_busy_runtime(&url, &lags));
        run!("WSC", ws_capacity(&url, &lags));
    }
    summarise(&reports);
    // `--plot DIR`: SVG charts of this run.
    if let Some(dir) = args
        .iter()
        .position(|a| a == "--plot")
        .and_then(|i| args.get(i + 1))
    {
        for file in plot::plot(std::path::Path::new(dir), &reports)? {
            println!("wrote {file}");
        }
    }
    Ok(())
}

/// Redis on CPU 1, this process on CPU 0: no core shared between them.
fn pin_cpus(server: Option<&RedisServer>) -> Result<(), Error> {
    let on = |cpu: usize| -> Result<CpuSet, Error> {
        let mut set = CpuSet::new();
        set.set(cpu)?;
        Ok(set)
    };
    sched_setaffinity(Pid::from_raw(0), &on(0)?)?;
    if let Some(server) = server {
        sched_setaffinity(server.pid(), &on(1)?)?;
    }
    Ok(())
}

fn summarise(reports: &[Report]) {
    let find = |prefix: &str| reports.iter().find(|r| r.workload.starts_with(prefix));
    let against_rslock = [
        ("W1 p50", "W1 un", "WP1", Report::p50 as fn(&Report) -> f64),
        ("W2 pairs/s", "W2 64", "WP2", Report::per_second),
        ("W3 increments/s", "W3 16", "WP3", Report::per_second),
        ("W3 cross-task handoff p99", "W3 16", "WP3", Report::cross_p99),
        (
            "W4 Redlock N=3 p50",
            "W4 Redlock N=3 acq",
            "WP4 rslock Redlock N=3 acq",
            Report::p50,
        ),
        (
            "W4 Redlock N=3 increments/s",
            "W4 Redlock N=3, 16",
            "WP4 rslock Redlock N=3, 16",
            Report::per_second,
        ),
        (
            "W4 Redlock N=3 cross-task handoff p99",
            "W4 Redlock N=3, 16",
            "WP4 rslock Redlock N=3, 16",
            Report::cross_p99,
        ),
    ];
    if against_rslock.iter().any(|(_, _, peer, _)| find(peer).is_some()) {
        println!("\n| against rslock 0.10 | library | rslock | library / rslock |\n|---|---|---|---|");
        for (name, library, peer, figure) in against_rslock {
            if let (Some(l), Some(p)) = (find(library), find(peer)) {
                println!(
                    "| {name} | {:.1} | {:.1} | {:.2} |",
                    figure(l),
                    figure(p),
                    figure(l) / figure(p)
                );
            }
        }
    }
    if let (Some(floor), Some(library)) = (find("W1a floor"), find("W1a library")) {
        println!("\n| W1a one pair, counted | floor | library | library / floor |\n|---|---|---|---|");
        for (name, _) in &floor.extra {
            let (f, l) = (floor.extra(name), library.extra(name));
            println!("| {name} | {f:.2} | {l:.2} | {:.2} |", l / f);
        }
    }
    if find("WG1").is_some() {
        // The best of the alternating rounds, for the floor and library alike.
        let best_p50 = |prefix: &str| {
            reports
                .iter()
                .filter(|r| r.workload.starts_with(prefix))
                .map(Report::p50)
                .fold(f64::INFINITY, f64::min)
        };
        let figure = |prefix: &str, f: fn(&Report) -> f64| find(prefix).map_or(f64::NAN, f);
        println!(
            "\n| PostgreSQL, against the floors | library | floor | library / floor |\n|---|---|---|---|"
        );
        for (name, floor) in [
            ("WG1 p50 µs vs pg_try_advisory_lock pair", "WG0a"),
            ("WG1 p50 µs vs lease row pair", "WG0b"),
        ] {
            let (l, f) = (best_p50("WG1"), best_p50(floor));
            println!("| {name} | {l:.1} | {f:.1} | {:.2} |", l / f);
        }
        let median = reports
            .iter()
            .filter(|r| r.workload.starts_with("WG1"))
            .map(|r| r.extra("median_round_p50_ratio_to_lease_row"))
            .find(|ratio| !ratio.is_nan())
            .unwrap_or(f64::NAN);
        println!("| WG1 p50 vs lease row pair, median of the rounds' ratios | | | {median:.2} |");
        let (l, f) = (
            figure("WG2 PostgreSQL cross", Report::p50),
            figure("WG2 PostgreSQL floor", Report::p50),
        );
        println!(
            "| WG2 handoff p50 µs vs 100 ms polling | {l:.1} | {f:.1} | {:.3} |",
            l / f
        );
        for (name, library) in [
            ("WG3 increments/s, one client", "WG3 PostgreSQL 16"),
            ("WG3c increments/s, 4 clients", "WG3c"),
        ] {
            for (against, floor) in [
                (
                    "advisory retry loop",
                    "WG3 PostgreSQL floor 16 connections x 1 key, advisory",
                ),
                (
                    "lease row retry loop",
                    "WG3 PostgreSQL floor 16 connections x 1 key, lease",
                ),
            ] {
                let (l, f) = (
                    figure(library, Report::per_second),
                    figure(floor, Report::per_second),
                );
                println!("| {name} vs {against} | {l:.1} | {f:.1} | {:.2} |", l / f);
            }
        }
    }
    println!("\n| workload | ops | ops/s | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    for r in reports {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} |",
            r.workload,
            r.ops,
            r.per_second(),
            r.percentile_us(0.50),
            r.percentile_us(0.99)
        );
    }
    let (Some(rtt), Some(w1), Some(w2), Some(w3), Some(w3p), Some(w5), Some(w6)) = (
        find("W0 round"),
        find("W1 un"),
        find("W2 64"),
        find("W3 16"),
        find("W3 4"),
        find("W5"),
        find("W6"),
    ) else {
        return;
    };
    let rtt_p50 = rtt.percentile_us(0.5);
    let targets = [
        (
            "W1 p50 / floor pair p50 (median of interleaved rounds)",
            w1.extra("median_round_p50_ratio_to_floor"),
            "<= 1.05",
        ),
        (
            "W1 p99 / floor pair p99 (median of interleaved rounds)",
            w1.extra("median_round_p99_ratio_to_floor"),
            "<= 1.1",
        ),
        (
            "W1 p99 / floor pair p99 (all pairs of the interleaved rounds)",
            w1.extra("p99_ratio_to_interleaved_floor"),
            "(for reference)",
        ),
        (
            "W2 pairs/s / W2 floor pairs/s (median of rounds)",
            w2.extra("median_round_ratio_to_floor"),
            ">= 1.5",
        ),
        (
            "W2 pairs/s / the same floor on a ConnectionManager (median of rounds)",
            w2.extra("median_round_ratio_to_managed_floor"),
            "(for reference)",
        ),
        (
            "W3 cross-task handoff p50 / W0 round trip p50",
            w3.extra("cross_task_handoff_p50_us") / rtt_p50,
            "<= 3",
        ),
        (
            "W3 cross-task handoff p99 (µs)",
            w3.extra("cross_task_handoff_p99_us"),
            "<= 1000",
        ),
        (
            "W3 increments/s / W3 floor increments/s",
            find("W3 floor").map_or(f64::NAN, |f| w3.per_second() / f.per_second()),
            ">= 1.0",
        ),
        ("W3 final counter", w3.extra("final_counter"), "== 2000"),
        (
            "W4 Redlock N=3 final counter",
            find("W4 Redlock N=3, 16").map_or(f64::NAN, |r| r.extra("final_counter")),
            "== 2000",
        ),
        (
            "W3 processes final counter",
            w3p.extra("final_counter"),
            "== 2000",
        ),
        ("W5 ns per nested pair", w5.extra("ns_per_pair"), "< 1000"),
        ("W5 commands sent", w5.extra("commands_sent"), "== 0"),
        (
            "W6 round trips per 100 due leases",
            w6.extra("round_trips_per_100_due"),
            "<= 1",
        ),
    ];
    println!("\n| target | measured | goal |\n|---|---|---|");
    for (name, value, goal) in targets {
        println!("| {name} | {value:.2} | {goal} |");
    }
}
