//! Connections a handler can cut. A stream whose client reads nothing leaves its last events in
//! the HTTP connection's write buffer, and hyper polls neither the response body (where a cut
//! could be said) nor anything else of the connection until the socket takes more: without a
//! cut from outside, those events, and their room in the server's event budget, are held for
//! as long as the client keeps the connection open. So each accepted connection carries a
//! switch, handed to its requests as an extension: thrown, the connection's next read or write
//! fails at once (its task is woken for it), hyper drops the connection, and with it everything
//! queued on it. hyper and axum-server offer no write timeout that would do this.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::http::Request;
use axum_server::accept::Accept;
use futures::future::BoxFuture;
use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::Service;

/// The switch of one connection.
#[derive(Clone, Default)]
pub struct ConnectionCut(Arc<Switch>);

#[derive(Default)]
struct Switch {
    thrown: AtomicBool,
    /// The connection's task, woken when the switch is thrown.
    task: AtomicWaker,
}

impl ConnectionCut {
    /// Ends the connection: its next read or write fails, and its task is woken to make it.
    pub fn cut(&self) {
        self.0.thrown.store(true, Ordering::SeqCst);
        self.0.task.wake();
    }

    fn thrown(&self, cx: &Context<'_>) -> bool {
        self.0.task.register(cx.waker());
        self.0.thrown.load(Ordering::SeqCst)
    }
}

/// An accepted stream with its switch.
pub struct Cuttable<T> {
    inner: T,
    cut: ConnectionCut,
}

fn cut_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the server cut this connection",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for Cuttable<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.cut.thrown(cx) {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Cuttable<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.cut.thrown(cx) {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.cut.thrown(cx) {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.cut.thrown(cx) {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection's service: each of its requests carries the connection's switch (an
/// extension, taken with `Extension<ConnectionCut>`).
#[derive(Clone)]
pub struct WithCut<S> {
    inner: S,
    cut: ConnectionCut,
}

impl<S, B> Service<Request<B>> for WithCut<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        request.extensions_mut().insert(self.cut.clone());
        self.inner.call(request)
    }
}

/// Gives every accepted connection a switch (before `A`, TLS for instance, sees it), and its
/// requests the switch.
#[derive(Clone, Default)]
pub struct CuttableAcceptor<A> {
    inner: A,
}

impl<A> CuttableAcceptor<A> {
    pub fn new(inner: A) -> Self {
        Self { inner }
    }
}

impl<I, S, A> Accept<I, S> for CuttableAcceptor<A>
where
    A: Accept<Cuttable<I>, WithCut<S>>,
    A::Future: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = BoxFuture<'static, io::Result<(A::Stream, A::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let cut = ConnectionCut::default();
        let service = WithCut {
            inner: service,
            cut: cut.clone(),
        };
        Box::pin(self.inner.accept(Cuttable { inner: stream, cut }, service))
    }
}
