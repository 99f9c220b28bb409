//! Lock kinds under faults: the S0 shape (two processes of four tasks, here
//! on six keys) with read-write locks (S0rw), with permits (S0p) and with
//! two-key transfers (S0t), on Redis and on MariaDB (S0rwmy, S0pmy, S0tmy),
//! while the server is stopped (SIGSTOP) past every lease three times. The
//! long bodies (one in a hundred lasts 0.5–2.5 s) lose their leases mid-body
//! and must stop before their deadline. The checker's board is told each
//! body's share: no writer beside anyone, no
//! reader beside a writer, never more than N permit holders, no key of a
//! transfer held by another body. Each run comes
//! after its control, a lock that lies to the checker, was caught.
//! S0f and S0fmy judge fair locks' order: a caller in line before another
//! arrived gets the lock before it, away from the fault.

use super::*;
use lock_tests::lab::Workers;
use lock_tests::report::Verdict;
use lock_tests::{MariaDb, Postgres};

/// The server a kind's scenario runs on.
#[derive(Clone, Copy)]
enum On {
    Redis,
    Mariadb,
    Postgres,
}

/// A started server of either backend, stopped the same way.
enum Started {
    Redis(RedisServer),
    Mariadb(MariaDb),
    Postgres(Postgres),
}

impl Started {
    fn start(on: On) -> Self {
        match on {
            On::Redis => Started::Redis(RedisServer::start()),
            On::Mariadb => Started::Mariadb(MariaDb::start()),
            On::Postgres => Started::Postgres(Postgres::start()),
        }
    }

    fn target(&self) -> String {
        match self {
            Started::Redis(server) => server.url(),
            Started::Mariadb(server) => server.url(),
            Started::Postgres(server) => server.url(),
        }
    }

    /// Stops the server (SIGSTOP) for `how_long`, then resumes it.
    async fn stop_for(&self, how_long: Duration) {
        match self {
            Started::Redis(server) => Stall::Stop.apply(&[server], how_long).await,
            Started::Mariadb(server) => stop_for(server, how_long).await,
            Started::Postgres(server) => stop_for(server, how_long).await,
        }
    }
}

/// What one kind's scenario runs, and the control that must be caught.
struct KindScenario {
    id: &'static str,
    on: On,
    name: &'static str,
    lock: &'static str,
    control: &'static str,
    /// The control lies only when a lease runs out under a body: it runs
    /// on fixed leases shorter than its bodies.
    control_outlives_leases: bool,
}

/// On two keys, eight tasks with bodies up to twice a fixed 1 s lease, for
/// 4 s: about half the bodies outlive their lease.
fn outliving_workload(url: &str, keys: &[&str], lock: &str) -> Workload {
    let mut workload = broken_or_library(url, keys, lock, Duration::from_secs(4));
    workload.ttl = Duration::from_secs(1);
    workload.max_body = Duration::from_secs(2);
    workload
}

/// The control: on two keys, eight tasks with bodies of up to 20 ms, so
/// that the lie shows within the run (or bodies that outlive their leases,
/// for a control that lies only then).
fn control_is_caught(server: &RedisServer, control: &str, outlives_leases: bool) -> u32 {
    let trials = 3;
    let keys = ["control:a", "control:b"];
    let mut caught = 0;
    for _ in 0..trials {
        let board = Board::new();
        let workload = if outlives_leases {
            outliving_workload(&server.url(), &keys, control)
        } else {
            let mut workload = broken_or_library(&server.url(), &keys, control, Duration::from_millis(1500));
            workload.max_body = Duration::from_millis(20);
            workload
        };
        lab::run(&board, &workload, 2);
        if keys.iter().any(|k| board.witness.seen(k).overlaps > 0) {
            caught += 1;
        }
    }
    assert_eq!(caught, trials, "the checker missed the `{control}` control");
    caught
}

