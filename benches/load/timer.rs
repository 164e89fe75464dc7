//! A precise deadline for the open loop. Tokio's timers round up to whole milliseconds,
//! which would add up to 1 ms to every latency counted from a due time; a `timerfd`
//! (a high-resolution kernel timer, no slack) registered with the runtime's own reactor
//! wakes the dispatcher at the due time, without a hop through another thread.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

pub struct Deadline {
    fd: AsyncFd<OwnedFd>,
}

impl Deadline {
    pub fn new() -> io::Result<Deadline> {
        // SAFETY: timerfd_create takes plain integers; the result is checked before use.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the `OwnedFd` is moved into the `AsyncFd`, so the descriptor stays open and
        // the same for the `AsyncFd`'s whole life.
        let fd = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE)? };
        Ok(Deadline { fd })
    }

    /// Arms the timer to expire `after` from now (relative: `Instant` has no absolute form).
    fn arm(&self, after: Duration) -> io::Result<()> {
        // A zero it_value would disarm it: at least 1 ns.
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: the descriptor is a timerfd we own; `spec` outlives the call.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consumes a pending expiry, if any.
    fn drain(&self) {
        let mut expirations = [0u8; 8];
        // SAFETY: reads at most 8 bytes into an 8-byte buffer; EAGAIN (nothing pending) is fine.
        unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                expirations.as_mut_ptr().cast(),
                expirations.len(),
            );
        }
    }

    /// Returns at `due` (at once when it has passed). Cancel-safe: a stale expiry from an
    /// abandoned wait is drained and the timer re-armed.
    pub async fn until(&self, due: Instant) -> io::Result<()> {
        loop {
            let now = Instant::now();
            if now >= due {
                return Ok(());
            }
            self.arm(due - now)?;
            let mut guard = self.fd.readable().await?;
            self.drain();
            guard.clear_ready();
        }
    }
}
