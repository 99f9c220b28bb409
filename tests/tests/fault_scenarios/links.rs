//! Faults of the link between holder and server: blackholed (S4), and an
//! acquire whose reply is lost (S5).

use super::*;

/// S4: the holder's link is blackholed while it works: it must stop before
/// its validity deadline (it cannot know whether its renewals land), and a
/// rival on a healthy link may enter only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_holder_cut_off_stops_before_its_deadline() {
    let server = RedisServer::start();
    let board = Board::new();
    let ttl = Duration::from_millis(600);
    let trials = 5;
    let mut gaps = Vec::new();
    for trial in 0..trials {
        let key = format!("s4:{trial}");
        let proxy = Proxy::start(server.port()).await;
        let holder = LockClient::builder()
            .command_timeout(Duration::from_millis(100))
            .connect(&proxy.url())
            .await
            .expect("connect");
        let rival = LockClient::connect(&server.url()).await.expect("connect");
        let guard = holder
            .lock(key.as_str())
            .ttl(ttl)
            .acquire()
            .await
            .expect("acquire");
        board.witness.enter(&key, 1, 0);
        tokio::time::sleep(ttl / 2).await;
        board.witness.fault("proxy-blackhole");
        proxy.blackhole();
        let rival_run = {
            let (witness, key) = (board.witness.clone(), key.clone());
            tokio::spawn(async move {
                rival
                    .lock(key.as_str())
                    .wait(Duration::from_secs(5))
                    .run(async {
                        witness.enter(&key, 2, 0);
                        let entered = Instant::now();
                        witness.exit(&key, 2, 0);
                        entered
                    })
                    .await
            })
        };
        // The holder works in 1 ms steps, checking its lease before each.
        while guard.is_held() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let stopped = Instant::now();
        board.witness.lost(&key, 1, 0, guard.valid_until());
        let entered = rival_run.await.expect("join").expect("the rival gets the lock");
        gaps.push(entered.saturating_duration_since(stopped));
        assert_eq!(board.witness.seen(&key).overlaps, 0, "trial {trial}");
        proxy.pass();
        board.witness.heal("proxy-blackhole");
        drop(guard);
    }
    let logged = analyze(board.path(), &[]).expect("analyze");
    let slack: Vec<Duration> = logged
        .lost_slack_ns
        .iter()
        .map(|&ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
        .collect();
    assert!(
        logged.lost_slack_ns.iter().all(|&ns| ns >= 0),
        "a holder stopped after its deadline: {:?}",
        logged.lost_slack_ns
    );
    assert!(logged.overlaps.is_empty(), "{logged:?}");
    let slack = spread_ms(slack);
    report::write(
        "S4",
        json!({
            "scenario": "S4 holder link blackholed",
            "verdict": "PASS",
            "parameters": {"trials": trials, "ttl_ms": ttl.as_millis(), "command_timeout_ms": 100},
            "acquisitions": logged.entries,
            "faults": trials,
            "overlaps": 0,
            "lost_slack_ms": slack,
            "gap_rival_after_stop_ms": spread_ms(gaps),
            "key_figure": format!("stopped before D in {trials}/{trials}"),
        }),
    );
}

/// S5: the acquire reaches the server but its reply is lost (half-open
/// link): the acquisition fails, and the compensating release frees the key
/// at once instead of leaving it until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_half_open_acquire_leaves_no_orphan() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let locks = LockClient::builder()
        .command_timeout(Duration::from_millis(100))
        .connect(&proxy.url())
        .await
        .expect("connect");
    locks.lock("warm-up").run(async {}).await.expect("scripts loaded");
    proxy.half_open();
    let outcome = locks.lock("s5").acquire().await;
    let gave_up = Instant::now();
    assert!(
        outcome.is_err(),
        "no reply came back, so the lock cannot be known as held"
    );
    let freed = eventually(Duration::from_secs(2), || {
        server.query::<i64>(redis::cmd("EXISTS").arg("lock:{s5}")) == 0
    })
    .await
    .expect("the orphan was released");
    let orphan = gave_up.elapsed().min(freed + Duration::from_millis(2));
    report::write(
        "S5",
        json!({
            "scenario": "S5 half-open acquire (reply lost)",
            "verdict": "PASS",
            "faults": 1,
            "orphan_ms": orphan.as_secs_f64() * 1e3,
            "caller_saw": outcome.err().map(|e| e.to_string()),
            "key_figure": format!("orphan {:.1} ms (bound 150)", orphan.as_secs_f64() * 1e3),
        }),
    );
    assert!(
        orphan <= Duration::from_millis(150),
        "orphan lock lived {orphan:?}"
    );
}
