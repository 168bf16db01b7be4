//! Request bodies, bounded: [`Deadline`] gives every body on the server one deadline for its
//! whole arrival (set by `serve` when the request head is in), and [`read`] reads a body up
//! to a size limit, telling "too large", "too slow" and "broken" apart. Never buffers past
//! the limit.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::BoxError;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use futures_util::StreamExt;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

/// The error a [`Deadline`] body yields once its time is up.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

/// A body that fails with [`BodyTimedOut`] if it has not fully arrived by its deadline.
pub struct Deadline {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
    expired: bool,
}

impl Deadline {
    /// `inner`, which must arrive completely within `within` from now.
    pub fn new(inner: Body, within: Duration) -> Deadline {
        Deadline {
            inner,
            sleep: Box::pin(tokio::time::sleep(within)),
            expired: false,
        }
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|r| r.map_err(Into::into))),
            Poll::Pending => {
                if this.sleep.as_mut().poll(cx).is_ready() {
                    this.expired = true;
                    Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
                } else {
                    Poll::Pending
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than the limit (declared or sent).
    TooLarge,
    /// Not complete by the server's body deadline.
    TimedOut,
    /// The client went away or sent a malformed body.
    Broken,
}

/// Reads a whole body of at most `limit` bytes. A declared `Content-Length` over the limit is
/// refused before anything is read.
pub async fn read(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut stream = body.into_data_stream();
    let mut first: Option<Bytes> = None;
    let mut rest: Vec<u8> = Vec::new();
    let mut len = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| classify(&e))?;
        len = len.saturating_add(chunk.len());
        if len > limit {
            return Err(BodyError::TooLarge);
        }
        match first.take() {
            None if rest.is_empty() => first = Some(chunk),
            Some(f) => {
                rest.extend_from_slice(&f);
                rest.extend_from_slice(&chunk);
            }
            None => rest.extend_from_slice(&chunk),
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(rest)))
}

fn classify(e: &axum::Error) -> BodyError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<BodyTimedOut>() {
            return BodyError::TimedOut;
        }
        cur = err.source();
    }
    BodyError::Broken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_within_the_limit_and_refuses_past_it() {
        let h = HeaderMap::new();
        let b = read(&h, Body::from("hello"), 5).await.unwrap();
        assert_eq!(&b[..], b"hello");
        assert_eq!(
            read(&h, Body::from("hello!"), 5).await,
            Err(BodyError::TooLarge)
        );
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, "6".parse().unwrap());
        assert_eq!(
            read(&declared, Body::from(""), 5).await,
            Err(BodyError::TooLarge)
        );
        // Several chunks are joined.
        let chunks = futures_util::stream::iter(
            ["ab", "cd", "e"].map(|s| Ok::<_, std::io::Error>(Bytes::from_static(s.as_bytes()))),
        );
        let b = read(&h, Body::from_stream(chunks), 5).await.unwrap();
        assert_eq!(&b[..], b"abcde");
    }

    #[tokio::test]
    async fn a_body_that_never_ends_times_out() {
        let stalled = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
        let body = Body::new(Deadline::new(
            Body::from_stream(stalled),
            Duration::from_millis(50),
        ));
        let r = read(&HeaderMap::new(), body, 100).await;
        assert_eq!(r, Err(BodyError::TimedOut));
    }
}
