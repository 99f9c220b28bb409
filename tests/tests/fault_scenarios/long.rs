//! The fault scenarios, tier 2: the scenarios that take too
//! long for every change, the negative controls that need several masters
//! or a replica, and the X1/X2 campaigns. Every test here is `#[ignore]`d;
//! `LOCK_FAULTS_TIER2=1 .ci/run` runs them one at a time, as does
//! `cargo test -p lock-tests --test fault_scenarios -- --ignored --test-threads=1`
//! (the ignored tests of this binary are these).
//! `LOCK_FAULTS_CAMPAIGN_SECS` sets the campaigns' length (default 600 s) and
//! `LOCK_FAULTS_SEED` their seed (default: random, reported). X3 runs
//! `LOCK_FAULTS_CAMPAIGN_SECS` on each of its five backends.

use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use lock_tests::etcd::{self, Etcd};
use lock_tests::lab::{self, Board, Holder, Stall, Workers, Workload};
use lock_tests::monitor::{self, Monitor};
use lock_tests::report::{self, Verdict, spread_ms};
use lock_tests::witness::{Analysis, FAULTS, Witness, analyze};
use lock_tests::zookeeper::{self, ZooKeeper};
use lock_tests::{MariaDb, Postgres, Proxy, RedisServer, eventually};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const T: Duration = Duration::from_millis(1500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(100);

fn seed() -> u64 {
    std::env::var("LOCK_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random())
}

fn campaign_length() -> Duration {
    let secs = std::env::var("LOCK_FAULTS_CAMPAIGN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    Duration::from_secs(secs)
}

/// Tasks per worker process in the death campaign: more tasks put more
/// acquisitions between deaths (a long body parks only its own task).
fn campaign_tasks() -> usize {
    std::env::var("LOCK_FAULTS_CAMPAIGN_TASKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(8)
}

/// Whether X3 runs on `backend`: all five unless `LOCK_FAULTS_X3_BACKENDS`
/// names some (comma-separated: `redis,mariadb,postgres,zookeeper,etcd`).
fn x3_runs_on(backend: &str) -> bool {
    std::env::var("LOCK_FAULTS_X3_BACKENDS")
        .map_or(true, |names| names.split(',').any(|n| n.trim() == backend))
}

fn workload(target: String, keys: &[&str], duration: Duration, max_body: Duration) -> Workload {
    Workload {
        target,
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        lock: "library".into(),
        tasks: 4,
        duration,
        ttl: T,
        max_body,
        command_timeout: Some(COMMAND_TIMEOUT),
        long_body_percent: 0,
        replica_acks: None,
        wait: None,
        lease: None,
    }
}

/// The campaigns' load: short bodies, and 1% of bodies long enough to need
/// renewals, so that stalls cost locks and the lost path is exercised.
fn campaign_workload(target: String, length: Duration) -> Workload {
    Workload {
        long_body_percent: 1,
        replica_acks: None,
        wait: None,
        ..workload(target, &["x:a", "x:b", "x:c"], length, Duration::from_millis(20))
    }
}

fn slack_ms(analysis: &Analysis) -> serde_json::Value {
    let slack: Vec<Duration> = analysis
        .lost_slack_ns
        .iter()
        .map(|&ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
        .collect();
    spread_ms(slack)
}

/// A Redis node and the proxies the workers reach it through (one per
/// worker process, so that a link fault can hit one client).
struct Node {
    server: RedisServer,
    proxies: Vec<Proxy>,
}

impl Node {
    async fn start(workers: usize, extra: &[&str]) -> Node {
        let server = RedisServer::start_with(extra);
        let mut proxies = Vec::new();
        for _ in 0..workers {
            proxies.push(Proxy::start(server.port()).await);
        }
        Node { server, proxies }
    }
}

/// Applies `fault` (one of `witness::FAULTS`) to the nodes `chosen`, with
/// lengths drawn from `rng`, and returns once it is healed.
async fn inflict(fault: &str, nodes: &mut [Node], chosen: &[usize], rng: &mut StdRng) {
    let between = |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
    let stall = match fault {
        "server-sigstop" => Some((Stall::Stop, between(rng, 200, 3000))),
        "debug-sleep" => Some((Stall::DebugSleep, between(rng, 200, 3000))),
        "client-pause" if rng.random_bool(0.5) => Some((Stall::PauseWrite, between(rng, 200, 1000))),
        "client-pause" => Some((Stall::PauseAll, between(rng, 200, 1000))),
        _ => None,
    };
    if let Some((stall, length)) = stall {
        let servers: Vec<&RedisServer> = chosen.iter().map(|&i| &nodes[i].server).collect();
        stall.apply(&servers, length).await;
        return;
    }
    match fault {
        "proxy-delay" => {
            let delay = between(rng, 50, 400);
            chosen
                .iter()
                .for_each(|&i| nodes[i].proxies.iter().for_each(|p| p.delay(delay)));
            tokio::time::sleep(between(rng, 1000, 3000)).await;
            chosen
                .iter()
                .for_each(|&i| nodes[i].proxies.iter().for_each(Proxy::pass));
        }
        "proxy-blackhole" => {
            let worker = rng.random_range(0..nodes[0].proxies.len());
            chosen.iter().for_each(|&i| nodes[i].proxies[worker].blackhole());
            tokio::time::sleep(between(rng, 500, 3000)).await;
            chosen.iter().for_each(|&i| nodes[i].proxies[worker].pass());
        }
        "proxy-throttle" => {
            chosen
                .iter()
                .for_each(|&i| nodes[i].proxies.iter().for_each(|p| p.throttle(2000)));
            tokio::time::sleep(between(rng, 500, 2000)).await;
            chosen
                .iter()
                .for_each(|&i| nodes[i].proxies.iter().for_each(Proxy::pass));
        }
        "proxy-reset" => chosen
            .iter()
            .for_each(|&i| nodes[i].proxies.iter().for_each(Proxy::reset)),
        "client-kill" => {
            for &i in chosen {
                nodes[i]
                    .server
                    .query::<i64>(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal"));
            }
        }
        "script-flush" => {
            for &i in chosen {
                nodes[i].server.query::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
            }
        }
        "kill-restart-aof" => tokio::task::block_in_place(|| {
            chosen.iter().for_each(|&i| nodes[i].server.restart());
        }),
        "kill-restart-delayed" => {
            for &i in chosen {
                nodes[i].server.kill();
                nodes[i].server.wipe_data();
            }
            tokio::time::sleep(T + Duration::from_millis(200)).await;
            tokio::task::block_in_place(|| chosen.iter().for_each(|&i| nodes[i].server.revive()));
        }
        other => panic!("no such fault: {other}"),
    }
}

/// A campaign: one worker process per workload, and every 3–6 s a fault
/// from `mix` on up to `at_once` of `nodes`, every fault and heal logged.
/// Returns what the workers did and the worst lateness any process saw.
async fn campaign(
    board: &Board,
    nodes: &mut [Node],
    workloads: &[Workload],
    mix: &[&str],
    at_once: usize,
    seed: u64,
) -> (lab::Tally, Duration) {
    let mut rng = StdRng::seed_from_u64(seed);
    let controller = Monitor::start();
    let workers = Workers::spawn_each(board, workloads);
    let end = Instant::now() + campaign_length();
    while Instant::now() + Duration::from_secs(8) < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(3000..=6000))).await;
        let fault = mix[rng.random_range(0..mix.len())];
        let mut chosen: Vec<usize> = (0..nodes.len()).collect();
        let count = rng.random_range(1..=at_once.min(nodes.len()));
        while chosen.len() > count {
            chosen.swap_remove(rng.random_range(0..chosen.len()));
        }
        board.witness.fault(fault);
        inflict(fault, nodes, &chosen, &mut rng).await;
        board.witness.heal(fault);
    }
    let tally = tokio::task::block_in_place(|| workers.finish());
    let worst = tally.worst_late.max(controller.worst());
    (tally, worst)
}

/// Every fault the campaigns draw from, but `left_out`. Not drawn: the
/// faults of scenarios of their own (eviction, an empty restart, a
/// replicated master's kill, which needs replicas and a failover these
/// nodes do not have, and X3's deaths of a server or an ensemble member).
fn mix_without(left_out: &str) -> Vec<&'static str> {
    const OWN_SCENARIOS: [&str; 5] = [
        "eviction",
        "kill-restart-empty",
        "master-sigkill",
        "server-kill-restart",
        "member-kill-restart",
    ];
    FAULTS
        .iter()
        .copied()
        .filter(|f| *f != left_out && !OWN_SCENARIOS.contains(f))
        .collect()
}

/// Judges a campaign: no overlap, no token regression, and after every heal
/// some body entered within T + 1 s. A run whose monitor saw a process
/// starved beyond δ/2 and that shows a violation is INVALID, not failed.
fn judge(id: &str, scenario: &str, board: &Board, tally: &lab::Tally, worst: Duration, seed: u64) {
    let keys = ["x:a", "x:b", "x:c"];
    let logged = analyze(board.path(), &keys).expect("analyze");
    let online: u64 = keys.iter().map(|k| board.witness.seen(k).overlaps).sum();
    let stale_accepted: u64 = keys.iter().map(|k| board.witness.seen(k).stale_accepted).sum();
    let stale_rejected: u64 = keys.iter().map(|k| board.witness.seen(k).stale_rejected).sum();
    let worst_heal = logged.heal_to_entry_ns.iter().max().copied().unwrap_or(0);
    let violations = online + logged.overlaps.len() as u64 + logged.token_regressions + stale_accepted;
    let late = worst > monitor::bound(T);
    let verdict = match (violations, late) {
        (0, _) => "PASS",
        (_, true) => "INVALID",
        (_, false) => "FAIL",
    };
    let heals: Vec<Duration> = logged
        .heal_to_entry_ns
        .iter()
        .map(|&ns| Duration::from_nanos(ns))
        .collect();
    report::write(
        id,
        json!({
            "scenario": scenario,
            "verdict": verdict,
            "seed": seed,
            "parameters": {"seconds": campaign_length().as_secs(), "processes": 2, "tasks": 4, "keys": 3, "ttl_ms": T.as_millis(), "command_timeout_ms": COMMAND_TIMEOUT.as_millis(), "bodies": "99% up to 20 ms, 1% 0.5-2.5 s"},
            "acquisitions": logged.entries,
            "faults": logged.faults,
            "faults_by_kind": logged.faults_by_kind,
            "overlaps": online.max(logged.overlaps.len() as u64),
            "overlap_details": logged.overlaps.iter().take(5).map(|o| format!("{} {:?}", o.key, o.duration)).collect::<Vec<_>>(),
            "token_regressions": logged.token_regressions,
            "stale_writes_accepted": stale_accepted,
            "stale_writes_rejected": stale_rejected,
            "lost": tally.lost,
            "lost_slack_ms": slack_ms(&logged),
            "acquire_timeouts": tally.timeouts,
            "acquire_or_release_errors": tally.errors,
            "first_error": tally.first_error,
            "heal_to_entry_ms": spread_ms(heals),
            "heals_without_entry": logged.heals_without_entry,
            "unmatched_entries": logged.unmatched,
            "worst_lateness_ms": (worst.as_secs_f64() * 1e5).round() / 100.0,
            "key_figure": format!("{} faults, {} acquisitions, worst heal→entry {:.0} ms", logged.faults, logged.entries, worst_heal as f64 / 1e6),
        }),
    );
    assert_ne!(verdict, "FAIL", "{id}: {logged:?}");
    assert!(
        Duration::from_nanos(worst_heal) <= T + Duration::from_secs(1),
        "{id}: a heal was followed by no entry for {:?}",
        Duration::from_nanos(worst_heal)
    );
    assert_eq!(logged.unmatched, 0, "{id}: a body never left");
}

/// X1: one node behind a proxy per worker, fencing on; every 3–6 s a fault
/// that keeps the lock's assumptions (stalls, link faults, killed clients,
/// script flushes, kill -9 + restart with `appendfsync always`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn x1_assumption_preserving_campaign_on_one_node() {
    let seed = seed();
    let board = Board::new();
    let mut nodes = [Node::start(2, &["--appendonly", "yes", "--appendfsync", "always"]).await];
    // Each worker process reaches the server through a proxy of its own.
    let workloads: Vec<Workload> = nodes[0]
        .proxies
        .iter()
        .map(|p| campaign_workload(p.url(), campaign_length()))
        .collect();
    // A restart after T without data is X2's: one node has no majority to keep.
    let mix = mix_without("kill-restart-delayed");
    let (tally, worst) = campaign(&board, &mut nodes, &workloads, &mix, 1, seed).await;
    judge(
        "X1",
        "X1 campaign, one node, assumption-preserving faults",
        &board,
        &tally,
        worst,
        seed,
    );
}

/// X2: Redlock over 5 masters; the same mix on up to 2 masters at a time,
/// plus kill -9 with a restart delayed past the lease and no data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn x2_redlock_campaign_on_five_masters() {
    let seed = seed();
    let board = Board::new();
    let mut nodes = Vec::new();
    for _ in 0..5 {
        nodes.push(Node::start(1, &["--appendonly", "yes", "--appendfsync", "always"]).await);
    }
    // Both workers share each master's proxy: a link fault hits a master.
    let target = format!(
        "redlock={}",
        nodes
            .iter()
            .map(|n| n.proxies[0].url())
            .collect::<Vec<_>>()
            .join(",")
    );
    // Throttling stays in X1: on five masters it only slows the majority.
    let mix = mix_without("proxy-throttle");
    let workloads = vec![campaign_workload(target, campaign_length()); 2];
    let (tally, worst) = campaign(&board, &mut nodes, &workloads, &mix, 2, seed).await;
    judge(
        "X2",
        "X2 campaign, Redlock N=5, faults on up to 2 masters",
        &board,
        &tally,
        worst,
        seed,
    );
}