async fn run_kind_scenario(scenario: KindScenario) {
    let started = Instant::now();
    // The controls are broken locks written with Redis commands: they are
    // proven on a Redis server whatever the scenario's backend.
    let caught = {
        let redis = RedisServer::start();
        tokio::task::block_in_place(|| {
            control_is_caught(&redis, scenario.control, scenario.control_outlives_leases)
        })
    };
    let server = Started::start(scenario.on);
    // Six keys, not S0's three: a long body stalls every task that picks
    // its key (a transfer holds two), and with three keys that was most of
    // them, so the traffic fell as low as 92 bodies in a run.
    let keys = ["k:a", "k:b", "k:c", "k:d", "k:e", "k:f"];
    let stop = T + Duration::from_millis(500);
    let bound = monitor::bound(T);
    let mut invalid_runs = 0;
    for attempt in 1..=3 {
        let board = Board::new();
        let controller = Monitor::start();
        let mut workload = broken_or_library(&server.target(), &keys, scenario.lock, Duration::from_secs(12));
        workload.max_body = Duration::from_millis(5);
        // Some bodies outlast a stop, so that leases are lost mid-body.
        workload.long_body_percent = 1;
        let workers = Workers::spawn(&board, &workload, 2);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            board.witness.fault(Stall::Stop.fault());
            server.stop_for(stop).await;
            board.witness.heal(Stall::Stop.fault());
        }
        let tally = tokio::task::block_in_place(|| workers.finish());
        let worst_late = tally.worst_late.max(controller.worst());
        let seen: Vec<_> = checked_keys(&keys, scenario.lock)
            .iter()
            .map(|k| board.witness.seen(k))
            .collect();
        let entries: u64 = seen.iter().map(|s| s.entries).sum();
        let overlaps: u64 = seen.iter().map(|s| s.overlaps).sum();
        let starved = worst_late > bound;
        // A long body stalls every task that picks its key (a waiting
        // writer holds new readers back), so traffic swings from run to
        // run; a few hundred bodies across three stops still mean
        // something, and fewer in a starved run are re-run.
        let thin = entries <= 200;
        let verdict = Verdict::judge(overlaps > 0 || (thin && starved), starved);
        match verdict {
            Verdict::Fail => panic!("{}: {overlaps} overlaps: {seen:?}", scenario.id),
            Verdict::Invalid => {
                invalid_runs += 1;
                eprintln!(
                    "{} run {attempt} INVALID: a process was {worst_late:?} late (bound {bound:?}); {overlaps} overlaps, {entries} bodies not counted",
                    scenario.id
                );
                if attempt < 3 {
                    continue;
                }
            }
            Verdict::Pass => assert!(!thin, "too little traffic to mean anything: {tally:?}"),
        }
        report::write(
            scenario.id,
            json!({
                "scenario": scenario.name,
                "verdict": verdict.as_str(),
                "starved": starved,
                "parameters": {"processes": 2, "tasks": 4, "keys": 6, "seconds": 12, "ttl_ms": T.as_millis(),
                    "max_body_ms": 5, "long_body_percent": 1, "lock": scenario.lock, "server_stops": 3, "stop_ms": stop.as_millis()},
                "acquisitions": entries,
                "faults": 3,
                "overlaps": overlaps,
                "lost": tally.lost,
                "timeouts": tally.timeouts,
                "errors": tally.errors,
                "invalid_runs": invalid_runs,
                "worst_lateness_ms": (worst_late.as_secs_f64() * 1e5).round() / 100.0,
                "controls": [{"control": scenario.control, "caught": caught, "trials": caught}],
                "key_figure": format!("{entries} acquisitions through 3 server stops, 0 overlaps; control caught {caught}/{caught}"),
                "seconds": started.elapsed().as_secs_f64(),
            }),
        );
        return;
    }
}

/// S0rw: one writer in four, the rest readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0rw_no_writer_beside_anyone_through_server_stops() {
    scenario("s0rw_no_writer_beside_anyone_through_server_stops", async move {
        run_kind_scenario(KindScenario {
            id: "S0rw",
            on: On::Redis,
            name: "S0 with read-write locks, server stopped past the leases",
            lock: "library-rw",
            control: "library-rw-writers-read",
            control_outlives_leases: false,
        })
        .await;
    })
    .await
}

/// S0t: transfers, two of the three keys at once with `lock_all`; the
/// board checks each key's occupancy, so a body that held only one of its
/// keys shows as an overlap on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0t_transfers_hold_both_keys_through_server_stops() {
    scenario("s0t_transfers_hold_both_keys_through_server_stops", async move {
        run_kind_scenario(KindScenario {
            id: "S0t",
            on: On::Redis,
            name: "S0 with two-key transfers (lock_all), server stopped past the leases",
            lock: "library-transfer",
            control: "library-transfer-first-only",
            control_outlives_leases: false,
        })
        .await;
    })
    .await
}

