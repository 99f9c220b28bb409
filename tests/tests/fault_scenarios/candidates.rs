//! Leader elections when the candidates fail (#56 item 5): three worker
//! processes of two candidates each campaign in one election through
//! `Election::run`, each process through a proxy of its own, while the
//! controller strikes whichever process leads: SIGKILLed (and replaced),
//! stopped (SIGSTOP) inside its term past its lease, and cut off (its proxy
//! blackholed) inside a term that works on until it is lost; on Redis, which runs with `appendfsync
//! always`, the server is also killed and restarted. Through Sentinel (SCs)
//! and on a Cluster (SCc) the leader is killed and stopped but not cut off
//! (the client reaches the master the sentinels or the cluster name, past
//! any proxy of this harness), and then the master is killed and a replica
//! promoted, the candidates asking for `replica_acks(1)`. The checker asks:
//! - no two terms overlap. A term lost while its process was stopped ends
//!   at its validity deadline (a stopped process cannot be told anything:
//!   `witness::analyze_with_pauses`); every other term ends when its
//!   leader was told;
//! - epochs rise in the order terms began (the epoch is the term's token);
//! - the stopped leader, continued, writes with its epoch: the fenced
//!   register refuses it and the unfenced one takes it (the control);
//! - the cut-off leader, whose term works on until it is lost, is told
//!   before its deadline;
//! - after each fault to a candidate, a term of another process begins
//!   within the backend's lease + 1 s; after the server's restart, the
//!   store names a leader within the same bound.
//!
//! A run that breaks one of these while a process (this one, a worker or
//! the server) was starved is INVALID and runs again, three runs at most.
//! The control for a leader not told its term ended is SEctl.

use std::collections::HashMap;

use super::deaths::CALL_WAIT;
use super::*;
use lock_runtime::Election;
use lock_tests::lab::{TermRequest, Workers, term_request, unfenced_register};
use lock_tests::witness::{Kind, Pause, analyze_with_pauses, key_id, now_ns, read_logs};
use lock_tests::{Etcd, MariaDb, Postgres, ZooKeeper, etcd, zookeeper};

/// The one election.
const ELECTION: &str = "sc:a";

/// Worker processes, each with two candidates and a proxy of its own.
const PROCESSES: usize = 3;

/// Load before each fault and after the last.
const SPACING: Duration = Duration::from_secs(1);

/// One backend's scenario.
struct Candidates {
    id: &'static str,
    name: &'static str,
    /// The backend, in `lock-worker`'s notation, reached directly.
    target: String,
    /// How long a leader's claim outlives it on this backend: the
    /// election's ttl on Redis and SQL, the session on ZooKeeper, the
    /// lease on etcd.
    lease: Duration,
    /// The session or etcd lease the candidates ask for, where the backend
    /// has one.
    backend_lease: Option<Duration>,
    /// Whether the workers can be reached through proxies of this harness
    /// (not through Sentinel or on a Cluster, whose clients connect to the
    /// addresses the servers name): the cut needs them.
    proxied: bool,
}

/// What the controller does to the leader's process, or to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Pause,
    Cut,
    ServerRestart,
    /// The master killed and a replica promoted (Sentinel, Cluster).
    Failover,
}

impl Fault {
    /// The witness log's name for it.
    fn logged_as(self) -> &'static str {
        match self {
            Fault::Kill => "client-kill",
            Fault::Pause => "client-pause",
            Fault::Cut => "proxy-blackhole",
            Fault::ServerRestart => "kill-restart-aof",
            Fault::Failover => "master-sigkill",
        }
    }
}

/// A fault as it happened: to which process, and when it began (raw
/// monotonic clock).
#[derive(Debug)]
struct Struck {
    fault: Fault,
    process: Option<u32>,
    began: u64,
    /// The server's restart only: how long after it the store named a
    /// leader.
    named_after: Option<Duration>,
}