/// A death X3 inflicts: the server (or a member) SIGKILLed and started
/// again on its port and data, or stopped (SIGSTOP) past every lease.
#[derive(Clone, Copy)]
enum Death {
    KillRestart,
    Stop,
}

/// X3's load on one backend for `length`, with a death drawn from `rng`
/// every 4–8 s and inflicted by `inflict`; returns the backend's record and
/// panics on a failed call or, unless a process was starved, a violation.
async fn deaths_campaign(
    backend: &str,
    target: String,
    length: Duration,
    rng: &mut StdRng,
    mut inflict: impl FnMut(Death, &mut StdRng),
) -> serde_json::Value {
    let board = Board::new();
    // Many keys: a long body holds one of them for seconds, and the tasks
    // that pick it wait; on a few keys that would be most of them.
    let tasks = campaign_tasks();
    let keys: Vec<String> = (0..4 * tasks).map(|i| format!("x3:{i}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut load = workload(target, &key_refs, length, Duration::from_millis(1));
    load.tasks = tasks;
    load.long_body_percent = 1;
    load.command_timeout = None;
    // Longer than any restart or election here: a death costs time only.
    load.wait = Some(Duration::from_secs(20));
    let controller = Monitor::start();
    let workers = Workers::spawn(&board, &load, 2);
    let end = Instant::now() + length;
    while Instant::now() + Duration::from_secs(10) < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(4000..=8000))).await;
        let death = if rng.random_bool(0.5) {
            Death::KillRestart
        } else {
            Death::Stop
        };
        let fault = match (death, backend) {
            (Death::KillRestart, "zookeeper" | "etcd") => "member-kill-restart",
            (Death::KillRestart, _) => "server-kill-restart",
            (Death::Stop, _) => "server-sigstop",
        };
        board.witness.fault(fault);
        tokio::task::block_in_place(|| inflict(death, rng));
        board.witness.heal(fault);
    }
    let tally = tokio::task::block_in_place(|| workers.finish());
    let worst = tally.worst_late.max(controller.worst());
    let logged = analyze(board.path(), &key_refs).expect("analyze");
    let seen: Vec<_> = key_refs.iter().map(|k| board.witness.seen(k)).collect();
    let online: u64 = seen.iter().map(|s| s.overlaps).sum();
    let lost_updates: u64 = seen.iter().map(|s| s.lost_updates()).sum();
    let overlaps = online.max(logged.overlaps.len() as u64);
    let violations = overlaps + logged.token_regressions + lost_updates;
    let starved = worst > monitor::bound(T);
    let verdict = Verdict::judge(violations > 0, starved);
    let record = json!({
        "backend": backend,
        "verdict": verdict.as_str(),
        "starved": starved,
        "acquisitions": logged.entries,
        "faults": logged.faults,
        "faults_by_kind": logged.faults_by_kind,
        "overlaps": overlaps,
        "token_regressions": logged.token_regressions,
        "lost_updates": lost_updates,
        "lost": tally.lost,
        "timeouts": tally.timeouts,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "release_errors": tally.release_errors,
        "heals_without_entry": logged.heals_without_entry,
        "worst_lateness_ms": (worst.as_secs_f64() * 1e5).round() / 100.0,
    });
    // Each backend's record as soon as it is known: a later backend's
    // failure must not lose it. Judged together at the end.
    report::write(&format!("X3-{backend}"), record.clone());
    record
}

