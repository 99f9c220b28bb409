//! WR: the cost of `replica_acks(1)`. W1 and W3 on a master with one
//! replica, with acknowledgement and without, on the same servers in
//! alternating rounds.

use super::*;

/// W1 and W3 with `replica_acks(1)`, then the same without, on a master
/// with one replica the bench starts; the ratio goes into each report.
pub(crate) async fn wr_replica_acks() -> Result<Vec<Report>, Error> {
    let group = lock_tests::Replicated::start_without_sentinels(1);
    let url = group.master.url();
    let acked = LockClient::builder().replica_acks(1).connect(&url).await?;
    let plain = LockClient::connect(&url).await?;
    let mut w1_plain = w1_on(&plain, "WR W1 one replica, no acks", SEQUENTIAL_PAIRS).await?;
    let mut w1_acked = w1_on(&acked, "WR W1 one replica, replica_acks(1)", SEQUENTIAL_PAIRS).await?;
    let ratio = w1_acked.percentile_us(0.50) / w1_plain.percentile_us(0.50);
    w1_acked.extra.push(("p50_ratio_to_no_acks", ratio));
    w1_plain.extra.push(("p50_ratio_to_no_acks", 1.0));
    let w3_plain = w3_on(plain, &url, "WR W3 one replica, no acks").await?;
    let mut w3_acked = w3_on(acked, &url, "WR W3 one replica, replica_acks(1)").await?;
    let ratio = w3_acked.per_second() / w3_plain.per_second();
    w3_acked.extra.push(("throughput_ratio_to_no_acks", ratio));
    Ok(vec![w1_plain, w1_acked, w3_plain, w3_acked])
}
