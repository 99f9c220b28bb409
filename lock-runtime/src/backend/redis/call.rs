//! Script calls written straight into one command.
//!
//! Hand-written because `redis::ScriptInvocation` first copies every key
//! and argument into a `Vec` of its own, and then copies them all again
//! into the command: six allocations for a release's four arguments, and
//! three per release in a coalesced call, on the path every lock takes.
//! Written here, a call is one command buffer sized up front.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// `EVALSHA` of one script with its keys, then its arguments, in order.
pub(crate) struct ScriptCall<'s> {
    script: &'s Script,
    cmd: Cmd,
}

impl<'s> ScriptCall<'s> {
    /// A call that will be given `keys` keys first, and `args` keys and
    /// arguments in all (that sizes its buffer: a count too small only
    /// costs a regrowth).
    pub(crate) fn new(script: &'s Script, keys: usize, args: usize) -> Self {
        // EVALSHA, the 40-digit hash and the key count come first; a key,
        // channel or holder id of this library is rarely past 48 bytes.
        let mut cmd = Cmd::with_capacity(3 + args, 64 + 48 * args);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        ScriptCall { script, cmd }
    }

    /// The next key or argument.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call; a server that does not know the script yet (a
    /// restart, `SCRIPT FLUSH`, a new replica promoted) is sent it once and
    /// the call again, as `ScriptInvocation` does.
    pub(crate) async fn invoke<T: FromRedisValue, C: ConnectionLike>(&self, conn: &mut C) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}