/// The process whose candidate the store names leader, polled until it
/// names one of `running` (its value is `<pid>:<task>`; a killed leader is
/// named until its lease ends).
async fn leading_process(election: &Election, within: Duration, running: &[u32]) -> Option<u32> {
    let until = Instant::now() + within;
    loop {
        if let Ok(Some(leader)) = election.leader().await
            && let Some(pid) = leader.value.split(':').next().and_then(|p| p.parse().ok())
            && (running.is_empty() || running.contains(&pid))
        {
            return Some(pid);
        }
        if Instant::now() >= until {
            return None;
        }
        // A poll of the store, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most `within`) until a term after the one that wrote last
/// has written its epoch: a successor of the leader struck now. Read at
/// the strike, not before the request that chose the term: the request
/// may be taken by a later term of the same process (a cut healed at once
/// when its term's own epoch counted as the successor's).
async fn successor_writes(witness: &lock_tests::witness::Witness, within: Duration) {
    let struck = witness.register_max(ELECTION);
    let _ = eventually(within, || witness.register_max(ELECTION) > struck).await;
}

fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") T "))
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid"));
    nix::sys::signal::kill(pid, signal).expect("signal the worker");
}

/// Runs `c`; `server_fault` (a restart, or a failover) strikes the
/// server after the candidates' faults.
async fn run_candidates(c: Candidates, mut server_fault: Option<(Fault, &mut (dyn FnMut() + Send))>) {
    let started = Instant::now();
    let bound = c.lease + Duration::from_secs(1);
    let observer = lab::connect(&c.target, LockClient::builder())
        .await
        .expect("connect the controller");
    let election = observer.election(ELECTION);
    let mut faults = vec![Fault::Kill, Fault::Pause];
    if c.proxied {
        faults.push(Fault::Cut);
    }
    if let Some((fault, _)) = &server_fault {
        faults.push(*fault);
    }
    for attempt in 1..=3 {
        let board = Board::new();
        let watch = Watch::start();
        let children = Monitor::start();
        let mut proxies = Vec::new();
        if c.proxied {
            for _ in 0..PROCESSES {
                proxies.push(Proxy::start(lab::port_of(&c.target)).await);
            }
        }
        let targets: Vec<String> = if c.proxied {
            proxies
                .iter()
                .map(|p| lab::through(&c.target, p.port()))
                .collect()
        } else {
            vec![c.target.clone(); PROCESSES]
        };
        let workloads: Vec<Workload> = targets
            .iter()
            .map(|target| {
                let mut w =
                    broken_or_library(target, &[ELECTION], "library-election", Duration::from_secs(120));
                w.tasks = 2;
                w.max_body = Duration::from_millis(5);
                w.long_body_percent = 10;
                w.wait = Some(CALL_WAIT);
                w.lease = c.backend_lease;
                // A failover must not lose a term's grant (P1's control).
                if !c.proxied {
                    w.replica_acks = Some(1);
                }
                w
            })
            .collect();
        let mut workers = Workers::spawn_each(&board, &workloads);
        // The proxy each worker goes through.
        let mut link: HashMap<u32, usize> = workers
            .pids()
            .iter()
            .enumerate()
            .map(|(i, pid)| (u32::try_from(pid.as_raw()).expect("pid"), i))
            .collect();
        let mut struck = Vec::new();
        let mut pauses = Vec::new();
        for &fault in &faults {
            tokio::time::sleep(SPACING).await;
            let process = match fault {
                Fault::ServerRestart | Fault::Failover => None,
                _ => {
                    let running: Vec<u32> = link.keys().copied().collect();
                    Some(
                        leading_process(&election, Duration::from_secs(10), &running)
                            .await
                            .expect("a running leader before the fault"),
                    )
                }
            };
            let (began, named_after) = match (fault, process) {
                (Fault::Kill, Some(pid)) => {
                    board.witness.fault(fault.logged_as());
                    let began = now_ns();
                    workers.kill(nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")));
                    let proxy = link.remove(&pid).expect("a worker of this run");
                    let replacement = workers.add(&board, &workloads[proxy]);
                    link.insert(u32::try_from(replacement.as_raw()).expect("pid"), proxy);
                    board.witness.heal(fault.logged_as());
                    (began, None)
                }
                (Fault::Pause, Some(pid)) => {
                    std::fs::write(term_request(board.path(), pid, TermRequest::Pause), b"")
                        .expect("ask for a pause");
                    let seen = eventually(Duration::from_secs(10), || stopped(pid)).await;
                    assert!(
                        seen.is_some(),
                        "{}: the leader's process did not stop in its term",
                        c.id
                    );
                    board.witness.fault(fault.logged_as());
                    let began = now_ns();
                    successor_writes(&board.witness, bound + SPACING).await;
                    pauses.push(Pause {
                        pid,
                        from: began,
                        to: now_ns(),
                    });
                    signal(pid, nix::sys::signal::Signal::SIGCONT);
                    board.witness.heal(fault.logged_as());
                    (began, None)
                }
                (Fault::Cut, Some(pid)) => {
                    // Cut inside a term that works on until it is lost.
                    let hold = term_request(board.path(), pid, TermRequest::Hold);
                    std::fs::write(&hold, b"").expect("ask for a held term");
                    let taken = eventually(Duration::from_secs(10), || !hold.exists()).await;
                    assert!(
                        taken.is_some(),
                        "{}: the leader's process did not hold its term",
                        c.id
                    );
                    let proxy = &proxies[link[&pid]];
                    board.witness.fault(fault.logged_as());
                    let began = now_ns();
                    proxy.blackhole();
                    successor_writes(&board.witness, bound + SPACING).await;
                    proxy.pass();
                    board.witness.heal(fault.logged_as());
                    (began, None)
                }
                (Fault::ServerRestart | Fault::Failover, None) => {
                    let (_, restart) = server_fault.as_mut().expect("a server to strike");
                    board.witness.fault(fault.logged_as());
                    let began = now_ns();
                    tokio::task::block_in_place(restart);
                    board.witness.heal(fault.logged_as());
                    let healed = Instant::now();
                    let named = leading_process(&election, bound + SPACING, &[]).await;
                    (began, named.map(|_| healed.elapsed()))
                }
                _ => unreachable!("a candidate's fault strikes a process"),
            };
            struck.push(Struck {
                fault,
                process,
                began,
                named_after,
            });
        }
        tokio::time::sleep(SPACING).await;
        workers.stop();
        let tally = tokio::task::block_in_place(|| workers.finish());
        let starved = watch.worst().max(children.children_worst());
        let analysis = analyze_with_pauses(board.path(), &[ELECTION], &pauses).expect("analyze");
        let records = read_logs(board.path()).expect("logs");
        let election_id = key_id(ELECTION);
        // From each fault to the next term: of another process after a
        // candidate's fault, the store's leader after the server's restart.
        let reelected: Vec<Option<Duration>> = struck
            .iter()
            .map(|s| match s.process {
                Some(pid) => records
                    .iter()
                    .find(|r| {
                        r.kind == Kind::Enter && r.key == election_id && r.at >= s.began && r.pid != pid
                    })
                    .map(|r| Duration::from_nanos(r.at - s.began)),
                None => s.named_after,
            })
            .collect();
        // The cut-off leader's held term: lost, and told so before its
        // deadline (it was running: nothing excuses it).
        let cut_told: Vec<Option<i128>> = struck
            .iter()
            .filter(|s| s.fault == Fault::Cut)
            .map(|s| {
                let pid = s.process.expect("a process");
                records
                    .iter()
                    .find(|r| r.kind == Kind::Lost && r.key == election_id && r.pid == pid && r.at >= s.began)
                    .map(|r| i128::from(r.detail) - i128::from(r.at))
            })
            .collect();
        let cut_told_in_time = cut_told.iter().all(|slack| slack.is_some_and(|ns| ns >= 0));
        let fenced = board.witness.seen(ELECTION);
        let unfenced = board.witness.seen(&unfenced_register(ELECTION));
        assert_eq!(
            tally.errors, 0,
            "{}: {} candidates' runs ended in an error (first: {:?})",
            c.id, tally.errors, tally.first_error
        );
        let late: Vec<String> = struck
            .iter()
            .zip(&reelected)
            .filter(|(_, took)| took.is_none_or(|t| t > bound))
            .map(|(s, took)| format!("{:?}: {took:?}", s.fault))
            .collect();
        // The stopped leader's one late write: refused with its epoch,
        // taken without.
        let fenced_late_write = fenced.stale_rejected == 1 && unfenced.stale_accepted == 1;
        // The stopped leader's term, at least, was lost.
        let violated = !analysis.overlaps.is_empty()
            || analysis.token_regressions > 0
            || analysis.lost_slack_ns.is_empty()
            || !fenced_late_write
            || !cut_told_in_time
            || !late.is_empty();
        let verdict = Verdict::judge(violated, starved > monitor::bound(T));
        let summary = format!(
            "{} run {attempt}: {} terms, {} lost, overlaps {:?}, {} epoch regressions, the stopped leader's late write refused {} and taken by the control {}, the cut-off leader told with {cut_told:?} ns to its deadline, next term after each fault {reelected:?} (bound {bound:?}; late: {late:?}), starved at most {starved:?}",
            c.id,
            analysis.entries,
            analysis.lost_slack_ns.len(),
            analysis.overlaps,
            analysis.token_regressions,
            fenced.stale_rejected,
            unfenced.stale_accepted,
        );
        match verdict {
            Verdict::Fail => panic!("{summary}"),
            Verdict::Invalid => {
                eprintln!("INVALID: {summary}");
                assert!(attempt < 3, "INVALID three times: {summary}");
                continue;
            }
            Verdict::Pass => {}
        }
        let ms = |d: &Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        report::write(
            c.id,
            json!({
                "scenario": c.name,
                "verdict": "PASS; control caught",
                "attempt": attempt,
                "parameters": {
                    "processes": PROCESSES,
                    "candidates_per_process": 2,
                    "election_ttl_ms": T.as_millis(),
                    "lease_ms": c.lease.as_millis(),
                    "bound_ms": bound.as_millis(),
                },
                "terms": analysis.entries,
                "terms_lost": analysis.lost_slack_ns.len(),
                "overlaps": 0,
                "epoch_regressions": 0,
                "late_write_refused_by_epoch": fenced.stale_rejected,
                "control_unfenced_late_write_taken": unfenced.stale_accepted,
                "cut_off_leader_told_before_deadline_ms": cut_told.iter().map(|ns| ns.map_or(f64::NAN, |ns| ns as f64 / 1e6)).collect::<Vec<_>>(),
                "faults": struck.iter().zip(&reelected).map(|(s, took)| json!({
                    "fault": s.fault.logged_as(),
                    "next_leader_ms": ms(took),
                })).collect::<Vec<_>>(),
                "starved_at_most_ms": starved.as_secs_f64() * 1e3,
                "key_figure": format!(
                    "{} terms, 0 overlaps, 0 epoch regressions, late write refused; next leader after kill/pause{}: {} ms (bound {} ms)",
                    analysis.entries,
                    match (c.proxied, faults.last()) {
                        (true, Some(Fault::ServerRestart)) => "/cut/server restart",
                        (true, _) => "/cut",
                        (false, Some(Fault::Failover)) => "/failover",
                        _ => "",
                    },
                    reelected.iter().map(|t| format!("{:.0}", ms(t))).collect::<Vec<_>>().join("/"),
                    bound.as_millis()
                ),
                "seconds": started.elapsed().as_secs_f64(),
            }),
        );
        return;
    }
}

/// SC: Redis (`appendfsync always`), the candidates' three faults and the
/// server killed and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_candidates_killed_stopped_and_cut_off_on_redis() {
    scenario("sc_candidates_killed_stopped_and_cut_off_on_redis", async move {
        let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
        let candidates = Candidates {
            id: "SC",
            name: "SC elections, the leader killed, stopped past its lease and cut off; Redis (appendfsync always) killed and restarted",
            target: server.url(),
            lease: T,
            backend_lease: None,
            proxied: true,
        };
        let mut restart = || server.restart();
        run_candidates(candidates, Some((Fault::ServerRestart, &mut restart))).await;
    })
    .await
}

