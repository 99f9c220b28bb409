//! `lockctl --etcd`: the built binary against an etcd member the harness
//! starts, while services' locks of every kind are held (and waited for)
//! in this process.

use std::process::Output;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode, LockRequest};
use lock_tests::Etcd;
use lock_tests::etcd::LEASE_TTL;
use serde_json::Value;

mod common;
use common::{BOUND, PasswordFrom, find, json_lines, lockctl_with_password};

/// Where the services' locks live: not the default, so `--etcd-root` is
/// what finds them.
const ROOT: &str = "/shop-locks";

fn lockctl(etcd: &Etcd, args: &[&str]) -> Output {
    let endpoints = etcd.endpoints().join(",");
    let mut all = vec!["--etcd", &endpoints, "--etcd-root", ROOT];
    all.extend_from_slice(args);
    lock_tests::output_within_limit(
        std::process::Command::new(env!("CARGO_BIN_EXE_lockctl")).args(&all),
        &format!("lockctl {}", args.join(" ")),
    )
}

async fn locks(etcd: &Etcd) -> LockClient {
    let endpoints = etcd.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    LockClient::builder()
        .etcd_root(ROOT)
        .etcd_lease_ttl(LEASE_TTL)
        .etcd(&endpoints)
        .await
        .expect("connect")
}

/// Until the line of `key` has `n` keys, holders and waiters.
async fn until_line_is(etcd: &Etcd, key: &str, n: usize) {
    let mut operator = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .expect("operator client");
    let line = format!("{ROOT}/lock:{{{key}}}/");
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let options = etcd_client::GetOptions::new().with_prefix().with_count_only();
        let count = operator
            .get(line.as_str(), Some(options))
            .await
            .map_or(0, |reply| reply.count());
        if usize::try_from(count).ok() == Some(n) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key}'s line never had {n} keys (last {count})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task waiting for the lock `request` asks for, that releases it once
/// it has it.
fn waiter<R>(locks: &LockClient, request: R) -> tokio::task::JoinHandle<Result<(), LockError>>
where
    R: for<'c> FnOnce(&'c LockClient) -> LockRequest<'c> + Send + 'static,
{
    let locks = locks.clone();
    tokio::spawn(async move {
        request(&locks)
            .wait(Duration::from_secs(60))
            .acquire()
            .await?
            .release()
            .await
    })
}

