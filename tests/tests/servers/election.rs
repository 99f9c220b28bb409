//! Leader election (`LockClient::election`, DESIGN §15): one leader at a
//! time with a growing epoch, on every backend that can fence; who leads,
//! with what value, read and observed by followers; `Election::run`'s
//! terms, against real servers the tests start.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{Leader, LockClient, LockError};
use lock_tests::monitor::{self, Watch};
use lock_tests::{Cluster, Etcd, MariaDb, Postgres, Proxy, RedisServer, Replicated, ZooKeeper, eventually};

/// Two clients of one store (two replicas of a service), and the server.
struct Replicas {
    a: LockClient,
    b: LockClient,
    _server: Box<dyn std::any::Any + Send>,
}

async fn in_memory() -> Replicas {
    let locks = LockClient::in_memory();
    Replicas {
        a: locks.clone(),
        b: locks,
        _server: Box::new(()),
    }
}

/// As the least-privilege ACL user of docs/backends.md.
async fn redis() -> Replicas {
    let server = RedisServer::start_with_lock_user("");
    Replicas {
        a: LockClient::connect(&server.lock_user_url())
            .await
            .expect("connect"),
        b: LockClient::connect(&server.lock_user_url())
            .await
            .expect("connect"),
        _server: Box::new(server),
    }
}

/// A master, a replica and three sentinels, as the least-privilege ACL
/// user.
async fn sentinel() -> Replicas {
    let group = Replicated::start_named_with_lock_user(1);
    Replicas {
        a: lock_tests::sentinel::lock_user_client(&group).await,
        b: lock_tests::sentinel::lock_user_client(&group).await,
        _server: Box::new(group),
    }
}

/// Three masters, as the least-privilege ACL user: an election's keys
/// share a slot.
async fn cluster() -> Replicas {
    let cluster = Cluster::start_with_lock_user(3, 0);
    Replicas {
        a: LockClient::cluster(cluster.lock_user_urls())
            .await
            .expect("cluster client"),
        b: LockClient::cluster(cluster.lock_user_urls())
            .await
            .expect("cluster client"),
        _server: Box::new(cluster),
    }
}

async fn mysql() -> Replicas {
    let server = MariaDb::start();
    Replicas {
        a: LockClient::mysql(&server.url()).await.expect("connect"),
        b: LockClient::mysql(&server.url()).await.expect("connect"),
        _server: Box::new(server),
    }
}

async fn postgres() -> Replicas {
    let server = Postgres::start();
    Replicas {
        a: LockClient::postgres(&server.url()).await.expect("connect"),
        b: LockClient::postgres(&server.url()).await.expect("connect"),
        _server: Box::new(server),
    }
}

async fn zookeeper() -> Replicas {
    let server = ZooKeeper::start();
    Replicas {
        a: LockClient::zookeeper(&server.connect_string())
            .await
            .expect("connect"),
        b: LockClient::zookeeper(&server.connect_string())
            .await
            .expect("connect"),
        _server: Box::new(server),
    }
}

async fn etcd() -> Replicas {
    let server = Etcd::start();
    Replicas {
        a: lock_tests::etcd::client(&server).await,
        b: lock_tests::etcd::client(&server).await,
        _server: Box::new(server),
    }
}