/// SCmy: MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scmy_candidates_killed_stopped_and_cut_off_on_mariadb() {
    scenario(
        "scmy_candidates_killed_stopped_and_cut_off_on_mariadb",
        async move {
            let server = MariaDb::start();
            let candidates = Candidates {
                id: "SCmy",
                name: "SC elections on MariaDB, the leader killed, stopped past its lease and cut off",
                target: server.url(),
                lease: T,
                backend_lease: None,
                proxied: true,
            };
            run_candidates(candidates, None).await;
        },
    )
    .await
}

/// SCpg: PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scpg_candidates_killed_stopped_and_cut_off_on_postgres() {
    scenario(
        "scpg_candidates_killed_stopped_and_cut_off_on_postgres",
        async move {
            let server = Postgres::start();
            let candidates = Candidates {
                id: "SCpg",
                name: "SC elections on PostgreSQL, the leader killed, stopped past its lease and cut off",
                target: server.url(),
                lease: T,
                backend_lease: None,
                proxied: true,
            };
            run_candidates(candidates, None).await;
        },
    )
    .await
}

/// SCzk: ZooKeeper, the candidates' sessions 1.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sczk_candidates_killed_stopped_and_cut_off_on_zookeeper() {
    scenario(
        "sczk_candidates_killed_stopped_and_cut_off_on_zookeeper",
        async move {
            let zk = ZooKeeper::start();
            let session = Duration::from_millis(1500);
            let candidates = Candidates {
                id: "SCzk",
                name: "SC elections on ZooKeeper, the leader killed, stopped past its session and cut off",
                target: zookeeper::target(&zk),
                lease: session,
                backend_lease: Some(session),
                proxied: true,
            };
            run_candidates(candidates, None).await;
        },
    )
    .await
}

