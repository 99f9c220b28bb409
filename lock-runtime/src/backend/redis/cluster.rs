//! The connection to a Redis Cluster, made on first use when the client is
//! lazy. The redis crate connects a cluster client eagerly only, so this
//! wraps it: the first command connects (through the seeds), later ones
//! reuse that connection, which follows slots and failovers by itself.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

/// Cheap to clone: clones share the one connection.
#[derive(Clone)]
pub(crate) struct ClusterLink(Arc<Link>);

struct Link {
    client: ClusterClient,
    conn: OnceCell<ClusterConnection>,
}

impl ClusterLink {
    pub(crate) fn new(client: ClusterClient) -> Self {
        ClusterLink(Arc::new(Link {
            client,
            conn: OnceCell::new(),
        }))
    }

    /// The connection, made now if this is the first use. A failed attempt
    /// leaves nothing behind: the next command tries again.
    pub(crate) async fn connection(&self) -> RedisResult<ClusterConnection> {
        let link = &self.0;
        link.conn
            .get_or_try_init(|| link.client.get_async_connection())
            .await
            .cloned()
    }
}

impl ConnectionLike for ClusterLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.connection().await?.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.connection()
                .await?
                .req_packed_commands(pipeline, offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A cluster client's builder for `seeds`, with `timeout` for connecting and
/// for each reply, and `tls_root` (PEM) to verify `rediss://` nodes with.
pub(crate) fn cluster_builder(
    seeds: &[String],
    timeout: Duration,
    tls_root: Option<&[u8]>,
) -> ClusterClientBuilder {
    let builder = ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(timeout)
        .response_timeout(timeout);
    #[cfg(feature = "tls")]
    if seeds.iter().any(|s| s.starts_with("rediss://")) {
        crate::backend::tls::install_tls_provider();
        if let Some(pem) = tls_root {
            return builder.certs(crate::backend::tls::tls_certificates(pem));
        }
    }
    let _ = tls_root;
    builder
}