/// One term at a time: a second candidate waits while the first leads, and
/// is elected once it resigns, with a greater epoch. Where the backend
/// keeps the record, followers read who leads, with what value, and nobody
/// once the leader resigned. A lock of the election's name is another key.
async fn one_leader_at_a_time(replicas: Replicas) {
    let Replicas { a, b, .. } = replicas;
    let (ours, theirs) = (a.election("scheduler"), b.election("scheduler"));

    let mut first = ours.campaign("10.0.0.1:80").await.expect("elected");
    assert!(first.is_held());
    assert_eq!(first.value(), "10.0.0.1:80");
    assert_eq!(first.election(), "scheduler");
    // From a task of its own: in process, both replicas are one client,
    // and a second campaign in the leader's own task fails at once
    // (`WouldDeadlock`) rather than wait for itself.
    let rival = theirs.clone().wait(Duration::from_millis(200));
    let waited = tokio::spawn(async move { rival.campaign("10.0.0.2:80").await })
        .await
        .expect("the rival's task");
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "a second candidate was elected beside the leader: {waited:?}"
    );
    // A lock named like the election is a lock of its own.
    let lock = b
        .lock("scheduler")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("a lock named like an election is free");
    lock.release().await.expect("release");

    let seen = leading(&theirs).await;
    assert_eq!((seen.value.as_str(), seen.epoch), ("10.0.0.1:80", first.epoch()));
    first.proclaim("10.0.0.1:81").await.expect("proclaim");
    let seen = leading(&theirs).await;
    assert_eq!(seen.value, "10.0.0.1:81");
    // The same value again is still a proclamation of the leader's (a SQL
    // update that changes nothing counts no row).
    first.proclaim("10.0.0.1:81").await.expect("the same value again");

    let first_epoch = first.epoch();
    let first_id = leading(&theirs).await.id;
    first.resign().await.expect("resign");
    assert_eq!(
        theirs.leader().await.expect("read"),
        None,
        "nobody leads after a resignation"
    );

    let second = theirs
        .clone()
        .wait(Duration::from_secs(10))
        .campaign("10.0.0.2:80")
        .await
        .expect("elected after the resignation");
    assert!(
        second.epoch() > first_epoch,
        "epoch {} after {first_epoch}",
        second.epoch()
    );
    let seen = leading(&ours).await;
    assert_eq!((seen.value.as_str(), seen.epoch), ("10.0.0.2:80", second.epoch()));
    assert_ne!(seen.id, first_id, "a new term has a new id");

    // Dropping a term resigns it: the next candidate gets in.
    let second_epoch = second.epoch();
    drop(second);
    let third = ours
        .clone()
        .wait(Duration::from_secs(10))
        .campaign("10.0.0.1:80")
        .await
        .expect("elected after a dropped term");
    assert!(third.epoch() > second_epoch);
    third.resign().await.expect("resign");
}

macro_rules! on_backends {
    ($test:ident: $($backend:ident),*) => {
        $(
            mod $backend {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    lock_tests::bounded(stringify!($test), async move {
                        super::super::$test(super::super::$backend().await).await;
                    })
                    .await
                }
            }
        )*
    };
}

mod one_leader {
    on_backends!(one_leader_at_a_time: in_memory, redis, sentinel, cluster, mysql, postgres, zookeeper, etcd);
}

/// A client that may not add the `record` column to an earlier version's
/// SQL lock table (`app`, started while `captured` ran) warned that it
/// could not, its locks work, and its elections fail with the server's
/// error (which says `missing`) until `add_column` adds the column; then
/// they work.
pub(crate) async fn elections_wait_for_the_record_column(
    app: &LockClient,
    captured: &lock_tests::secrets::Captured,
    missing: &str,
    add_column: impl AsyncFnOnce(),
) {
    let logged = captured.text();
    assert!(
        logged.contains("cannot add the column elections need") && logged.contains("record"),
        "no warning: {logged}"
    );
    app.lock("before").run(async {}).await.expect("its locks work");
    let refused = app
        .election("before")
        .wait(Duration::from_secs(5))
        .campaign("here")
        .await
        .expect_err("no column for the record");
    assert!(refused.to_string().contains(missing), "{refused}");
    add_column().await;
    let term = app
        .election("before")
        .campaign("here")
        .await
        .expect("elected once the column is there");
    term.resign().await.expect("resign");
}

/// Who leads `election` now; somebody must.
async fn leading(election: &lock_runtime::Election) -> Leader {
    election.leader().await.expect("read").expect("somebody leads")
}