fn roles(lock: &Value) -> Vec<String> {
    lock["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| h["role"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_tell_holders_from_waiters_in_every_kind_of_line() {
    lock_tests::bounded(
        "list_and_inspect_tell_holders_from_waiters_in_every_kind_of_line",
        async move {
            let etcd = Etcd::start();
            let locks = locks(&etcd).await;
            let fenced = locks
                .lock("stock:1")
                .ttl(Duration::from_secs(30))
                .fencing(true)
                .acquire()
                .await
                .expect("free");
            let token = fenced.fencing_token().expect("a token was asked for");
            let stock_waiter = waiter(&locks, |l| l.lock("stock:1"));
            let read = || locks.lock("catalog").mode(LockMode::Read).acquire();
            let readers = [read().await.expect("read"), read().await.expect("read")];
            let writer = waiter(&locks, |l| l.lock("catalog").mode(LockMode::Write));
            let permit = || locks.lock("pool").permits(2).acquire();
            let permits = [permit().await.expect("permit"), permit().await.expect("permit")];
            let third = waiter(&locks, |l| l.lock("pool").permits(2));
            let segment = locks
                .lock("counter")
                .segments(4)
                .acquire()
                .await
                .expect("segment");
            let fair = locks.lock("queue").fair(true).acquire().await.expect("free");
            let fair_waiter = common::fair_waiter(&locks, "queue");
            for (key, n) in [("stock:1", 2), ("catalog", 3), ("pool", 3), ("queue", 2)] {
                until_line_is(&etcd, key, n).await;
            }

            let listed = json_lines(&lockctl(&etcd, &["--json", "list"]));
            let stock = find(&listed, "stock:1");
            assert_eq!(stock["kind"], "exclusive");
            assert_eq!(
                stock["fence"], token,
                "the holder's token: its key's create revision"
            );
            assert_eq!(
                (stock["waiters"].clone(), stock["in_line"].clone()),
                (true.into(), 1.into())
            );
            let left = stock["holders"][0]["time_left_ms"].as_u64().expect("an expiry");
            assert!(
                left > 0 && left <= LEASE_TTL.as_millis() as u64,
                "time left {left} ms of a {LEASE_TTL:?} etcd lease"
            );
            let catalog = find(&listed, "catalog");
            assert_eq!(catalog["kind"], "read-write");
            assert_eq!(
                roles(catalog),
                ["reader", "reader"],
                "the waiting writer is no holder"
            );
            assert_eq!(catalog["waiters"], true);
            let pool = find(&listed, "pool");
            assert_eq!(pool["kind"], "permits");
            assert_eq!(
                roles(pool),
                ["permit", "permit"],
                "the third in line waits: {pool}"
            );
            assert_eq!(pool["in_line"], 1);
            let seg = format!("counter#{}", segment.segment().expect("a segment"));
            assert_eq!(find(&listed, &seg)["kind"], "segment");
            let queue = find(&listed, "queue");
            assert_eq!(queue["kind"], "fair");
            assert_eq!(queue["in_line"], 1);
            assert_eq!(listed.len(), 5, "{listed:?}");

            // A Redis glob, with its `?` and `[…]`.
            let narrowed = json_lines(&lockctl(&etcd, &["--json", "list", "st?ck:[0-9]"]));
            assert_eq!(narrowed.len(), 1, "{narrowed:?}");
            assert_eq!(narrowed[0]["key"], "stock:1");
            assert!(json_lines(&lockctl(&etcd, &["--json", "list", "stock:[2-9]"])).is_empty());
            let unclosed = lockctl(&etcd, &["list", "stock:[1"]);
            assert_eq!(unclosed.status.code(), Some(1));
            assert!(String::from_utf8_lossy(&unclosed.stderr).contains("`[`"));

            let inspected = json_lines(&lockctl(&etcd, &["--json", "inspect", &seg]));
            assert_eq!(inspected[0]["held"], true);
            let free = json_lines(&lockctl(&etcd, &["--json", "inspect", "nothing:here"]));
            assert_eq!(free[0]["held"], false);

            // Every release hands over; once the waiters are through,
            // nothing is listed.
            fenced.release().await.expect("release");
            let [a, b] = readers;
            a.release().await.expect("release");
            b.release().await.expect("release");
            let [p, q] = permits;
            p.release().await.expect("release");
            q.release().await.expect("release");
            segment.release().await.expect("release");
            fair.release().await.expect("release");
            for waiting in [stock_waiter, writer, third, fair_waiter] {
                common::got_the_lock(waiting, "the waiter got the lock").await;
            }
            let listed = json_lines(&lockctl(&etcd, &["--json", "list"]));
            assert!(listed.is_empty(), "{listed:?}");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_force_stops_the_holder_hands_over_and_keeps_tokens_growing() {
    lock_tests::bounded(
        "unlock_force_stops_the_holder_hands_over_and_keeps_tokens_growing",
        async move {
            let etcd = Etcd::start();
            let other = locks(&etcd).await;
            common::a_stuck_holder_is_freed_by_force(locks(&etcd).await, &other, |args| lockctl(&etcd, args))
                .await;

            // A read-write lock loses every reader at once; a waiting
            // writer keeps its place and gets the lock.
            let reader = other
                .lock("catalog")
                .mode(LockMode::Read)
                .acquire()
                .await
                .expect("read");
            let writer = waiter(&other, |l| l.lock("catalog").mode(LockMode::Write));
            until_line_is(&etcd, "catalog", 2).await;
            let forced = json_lines(&lockctl(&etcd, &["--json", "unlock", "catalog", "--force"]));
            assert_eq!(forced[0]["freed"], true);
            common::got_the_lock(writer, "the writer got the lock").await;
            assert!(matches!(reader.release().await, Err(LockError::NotHeld { .. })));
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_acquisitions_and_releases() {
    lock_tests::bounded("watch_prints_acquisitions_and_releases", async move {
        let etcd = Etcd::start();
        let locks = locks(&etcd).await;
        let endpoints = etcd.endpoints().join(",");
        let target = ["--etcd", &endpoints, "--etcd-root", ROOT];
        common::watch_prints_the_lock_coming_and_going(&target, &locks, |holder| {
            assert!(!holder.is_empty(), "the acquisition names its holder");
        })
        .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_listed_with_its_leader_value_and_epoch() {
    lock_tests::bounded(
        "an_election_is_listed_with_its_leader_value_and_epoch",
        async move {
            let server = Etcd::start();
            let locks = locks(&server).await;
            common::an_election_is_listed_with_its_leader(&locks, |args| lockctl(&server, args)).await;
        },
    )
    .await
}

/// An etcd member that asks for client certificates (`--client-cert-auth`)
/// and authenticates users: `lockctl` lists a held lock given the CA
/// (`--tls-ca`), its certificate and key (`--etcd-cert`, `--etcd-key`) and
/// the user (`--etcd-user`), whose password (of every URL character) comes
/// from `LOCKCTL_PASSWORD` or `--password-file` and never shows; a wrong
/// one is refused, so is a user without a password and a password file
/// without a user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_etcd_is_read_with_a_certificate_and_a_user() {
    lock_tests::bounded(
        "a_secured_etcd_is_read_with_a_certificate_and_a_user",
        async move {
            let certs = tempfile::tempdir().expect("cert dir");
            lock_tests::make_certificates(certs.path());
            lock_tests::make_client_certificate(certs.path(), "lockctl");
            let path = |name: &str| certs.path().join(name);
            let ca_flag = format!("--trusted-ca-file={}", path("ca.crt").display());
            let etcd = Etcd::start_secured(
                Some((&path("server.crt"), &path("server.key"))),
                &["--client-cert-auth", &ca_flag],
            );
            let endpoints = etcd.endpoints();
            let password = "Zq7@/#?:%Wv3";
            let read = |name: &str| std::fs::read(path(name)).expect("read a certificate file");
            let tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt")))
                .identity(etcd_client::Identity::from_pem(
                    read("lockctl.crt"),
                    read("lockctl.key"),
                ));
            let options = etcd_client::ConnectOptions::new().with_tls(tls);
            let mut admin = etcd_client::Client::connect(&endpoints, Some(options))
                .await
                .expect("connect as the administrator");
            admin
                .user_add("root", "root-secret", None)
                .await
                .expect("add root");
            admin.user_grant_role("root", "root").await.expect("root is root");
            admin.user_add("ops", password, None).await.expect("add ops");
            admin
                .user_grant_role("ops", "root")
                .await
                .expect("ops may read the locks");
            admin.auth_enable().await.expect("auth enable");

            let endpoint_list: Vec<&str> = endpoints.iter().map(String::as_str).collect();
            let locks = LockClient::builder()
                .etcd_root(ROOT)
                .etcd_lease_ttl(LEASE_TTL)
                .tls_root_certificate(read("ca.crt"))
                .etcd_client_certificate(read("lockctl.crt"), read("lockctl.key"))
                .etcd_user("ops", password)
                .etcd(&endpoint_list)
                .await
                .expect("a service's client");
            let guard = locks.lock("secured").acquire().await.expect("free");

            let (ca, cert, key) = (path("ca.crt"), path("lockctl.crt"), path("lockctl.key"));
            let joined = endpoints.join(",");
            let mut args = vec!["--json", "list", "--etcd", &joined, "--etcd-root", ROOT];
            args.extend(["--tls-ca", ca.to_str().expect("utf-8 path")]);
            args.extend(["--etcd-cert", cert.to_str().expect("utf-8 path")]);
            args.extend(["--etcd-key", key.to_str().expect("utf-8 path")]);
            let without_user = args.clone();
            args.extend(["--etcd-user", "ops"]);
            common::takes_the_password_and_refuses_a_wrong_one(
                &args,
                password,
                "secured",
                "refused user `ops`",
            );

            let dir = tempfile::tempdir().expect("a directory for the password file");
            let no_password = lock_tests::output_within_limit(
                std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
                    .args(&args)
                    .env_remove("LOCKCTL_PASSWORD"),
                "lockctl without a password",
            );
            assert!(!no_password.status.success());
            assert!(String::from_utf8_lossy(&no_password.stderr).contains("--password-file"));
            let no_user = lockctl_with_password(&without_user, password, PasswordFrom::File, dir.path());
            assert!(!no_user.status.success());
            assert!(String::from_utf8_lossy(&no_user.stderr).contains("--etcd-user"));
            guard.release().await.expect("release");
        },
    )
    .await
}
