//! W6: 10,000 leases held with renewal: round trips and client CPU.

use super::*;

pub(crate) fn cpu_time() -> Duration {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
        tv(u.user_time()) + tv(u.system_time())
    })
}

/// W6: 10,000 locks held (ttl 3s) for 10s: renewal traffic and client CPU.
pub(crate) async fn w6_watchdog(url: &str, server: Option<&RedisServer>) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let acquires = (0..W6_LOCKS).map(|i| locks.lock(format!("w6:{i}")).ttl(W6_TTL).acquire());
    let guards: Vec<_> = futures_util::future::join_all(acquires)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let before = server.map(RedisServer::command_calls);
    let cpu_before = cpu_time();
    tokio::time::sleep(W6_HOLD).await;
    let cpu = cpu_time() - cpu_before;
    let after = server.map(RedisServer::command_calls);
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let round_trips = before
        .zip(after)
        .map(|(b, a)| commands_between(&b, &a).get("evalsha").copied().unwrap_or(0));
    // Each lease falls due once per renewal interval (ttl/3).
    let due = W6_LOCKS as f64 * W6_HOLD.as_secs_f64() / (W6_TTL.as_secs_f64() / 3.0);
    for guard in guards {
        guard.release().await?;
    }
    let round_trips = round_trips.map_or(f64::NAN, |n| n as f64);
    Ok(Report {
        workload: "W6 10k leases renewing for 10s",
        ops: W6_LOCKS,
        elapsed: W6_HOLD,
        extra: vec![
            ("renewal_round_trips_per_s", round_trips / W6_HOLD.as_secs_f64()),
            ("round_trips_per_100_due", round_trips / due * 100.0),
            (
                "client_cpu_ms_per_s",
                cpu.as_secs_f64() * 1e3 / W6_HOLD.as_secs_f64(),
            ),
            ("still_held", still_held as f64),
        ],
        ..Report::default()
    })
}
