//! A TCP proxy per link, for faults between a client and a server without
//! root: pass, delay, blackhole, half-open, throttle and reset.

use std::time::Duration;

/// A TCP proxy in front of a server, for link faults without root:
/// `blackhole` keeps every socket open and forwards nothing (the client
/// sees a stalled server, not a reset); `half_open` delivers requests and drops
/// replies; `delay` holds every chunk back; `throttle` caps the byte rate;
/// `reset` closes every connection at once.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    link: std::sync::Arc<Link>,
    task: tokio::task::JoinHandle<()>,
}

/// The proxy's mode, shared with its pumps.
#[derive(Debug, Default)]
struct Link {
    mode: std::sync::atomic::AtomicU8,
    /// Delay in µs (`DELAY`) or bytes per second (`THROTTLE`).
    parameter: std::sync::atomic::AtomicU64,
    /// Connections still to be closed as soon as they are accepted.
    to_close: std::sync::atomic::AtomicU32,
    pumps: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
}

const PASS: u8 = 0;
const BLACKHOLE: u8 = 1;
const HALF_OPEN: u8 = 2;
const DELAY: u8 = 3;
const THROTTLE: u8 = 4;

impl Proxy {
    /// Starts forwarding `127.0.0.1:<new port>` to `127.0.0.1:<target>`.
    pub async fn start(target: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let link = std::sync::Arc::new(Link::default());
        let shared = std::sync::Arc::clone(&link);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let close = shared
                    .to_close
                    .fetch_update(
                        std::sync::atomic::Ordering::SeqCst,
                        std::sync::atomic::Ordering::SeqCst,
                        |n| n.checked_sub(1),
                    )
                    .is_ok();
                if close {
                    drop(client);
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let requests = tokio::spawn(pump(
                    client_read,
                    server_write,
                    std::sync::Arc::clone(&shared),
                    Direction::Request,
                ));
                let replies = tokio::spawn(pump(
                    server_read,
                    client_write,
                    std::sync::Arc::clone(&shared),
                    Direction::Reply,
                ));
                let mut pumps = shared.pumps.lock().expect("pumps");
                pumps.retain(|p| !p.is_finished());
                pumps.extend([requests.abort_handle(), replies.abort_handle()]);
            }
        });
        Proxy { port, link, task }
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn set(&self, mode: u8, parameter: u64) {
        use std::sync::atomic::Ordering;
        self.link.parameter.store(parameter, Ordering::SeqCst);
        self.link.mode.store(mode, Ordering::SeqCst);
    }

    /// Stops forwarding, both ways, on every connection.
    pub fn blackhole(&self) {
        self.set(BLACKHOLE, 0);
    }

    /// Requests go through; replies are dropped.
    pub fn half_open(&self) {
        self.set(HALF_OPEN, 0);
    }

    /// Every chunk, both ways, is forwarded `by` late.
    pub fn delay(&self, by: Duration) {
        self.set(DELAY, u64::try_from(by.as_micros()).unwrap_or(u64::MAX));
    }

    /// At most `bytes_per_second`, both ways.
    pub fn throttle(&self, bytes_per_second: u64) {
        self.set(THROTTLE, bytes_per_second.max(1));
    }

    /// Closes every open connection (both sides see the socket close); new
    /// connections are forwarded as before.
    pub fn reset(&self) {
        for pump in self.link.pumps.lock().expect("pumps").drain(..) {
            pump.abort();
        }
    }

    /// Closes the next `count` connections as soon as they are accepted (the
    /// client's connect succeeds, its first request meets a closed socket):
    /// what a client reconnecting to a server that is still starting, or
    /// dying, can meet.
    pub fn close_next(&self, count: u32) {
        self.link
            .to_close
            .store(count, std::sync::atomic::Ordering::SeqCst);
    }

    /// Forwards again; what a blackhole held back is delivered.
    pub fn pass(&self) {
        self.set(PASS, 0);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.reset();
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Request,
    Reply,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: std::sync::Arc<Link>,
    direction: Direction,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while link.mode.load(Ordering::SeqCst) == BLACKHOLE {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let parameter = link.parameter.load(Ordering::SeqCst);
        match link.mode.load(Ordering::SeqCst) {
            HALF_OPEN if direction == Direction::Reply => continue,
            DELAY => tokio::time::sleep(Duration::from_micros(parameter)).await,
            THROTTLE => {
                let nanos = n as u64 * 1_000_000_000 / parameter.max(1);
                tokio::time::sleep(Duration::from_nanos(nanos)).await;
            }
            _ => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod proxy_tests {
    use super::*;
    use crate::server::RedisServer;
    use std::time::Instant;

    async fn ping(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<String> {
        redis::cmd("PING").query_async(conn).await
    }

    #[tokio::test]
    async fn delay_throttle_and_reset_do_what_they_say() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port()).await;
        let client = redis::Client::open(proxy.url()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        ping(&mut conn).await.expect("pass");

        proxy.delay(Duration::from_millis(30));
        let start = Instant::now();
        ping(&mut conn).await.expect("delayed");
        // Held back once each way.
        assert!(
            start.elapsed() >= Duration::from_millis(60),
            "{:?}",
            start.elapsed()
        );

        proxy.throttle(1000);
        let start = Instant::now();
        let value = "v".repeat(200);
        redis::cmd("SET")
            .arg("k")
            .arg(&value)
            .query_async::<()>(&mut conn)
            .await
            .expect("throttled");
        assert!(
            start.elapsed() >= Duration::from_millis(200),
            "{:?}",
            start.elapsed()
        );

        proxy.pass();
        proxy.reset();
        assert!(ping(&mut conn).await.is_err(), "the connection survived a reset");
        let mut fresh = client
            .get_multiplexed_async_connection()
            .await
            .expect("reconnect");
        ping(&mut fresh)
            .await
            .expect("new connections pass after a reset");
    }
}