/// X3 (issue #31, item 5; #57, item 4): server deaths across backends
/// under the witness, one backend after another: Redis (one node,
/// `appendfsync always`), MariaDB, PostgreSQL, a 3-member ZooKeeper
/// ensemble and a 3-member etcd cluster, each for
/// `LOCK_FAULTS_CAMPAIGN_SECS`. Every 4–8 s the server (or, on ZooKeeper
/// and etcd, a member drawn at random) is SIGKILLed and restarted, or stopped past every
/// lease. 2 processes × `LOCK_FAULTS_CAMPAIGN_TASKS` tasks (8 unless set)
/// on four keys per task, bodies up to 1 ms (1% last
/// 0.5–2.5 s), fenced, 20 s waits: no overlap, no lost update, no token regression,
/// no failed call. `LOCK_FAULTS_X3_BACKENDS` picks some of the backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn x3_server_deaths_across_backends() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let length = campaign_length();
    let stop_past_the_lease = T + Duration::from_millis(500);
    let mut records = Vec::new();

    if x3_runs_on("redis") {
        let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
        let target = redis.url();
        records.push(
            deaths_campaign("redis", target, length, &mut rng, |death, _| match death {
                Death::KillRestart => redis.restart(),
                Death::Stop => {
                    redis.pause();
                    std::thread::sleep(stop_past_the_lease);
                    redis.resume();
                }
            })
            .await,
        );
        drop(redis);
    }

    if x3_runs_on("mariadb") {
        let mut mariadb = MariaDb::start();
        let target = mariadb.url();
        records.push(
            deaths_campaign("mariadb", target, length, &mut rng, |death, _| match death {
                Death::KillRestart => {
                    mariadb.kill();
                    mariadb.revive();
                }
                Death::Stop => {
                    mariadb.pause();
                    std::thread::sleep(stop_past_the_lease);
                    mariadb.resume();
                }
            })
            .await,
        );
        drop(mariadb);
    }

    if x3_runs_on("postgres") {
        let mut postgres = tokio::task::block_in_place(Postgres::start);
        let target = postgres.url();
        records.push(
            deaths_campaign("postgres", target, length, &mut rng, |death, _| match death {
                Death::KillRestart => {
                    postgres.kill();
                    postgres.revive();
                }
                Death::Stop => {
                    postgres.pause();
                    std::thread::sleep(stop_past_the_lease);
                    postgres.resume();
                }
            })
            .await,
        );
        drop(postgres);
    }

    if x3_runs_on("zookeeper") {
        let mut zk = tokio::task::block_in_place(ZooKeeper::ensemble);
        let target = zookeeper::target(&zk);
        records.push(
            deaths_campaign("zookeeper", target, length, &mut rng, |death, rng| {
                let member = rng.random_range(0..zk.len());
                match death {
                    Death::KillRestart => {
                        zk.kill(member);
                        zk.revive(member);
                    }
                    Death::Stop => {
                        zk.pause(member);
                        std::thread::sleep(stop_past_the_lease);
                        zk.resume(member);
                    }
                }
            })
            .await,
        );
        drop(zk);
    }

    if x3_runs_on("etcd") {
        let mut cluster = tokio::task::block_in_place(Etcd::cluster);
        let target = etcd::target(&cluster);
        records.push(
            deaths_campaign("etcd", target, length, &mut rng, |death, rng| {
                let member = rng.random_range(0..cluster.len());
                match death {
                    Death::KillRestart => {
                        cluster.kill(member);
                        cluster.revive(member);
                    }
                    Death::Stop => {
                        cluster.pause(member);
                        std::thread::sleep(stop_past_the_lease);
                        cluster.resume(member);
                    }
                }
            })
            .await,
        );
    }

    let failed: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["errors"].as_u64() != Some(0) || r["verdict"] == "FAIL")
        .collect();
    assert!(
        failed.is_empty(),
        "X3: calls failed through the deaths, or a violation: {failed:?}"
    );
    let total = |field: &str| {
        records
            .iter()
            .map(|r| r[field].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let verdict = if records.iter().any(|r| r["verdict"] == "INVALID") {
        "INVALID"
    } else {
        "PASS"
    };
    report::write(
        "X3",
        json!({
            "scenario": "X3 server deaths across backends: Redis, MariaDB, PostgreSQL, a ZooKeeper ensemble, an etcd cluster",
            "verdict": verdict,
            "seed": seed,
            "parameters": {"seconds_per_backend": length.as_secs(), "processes": 2, "tasks": campaign_tasks(), "keys": 4 * campaign_tasks(),
                "ttl_ms": T.as_millis(), "bodies": "99% up to 1 ms, 1% 0.5-2.5 s", "wait_ms": 20_000},
            "acquisitions": total("acquisitions"),
            "faults": total("faults"),
            "overlaps": total("overlaps"),
            "token_regressions": total("token_regressions"),
            "backends": records,
            "key_figure": format!(
                "{} acquisitions, {} deaths, 0 overlaps, 0 failed calls (per backend in the record)",
                total("acquisitions"),
                total("faults")
            ),
        }),
    );
}

/// S0 at full length: 60 s, two processes of four tasks on three keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn s0_long_baseline() {
    let server = RedisServer::start();
    let board = Board::new();
    let keys = ["s0:a", "s0:b", "s0:c"];
    let controller = Monitor::start();
    let mut load = workload(
        server.url(),
        &keys,
        Duration::from_secs(60),
        Duration::from_millis(2),
    );
    load.command_timeout = None;
    let tally = tokio::task::block_in_place(|| lab::run(&board, &load, 2));
    let logged = analyze(board.path(), &keys).expect("analyze");
    let lost_updates: u64 = keys
        .iter()
        .map(|k| {
            let s = board.witness.seen(k);
            s.lost_updates()
        })
        .sum();
    let worst = tally.worst_late.max(controller.worst());
    report::write(
        "S0L",
        json!({
            "scenario": "S0 baseline, 60 s",
            "verdict": if logged.overlaps.is_empty() && logged.token_regressions == 0 && lost_updates == 0 { "PASS" } else { "FAIL" },
            "acquisitions": logged.entries,
            "faults": 0,
            "overlaps": logged.overlaps.len(),
            "token_regressions": logged.token_regressions,
            "lost_updates": lost_updates,
            "lost": tally.lost,
            "worst_lateness_ms": (worst.as_secs_f64() * 1e5).round() / 100.0,
            "key_figure": format!("{} acquisitions in 60 s", logged.entries),
        }),
    );
    assert!(logged.overlaps.is_empty() && logged.token_regressions == 0 && lost_updates == 0);
    assert!(logged.entries >= 20_000, "{} acquisitions", logged.entries);
}

