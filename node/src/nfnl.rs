//! nfnetlink requests: one socket, requests and dumps, and the attribute helpers their
//! answers need (nf_tables: the generation id and the table fingerprint; ctnetlink: the
//! conntrack cleanup).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_NETFILTER: libc::c_int = 12;
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_DUMP_INTR: u16 = 0x10;

pub(crate) fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

pub(crate) fn nla(t: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut v = Vec::with_capacity((len + 3) & !3);
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&t.to_ne_bytes());
    v.extend_from_slice(value);
    v.resize((len + 3) & !3, 0);
    v
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The attributes of a nested attribute's payload: (type without flags, payload).
pub(crate) fn nested<'a>(mut b: &'a [u8], mut f: impl FnMut(u16, &'a [u8])) {
    while b.len() >= 4 {
        let (Some(len), Some(t)) = (u16_at(b, 0), u16_at(b, 2)) else {
            return;
        };
        let len = len as usize;
        if len < 4 || len > b.len() {
            return;
        }
        f(t & 0x3fff, &b[4..len]);
        b = &b[((len + 3) & !3).min(b.len())..];
    }
}

/// The attributes of one nf_tables message (after nlmsghdr and nfgenmsg).
pub(crate) fn for_each_attr<'a>(msg: &'a [u8], f: impl FnMut(u16, &'a [u8])) {
    nested(msg.get(20..).unwrap_or(&[]), f)
}

pub(crate) fn str_attr(msg: &[u8], t: u16) -> Option<&str> {
    let mut out = None;
    for_each_attr(msg, |at, v| {
        if at == t && out.is_none() {
            out = std::str::from_utf8(v.strip_suffix(&[0]).unwrap_or(v)).ok();
        }
    });
    out
}

pub(crate) fn u32_attr(msg: &[u8], t: u16) -> Option<u32> {
    let mut out = None;
    for_each_attr(msg, |at, v| {
        if at == t && v.len() == 4 {
            out = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]));
        }
    });
    out
}

pub(crate) struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Socket {
    pub(crate) fn open() -> io::Result<Socket> {
        // SAFETY: plain socket call; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_NETFILTER,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned by socket.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A bounded wait for every answer.
        let tv = libc::timeval {
            tv_sec: 10,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a timeval of its size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        // The kernel fills dump messages up to the largest read it has seen (32 KB at most).
        Ok(Socket {
            fd,
            seq: 0,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Sends a dump request of `kind` with `attrs` and hands every answer's message to
    /// `each`. A dump the kernel marks interrupted (a commit during it) is an error: the
    /// caller reads again or falls back to a full read.
    pub(crate) fn dump(
        &mut self,
        kind: u16,
        family: u8,
        attrs: &[u8],
        each: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.request(kind, family, libc::NLM_F_DUMP as u16, attrs, each)
    }

    /// Sends an nf_tables request of `kind` (with `flags` besides `NLM_F_REQUEST`) and
    /// hands every answer's message to `each`, until the end of a dump or the
    /// acknowledgement.
    pub(crate) fn request(
        &mut self,
        kind: u16,
        family: u8,
        flags: u16,
        attrs: &[u8],
        each: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.request_to(NFNL_SUBSYS_NFTABLES, kind, family, flags, attrs, each)
    }

    /// [`Socket::request`] to the nfnetlink subsystem `subsys`.
    pub(crate) fn request_to(
        &mut self,
        subsys: u16,
        kind: u16,
        family: u8,
        flags: u16,
        attrs: &[u8],
        mut each: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let len = 20 + attrs.len();
        let mut req = Vec::with_capacity(len);
        req.extend_from_slice(&(len as u32).to_ne_bytes());
        req.extend_from_slice(&((subsys << 8) | kind).to_ne_bytes());
        let flags = libc::NLM_F_REQUEST as u16 | flags;
        req.extend_from_slice(&flags.to_ne_bytes());
        req.extend_from_slice(&seq.to_ne_bytes());
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&[family, 0, 0, 0]);
        req.extend_from_slice(attrs);
        // SAFETY: sending a buffer we own to the kernel (nl_pid 0).
        let sent = unsafe {
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            libc::sendto(
                self.fd.as_raw_fd(),
                req.as_ptr().cast(),
                req.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink answer");
        loop {
            // SAFETY: receiving into a buffer we own.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut msgs = &self.buf[..n as usize];
            while msgs.len() >= 16 {
                let len = u32_at(msgs, 0).ok_or_else(bad)? as usize;
                let t = u16_at(msgs, 4).ok_or_else(bad)?;
                let flags = u16_at(msgs, 6).ok_or_else(bad)?;
                if len < 16 || len > msgs.len() {
                    return Err(bad());
                }
                let msg = &msgs[..len];
                msgs = &msgs[((len + 3) & !3).min(msgs.len())..];
                if u32_at(msg, 8) != Some(seq) {
                    continue;
                }
                if flags & NLM_F_DUMP_INTR != 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "nf_tables changed during the read",
                    ));
                }
                match t {
                    // The end of a dump carries the dump's own error, if it ended in one
                    // (what came before it is then not all there is).
                    NLMSG_DONE => {
                        return match u32_at(msg, 16).map_or(0, |e| e as i32) {
                            0 => Ok(()),
                            e => Err(io::Error::from_raw_os_error(-e)),
                        }
                    }
                    NLMSG_ERROR => {
                        let errno = u32_at(msg, 16).map_or(0, |e| e as i32);
                        if errno == 0 {
                            return Ok(());
                        }
                        // E.g. a chain gone between listing it and asking for its rules: a
                        // commit in between, which the caller sees by the generation anyway.
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                    _ => each(msg)?,
                }
            }
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}
