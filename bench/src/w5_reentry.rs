//! W5: nested re-entry costs no command.

use super::*;

/// W5: nested acquire + release inside a held lock: no command at all.
pub(crate) async fn w5_reentry(url: &str, server: Option<&RedisServer>) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let (elapsed, sent) = locks
        .lock("w5")
        .run(async {
            let before = server.map(RedisServer::command_calls);
            let start = Instant::now();
            for _ in 0..W5_NESTED {
                locks.lock("w5").run(async {}).await?;
            }
            let elapsed = start.elapsed();
            let after = server.map(RedisServer::command_calls);
            let sent = before
                .zip(after)
                .map(|(b, a)| commands_between(&b, &a).values().sum::<u64>());
            Ok::<_, lock_runtime::LockError>((elapsed, sent))
        })
        .await??;
    Ok(Report {
        workload: "W5 nested re-entry",
        ops: W5_NESTED,
        elapsed,
        extra: vec![
            ("ns_per_pair", elapsed.as_nanos() as f64 / W5_NESTED as f64),
            ("commands_sent", sent.map_or(f64::NAN, |n| n as f64)),
        ],
        ..Report::default()
    })
}