/// SCetcd: etcd, the candidates' leases 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scetcd_candidates_killed_stopped_and_cut_off_on_etcd() {
    scenario(
        "scetcd_candidates_killed_stopped_and_cut_off_on_etcd",
        async move {
            let server = Etcd::start();
            let lease = Duration::from_secs(3);
            let candidates = Candidates {
                id: "SCetcd",
                name: "SC elections on etcd, the leader killed, stopped past its lease and cut off",
                target: etcd::target(&server),
                lease,
                backend_lease: Some(lease),
                proxied: true,
            };
            run_candidates(candidates, None).await;
        },
    )
    .await
}

/// SCs: through Sentinel (a master, two replicas, three sentinels): the
/// leader killed and stopped, then the master killed and a replica
/// promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scs_candidates_killed_and_stopped_through_a_sentinel_failover() {
    scenario(
        "scs_candidates_killed_and_stopped_through_a_sentinel_failover",
        async move {
            let mut group = tokio::task::block_in_place(|| lock_tests::Replicated::start(2));
            let candidates = Candidates {
                id: "SCs",
                name: "SC elections through Sentinel, the leader killed and stopped past its lease, then the master killed and a replica promoted (replica_acks(1))",
                target: format!(
                    "sentinel={}@{}",
                    lock_tests::sentinel::MASTER_NAME,
                    group.sentinel_urls().join(",")
                ),
                lease: T,
                backend_lease: None,
                proxied: false,
            };
            let mut failover = || {
                group.kill_master(Duration::from_secs(30));
            };
            run_candidates(candidates, Some((Fault::Failover, &mut failover))).await;
        },
    )
    .await
}

/// SCc: on a Cluster of three masters with two replicas each (so that the
/// promoted one still has a replica to acknowledge): the leader killed and
/// stopped, then the master of the election's slot killed and a replica
/// promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scc_candidates_killed_and_stopped_through_a_cluster_failover() {
    scenario(
        "scc_candidates_killed_and_stopped_through_a_cluster_failover",
        async move {
            let mut cluster = tokio::task::block_in_place(|| lock_tests::Cluster::start(3, 2));
            let candidates = Candidates {
                id: "SCc",
                name: "SC elections on a Redis Cluster, the leader killed and stopped past its lease, then the master of the election's slot killed and a replica promoted (replica_acks(1))",
                target: format!("cluster={}", cluster.urls().join(",")),
                lease: T,
                backend_lease: None,
                proxied: false,
            };
            let mut failover = || {
                cluster.kill_master_of(&format!("lock:{{{ELECTION}}}"), Duration::from_secs(30));
            };
            run_candidates(candidates, Some((Fault::Failover, &mut failover))).await;
        },
    )
    .await
}