/// S0p: two permits per key, for eight tasks over three keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0p_never_more_than_n_permit_holders_through_server_stops() {
    scenario(
        "s0p_never_more_than_n_permit_holders_through_server_stops",
        async move {
            run_kind_scenario(KindScenario {
                id: "S0p",
                on: On::Redis,
                name: "S0 with 2 permits per key, server stopped past the leases",
                lock: "library-permits-2",
                control: "library-permits-3-checked-2",
                control_outlives_leases: false,
            })
            .await;
        },
    )
    .await
}

/// S0s: any free one of two segments per key, each segment checked as its
/// own exclusive lock. The control reports each body as holding the
/// unsplit key, where two segments' holders overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0s_one_holder_per_segment_through_server_stops() {
    scenario("s0s_one_holder_per_segment_through_server_stops", async move {
        run_kind_scenario(KindScenario {
            id: "S0s",
            on: On::Redis,
            name: "S0 with 2 segments per key, server stopped past the leases",
            lock: "library-segments-2",
            control: "library-segments-2-unsplit",
            control_outlives_leases: false,
        })
        .await;
    })
    .await
}

/// S0smy: S0s on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0smy_one_holder_per_segment_on_mariadb_through_server_stops() {
    scenario(
        "s0smy_one_holder_per_segment_on_mariadb_through_server_stops",
        async move {
            run_kind_scenario(KindScenario {
                id: "S0smy",
                on: On::Mariadb,
                name: "S0 with 2 segments per key on MariaDB, server stopped past the leases",
                lock: "library-segments-2",
                control: "library-segments-2-unsplit",
                control_outlives_leases: false,
            })
            .await;
        },
    )
    .await
}

/// S0rwmy: S0rw on MariaDB (the members table, admission under the gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0rwmy_no_writer_beside_anyone_on_mariadb_through_server_stops() {
    scenario(
        "s0rwmy_no_writer_beside_anyone_on_mariadb_through_server_stops",
        async move {
            run_kind_scenario(KindScenario {
                id: "S0rwmy",
                on: On::Mariadb,
                name: "S0 with read-write locks on MariaDB, server stopped past the leases",
                lock: "library-rw",
                control: "library-rw-writers-read",
                control_outlives_leases: false,
            })
            .await;
        },
    )
    .await
}

/// S0pmy: S0p on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0pmy_never_more_than_n_permit_holders_on_mariadb_through_server_stops() {
    scenario(
        "s0pmy_never_more_than_n_permit_holders_on_mariadb_through_server_stops",
        async move {
            run_kind_scenario(KindScenario {
                id: "S0pmy",
                on: On::Mariadb,
                name: "S0 with 2 permits per key on MariaDB, server stopped past the leases",
                lock: "library-permits-2",
                control: "library-permits-3-checked-2",
                control_outlives_leases: false,
            })
            .await;
        },
    )
    .await
}

/// S0run: S0's shape with every body run by `run()` rather than watched
/// through a guard: the long bodies lose their renewed leases in the server
/// stops, and the runner alone must drop them before their deadlines. Its
/// control runs each body's work in a task the runner cannot stop (as a
/// runner that ignored the lost lease would) and must be caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0run_run_bodies_are_dropped_when_their_lease_is_lost() {
    scenario(
        "s0run_run_bodies_are_dropped_when_their_lease_is_lost",
        async move {
            run_kind_scenario(KindScenario {
                id: "S0run",
                on: On::Redis,
                name: "S0 with run() bodies, server stopped past the leases",
                lock: "library-run",
                control: "library-run-detached",
                control_outlives_leases: true,
            })
            .await;
        },
    )
    .await
}

