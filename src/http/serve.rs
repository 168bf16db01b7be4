//! The HTTP server loop: accepts connections up to a global bound, serves each over HTTP/1
//! with a deadline for every request head (which also ends idle keep-alive connections) and
//! one for every whole body, and drains on shutdown. Knows nothing of routes.
//!
//! axum's own `serve` has none of these bounds, so a client that sends slowly could hold a
//! connection, and whatever a handler took for it, for ever. Here a connection lasts at most
//! one head deadline while idle or sending its head, and one body deadline while sending its
//! body; past [`HttpConfig::max_connections`] new connections wait in the listen backlog.
//! HTTP/1 only: Lark and the OpenAI-style clients speak it, and an HTTP/2 connection would
//! carry many requests past the connection bound.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service;

use crate::config::HttpConfig;
use crate::metrics::Metrics;

/// Pause after a failed `accept` (out of file descriptors, say) before the next one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// requests in flight finish (idle connections close at once) and returns when every
/// connection is closed. The caller bounds that wait.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    loop {
        // A slot first: at the bound, connections stay in the backlog, not in memory.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::select! {
                        _ = tokio::time::sleep(ACCEPT_PAUSE) => {}
                        _ = shutdown.cancelled() => break,
                    }
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(connection(
            stream,
            router.clone(),
            limits.clone(),
            Open::new(metrics.clone(), slot),
            shutdown.clone(),
        ));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// One connection, served until the client closes it, a deadline passes, or shutdown.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: HttpConfig,
    _open: Open,
    shutdown: CancellationToken,
) {
    let body_timeout = limits.body_timeout;
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut router = router.clone();
        let req = req.map(|b| Body::new(super::body::Deadline::new(Body::new(b), body_timeout)));
        router.call(req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
            return;
        }
        _ = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

/// An open connection: holds its slot and is counted in `sshmode_http_connections`.
struct Open {
    metrics: Arc<Metrics>,
    _slot: OwnedSemaphorePermit,
}

impl Open {
    fn new(metrics: Arc<Metrics>, slot: OwnedSemaphorePermit) -> Open {
        metrics.http_connections.inc();
        Open {
            metrics,
            _slot: slot,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.http_connections.dec();
    }
}