/// R1: Redlock baseline, N = 3 and N = 5, 30 s each: no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn r1_redlock_baseline() {
    let mut per_n = Vec::new();
    let mut total = 0;
    for n in [3usize, 5] {
        let masters = lock_tests::start_masters(n);
        let board = Board::new();
        let target = format!(
            "redlock={}",
            masters.iter().map(RedisServer::url).collect::<Vec<_>>().join(",")
        );
        let keys = ["r1:a", "r1:b", "r1:c"];
        let tally = tokio::task::block_in_place(|| {
            lab::run(
                &board,
                &workload(target, &keys, Duration::from_secs(30), Duration::from_millis(2)),
                2,
            )
        });
        let logged = analyze(board.path(), &keys).expect("analyze");
        let online: u64 = keys.iter().map(|k| board.witness.seen(k).overlaps).sum();
        assert_eq!((online, logged.overlaps.len()), (0, 0), "N={n}: {logged:?}");
        assert_eq!(tally.lost, 0, "N={n}: lost on healthy masters");
        total += logged.entries;
        per_n.push(json!({"n": n, "acquisitions": logged.entries, "overlaps": 0, "errors": tally.errors}));
    }
    report::write(
        "R1",
        json!({
            "scenario": "R1 Redlock baseline, N = 3 and 5, 30 s each",
            "verdict": "PASS",
            "acquisitions": total,
            "faults": 0,
            "overlaps": 0,
            "per_n": per_n,
            "key_figure": format!("{total} acquisitions, 0 overlaps"),
        }),
    );
}

