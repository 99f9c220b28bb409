//! The etcd test servers themselves (`lock_tests::Etcd`): `etcd` from
//! Debian's `etcd-server`, one member alone or three in a cluster, on free
//! loopback ports in fresh directories, killed, restarted, paused and
//! stopped as the etcd backend's tests and the fault scenarios will need.
//! Read and written through `etcd-client`, the driver the backend is to use.

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use lock_tests::Etcd;
use lock_tests::etcd::healthy;

async fn connect(endpoints: &[String]) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Client::connect(endpoints, Some(options))
        .await
        .expect("connect to the test etcd")
}

async fn value(client: &mut Client, key: &str) -> Option<String> {
    let reply = client.get(key, None).await.expect("get");
    reply
        .kvs()
        .first()
        .map(|kv| kv.value_str().expect("utf-8").to_owned())
}

/// A member alone keeps what it committed across a kill and a restart on
/// the same ports, and a stopped member answers nothing until resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_alone_keeps_its_keys_across_a_kill_and_answers_nothing_while_paused() {
    lock_tests::bounded(
        "a_member_alone_keeps_its_keys_across_a_kill_and_answers_nothing_while_paused",
        async move {
            let mut etcd = Etcd::start();
            assert_eq!(etcd.len(), 1);
            let mut client = connect(&etcd.endpoints()).await;
            client.put("kept", "1", None).await.expect("put");

            tokio::task::block_in_place(|| etcd.kill(0));
            assert!(!etcd.is_running(0));
            assert!(!healthy(etcd.port(0)), "a killed member answers nothing");
            tokio::task::block_in_place(|| etcd.revive(0));
            let mut client = connect(&etcd.endpoints()).await;
            assert_eq!(value(&mut client, "kept").await.as_deref(), Some("1"));

            etcd.pause(0);
            let stalled = tokio::time::timeout(Duration::from_millis(500), client.get("kept", None)).await;
            assert!(stalled.is_err(), "a stopped member answered: {stalled:?}");
            etcd.resume(0);
            assert_eq!(value(&mut client, "kept").await.as_deref(), Some("1"));
        },
    )
    .await
}

/// Three members form one cluster: a write through one is read through
/// another, and with any one member killed the other two still commit;
/// the killed member rejoins with what it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_commits_with_any_one_member_down_and_the_member_catches_up() {
    lock_tests::bounded(
        "a_cluster_commits_with_any_one_member_down_and_the_member_catches_up",
        async move {
            let mut etcd = Etcd::cluster();
            assert_eq!(etcd.len(), 3);
            let endpoints = etcd.endpoints();
            let mut first = connect(&endpoints[..1]).await;
            first.put("k", "0", None).await.expect("put through member 0");
            let mut third = connect(&endpoints[2..]).await;
            assert_eq!(value(&mut third, "k").await.as_deref(), Some("0"));

            for down in 0..3 {
                tokio::task::block_in_place(|| etcd.kill(down));
                let up: Vec<String> = (0..3)
                    .filter(|&i| i != down)
                    .map(|i| endpoints[i].clone())
                    .collect();
                let mut client = connect(&up).await;
                let written = format!("{}", down + 1);
                // A killed leader is replaced within a few election timeouts;
                // until then a write may fail, and is tried again.
                let deadline = Instant::now() + Duration::from_secs(30);
                let committed = loop {
                    match client.put("k", written.as_str(), None).await {
                        Ok(_) => break Ok(()),
                        Err(e) if Instant::now() > deadline => break Err(e),
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                };
                committed.unwrap_or_else(|e| panic!("no commit with member {down} down: {e}"));
                tokio::task::block_in_place(|| etcd.revive(down));
                let mut revived = connect(&endpoints[down..=down]).await;
                assert_eq!(value(&mut revived, "k").await.as_deref(), Some(written.as_str()));
            }
        },
    )
    .await
}
