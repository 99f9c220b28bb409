//! W1a: where one uncontended acquire+release pair's time goes, for the
//! library and for the floor, on the same server in one run: the commands
//! the server ran (with the commands scripts ran inside them), its time in
//! each, the reads it served (a read per round trip: a pipelined batch
//! arrives in one), the bytes each way, and the client's CPU time and
//! allocations. The figures are counted, not timed per pair: a pair
//! is too short to time its parts without changing them.

use std::collections::BTreeMap;

use super::*;

/// Pairs per side: enough that the client's CPU time (read from the
/// kernel in nanoseconds) and the server's (in microseconds) are exact to
/// a few per cent.
const PAIRS: usize = 5_000;

/// What the server and the client spent on `PAIRS` pairs.
struct Spent {
    elapsed: Duration,
    latencies: Vec<Duration>,
    /// Per command: (calls, µs of server time).
    commands: BTreeMap<String, (u64, u64)>,
    reads: u64,
    bytes_in: u64,
    bytes_out: u64,
    cpu: Duration,
    /// The server's CPU time (`INFO cpu`): commands, reads, writes and the
    /// event loop.
    server_cpu: Duration,
    allocations: u64,
    allocated_bytes: u64,
}

/// `INFO commandstats`: per command, its calls and its µs, without the
/// commands the measuring itself sends.
pub(crate) async fn command_stats(
    conn: &mut MultiplexedConnection,
) -> Result<BTreeMap<String, (u64, u64)>, Error> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    Ok(info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let field = |key: &str| {
                rest.split(',')
                    .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))?
                    .parse::<u64>()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat"))
        .collect())
}

/// One field of `INFO stats`.
fn stat(info: &str, key: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `pairs` and counts what they cost: the server's counters are reset
/// before, the client's are read before and after.
async fn account<F, Fut>(conn: &mut MultiplexedConnection, mut pair: F) -> Result<Spent, Error>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    // Warm: connections made, scripts loaded, statements cached.
    for i in 0..100 {
        pair(i).await?;
    }
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(conn).await?;
    let server_before = server_cpu(conn).await?;
    let mut latencies = Vec::with_capacity(PAIRS);
    let (cpu, allocated, start) = (cpu_time(), allocations::start(), Instant::now());
    for i in 0..PAIRS {
        let t = Instant::now();
        pair(i).await?;
        latencies.push(t.elapsed());
    }
    let elapsed = start.elapsed();
    let (cpu, allocated) = (cpu_time() - cpu, allocations::stop() - allocated);
    let server_cpu = server_cpu(conn).await?.saturating_sub(server_before);
    let stats: String = redis::cmd("INFO").arg("stats").query_async(conn).await?;
    Ok(Spent {
        elapsed,
        latencies,
        commands: command_stats(conn).await?,
        // Less the measuring's own: two INFO cpu and this INFO.
        reads: stat(&stats, "total_reads_processed").saturating_sub(3),
        bytes_in: stat(&stats, "total_net_input_bytes"),
        bytes_out: stat(&stats, "total_net_output_bytes"),
        cpu,
        server_cpu,
        allocations: (allocated.allocations + allocated.reallocations) as u64,
        allocated_bytes: allocated.bytes_allocated as u64,
    })
}

impl Spent {
    /// One JSON line per command, then the pair's totals as a report.
    fn report(self, workload: &'static str) -> Report {
        let per_pair = |n: u64| n as f64 / PAIRS as f64;
        for (command, (calls, usec)) in &self.commands {
            println!(
                "{{\"workload\":\"{workload}\",\"command\":\"{command}\",\"calls_per_pair\":{:.2},\"us_per_call\":{:.2}}}",
                per_pair(*calls),
                *usec as f64 / (*calls).max(1) as f64,
            );
        }
        // A script's calls and time include those of the commands it ran,
        // which are listed (and counted here) too.
        let calls: u64 = self.commands.values().map(|(calls, _)| calls).sum();
        Report {
            workload,
            ops: PAIRS,
            elapsed: self.elapsed,
            extra: vec![
                ("commands_per_pair_scripts_inner_too", per_pair(calls)),
                ("round_trips_per_pair", per_pair(self.reads)),
                (
                    "server_cpu_us_per_pair",
                    self.server_cpu.as_secs_f64() * 1e6 / PAIRS as f64,
                ),
                ("bytes_in_per_pair", per_pair(self.bytes_in)),
                ("bytes_out_per_pair", per_pair(self.bytes_out)),
                (
                    "client_cpu_us_per_pair",
                    self.cpu.as_secs_f64() * 1e6 / PAIRS as f64,
                ),
                ("allocations_per_pair", per_pair(self.allocations)),
                ("allocated_bytes_per_pair", per_pair(self.allocated_bytes)),
            ],
            latencies: self.latencies,
        }
    }
}

/// W1a on the server at `url`: the floor's pairs, then the library's.
pub(crate) async fn w1_accounting(url: &str) -> Result<Vec<Report>, Error> {
    let mut stats = raw_connection(url).await?;
    let conn = raw_connection(url).await?;
    let release = Arc::new(redis::Script::new(COMPARE_AND_DELETE));
    let floor = account(&mut stats, |i| {
        let (mut conn, release) = (conn.clone(), Arc::clone(&release));
        async move { floor_pair(&mut conn, &release, "w1a:floor", &format!("floor:{i}")).await }
    })
    .await?;
    let locks = LockClient::connect(url).await?;
    let library = account(&mut stats, |_| {
        let locks = locks.clone();
        async move {
            locks.lock("w1a").acquire().await?.release().await?;
            Ok(())
        }
    })
    .await?;
    Ok(vec![
        floor.report("W1a floor pair, accounted"),
        library.report("W1a library pair, accounted"),
    ])
}
