//! The checker of the fault suite: what really happened, observed without
//! trusting the lock (RELIABILITY §6). It lives on a separate `redis-server`
//! that no fault ever touches (§6.7's witness Redis, which also works across
//! processes): occupancy per key (a body entering where another is inside is
//! an overlap), a fenced register that refuses stale tokens, and a
//! read-modify-write counter that loses updates when bodies overlap.

use std::sync::LazyLock;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

/// KEYS[1] the register's highest token; ARGV[1] the writer's token;
/// ARGV[2] '1' to refuse stale tokens (a fenced resource), '0' to accept
/// them (an unfenced one, which only counts them). Returns 1 if applied.
static FENCED_WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
        local max = tonumber(redis.call('GET', KEYS[1]) or '0')
        local token = tonumber(ARGV[1])
        if token < max then
          if ARGV[2] == '1' then
            redis.call('INCR', KEYS[2])
            return 0
          end
          redis.call('INCR', KEYS[3])
          return 1
        end
        redis.call('SET', KEYS[1], token)
        return 1
        ",
    )
});

/// One witness connection; cheap to clone.
#[derive(Clone)]
pub struct Witness {
    conn: MultiplexedConnection,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Witness")
    }
}

/// What the witness saw for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Bodies that entered.
    pub entries: u64,
    /// Entries made while another body was inside.
    pub overlaps: u64,
    /// The read-modify-write counter: equals `entries` unless updates were lost.
    pub counter: u64,
    /// Stale tokens the fenced register refused.
    pub stale_rejected: u64,
    /// Stale tokens an unfenced register accepted.
    pub stale_accepted: u64,
}

impl Witness {
    /// Connects to the witness server.
    pub async fn connect(url: &str) -> redis::RedisResult<Witness> {
        Ok(Witness {
            conn: redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?,
        })
    }

    /// A body enters the critical section of `key`.
    pub async fn enter(&self, key: &str) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        let inside: i64 = conn.incr(format!("occ:{key}"), 1).await?;
        let _: i64 = conn.incr(format!("entries:{key}"), 1).await?;
        if inside > 1 {
            let _: i64 = conn.incr(format!("overlaps:{key}"), 1).await?;
        }
        Ok(())
    }

    /// The body leaves.
    pub async fn exit(&self, key: &str) -> redis::RedisResult<()> {
        let _: i64 = self.conn.clone().decr(format!("occ:{key}"), 1).await?;
        Ok(())
    }

    /// Reads the counter, yields, writes it back plus one: the write a lock
    /// protects.
    pub async fn bump(&self, key: &str) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        let seen: Option<u64> = conn.get(format!("counter:{key}")).await?;
        tokio::task::yield_now().await;
        conn.set(format!("counter:{key}"), seen.unwrap_or(0) + 1).await
    }

    /// Writes to the register with a fencing token; `fenced` makes the
    /// register refuse tokens lower than the highest it has seen.
    pub async fn write(&self, key: &str, token: u64, fenced: bool) -> redis::RedisResult<bool> {
        let applied: i64 = FENCED_WRITE
            .key(format!("max:{key}"))
            .key(format!("rejected:{key}"))
            .key(format!("accepted_stale:{key}"))
            .arg(token)
            .arg(if fenced { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(applied == 1)
    }

    /// Everything the witness saw for `key`.
    pub async fn seen(&self, key: &str) -> redis::RedisResult<Seen> {
        let mut conn = self.conn.clone();
        let get = |name: &str| format!("{name}:{key}");
        let values: Vec<Option<u64>> = conn
            .mget(&[
                get("entries"),
                get("overlaps"),
                get("counter"),
                get("rejected"),
                get("accepted_stale"),
            ])
            .await?;
        let v = |i: usize| values.get(i).copied().flatten().unwrap_or(0);
        Ok(Seen {
            entries: v(0),
            overlaps: v(1),
            counter: v(2),
            stale_rejected: v(3),
            stale_accepted: v(4),
        })
    }
}
