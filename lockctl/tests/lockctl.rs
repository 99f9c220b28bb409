//! `lockctl` run as an operator runs it: the built binary, against real
//! servers the harness starts, while services' locks are held in this
//! process.

use std::process::Output;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode};
use lock_tests::{Cluster, RedisServer, Replicated, start_masters, until_waiting};

mod common;
use common::{BOUND, find, json_lines, stdout, takes_the_password_and_refuses_a_wrong_one};

fn lockctl(args: &[&str]) -> Output {
    lock_tests::output_within_limit(
        std::process::Command::new(env!("CARGO_BIN_EXE_lockctl")).args(args),
        &format!("lockctl {}", args.join(" ")),
    )
}

fn holder_of(server: &RedisServer, key: &str) -> String {
    server.query::<String>(redis::cmd("GET").arg(format!("lock:{{{key}}}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_each_kind_with_its_holders_time_left_fence_and_waiters() {
    lock_tests::bounded(
        "list_shows_each_kind_with_its_holders_time_left_fence_and_waiters",
        async move {
            let server = RedisServer::start();
            let url = server.url();
            let locks = LockClient::connect(&url).await.expect("connect");
            let fenced = locks
                .lock("stock:1")
                .ttl(Duration::from_secs(30))
                .fencing(true)
                .acquire()
                .await
                .expect("free");
            let token = fenced.fencing_token().expect("a token was asked for");
            let reader_a = locks
                .lock("catalog")
                .mode(LockMode::Read)
                .acquire()
                .await
                .expect("read");
            let reader_b = locks
                .lock("catalog")
                .mode(LockMode::Read)
                .acquire()
                .await
                .expect("read");
            let permit = locks.lock("pool").permits(3).acquire().await.expect("permit");
            let segment = locks
                .lock("counter")
                .segments(4)
                .acquire()
                .await
                .expect("segment");
            // A waiter marks the fenced lock.
            let waiter = {
                let locks = locks.clone();
                tokio::spawn(async move {
                    locks
                        .lock("stock:1")
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .await
                })
            };
            until_waiting(&server, "stock:1").await;

            let listed = json_lines(&lockctl(&["--url", &url, "--json", "list"]));
            let stock = find(&listed, "stock:1");
            assert_eq!(stock["kind"], "exclusive");
            assert_eq!(stock["fence"], token);
            assert_eq!(stock["waiters"], true);
            assert_eq!(
                stock["holders"][0]["id"].as_str().map(|id| format!("{id}+w")),
                Some(holder_of(&server, "stock:1"))
            );
            let left = stock["holders"][0]["time_left_ms"].as_u64().expect("an expiry");
            assert!(left > 0 && left <= 30_000, "time left {left} ms of a 30 s lease");
            let catalog = find(&listed, "catalog");
            assert_eq!(catalog["kind"], "read-write");
            assert_eq!(catalog["holders"].as_array().map(Vec::len), Some(2));
            assert!(
                catalog["holders"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|h| h["role"] == "reader")
            );
            assert_eq!(find(&listed, "pool")["kind"], "permits");
            let seg = format!("counter#{}", segment.segment().expect("a segment"));
            assert_eq!(find(&listed, &seg)["kind"], "segment");
            assert_eq!(
                listed.len(),
                4,
                "no fence counter or other key listed as a lock: {listed:?}"
            );

            // A pattern narrows the list; the text table names the same locks.
            let narrowed = json_lines(&lockctl(&["--url", &url, "--json", "list", "stock:*"]));
            assert_eq!(narrowed.len(), 1);
            let table = stdout(&lockctl(&["--url", &url, "list"]));
            for key in ["stock:1", "catalog", "pool", &seg] {
                assert!(table.contains(key), "{key} missing from\n{table}");
            }
            assert!(
                table.lines().next().is_some_and(|h| h.starts_with("KEY")),
                "{table}"
            );

            // Inspect one lock, and one that is free.
            let inspected = json_lines(&lockctl(&["--url", &url, "--json", "inspect", "catalog"]));
            assert_eq!(inspected[0]["held"], true);
            assert_eq!(
                inspected[0]["locks"][0]["holders"].as_array().map(Vec::len),
                Some(2)
            );
            let free = json_lines(&lockctl(&["--url", &url, "--json", "inspect", "nothing:here"]));
            assert_eq!(free[0]["held"], false);

            for guard in [fenced, reader_a, reader_b, permit, segment] {
                guard.release().await.expect("release");
            }
            let taken = tokio::time::timeout(BOUND, waiter)
                .await
                .expect("the waiter got the lock");
            taken
                .expect("join")
                .expect("acquired")
                .release()
                .await
                .expect("release");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_force_is_seen_as_lost_by_the_running_holder_and_wakes_a_waiter() {
    lock_tests::bounded(
        "unlock_force_is_seen_as_lost_by_the_running_holder_and_wakes_a_waiter",
        async move {
            let server = RedisServer::start();
            let url = server.url();
            let holder = LockClient::connect(&url).await.expect("connect");
            let waiter = LockClient::connect(&url).await.expect("connect");
            let (running, stuck_token) = common::stuck_holder(holder, "stuck-job").await;
            let waiting = tokio::spawn(async move {
                let guard = waiter
                    .lock("stuck-job")
                    .fencing(true)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await?;
                let token = guard.fencing_token();
                guard.release().await.map(|()| token)
            });
            until_waiting(&server, "stuck-job").await;
            let mut announcements = server.sync_connection().expect("connect");
            let mut announcements = announcements.as_pubsub();
            announcements
                .subscribe("lock:{stuck-job}:released")
                .expect("subscribe");
            announcements.set_read_timeout(Some(BOUND)).expect("read timeout");

            // Without --force nothing happens.
            let refused = lockctl(&["--url", &url, "unlock", "stuck-job"]);
            assert_eq!(refused.status.code(), Some(2));
            assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"));
            assert!(!holder_of(&server, "stuck-job").is_empty());

            let forced = json_lines(&lockctl(&[
                "--url",
                &url,
                "--json",
                "unlock",
                "stuck-job",
                "--force",
            ]));
            assert_eq!(forced[0]["freed"], true);
            // Announced as a writer's release, which wakes every waiter of a
            // process: none of them sleeps until its poll.
            let announced: String = announcements
                .get_message()
                .expect("the forced unlock was announced")
                .get_payload()
                .expect("a text payload");
            assert_eq!(announced, "w:forced");
            drop(announcements);
            common::expect_taken_over(running).await;
            let next_token = tokio::time::timeout(BOUND, waiting)
                .await
                .expect("the waiter got the lock")
                .expect("join")
                .expect("acquired and released")
                .expect("a token was asked for");
            assert!(
                next_token > stuck_token,
                "the fence counter went back: {next_token} after {stuck_token}"
            );

            let again = json_lines(&lockctl(&[
                "--url",
                &url,
                "--json",
                "unlock",
                "stuck-job",
                "--force",
            ]));
            assert_eq!(again[0]["freed"], false, "nothing left to free");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_this_library_did_not_write_is_never_freed() {
    lock_tests::bounded("a_key_this_library_did_not_write_is_never_freed", async move {
        let server = RedisServer::start();
        server.query::<()>(redis::cmd("SET").arg("lock:{foreign}").arg("not a holder"));
        let refused = lockctl(&["--url", &server.url(), "unlock", "foreign", "--force"]);
        assert_eq!(refused.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&refused.stderr).contains("lock:{foreign}"));
        assert_eq!(holder_of(&server, "foreign"), "not a holder");
        // Bad input is a clear error, not a panic.
        let braces = lockctl(&["--url", &server.url(), "inspect", "a{b}"]);
        assert_eq!(braces.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&braces.stderr).contains("brace"));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_or_error_shows_a_password() {
    lock_tests::bounded("no_output_or_error_shows_a_password", async move {
        let password = "s3cret-Pa55";
        let server = RedisServer::start_with_password(password);
        let url = server.url_with_password();
        let locks = LockClient::connect(&url).await.expect("connect");
        let guard = locks.lock("private").acquire().await.expect("free");
        for args in [vec!["list"], vec!["--json", "list"], vec!["inspect", "private"]] {
            let mut all = vec!["--url", url.as_str()];
            all.extend(args);
            let out = stdout(&lockctl(&all));
            assert!(out.contains("private"), "{out}");
            assert!(!out.contains(password), "password shown: {out}");
        }
        let wrong = format!("redis://:wrong-{password}@127.0.0.1:{}/", server.port());
        let refused = lockctl(&["--url", &wrong, "list"]);
        assert_eq!(refused.status.code(), Some(1));
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!message.contains(password), "password shown: {message}");
        guard.release().await.expect("release");
    })
    .await
}

/// On a cluster, `list` reads every master (an election's term included,
/// wherever its slot is), and `unlock --force` finds the key's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_list_covers_every_master() {
    lock_tests::bounded("on_a_cluster_list_covers_every_master", async move {
        let cluster = Cluster::start(3, 0);
        let urls = cluster.urls();
        let locks = LockClient::cluster(&urls).await.expect("connect");
        // Keys until every master holds one.
        let mut guards = Vec::new();
        let mut masters = std::collections::BTreeSet::new();
        for i in 0.. {
            let key = format!("job:{i}");
            if masters.insert(cluster.master_of(&format!("lock:{{{key}}}"))) {
                guards.push((key.clone(), locks.lock(key).acquire().await.expect("free")));
            }
            if masters.len() == 3 {
                break;
            }
        }
        let seeds = urls.join(",");
        let listed = json_lines(&lockctl(&["--cluster", &seeds, "--json", "list"]));
        assert_eq!(listed.len(), 3, "{listed:?}");
        let nodes: std::collections::BTreeSet<&str> =
            listed.iter().filter_map(|l| l["node"].as_str()).collect();
        assert_eq!(nodes.len(), 3, "one lock per master: {listed:?}");
        let (key, _) = &guards[0];
        let forced = json_lines(&lockctl(&[
            "--cluster",
            &seeds,
            "--json",
            "unlock",
            key,
            "--force",
        ]));
        assert_eq!(forced[0]["freed"], true);
        assert_eq!(
            json_lines(&lockctl(&["--cluster", &seeds, "--json", "list"])).len(),
            2
        );
        // An election's term, on whichever master holds its slot.
        common::an_election_is_listed_with_its_leader(&locks, |args| {
            let mut all = vec!["--cluster", seeds.as_str()];
            all.extend_from_slice(args);
            lockctl(&all)
        })
        .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redlock_each_master_shows_its_copy_and_unlock_frees_them_all() {
    lock_tests::bounded(
        "on_a_redlock_each_master_shows_its_copy_and_unlock_frees_them_all",
        async move {
            let masters = start_masters(3);
            let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
            let locks = LockClient::redlock(&urls).await.expect("connect");
            let guard = locks.lock("report").acquire().await.expect("free");
            // A Redlock acquisition returns once a majority granted it; the third
            // master's grant may still be on its way.
            let on_every_master = lock_tests::eventually(Duration::from_secs(5), || {
                masters
                    .iter()
                    .all(|m| m.query::<i64>(redis::cmd("EXISTS").arg("lock:{report}")) == 1)
            })
            .await;
            assert!(
                on_every_master.is_some(),
                "the lock never reached every master: {:?}",
                masters
                    .iter()
                    .map(|m| m.query::<Vec<String>>(redis::cmd("KEYS").arg("*")))
                    .collect::<Vec<_>>()
            );
            let joined = urls.join(",");
            let listed = json_lines(&lockctl(&["--redlock", &joined, "--json", "list"]));
            assert_eq!(listed.len(), 3, "one row per master: {listed:?}");
            // As docs/operations.md writes it, the subcommand right after
            // the URLs (which once took it for one more URL), and the URLs
            // given one by one.
            let shown = stdout(&lockctl(&["--redlock", &joined, "inspect", "report"]));
            assert!(shown.contains("report"), "{shown}");
            let mut one_by_one: Vec<&str> = urls.iter().flat_map(|u| ["--redlock", u.as_str()]).collect();
            one_by_one.extend(["--json", "list"]);
            assert_eq!(json_lines(&lockctl(&one_by_one)).len(), 3);
            let forced = json_lines(&lockctl(&[
                "--redlock",
                &joined,
                "--json",
                "unlock",
                "report",
                "--force",
            ]));
            assert_eq!(forced[0]["nodes"], 3);
            assert!(json_lines(&lockctl(&["--redlock", &joined, "--json", "list"])).is_empty());
            assert!(matches!(guard.release().await, Err(LockError::NotHeld { .. })));
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_acquisitions_and_releases() {
    lock_tests::bounded("watch_prints_acquisitions_and_releases", async move {
        let server = RedisServer::start();
        let url = server.url();
        let locks = LockClient::connect(&url).await.expect("connect");
        common::watch_prints_the_lock_coming_and_going(&["--url", &url], &locks, |holder| {
            assert_eq!(holder, holder_of(&server, "watched"));
        })
        .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_shows_its_line_and_a_forced_unlock_hands_it_to_the_first_waiter() {
    lock_tests::bounded(
        "a_fair_lock_shows_its_line_and_a_forced_unlock_hands_it_to_the_first_waiter",
        async move {
            let server = RedisServer::start();
            let url = server.url();
            let locks = LockClient::connect(&url).await.expect("connect");
            let held = locks.lock("queue").fair(true).acquire().await.expect("free");
            let waiter = common::fair_waiter(&locks, "queue");
            until_waiting(&server, "queue").await;
            let listed = json_lines(&lockctl(&["--url", &url, "--json", "list"]));
            let queue = find(&listed, "queue");
            assert_eq!(queue["kind"], "fair");
            assert_eq!(queue["in_line"], 1);
            assert_eq!(queue["waiters"], true);

            let first_in_line: Vec<String> =
                server.query(redis::cmd("ZRANGE").arg("lock:{queue}:line").arg(0).arg(0));
            let mut announcements = server.sync_connection().expect("connect");
            let mut announcements = announcements.as_pubsub();
            announcements
                .subscribe("lock:{queue}:released")
                .expect("subscribe");
            announcements.set_read_timeout(Some(BOUND)).expect("read timeout");

            let forced = json_lines(&lockctl(&["--url", &url, "--json", "unlock", "queue", "--force"]));
            assert_eq!(forced[0]["freed"], true);
            // The forced release names the first in line, as a release does: that
            // waiter alone is woken.
            let announced: String = announcements
                .get_message()
                .expect("the forced unlock was announced")
                .get_payload()
                .expect("a text payload");
            assert_eq!(Some(&announced), first_in_line.first());
            drop(announcements);
            common::got_the_lock(waiter, "the first in line got the lock").await;
            assert!(matches!(held.release().await, Err(LockError::NotHeld { .. })));
        },
    )
    .await
}

/// Through Sentinel, `lockctl` reads the master the sentinels name: its
/// locks and its elections' terms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_it_reads_the_master_the_sentinels_name() {
    lock_tests::bounded(
        "through_sentinel_it_reads_the_master_the_sentinels_name",
        async move {
            let replicated = Replicated::start(1);
            let urls = replicated.sentinel_urls();
            let locks = LockClient::sentinel(lock_tests::sentinel::MASTER_NAME, &urls)
                .await
                .expect("connect");
            let guard = locks.lock("failover-safe").acquire().await.expect("free");
            let target = format!("{}@{}", lock_tests::sentinel::MASTER_NAME, urls.join(","));
            let listed = json_lines(&lockctl(&["--sentinel", &target, "--json", "list"]));
            assert_eq!(listed.len(), 1, "{listed:?}");
            assert_eq!(listed[0]["key"], "failover-safe");
            let bad = lockctl(&["--sentinel", "no-at-sign", "list"]);
            assert_eq!(bad.status.code(), Some(1));
            assert!(String::from_utf8_lossy(&bad.stderr).contains("NAME@URL"));
            guard.release().await.expect("release");
            common::an_election_is_listed_with_its_leader(&locks, |args| {
                let mut all = vec!["--sentinel", target.as_str()];
                all.extend_from_slice(args);
                lockctl(&all)
            })
            .await;
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_listed_with_its_leader_value_and_epoch() {
    lock_tests::bounded(
        "an_election_is_listed_with_its_leader_value_and_epoch",
        async move {
            let server = RedisServer::start();
            let url = server.url();
            let locks = LockClient::connect(&url).await.expect("connect");
            common::an_election_is_listed_with_its_leader(&locks, |args| {
                let mut all = vec!["--url", url.as_str()];
                all.extend_from_slice(args);
                lockctl(&all)
            })
            .await;
        },
    )
    .await
}

/// The password comes from `LOCKCTL_PASSWORD` or `--password-file` (an
/// argument shows in `ps`), whatever URL characters it holds; a wrong one
/// fails with a clear error, and no run shows any piece of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_come_from_the_environment_or_a_file_and_never_show() {
    lock_tests::bounded(
        "passwords_come_from_the_environment_or_a_file_and_never_show",
        async move {
            for password in lock_tests::secrets::url_passwords() {
                let server = RedisServer::start_with_password(&password);
                let locks = LockClient::connect(&server.url_with_password())
                    .await
                    .expect("connect");
                let held = locks.lock("stock:1").acquire().await.expect("free");
                let url = format!("redis://default@127.0.0.1:{}/", server.port());
                // One node, and the same server as a Redlock of one.
                for target in ["--url", "--redlock"] {
                    let args = [target, url.as_str(), "--json", "list"];
                    takes_the_password_and_refuses_a_wrong_one(
                        &args,
                        &password,
                        "stock:1",
                        "refused the credentials",
                    );
                }
                // A password in the URL as well is refused, not replaced.
                let both = format!("redis://default:other@127.0.0.1:{}/", server.port());
                let dir = tempfile::tempdir().expect("a directory for the password file");
                let out = common::lockctl_with_password(
                    &["--url", both.as_str(), "list"],
                    &password,
                    common::PasswordFrom::Environment,
                    dir.path(),
                );
                let said = String::from_utf8_lossy(&out.stderr);
                assert!(said.contains("holds a password already"), "{said}");
                held.release().await.expect("release");
            }
        },
    )
    .await
}

/// `--cluster` and `--sentinel` take the password from `LOCKCTL_PASSWORD`
/// or `--password-file` too, for every seed or sentinel (a password of
/// every URL character: the cluster's, and the Sentinel group's lock
/// user's on its sentinels and master); a wrong one is refused, and none
/// shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_and_sentinel_passwords_come_from_the_environment_or_a_file() {
    lock_tests::bounded(
        "cluster_and_sentinel_passwords_come_from_the_environment_or_a_file",
        async move {
            let password = lock_tests::secrets::url_passwords()
                .pop()
                .expect("a password of every URL character");
            let cluster = Cluster::start_with_password(3, &password);
            let locks = LockClient::cluster(cluster.urls_with_password())
                .await
                .expect("connect");
            let held = locks.lock("stock:1").acquire().await.expect("free");
            let seeds: Vec<String> = cluster
                .nodes
                .iter()
                .map(|node| format!("redis://default@127.0.0.1:{}/", node.port()))
                .collect();
            let seeds = seeds.join(",");
            takes_the_password_and_refuses_a_wrong_one(
                &["--cluster", &seeds, "--json", "list"],
                &password,
                "stock:1",
                "refused the credentials",
            );
            held.release().await.expect("release");

            // The lock user of a Sentinel group (on the sentinels and the
            // master), which may read a lock but not list them (`SCAN`).
            let group = Replicated::start_named_with_lock_user_password(0, &password);
            let locks =
                LockClient::sentinel(lock_tests::sentinel::MASTER_NAME, group.lock_user_sentinel_urls())
                    .await
                    .expect("connect");
            let held = locks.lock("stock:2").acquire().await.expect("free");
            let sentinels: Vec<String> = group
                .lock_user_sentinel_urls()
                .iter()
                .map(|url| {
                    let written = format!(":{}@", lock_tests::percent_encode(&password));
                    assert!(url.contains(&written), "no password in {url}");
                    url.replace(&written, "@")
                })
                .collect();
            let target = format!("{}@{}", lock_tests::sentinel::MASTER_NAME, sentinels.join(","));
            takes_the_password_and_refuses_a_wrong_one(
                &["--sentinel", &target, "--json", "inspect", "stock:2"],
                &password,
                "stock:2",
                "refused the credentials",
            );
            // The wrong passwords stop at the sentinels: the master's audit
            // on drop still fails the test if it refused `inspect` anything.
            held.release().await.expect("release");
        },
    )
    .await
}
