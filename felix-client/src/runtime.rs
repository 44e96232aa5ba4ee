//! The async runtime a [`crate::Client`] runs on. The client is written once: its tasks,
//! timers and UDP socket all go through quinn's runtime trait, so choosing tokio or smol is
//! a value in [`crate::ClientConfig`], not a second API. The locks and channels inside are
//! `tokio::sync`, which is runtime-agnostic (its docs: usable "from non-Tokio runtimes").

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Which async runtime the client's connection, tasks and timers run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Runtime {
    /// The tokio runtime `Client::connect` is called in (feature `tokio`, the default).
    #[cfg(feature = "tokio")]
    Tokio,
    /// smol: the async-io reactor and smol's global executor (feature `smol`). Works
    /// whatever executor polls the client's futures.
    #[cfg(feature = "smol")]
    Smol,
}

impl Default for Runtime {
    /// tokio when built in, else smol.
    fn default() -> Runtime {
        #[cfg(feature = "tokio")]
        return Runtime::Tokio;
        #[cfg(not(feature = "tokio"))]
        return Runtime::Smol;
    }
}

impl Runtime {
    pub(crate) fn quinn(self) -> Arc<dyn quinn::Runtime> {
        match self {
            #[cfg(feature = "tokio")]
            Runtime::Tokio => Arc::new(quinn::TokioRuntime),
            #[cfg(feature = "smol")]
            Runtime::Smol => Arc::new(quinn::SmolRuntime),
        }
    }
}

/// A future that outlived its time.
#[derive(Debug)]
pub(crate) struct Elapsed;

/// `fut`'s output, or [`Elapsed`] once `after` has passed on `runtime`'s timer.
pub(crate) async fn timeout<F: Future>(
    runtime: &dyn quinn::Runtime,
    after: Duration,
    fut: F,
) -> Result<F::Output, Elapsed> {
    let mut timer = runtime.new_timer(Instant::now() + after);
    let mut fut = pin!(fut);
    poll_fn(|cx| {
        if let Poll::Ready(output) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        timer.as_mut().poll(cx).map(|()| Err(Elapsed))
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::future::pending;

    use super::*;

    /// A ready future wins; a pending one loses to the runtime's timer, not before its time,
    /// and a shorter timeout ends before a longer one. No wall-clock ceiling: how late a
    /// timer fires on a loaded machine is not this function's promise, and the order is.
    async fn check(runtime: Runtime) {
        let rt = runtime.quinn();
        assert!(matches!(
            timeout(&*rt, Duration::from_secs(5), async { 7 }).await,
            Ok(7)
        ));
        let began = Instant::now();
        let short = timeout(&*rt, Duration::from_millis(30), pending::<()>());
        let long = timeout(&*rt, Duration::from_secs(3_600), pending::<()>());
        let (mut short, mut long) = (pin!(short), pin!(long));
        let first = poll_fn(|cx| {
            if let Poll::Ready(r) = long.as_mut().poll(cx) {
                return Poll::Ready(("long", r));
            }
            short.as_mut().poll(cx).map(|r| ("short", r))
        })
        .await;
        assert!(
            matches!(first, ("short", Err(Elapsed))),
            "{runtime:?}: {first:?}"
        );
        assert!(
            began.elapsed() >= Duration::from_millis(30),
            "{runtime:?}: the timer fired early"
        );
    }

    #[cfg(feature = "tokio")]
    #[test]
    fn timeout_on_tokio() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(check(Runtime::Tokio));
    }

    #[cfg(feature = "smol")]
    #[test]
    fn timeout_on_smol() {
        smol::block_on(check(Runtime::Smol));
    }
}