/// Waits (at most 10 s) until the observed leader satisfies `wanted`.
async fn until(
    seen: &mut tokio::sync::watch::Receiver<Option<Leader>>,
    what: &str,
    wanted: impl FnMut(&Option<Leader>) -> bool,
) {
    let waited = tokio::time::timeout(Duration::from_secs(10), seen.wait_for(wanted))
        .await
        .map(|found| found.is_ok());
    match waited {
        Ok(true) => {}
        Ok(false) => panic!("the observer ended before {what}"),
        Err(_) => panic!(
            "not observed within 10 s: {what} (last seen {:?})",
            *seen.borrow()
        ),
    }
}

/// A leader whose process crashes (SIGKILL) neither resigns nor renews:
/// its claim ends on the server with its lease (its session on ZooKeeper,
/// its lease on etcd), and an observer then says nobody leads, within a
/// second of the lease's end. On Redis an expiry publishes nothing, so the
/// observer times it from the key's remaining TTL.
async fn observers_see_nobody_once_a_crashed_leaders_lease_ends(target: String) {
    let follower = lock_tests::lab::connect(&target, LockClient::builder())
        .await
        .expect("connect");
    let election = follower.election("crashed");
    let mut seen = election.observe().await.expect("observe");
    // A 1 s lease; on ZooKeeper a 1 s session, on etcd the suite's lease.
    let lease = if target.starts_with("etcd=") {
        lock_tests::etcd::LEASE_TTL
    } else {
        Duration::from_secs(1)
    };
    on_time_unless_starved("nobody shown within a second of the lease's end", async || {
        let target_for_leader = target.clone();
        let (leader, epoch) = tokio::task::spawn_blocking(move || {
            lock_tests::lab::Holder::lead(
                &target_for_leader,
                "crashed",
                Duration::from_secs(1),
                Some(lease),
                "doomed",
            )
        })
        .await
        .expect("the leader started");
        until(&mut seen, "the doomed leader", |l| {
            l.as_ref()
                .is_some_and(|l| l.epoch == epoch && l.value == "doomed")
        })
        .await;
        leader.kill();
        let crashed = Instant::now();
        until(
            &mut seen,
            "nobody leading once the crashed leader's lease ended",
            Option::is_none,
        )
        .await;
        let shown = crashed.elapsed();
        assert_eq!(
            election.leader().await.expect("read"),
            None,
            "the store still names a leader"
        );
        eprintln!("nobody observed {shown:?} after the crash");
        if shown > lease + Duration::from_secs(1) {
            vec![shown]
        } else {
            Vec::new()
        }
    })
    .await;
}

/// One test per server backend: `$test(target)`, the server started by
/// `$start` and named by `$target` in `lock-worker`'s notation.
macro_rules! on_servers {
    ($test:ident: $($backend:ident: $start:expr, $target:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $backend() {
                lock_tests::bounded(stringify!($test), async move {
                    let server = $start;
                    $test($target(&server)).await;
                })
                .await
            }
        )*
    };
}

mod crashed_leaders {
    use super::*;

    on_servers! {
        observers_see_nobody_once_a_crashed_leaders_lease_ends:
        redis: RedisServer::start(), |s: &RedisServer| s.url();
        sentinel: Replicated::start_named(1), |g: &Replicated| format!(
            "sentinel={}@{}",
            lock_tests::sentinel::MASTER_NAME,
            g.sentinel_urls().join(",")
        );
        cluster: Cluster::start(3, 0), |c: &Cluster| format!("cluster={}", c.urls().join(","));
        mysql: MariaDb::start(), |s: &MariaDb| s.url();
        postgres: Postgres::start(), |s: &Postgres| s.url();
        zookeeper: ZooKeeper::start(), lock_tests::zookeeper::target;
        etcd: Etcd::start(), lock_tests::etcd::target;
    }
}

