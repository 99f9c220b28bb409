//! W4: Redis Cluster and Redlock.

use super::*;

/// W4: the W1 shape on Redlock (3 and 5 masters) and on a cluster of 3
/// masters + 3 replicas, and W3 on 3 masters; all started here. rslock
/// runs W1 and W3 on the same 3 masters.
pub(crate) async fn w4_scale_out() -> Result<Vec<Report>, Error> {
    const PAIRS: usize = 5_000;
    let three = lock_tests::start_masters(3);
    let five = lock_tests::start_masters(5);
    let cluster = lock_tests::Cluster::start(3, 1);
    let urls = |masters: &[RedisServer]| masters.iter().map(RedisServer::url).collect::<Vec<_>>();
    let redlock3 = LockClient::redlock(urls(&three)).await?;
    let redlock5 = LockClient::redlock(urls(&five)).await?;
    let clustered = LockClient::cluster(cluster.urls()).await?;
    let data = RedisServer::start();
    Ok(vec![
        w1_on(&redlock3, "W4 Redlock N=3 acquire+release", PAIRS).await?,
        w1_on(&redlock5, "W4 Redlock N=5 acquire+release", PAIRS).await?,
        w1_on(&clustered, "W4 Cluster acquire+release", PAIRS).await?,
        w3_on(
            redlock3,
            &data.url(),
            "W4 Redlock N=3, 16 tasks x 1 key, increments",
        )
        .await?,
        // The peer on the same three masters.
        w1_locker(
            &rslock(urls(&three)),
            "WP4 rslock Redlock N=3 acquire+release",
            PAIRS,
        )
        .await?,
        w3_locker(
            rslock(urls(&three)),
            &data.url(),
            "WP4 rslock Redlock N=3, 16 tasks x 1 key, increments",
        )
        .await?,
    ])
}