/// Three masters; `a` reaches them through proxies, `b` directly.
struct Trio {
    masters: Vec<RedisServer>,
    proxies: Vec<Proxy>,
    a: LockClient,
    b: LockClient,
}

impl Trio {
    async fn start(extra: &[&str]) -> Trio {
        let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(extra)).collect();
        let mut proxies = Vec::new();
        for m in &masters {
            proxies.push(Proxy::start(m.port()).await);
        }
        let client = |urls: Vec<String>| async move {
            LockClient::builder()
                .command_timeout(COMMAND_TIMEOUT)
                .node_timeout(Duration::from_millis(50))
                .redlock(urls)
                .await
                .expect("redlock")
        };
        let a = client(proxies.iter().map(Proxy::url).collect()).await;
        let b = client(masters.iter().map(RedisServer::url).collect()).await;
        Trio {
            masters,
            proxies,
            a,
            b,
        }
    }
}

/// A holds `key` on masters 0 and 1 only (its link to master 2 is cut);
/// `fault` then takes its lock off master 1; B tries. Returns whether the
/// checker saw the two overlap.
async fn split_majority_trial(
    witness: &Witness,
    key: &str,
    extra: &[&str],
    fault: impl AsyncFnOnce(&mut Trio),
) -> bool {
    let mut trio = Trio::start(extra).await;
    trio.proxies[2].blackhole();
    let guard = trio.a.lock(key).ttl(T).acquire().await.expect("A holds 0 and 1");
    witness.enter(key, 1, 0);
    // A's body stops the moment it hears of the loss, as a careful user's would.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let body = {
        let (witness, key) = (witness.clone(), key.to_owned());
        tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = guard.lost() => witness.lost(&key, 1, 0, guard.valid_until().into_std()),
                _ = done_rx => witness.exit(&key, 1, 0),
            }
            drop(guard);
        })
    };
    fault(&mut trio).await;
    let _ = trio
        .b
        .lock(key)
        .wait(Duration::from_millis(500))
        .run(async {
            witness.enter(key, 2, 0);
            witness.exit(key, 2, 0);
        })
        .await;
    // A learns at its next renewal, at the latest at D.
    tokio::time::sleep(T / 2).await;
    let _ = done_tx.send(());
    body.await.expect("A's body");
    trio.proxies[2].pass();
    witness.seen(key).overlaps > 0
}

