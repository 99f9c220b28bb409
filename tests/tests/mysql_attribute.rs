//! `#[distributed_lock]` exactly as users write it, with the process-wide
//! client on MariaDB: the attribute is backend-blind, so the same function
//! locks through a table. One test: the global client is installed once per
//! process, and its connections belong to the runtime that made them.

use std::time::Duration;

use lock_runtime::LockClient;
use lock_tests::MariaDb;

mod shop;

#[test]
fn the_attribute_locks_through_the_table() {
    let server = MariaDb::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(lock_tests::bounded(
        "the_attribute_locks_through_the_table",
        async {
            // A loaded machine can keep MariaDB from answering within the
            // default second; this test is about the attribute, not that.
            let client = LockClient::builder()
                .command_timeout(std::time::Duration::from_secs(10))
                .mysql(&server.url())
                .await
                .expect("connect");
            lock_runtime::init(client.clone()).expect("installed once");
            shop::kinds_through_the_attribute(&client, shop::Offers::ALL).await;
            let sold = shop::sell_120_orders_of_100().await;
            assert_eq!(sold, 100, "120 orders for 100 items: exactly 100 sold");
            // Released on every path: nothing is left in the table.
            let left = server.value("SELECT COUNT(*) FROM distributed_locks").await;
            assert_eq!(left.as_deref(), Some("0"), "no row left behind");
            // Outside any lock, the fenced function takes its own lock.
            let token = tokio::time::timeout(Duration::from_secs(10), shop::audit(8))
                .await
                .expect("in time")
                .expect("lock");
            assert_eq!(token, Some(1));
        },
    ));
}