/// S0run's control, honest: the same bodies outliving the same fixed
/// leases, run by `run()`, are dropped before each deadline, so the
/// checker sees no overlap; and some bodies did outlive their lease, or
/// the run proved nothing. A run with a starved process is re-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_bodies_that_outlive_a_fixed_lease_are_dropped_in_time() {
    scenario(
        "run_bodies_that_outlive_a_fixed_lease_are_dropped_in_time",
        async move {
            let server = RedisServer::start();
            let keys = ["fixed:a", "fixed:b"];
            let workload = outliving_workload(&server.url(), &keys, "library-run-fixed");
            let bound = monitor::bound(workload.ttl);
            for attempt in 1..=3 {
                let board = Board::new();
                let controller = Monitor::start();
                let tally = tokio::task::block_in_place(|| lab::run(&board, &workload, 2));
                let worst_late = tally.worst_late.max(controller.worst());
                let overlaps: u64 = keys.iter().map(|k| board.witness.seen(k).overlaps).sum();
                match Verdict::judge(overlaps > 0, worst_late > bound) {
                    Verdict::Fail => panic!("a run() body went on past its lease: {tally:?}"),
                    Verdict::Invalid if attempt < 3 => {
                        eprintln!(
                            "run {attempt} INVALID: a process was {worst_late:?} late (bound {bound:?})"
                        );
                        continue;
                    }
                    // Starved in every run: nothing was judged, which is
                    // not a pass.
                    Verdict::Invalid => panic!(
                        "INVALID in 3 runs: a process was {worst_late:?} late (bound {bound:?}), so nothing was judged"
                    ),
                    Verdict::Pass => {}
                }
                assert!(
                    tally.lost > 0,
                    "no body outlived its lease, so nothing was tested: {tally:?}"
                );
                return;
            }
        },
    )
    .await
}

/// The order check's control: the exclusive lock logged as fair, on two
/// keys, eight tasks, bodies up to 20 ms. A newcomer's first try can land
/// between a release and the waiters' next tries, ahead of them; the check
/// must see it in every trial. Returns the trials caught and the fewest
/// pairs out of order in one.
fn fair_control_is_caught(server: &RedisServer) -> (u32, u64) {
    let trials = 3;
    let keys = ["control:a", "control:b"];
    let (mut caught, mut fewest) = (0, u64::MAX);
    for _ in 0..trials {
        let board = Board::new();
        let mut workload = broken_or_library(
            &server.url(),
            &keys,
            "library-fair-barging",
            Duration::from_millis(1500),
        );
        workload.max_body = Duration::from_millis(20);
        lab::run(&board, &workload, 2);
        let out_of_order = analyze(board.path(), &keys).expect("analyze").fair_out_of_order;
        fewest = fewest.min(out_of_order);
        if out_of_order > 0 {
            caught += 1;
        }
    }
    assert_eq!(
        caught, trials,
        "the order check missed the `library-fair-barging` control"
    );
    (caught, fewest)
}

/// Fair locks on two keys, two processes of four tasks, fenced, for 12 s,
/// the server stopped past every lease once, at 4 s. The checker wants no
/// overlap, no token going back, and no caller let in ahead of one that
/// was in line before it arrived; order is judged before the stop and
/// after its grace (`witness::analyze`), and must have been judged.
async fn run_fair_scenario(id: &'static str, on: On, name: &'static str) {
    let started = Instant::now();
    let (caught, fewest) = {
        let redis = RedisServer::start();
        tokio::task::block_in_place(|| fair_control_is_caught(&redis))
    };
    let server = Started::start(on);
    let keys = ["f:a", "f:b"];
    let stop = T + Duration::from_millis(500);
    let bound = monitor::bound(T);
    let mut invalid_runs = 0;
    for attempt in 1..=3 {
        let board = Board::new();
        let controller = Monitor::start();
        let mut workload =
            broken_or_library(&server.target(), &keys, "library-fair", Duration::from_secs(12));
        workload.max_body = Duration::from_millis(5);
        let workers = Workers::spawn(&board, &workload, 2);
        tokio::time::sleep(Duration::from_secs(4)).await;
        board.witness.fault(Stall::Stop.fault());
        server.stop_for(stop).await;
        board.witness.heal(Stall::Stop.fault());
        let tally = tokio::task::block_in_place(|| workers.finish());
        let worst_late = tally.worst_late.max(controller.worst());
        let logged = analyze(board.path(), &keys).expect("analyze");
        let online: u64 = keys.iter().map(|k| board.witness.seen(k).overlaps).sum();
        let overlaps = online.max(logged.overlaps.len() as u64);
        let violations = overlaps + logged.token_regressions + logged.fair_out_of_order;
        let starved = worst_late > bound;
        let verdict = Verdict::judge(violations > 0, starved);
        match verdict {
            Verdict::Fail => panic!(
                "{id}: {overlaps} overlaps, {} token regressions, {} of {} waiting pairs out of order: {logged:?}",
                logged.token_regressions, logged.fair_out_of_order, logged.fair_pairs
            ),
            Verdict::Invalid => {
                invalid_runs += 1;
                eprintln!(
                    "{id} run {attempt} INVALID: a process was {worst_late:?} late (bound {bound:?}); {violations} violations not counted"
                );
                if attempt < 3 {
                    continue;
                }
            }
            Verdict::Pass => assert!(
                logged.fair_pairs > 0,
                "no waiting pairs judged, so the order was not tested: {tally:?}"
            ),
        }
        report::write(
            id,
            json!({
                "scenario": name,
                "verdict": verdict.as_str(),
                "starved": starved,
                "parameters": {"processes": 2, "tasks": 4, "keys": 2, "seconds": 12, "ttl_ms": T.as_millis(),
                    "max_body_ms": 5, "lock": "library-fair", "server_stops": 1, "stop_ms": stop.as_millis()},
                "acquisitions": logged.entries,
                "faults": 1,
                "overlaps": overlaps,
                "token_regressions": logged.token_regressions,
                "fair_pairs_judged": logged.fair_pairs,
                "fair_out_of_order": logged.fair_out_of_order,
                "lost": tally.lost,
                "timeouts": tally.timeouts,
                "errors": tally.errors,
                "invalid_runs": invalid_runs,
                "worst_lateness_ms": (worst_late.as_secs_f64() * 1e5).round() / 100.0,
                "controls": [{"control": "library-fair-barging", "caught": caught, "trials": caught,
                    "fewest_out_of_order": fewest}],
                "key_figure": format!(
                    "{} acquisitions through a server stop, 0 overlaps, {} waiting pairs all granted in arrival order; control caught {caught}/{caught}",
                    logged.entries, logged.fair_pairs
                ),
                "seconds": started.elapsed().as_secs_f64(),
            }),
        );
        return;
    }
}