/// R5 (NEG) and its mitigations: a master holding the lock is restarted
/// empty at once (antirez's K5): the checker must catch the overlap. With a
/// restart delayed past the lease, or with `appendfsync always`, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn r5_a_master_restarted_empty_lets_a_second_holder_in() {
    let board = Board::new();
    let trials = 10;
    let mut results = serde_json::Map::new();
    for variant in ["immediate", "delayed", "aof"] {
        let extra: &[&str] = if variant == "aof" {
            &["--appendonly", "yes", "--appendfsync", "always"]
        } else {
            &[]
        };
        let mut overlapped = 0;
        for trial in 0..trials {
            let key = format!("r5:{variant}:{trial}");
            let hit = split_majority_trial(&board.witness, &key, extra, async |trio: &mut Trio| {
                trio.masters[1].kill();
                if variant == "delayed" {
                    trio.masters[1].wipe_data();
                    tokio::time::sleep(T + Duration::from_millis(200)).await;
                }
                tokio::task::block_in_place(|| trio.masters[1].revive());
            })
            .await;
            overlapped += u32::from(hit);
        }
        results.insert(
            variant.into(),
            json!({"trials": trials, "overlaps_caught": overlapped}),
        );
        if variant == "immediate" {
            assert!(
                overlapped * 100 >= trials * 95,
                "control caught in {overlapped}/{trials}"
            );
        } else {
            assert_eq!(overlapped, 0, "{variant}: overlaps with the mitigation");
        }
    }
    let logged = analyze(board.path(), &[]).expect("analyze");
    report::write(
        "R5",
        json!({
            "scenario": "R5 master restarted without persistence (NEG) / delayed / appendfsync always",
            "verdict": "PASS; control caught",
            "variants": results,
            "lost_slack_ms": slack_ms(&logged),
            "key_figure": format!("immediate: caught {}; delayed and AOF: 0 overlaps", results["immediate"]["overlaps_caught"]),
        }),
    );
}

