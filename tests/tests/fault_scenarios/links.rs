//! Faults of the link between holder and server: blackholed (S4), and an
//! acquire whose reply is lost (S5).

use super::*;

/// S4: the holder's link is blackholed while it works: it must stop before
/// its validity deadline (it cannot know whether its renewals land), and a
/// rival on a healthy link may enter only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_holder_cut_off_stops_before_its_deadline() {
    scenario("s4_a_holder_cut_off_stops_before_its_deadline", async move {
        let server = RedisServer::start();
        let rival = LockClient::connect(&server.url()).await.expect("connect");
        let through = async |proxy: &Proxy| {
            LockClient::builder()
                .command_timeout(Duration::from_millis(100))
                .connect(&proxy.url())
                .await
                .expect("connect")
        };
        run_s4(server.port(), &rival, through, "S4", "S4 holder link blackholed").await;
    })
    .await
}

/// S5: the acquire reaches the server but its reply is lost (half-open
/// link): the acquisition fails, and the compensating release frees the key
/// at once instead of leaving it until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_half_open_acquire_leaves_no_orphan() {
    scenario("s5_a_half_open_acquire_leaves_no_orphan", async move {
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
    })
    .await
}