/// A follower that observes sees each term with its value and epoch, a
/// new proclamation, and nobody after a resignation. (That it never shows
/// an older term after a newer one is `election.rs`'s unit test: on these
/// stores epochs only grow, so no run here could show it.)
async fn followers_observe_who_leads(replicas: Replicas) {
    let Replicas { a, b, .. } = replicas;
    let (ours, follower) = (a.election("observed"), b.election("observed"));
    assert!(!follower.is_observing(), "observing before any observation");
    let mut seen = follower.observe().await.expect("observe");
    assert!(follower.is_observing());
    assert_eq!(*seen.borrow(), None, "nobody leads yet");
    let mut first = ours.campaign("one").await.expect("elected");
    let epoch = first.epoch();
    until(&mut seen, "the first leader", |l| {
        l.as_ref().is_some_and(|l| l.epoch == epoch && l.value == "one")
    })
    .await;
    first.proclaim("two").await.expect("proclaim");
    until(&mut seen, "the new value", |l| {
        l.as_ref().is_some_and(|l| l.value == "two")
    })
    .await;
    first.resign().await.expect("resign");
    until(&mut seen, "nobody leading after the resignation", Option::is_none).await;

    let second = ours.campaign("three").await.expect("elected again");
    assert!(second.epoch() > epoch);
    let epoch = second.epoch();
    until(&mut seen, "the second leader", |l| {
        l.as_ref().is_some_and(|l| l.epoch == epoch && l.value == "three")
    })
    .await;
    assert!(follower.is_observing());
    second.resign().await.expect("resign");
    until(&mut seen, "nobody leading at the end", Option::is_none).await;
}

mod observers {
    on_backends!(
        followers_observe_who_leads: in_memory, redis, sentinel, cluster, mysql, postgres, zookeeper, etcd
    );
}

/// Runs `trial` (which returns how long each of its late observations
/// took) until one has none late, at most three times. A trial with late
/// ones fails the test with `late_means` unless this process, or a server
/// it started, was starved past 250 ms meanwhile: then it proves nothing
/// (INVALID) and runs again.
async fn on_time_unless_starved(late_means: &str, mut trial: impl AsyncFnMut() -> Vec<Duration>) {
    for n in 1..=3 {
        let starved = Watch::start();
        let late = trial().await;
        if late.is_empty() {
            return;
        }
        let worst = starved.worst().max(starved.children_worst());
        assert!(worst > Duration::from_millis(250), "{late_means}: {late:?}");
        eprintln!("trial {n} INVALID: starved {worst:?}");
    }
    panic!("every trial was starved");
}

/// On ZooKeeper and etcd an observer is woken by its watches. A leader's
/// new value, which no store announces (the watch on the leader's data or
/// record), reaches it in under 500 ms in each of 10 proclamations, and so
/// does a leader elected where none led (the watch on the line); an
/// observer that read only by its clock (once a second) would take longer
/// in about half of them.
async fn an_observer_is_woken_by_the_stores_watch(replicas: Replicas) {
    let Replicas { a, b, .. } = replicas;
    let (ours, follower) = (a.election("watched"), b.election("watched"));
    let mut seen = follower.observe().await.expect("observe");
    on_time_unless_starved("read by the clock, not woken by the watch", async || {
        let mut late = Vec::new();
        let mut term = ours.campaign("v0").await.expect("elected");
        let epoch = term.epoch();
        until(&mut seen, "the leader", |l| {
            l.as_ref().is_some_and(|l| l.epoch == epoch)
        })
        .await;
        for i in 1..=10 {
            let value = format!("v{i}");
            let proclaimed = Instant::now();
            term.proclaim(value.as_str()).await.expect("proclaim");
            until(&mut seen, "the new value", |l| {
                l.as_ref().is_some_and(|l| l.value == value)
            })
            .await;
            if proclaimed.elapsed() >= Duration::from_millis(500) {
                late.push(proclaimed.elapsed());
            }
        }
        term.resign().await.expect("resign");
        until(&mut seen, "nobody leading", Option::is_none).await;
        let campaigned = Instant::now();
        let next = ours.campaign("next").await.expect("elected");
        let epoch = next.epoch();
        until(&mut seen, "the next leader", |l| {
            l.as_ref().is_some_and(|l| l.epoch == epoch)
        })
        .await;
        if campaigned.elapsed() >= Duration::from_millis(500) {
            late.push(campaigned.elapsed());
        }
        next.resign().await.expect("resign");
        late
    })
    .await;
}