/// R6 (NEG): a master's clock jumping forward, emulated by expiring the key
/// on it: a second holder gets in and the checker must catch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn r6_a_clock_jump_on_one_master_lets_a_second_holder_in() {
    let board = Board::new();
    let trials = 10;
    let mut overlapped = 0;
    for trial in 0..trials {
        let key = format!("r6:{trial}");
        let redis_key = format!("lock:{{{key}}}");
        let hit = split_majority_trial(&board.witness, &key, &[], async |trio: &mut Trio| {
            trio.masters[1].query::<i64>(redis::cmd("PEXPIRE").arg(&redis_key).arg(1));
            tokio::time::sleep(Duration::from_millis(5)).await;
        })
        .await;
        overlapped += u32::from(hit);
    }
    assert!(
        overlapped * 100 >= trials * 95,
        "control caught in {overlapped}/{trials}"
    );
    report::write(
        "R6",
        json!({
            "scenario": "R6 clock jump on one master (emulated by PEXPIRE 1), NEG",
            "verdict": "PASS; control caught",
            "trials": trials,
            "overlaps_caught": overlapped,
            "key_figure": format!("caught {overlapped}/{trials}"),
        }),
    );
}

/// R7: every link delayed past the lease during one acquisition: the call
/// never returns a lock it got too late, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn r7_a_slow_acquisition_is_not_a_success() {
    let trio = Trio::start(&[]).await;
    let ttl = Duration::from_millis(300);
    let mut false_successes = 0;
    let mut residue_ms = Vec::new();
    for trial in 0..5 {
        let key = format!("r7:{trial}");
        trio.proxies
            .iter()
            .for_each(|p| p.delay(ttl / 2 + Duration::from_millis(50)));
        let start = Instant::now();
        let outcome = trio.a.lock(key.as_str()).ttl(ttl).renew(false).acquire().await;
        if let Ok(guard) = outcome {
            if start.elapsed() >= ttl - ttl / 100 - Duration::from_millis(2) {
                false_successes += 1;
            }
            drop(guard);
        }
        trio.proxies.iter().for_each(Proxy::pass);
        let passed = Instant::now();
        let redis_key = format!("lock:{{{key}}}");
        let clean = eventually(Duration::from_secs(2), || {
            trio.masters
                .iter()
                .all(|m| m.query::<i64>(redis::cmd("EXISTS").arg(&redis_key)) == 0)
        })
        .await;
        assert!(clean.is_some(), "trial {trial}: residue left");
        residue_ms.push(passed.elapsed());
    }
    assert_eq!(false_successes, 0);
    report::write(
        "R7",
        json!({
            "scenario": "R7 slow acquisition (every link delayed past the lease)",
            "verdict": "PASS",
            "trials": 5,
            "false_successes": false_successes,
            "residue_cleared_after_heal_ms": spread_ms(residue_ms),
            "key_figure": "0 late successes, no residue",
        }),
    );
}

/// P1 (NEG): a write acknowledged by the master but never replicated; the
/// master dies and its replica is promoted: a second holder gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn p1_a_promoted_replica_that_missed_the_write_lets_a_second_holder_in() {
    let board = Board::new();
    let trials = 5;
    let mut overlapped = 0;
    for trial in 0..trials {
        let key = format!("p1:{trial}");
        let (mut master, link, replica) = lock_tests::sentinel::replica_behind_proxy().await;
        link.blackhole();
        let a = LockClient::connect(&master.url()).await.expect("connect");
        let guard = a.lock(key.as_str()).ttl(T).acquire().await.expect("acquire");
        board.witness.enter(&key, 1, 0);
        tokio::task::block_in_place(|| master.kill());
        replica.query::<()>(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
        let b = LockClient::connect(&replica.url()).await.expect("connect");
        let _ = b
            .lock(key.as_str())
            .wait(Duration::from_millis(500))
            .run(async {
                board.witness.enter(&key, 2, 0);
                board.witness.exit(&key, 2, 0);
            })
            .await;
        board.witness.exit(&key, 1, 0);
        drop(guard);
        overlapped += u32::from(board.witness.seen(&key).overlaps > 0);
    }
    assert_eq!(overlapped, trials, "the control must be caught every time");
    report::write(
        "P1",
        json!({
            "scenario": "P1 promoted replica missed the write (NEG)",
            "verdict": "PASS; control caught",
            "trials": trials,
            "overlaps_caught": overlapped,
            "mitigation": "replica_acks(n): scenario P1m (tier 1)",
            "key_figure": format!("caught {overlapped}/{trials}; mitigated by replica_acks, see P1m"),
        }),
    );
}

