//! `#[distributed_lock]` exactly as users write it, with the process-wide
//! client on ZooKeeper: the attribute is backend-blind, so the same function
//! locks through a queue of znodes. One test: the global client is
//! installed once per process, and its session belongs to the runtime that
//! made it.

use std::time::Duration;

use lock_runtime::LockClient;
use lock_tests::ZooKeeper;

mod shop;

#[test]
fn the_attribute_locks_through_zookeeper() {
    let server = ZooKeeper::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(lock_tests::bounded(
        "the_attribute_locks_through_zookeeper",
        async {
            let client = LockClient::zookeeper(&server.connect_string())
                .await
                .expect("connect");
            lock_runtime::init(client.clone()).expect("installed once");
            shop::kinds_through_the_attribute(&client, shop::Offers::ALL).await;
            let sold = shop::sell_120_orders_of_100().await;
            assert_eq!(sold, 100, "120 orders for 100 items: exactly 100 sold");
            // Released on every path: the queue is empty.
            let inspect = zookeeper_client::Client::connect(&server.connect_string())
                .await
                .expect("inspecting session");
            let left = inspect
                .list_children("/distributed-locks/lock:{stock:7}")
                .await
                .expect("the queue");
            assert!(left.is_empty(), "children left behind: {left:?}");
            // Outside any lock, the fenced function takes its own lock.
            let token = tokio::time::timeout(Duration::from_secs(10), shop::audit(8))
                .await
                .expect("in time")
                .expect("lock");
            // The creation zxid of the lock's node: some positive number.
            assert!(token.is_some_and(|t| t > 0), "{token:?}");
        },
    ));
}