mod watched_observers {
    on_backends!(an_observer_is_woken_by_the_stores_watch: zookeeper, etcd);
}

/// Where the store announces a release a candidate waits for (Redis
/// pub/sub on one node, through Sentinel and on a cluster; PostgreSQL's
/// `LISTEN`), an observer in the waiting candidate's client is
/// woken by that announcement: after each of 5 resignations in the other
/// client it shows the waiting candidate's term in under 500 ms. Each
/// resignation comes just after the observer's read of the resigning
/// term, so an observer that read only by its clock (once a second) would
/// take about a second every time.
async fn an_observer_hears_a_release_a_candidate_waits_for(replicas: Replicas) {
    let Replicas { a, b, .. } = replicas;
    let (leaving, waiting) = (a.election("announced"), b.election("announced"));
    let mut seen = waiting.observe().await.expect("observe");
    let admin = a.admin();
    on_time_unless_starved("read by the clock, not woken by the announcement", async || {
        let mut late = Vec::new();
        for i in 1..=5 {
            let term = leaving.campaign(format!("a{i}")).await.expect("elected");
            let epoch = term.epoch();
            until(&mut seen, "the leader", |l| {
                l.as_ref().is_some_and(|l| l.epoch == epoch)
            })
            .await;
            let candidate = tokio::spawn({
                let waiting = waiting.clone().wait(Duration::from_secs(10));
                async move { waiting.campaign("b").await }
            });
            // The release is announced only once the candidate has marked
            // the term as waited for.
            let marked = Instant::now();
            loop {
                let term_now = admin.inspect("announced (election)").await.expect("inspect");
                if term_now.iter().any(|l| l.waiters) {
                    break;
                }
                assert!(
                    marked.elapsed() < Duration::from_secs(10),
                    "the candidate did not mark the term: {term_now:?}"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let resigned = Instant::now();
            term.resign().await.expect("resign");
            until(&mut seen, "the waiting candidate's term", |l| {
                l.as_ref().is_some_and(|l| l.epoch > epoch)
            })
            .await;
            if resigned.elapsed() >= Duration::from_millis(500) {
                late.push(resigned.elapsed());
            }
            let next = candidate.await.expect("the candidate").expect("elected");
            assert_eq!(seen.borrow().as_ref().map(|l| l.epoch), Some(next.epoch()));
            next.resign().await.expect("resign");
        }
        late
    })
    .await;
}

mod announced_observers {
    on_backends!(
        an_observer_hears_a_release_a_candidate_waits_for: redis, sentinel, cluster, postgres
    );
}

/// An observer cut off from its store keeps the last leader it read and
/// says it is cut off (never `None`); reconnected, it reads again.
async fn an_observer_cut_off_keeps_its_last_value_and_says_so(target: String) {
    let proxy = Proxy::start(lock_tests::lab::port_of(&target)).await;
    let leader = lock_tests::lab::connect(&target, LockClient::builder())
        .await
        .expect("connect");
    let follower = lock_tests::lab::connect(
        &lock_tests::lab::through(&target, proxy.port()),
        LockClient::builder().command_timeout(Duration::from_millis(200)),
    )
    .await
    .expect("connect");
    let term = leader.election("far").campaign("here").await.expect("elected");
    let observed = follower.election("far");
    let mut seen = observed.observe().await.expect("observe");
    assert_eq!(seen.borrow().as_ref().map(|l| l.epoch), Some(term.epoch()));

    proxy.blackhole();
    let cut_off = eventually(Duration::from_secs(10), || !observed.is_observing()).await;
    assert!(cut_off.is_some(), "a cut-off observer still says it observes");
    assert_eq!(
        seen.borrow_and_update()
            .as_ref()
            .map(|l| (l.epoch, l.value.clone())),
        Some((term.epoch(), "here".to_owned())),
        "a cut-off observer keeps the last leader it read"
    );

    // While it is cut off the term ends; once the link is back, it reads
    // again and shows nobody leading.
    term.resign().await.expect("resign");
    proxy.pass();
    until(
        &mut seen,
        "nobody leading after the link came back",
        Option::is_none,
    )
    .await;
    assert!(observed.is_observing());
}

mod cut_off_observers {
    use super::*;

    on_servers! {
        an_observer_cut_off_keeps_its_last_value_and_says_so:
        redis: RedisServer::start(), |s: &RedisServer| s.url();
        mysql: MariaDb::start(), |s: &MariaDb| s.url();
        postgres: Postgres::start(), |s: &Postgres| s.url();
        zookeeper: ZooKeeper::start(), lock_tests::zookeeper::target;
        etcd: Etcd::start(), lock_tests::etcd::target;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_refuses_an_election_and_run_returns_the_refusal() {
    lock_tests::bounded(
        "a_redlock_refuses_an_election_and_run_returns_the_refusal",
        async move {
            let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
            let locks = LockClient::redlock(servers.iter().map(|s| s.url()))
                .await
                .expect("connect");
            let election = locks.election("scheduler");
            let campaign = election.campaign("me").await;
            assert!(
                matches!(campaign, Err(LockError::Unsupported { .. })),
                "{campaign:?}"
            );
            let ran = election.run("me", |_| async {}).await;
            assert!(matches!(ran, Err(LockError::Unsupported { .. })), "{ran:?}");
            let read = election.leader().await;
            assert!(matches!(read, Err(LockError::Unsupported { .. })), "{read:?}");
        },
    )
    .await
}

#[tokio::test]
async fn bad_names_and_values_are_refused_before_any_io() {
    let locks = LockClient::in_memory();
    let bad = locks.election("a{b").campaign("x").await;
    assert!(matches!(bad, Err(LockError::InvalidKey { .. })), "{bad:?}");
    let long = locks.election("ok").campaign("x".repeat(64 * 1024 + 1)).await;
    assert!(matches!(long, Err(LockError::InvalidRequest { .. })), "{long:?}");
    let ran = locks.election("").run("x", |_| async {}).await;
    assert!(matches!(ran, Err(LockError::InvalidKey { .. })), "{ran:?}");
    assert_eq!(locks.election("ok").leader().await.expect("read"), None);
}

/// `run` campaigns again after a term its body ended: every term has a
/// greater epoch, and the leader read during a term is that term's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_campaigns_again_after_its_body_returns() {
    lock_tests::bounded("run_campaigns_again_after_its_body_returns", async move {
        let server = RedisServer::start();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        let election = locks.election("rotating");
        let epochs = Arc::new(Mutex::new(Vec::new()));
        let run = {
            let (epochs, election, follower) = (Arc::clone(&epochs), election.clone(), election.clone());
            async move {
                election
                    .run("worker-1", move |term| {
                        let (epochs, election) = (Arc::clone(&epochs), follower.clone());
                        async move {
                            let seen = election.leader().await.expect("read").expect("somebody leads");
                            assert_eq!((seen.epoch, seen.value.as_str()), (term.epoch(), "worker-1"));
                            epochs.lock().expect("epochs").push(term.epoch());
                        }
                    })
                    .await
            }
        };
        tokio::select! {
            ran = run => panic!("run returned: {ran:?}"),
            seen = eventually(Duration::from_secs(10), || epochs.lock().expect("epochs").len() >= 3) => {
                seen.expect("three terms in 10 s");
            }
        }
        let epochs = epochs.lock().expect("epochs").clone();
        assert!(epochs.windows(2).all(|w| w[0] < w[1]), "epochs {epochs:?}");
        // The run future dropped, its last term is resigned.
        eventually(Duration::from_secs(5), || {
            server.query::<i64>(redis::cmd("EXISTS").arg("lock:{rotating}:leader")) == 0
        })
        .await
        .expect("the last term resigned when run was dropped");
    })
    .await
}

/// A leader cut off from the store: `run` drops its body before the
/// term's validity deadline, so before the other candidate, which waits
/// for the lease to expire on the server, is elected. A starved trial (the
/// assumption monitor saw the process late) proves nothing and is run
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_is_dropped_before_its_successor_is_elected() {
    lock_tests::bounded(
        "a_cut_off_leader_is_dropped_before_its_successor_is_elected",
        async move {
            const MAX_TRIALS: usize = 5;
            let server = RedisServer::start();
            let ttl = Duration::from_millis(600);
            let mut invalid = Vec::new();
            for trial in 0..MAX_TRIALS {
                let proxy = Proxy::start(server.port()).await;
                let cut_off = LockClient::builder()
                    .command_timeout(Duration::from_millis(100))
                    .connect(&proxy.url())
                    .await
                    .expect("connect");
                let rival = LockClient::connect(&server.url()).await.expect("connect");
                let name = format!("cut:{trial}");
                let watch = Watch::start();
                let events: Events = Arc::default();
                let election = cut_off.election(name.as_str()).ttl(ttl);
                let leading = {
                    let events = Arc::clone(&events);
                    election.run("first", move |term| {
                        let events = Arc::clone(&events);
                        async move {
                            events.lock().expect("events").push((
                                "first elected",
                                Instant::now(),
                                term.epoch(),
                            ));
                            // Recorded when the body is dropped, not when it returns.
                            let _dropped = Recorder(events, term.epoch());
                            std::future::pending::<()>().await;
                        }
                    })
                };
                let succession = async {
                    eventually(Duration::from_secs(5), || {
                        !events.lock().expect("events").is_empty()
                    })
                    .await
                    .expect("the first candidate is elected");
                    proxy.blackhole();
                    let second = rival
                        .election(name.as_str())
                        .ttl(ttl)
                        .wait(Duration::from_secs(10))
                        .campaign("second")
                        .await
                        .expect("the rival is elected once the lease expired");
                    events
                        .lock()
                        .expect("events")
                        .push(("second elected", Instant::now(), second.epoch()));
                    second
                };
                let second = tokio::select! {
                    ran = leading => panic!("run returned: {ran:?}"),
                    second = succession => second,
                };
                let starved = watch.worst();
                let events = events.lock().expect("events").clone();
                let at = |what: &str| events.iter().find(|e| e.0 == what).map(|e| (e.1, e.2));
                let (first_at, first_epoch) = at("first elected").expect("first elected");
                let (second_at, second_epoch) = at("second elected").expect("second elected");
                let dropped = at("first dropped");
                assert!(second_epoch > first_epoch, "epochs {events:?}");
                assert!(second_at > first_at);
                match dropped {
                    Some((dropped_at, _)) if dropped_at < second_at => {
                        second.resign().await.expect("resign");
                        return;
                    }
                    _ if starved > monitor::bound(ttl) => {
                        invalid.push(format!("trial {trial}: starved {starved:?}: {events:?}"));
                    }
                    _ => panic!("the cut-off leader still ran when its successor was elected: {events:?}"),
                }
            }
            panic!("every trial starved: {invalid:?}");
        },
    )
    .await
}

/// What happened when, with the term's epoch.
type Events = Arc<Mutex<Vec<(&'static str, Instant, u64)>>>;

/// Pushes `first dropped` when the term's body is dropped.
struct Recorder(Events, u64);

impl Drop for Recorder {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(("first dropped", Instant::now(), self.1));
    }
}

/// A term's future that lets its term go (drops or resigns its
/// `Leadership`) and would run on is dropped with it: it no longer leads,
/// and another candidate can be elected at once. `run` then campaigns
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_that_lets_its_term_go_is_dropped_with_it() {
    lock_tests::bounded("a_future_that_lets_its_term_go_is_dropped_with_it", async move {
        let locks = LockClient::in_memory();
        let events: Events = Arc::default();
        let run = {
            let events = Arc::clone(&events);
            let election = locks.election("let-go");
            async move {
                election
                    .run("me", move |term| {
                        let events = Arc::clone(&events);
                        async move {
                            let epoch = term.epoch();
                            events
                                .lock()
                                .expect("events")
                                .push(("elected", Instant::now(), epoch));
                            let _dropped = Recorder(Arc::clone(&events), epoch);
                            if epoch % 2 == 0 {
                                term.resign().await.expect("resign");
                            } else {
                                drop(term);
                            }
                            std::future::pending::<()>().await;
                        }
                    })
                    .await
            }
        };
        tokio::select! {
            ran = run => panic!("run returned: {ran:?}"),
            seen = eventually(Duration::from_secs(10), || {
                events.lock().expect("events").iter().filter(|e| e.0 == "elected").count() >= 4
            }) => {
                seen.expect("four terms: each future was dropped when it let its term go");
            }
        }
        let events = events.lock().expect("events").clone();
        // Each term's future is dropped before the next term begins.
        for pair in events.windows(2) {
            if pair[1].0 == "elected" {
                assert_eq!(pair[0].0, "first dropped", "{events:?}");
            }
        }
    })
    .await
}

/// A leader whose term ended while it was away (its lock expired; here
/// deleted, as the expiry would) cannot write the record any more: its
/// proclamation is refused, and followers read the successor's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_leader_cannot_proclaim() {
    lock_tests::bounded("a_stale_leader_cannot_proclaim", async move {
        let server = RedisServer::start();
        let old = LockClient::connect(&server.url()).await.expect("connect");
        let new = LockClient::connect(&server.url()).await.expect("connect");
        let mut stale = old.election("stale").campaign("old").await.expect("elected");
        let _: i64 = server.query(redis::cmd("DEL").arg("lock:{stale}:leader"));
        let successor = new
            .election("stale")
            .wait(Duration::from_secs(5))
            .campaign("new")
            .await
            .expect("elected after the expiry");
        let refused = stale.proclaim("old again").await;
        assert!(matches!(refused, Err(LockError::NotHeld { .. })), "{refused:?}");
        assert_eq!(stale.value(), "old", "a refused value is not this term's");
        let seen = leading(&old.election("stale")).await;
        assert_eq!((seen.value.as_str(), seen.epoch), ("new", successor.epoch()));
        // The old term's record is not read as the new leader's.
        let _: () = server.query(
            redis::cmd("SET")
                .arg("lock:{stale}:leader:value")
                .arg("someone-else\nforged"),
        );
        let seen = leading(&old.election("stale")).await;
        assert_eq!(
            seen.value, "",
            "a record of another holder is not the leader's value"
        );
        successor.resign().await.expect("resign");
    })
    .await
}

/// An `Election` is owned (`Clone`, `Send`, `'static`): a service keeps it
/// in its state or moves it into a task, and a `Leadership` moves with it.
#[test]
fn an_election_and_its_leadership_are_owned() {
    fn owned<T: Clone + Send + Sync + 'static>() {}
    fn movable<T: Send + 'static>() {}
    owned::<lock_runtime::Election>();
    movable::<lock_runtime::Leadership>();
}
