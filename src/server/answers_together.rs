//! A connection's stream that lets the worker's other ready requests go first before it
//! writes an answer, so that answers leave the worker one after another.
//!
//! Each answer written to a client that sleeps waiting for it wakes the client's thread: on
//! a VM that is an inter-processor interrupt, paid inside the server's `writev`. When the
//! worker reads a request, reviews it and writes its answer before it reads the next
//! connection's request, a busy client sleeps between answers and every answer wakes it.
//! When the worker first reviews every connection that is ready and then writes their
//! answers in a row, the client is woken by the first and busy reading for the rest.
//!
//! The stream does this by yielding once: the first write after a read returns
//! `Pending` and wakes its own task, which tokio's single-threaded runtime puts behind the
//! tasks already queued (the other connections the same poll of the event loop woke). With
//! one connection the yield costs one more poll of the connection. The price is the tail:
//! an answer waits for its whole batch, and under a saturating load the p99 grew while the
//! rate rose by a fifth to a third (BENCHMARKS.md, issue 17, twenty-first pass).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, whose first write after each read that brought bytes yields once.
pub(super) struct AnswersTogether<T> {
    inner: T,
    /// Bytes have come in since the last write: the next write yields first.
    read_since_write: bool,
}

impl<T> AnswersTogether<T> {
    pub(super) fn new(inner: T) -> Self {
        Self {
            inner,
            read_since_write: false,
        }
    }

    /// Whether this write is the first since a read: then the task is woken again and the
    /// write is to return `Pending`, once.
    fn yields_first(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.read_since_write {
            return false;
        }
        self.read_since_write = false;
        cx.waker().wake_by_ref();
        true
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for AnswersTogether<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.read_since_write = true;
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AnswersTogether<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.yields_first(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.yields_first(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream, duplex};

    use super::*;

    /// A stream that notes each read and write in a log shared by every connection.
    struct Noted {
        name: &'static str,
        stream: DuplexStream,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl AsyncRead for Noted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
            if buf.filled().len() > before {
                self.log.lock().unwrap().push(format!("read {}", self.name));
            }
            polled
        }
    }

    impl AsyncWrite for Noted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.log
                .lock()
                .unwrap()
                .push(format!("write {}", self.name));
            Pin::new(&mut self.stream).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.stream).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.stream).poll_shutdown(cx)
        }
    }

    /// Two connections whose requests are both waiting, each served by a task that reads a
    /// request and answers it, on one single-threaded runtime (a worker's); the log of their
    /// reads and writes, and what each client got back.
    fn serve_two(wrap: bool) -> (Vec<String>, Vec<Vec<u8>>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime starts");
        runtime.block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let mut clients = Vec::new();
            let mut servers = Vec::new();
            for name in ["a", "b"] {
                let (mut client, stream) = duplex(64);
                client
                    .write_all(b"request")
                    .await
                    .expect("the request is sent");
                clients.push(client);
                let noted = Noted {
                    name,
                    stream,
                    log: log.clone(),
                };
                servers.push(tokio::spawn(answer_once(noted, wrap)));
            }
            for server in servers {
                server.await.expect("the connection's task ends well");
            }
            let mut answers = Vec::new();
            for mut client in clients {
                let mut answer = vec![0; 6];
                client.read_exact(&mut answer).await.expect("an answer");
                answers.push(answer);
            }
            let log = log.lock().unwrap().clone();
            (log, answers)
        })
    }

    async fn answer_once(noted: Noted, wrap: bool) {
        if wrap {
            read_and_answer(AnswersTogether::new(noted)).await;
        } else {
            read_and_answer(noted).await;
        }
    }

    async fn read_and_answer(mut stream: impl AsyncRead + AsyncWrite + Unpin) {
        let mut request = [0u8; 7];
        stream.read_exact(&mut request).await.expect("a request");
        stream
            .write_all(b"answer")
            .await
            .expect("the answer is written");
    }

    #[test]
    fn every_ready_request_is_read_before_the_first_answer_is_written() {
        let (log, answers) = serve_two(true);
        assert_eq!(log, ["read a", "read b", "write a", "write b"]);
        assert_eq!(answers, [b"answer".to_vec(), b"answer".to_vec()]);
    }

    #[test]
    fn without_it_each_answer_is_written_before_the_next_request_is_read() {
        // The order the stream changes, so that the test above checks something.
        let (log, _) = serve_two(false);
        assert_eq!(log, ["read a", "write a", "read b", "write b"]);
    }

    #[tokio::test]
    async fn a_write_with_no_read_before_it_goes_straight_through() {
        let (mut client, server) = duplex(64);
        let mut stream = AnswersTogether::new(server);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let written = Pin::new(&mut stream).poll_write(&mut cx, b"hello");
        assert!(matches!(written, Poll::Ready(Ok(5))));
        let mut got = [0u8; 5];
        client.read_exact(&mut got).await.expect("the bytes arrive");
        assert_eq!(&got, b"hello");
    }

    #[tokio::test]
    async fn the_first_write_after_a_read_yields_once_and_wakes_its_task() {
        let (mut client, server) = duplex(64);
        client.write_all(b"ping").await.expect("sent");
        let mut stream = AnswersTogether::new(server);
        let mut got = [0u8; 4];
        stream.read_exact(&mut got).await.expect("read");

        let woken = Arc::new(WakeCount::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let first = Pin::new(&mut stream).poll_write(&mut cx, b"pong");
        assert!(first.is_pending());
        assert_eq!(woken.count(), 1, "a task that yields must be woken again");
        let second = Pin::new(&mut stream).poll_write(&mut cx, b"pong");
        assert!(matches!(second, Poll::Ready(Ok(4))));
        let third = Pin::new(&mut stream).poll_write(&mut cx, b"!");
        assert!(matches!(third, Poll::Ready(Ok(1))), "one yield per read");
        assert_eq!(woken.count(), 1);
    }

    #[derive(Default)]
    struct WakeCount(std::sync::atomic::AtomicUsize);

    impl WakeCount {
        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    impl std::task::Wake for WakeCount {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