/// S3: a holder process paused for 0.6 s (less than the lease minus a
/// renewal interval) keeps its lock, and nobody gets in meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn s3_a_short_holder_pause_costs_nothing() {
    use nix::sys::signal::{Signal, kill};
    let server = RedisServer::start();
    let rival = LockClient::connect(&server.url()).await.expect("connect");
    let trials = 5;
    for trial in 0..trials {
        let key = format!("s3:{trial}");
        let holder = Holder::spawn(&server.url(), &key, T, true);
        tokio::time::sleep(Duration::from_millis(100 * trial)).await;
        kill(holder.pid(), Signal::SIGSTOP).expect("SIGSTOP");
        tokio::time::sleep(Duration::from_millis(600)).await;
        kill(holder.pid(), Signal::SIGCONT).expect("SIGCONT");
        let refused = rival
            .lock(key.as_str())
            .wait(Duration::from_millis(1500))
            .acquire()
            .await;
        assert!(
            refused.is_err(),
            "trial {trial}: a rival got in after a short pause"
        );
        let pttl: i64 = server.query(redis::cmd("PTTL").arg(format!("lock:{{{key}}}")));
        assert!(pttl > 0, "trial {trial}: the holder's lease lapsed");
        holder.kill();
    }
    report::write(
        "S3",
        json!({
            "scenario": "S3 holder process paused 0.6 s (lease 1.5 s)",
            "verdict": "PASS",
            "trials": trials,
            "lost": 0,
            "overlaps": 0,
            "key_figure": "0 lost, rival refused every time",
        }),
    );
}

/// S12: a foreign script keeps the server busy past the lease: the holder
/// is told before D, and the waiter sees a wait, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn s12_a_foreign_busy_script_is_a_stall() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "100"]);
    let board = Board::new();
    let url = server.url();
    let connect = || {
        LockClient::builder()
            .command_timeout(COMMAND_TIMEOUT)
            .connect(&url)
    };
    let (holder, rival) = (
        connect().await.expect("connect"),
        connect().await.expect("connect"),
    );
    let guard = holder.lock("s12").ttl(T).acquire().await.expect("acquire");
    board.witness.enter("s12", 1, 0);
    let mut conn = server.sync_connection().expect("admin");
    let busy = tokio::task::spawn_blocking(move || {
        redis::cmd("EVAL")
            .arg("local t0 = redis.call('TIME') local start = t0[1] * 1000 + t0[2] / 1000 while true do local t = redis.call('TIME') if t[1] * 1000 + t[2] / 1000 - start > 2000 then return 1 end end")
            .arg(0)
            .query::<i64>(&mut conn)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rival_run = {
        let witness = board.witness.clone();
        tokio::spawn(async move {
            rival
                .lock("s12")
                .wait(Duration::from_secs(5))
                .run(async {
                    witness.enter("s12", 2, 0);
                    witness.exit("s12", 2, 0);
                })
                .await
        })
    };
    tokio::time::timeout(T * 2, guard.lost())
        .await
        .expect("the holder is told its lock could not be kept");
    board.witness.lost("s12", 1, 0, guard.valid_until().into_std());
    busy.await.expect("join").expect("the script ran");
    let rival_outcome = rival_run.await.expect("join");
    assert!(
        rival_outcome.is_ok(),
        "BUSY is a wait, not an error: {rival_outcome:?}"
    );
    let logged = analyze(board.path(), &[]).expect("analyze");
    assert!(logged.overlaps.is_empty(), "{logged:?}");
    assert!(logged.lost_slack_ns.iter().all(|&ns| ns >= 0), "{logged:?}");
    report::write(
        "S12",
        json!({
            "scenario": "S12 foreign 2 s script (busy-reply-threshold 100)",
            "verdict": "PASS",
            "acquisitions": logged.entries,
            "faults": 1,
            "overlaps": 0,
            "lost_slack_ms": slack_ms(&logged),
            "key_figure": "holder told before D; waiter got the lock after the script",
        }),
    );
}

/// S13: with active expiry off, a dead holder's lock frees by lazy expiry
/// alone, within the S1 bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2: LOCK_FAULTS_TIER2=1 .ci/run"]
async fn s13_lazy_expiry_alone_frees_a_dead_holders_lock() {
    let server = RedisServer::start();
    server.query::<()>(redis::cmd("DEBUG").arg("SET-ACTIVE-EXPIRE").arg(0));
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let ttl = Duration::from_millis(600);
    let mut unavailable = Vec::new();
    for trial in 0..5 {
        let key = format!("s13:{trial}");
        unavailable.push(
            lab::unavailable_after_holder_killed(&server.url(), &locks, &key, ttl, Duration::ZERO).await,
        );
    }
    let max = *unavailable.iter().max().expect("trials");
    assert!(max <= ttl + Duration::from_millis(250), "{max:?}");
    report::write(
        "S13",
        json!({
            "scenario": "S13 active expiry off, holder SIGKILLed",
            "verdict": "PASS",
            "faults": 5,
            "unavail_ms": spread_ms(unavailable),
            "key_figure": format!("unavailable at most {:.0} ms (ttl {} ms)", max.as_secs_f64() * 1e3, ttl.as_millis()),
        }),
    );
}
