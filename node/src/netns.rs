//! Network-namespace helpers shared by `apply`'s nf_tables generation and the eBPF loader.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `SO_NETNS_COOKIE` (Linux 5.14); the libc crate does not name it on every target.
const SO_NETNS_COOKIE: libc::c_int = 71;

/// Runs `f` on a thread of its own that has entered the network namespace `ns` (an open
/// `/run/netns/NAME`): setns changes the calling thread only, and sockets `f` opens stay
/// in that namespace. `Err` when the thread cannot enter it.
pub(crate) fn in_netns<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only, with a descriptor the caller holds open.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace's thread panicked")))
    })
}

/// Runs `f` in the network namespace `/run/netns/NAME` (on a thread of its own, see
/// [`in_netns`]), or on this thread when `netns` is `None`.
pub(crate) fn in_named<T: Send>(
    netns: Option<&str>,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    match netns {
        None => f(),
        Some(name) => {
            let ns = File::open(std::path::Path::new("/run/netns").join(name))?;
            in_netns(&ns, f)?
        }
    }
}

/// The cookie of the network namespace socket `sock` lives in (`SO_NETNS_COOKIE`, never
/// reused while the machine runs).
pub(crate) fn cookie_of(sock: &impl AsRawFd) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`, trimmed).
pub(crate) fn boot_id() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(boot.trim().to_string())
}