/// S0f: fair locks on Redis (the line a sorted set beside the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0f_fair_locks_grant_in_arrival_order_through_a_server_stop() {
    scenario(
        "s0f_fair_locks_grant_in_arrival_order_through_a_server_stop",
        run_fair_scenario(
            "S0f",
            On::Redis,
            "S0 with fair locks, order judged, server stopped past the leases",
        ),
    )
    .await
}

/// S0fmy: S0f on MariaDB (the line rows of the members table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0fmy_fair_locks_grant_in_arrival_order_on_mariadb_through_a_server_stop() {
    scenario(
        "s0fmy_fair_locks_grant_in_arrival_order_on_mariadb_through_a_server_stop",
        run_fair_scenario(
            "S0fmy",
            On::Mariadb,
            "S0 with fair locks on MariaDB, order judged, server stopped past the leases",
        ),
    )
    .await
}

/// S0rwpg: S0rw on PostgreSQL (the members table, admission under the
/// gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0rwpg_no_writer_beside_anyone_on_postgres_through_server_stops() {
    scenario(
        "s0rwpg_no_writer_beside_anyone_on_postgres_through_server_stops",
        async move {
            run_kind_scenario(KindScenario {
                id: "S0rwpg",
                on: On::Postgres,
                name: "S0 with read-write locks on PostgreSQL, server stopped past the leases",
                lock: "library-rw",
                control: "library-rw-writers-read",
                control_outlives_leases: false,
            })
            .await;
        },
    )
    .await
}

/// S0ppg: S0p on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0ppg_never_more_than_n_permit_holders_on_postgres_through_server_stops() {
    scenario(
        "s0ppg_never_more_than_n_permit_holders_on_postgres_through_server_stops",
        async move {
            run_kind_scenario(KindScenario {
                id: "S0ppg",
                on: On::Postgres,
                name: "S0 with 2 permits per key on PostgreSQL, server stopped past the leases",
                lock: "library-permits-2",
                control: "library-permits-3-checked-2",
                control_outlives_leases: false,
            })
            .await;
        },
    )
    .await
}

/// S0fpg: S0f on PostgreSQL (the line rows of the members table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0fpg_fair_locks_grant_in_arrival_order_on_postgres_through_a_server_stop() {
    scenario(
        "s0fpg_fair_locks_grant_in_arrival_order_on_postgres_through_a_server_stop",
        run_fair_scenario(
            "S0fpg",
            On::Postgres,
            "S0 with fair locks on PostgreSQL, order judged, server stopped past the leases",
        ),
    )
    .await
}
