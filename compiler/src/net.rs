//! Small address helpers: CIDRs and families, with the text forms Kubernetes uses.

use serde::{Serialize, Serializer};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum IpFamily {
    IPv4,
    IPv6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::IPv4,
            IpAddr::V6(_) => IpFamily::IPv6,
        }
    }
    /// `IPv4` / `IPv6`, as `spec.ipFamilies` writes them.
    pub fn parse(s: &str) -> Option<IpFamily> {
        match s {
            "IPv4" => Some(IpFamily::IPv4),
            "IPv6" => Some(IpFamily::IPv6),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::IPv4 => "IPv4",
            IpFamily::IPv6 => "IPv6",
        }
    }
    pub fn bits(self) -> u8 {
        match self {
            IpFamily::IPv4 => 32,
            IpFamily::IPv6 => 128,
        }
    }
}

/// A network prefix such as `10.96.0.0/12`. The address is kept as written; use
/// [`Cidr::network`] for the masked form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }
    fn mask(&self) -> u128 {
        let bits = self.family().bits() as u32;
        let p = self.prefix as u32;
        if p == 0 {
            0
        } else {
            (!0u128 << (bits - p)) & width_mask(bits)
        }
    }
    pub fn network(&self) -> Cidr {
        Cidr {
            addr: from_u128(to_u128(&self.addr) & self.mask(), self.family()),
            prefix: self.prefix,
        }
    }
    pub fn contains(&self, ip: &IpAddr) -> bool {
        IpFamily::of(ip) == self.family()
            && (to_u128(ip) & self.mask()) == (to_u128(&self.addr) & self.mask())
    }
    /// Number of addresses, saturating at u128::MAX.
    pub fn size(&self) -> u128 {
        let host_bits = (self.family().bits() - self.prefix) as u32;
        if host_bits >= 128 {
            u128::MAX
        } else {
            1u128 << host_bits
        }
    }
    /// The `i`-th address of the prefix (0 = network address).
    pub fn nth(&self, i: u128) -> IpAddr {
        let base = to_u128(&self.network().addr);
        from_u128(base.wrapping_add(i), self.family())
    }
    /// Offset of `ip` inside the prefix.
    pub fn offset(&self, ip: &IpAddr) -> u128 {
        to_u128(ip).wrapping_sub(to_u128(&self.network().addr))
    }
    pub fn is_host(&self) -> bool {
        self.prefix == self.family().bits()
    }
}

fn width_mask(bits: u32) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

pub fn to_u128(ip: &IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(*a) as u128,
        IpAddr::V6(a) => u128::from(*a),
    }
}

pub fn from_u128(v: u128, fam: IpFamily) -> IpAddr {
    match fam {
        IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}` is not a CIDR (expected ADDRESS/PREFIX)"))?;
        let addr: IpAddr = parse_ip(a).ok_or_else(|| format!("`{a}` is not an IP address"))?;
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| *p <= IpFamily::of(&addr).bits())
            .ok_or_else(|| format!("`{p}` is not a valid prefix length"))?;
        Ok(Cidr { addr, prefix })
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Parse an IP the way the API server does: no zone suffix; IPv4 octets with leading
/// zeros are read as decimal (`010.0.0.1` is 10.0.0.1), as its `ParseIPSloppy` and
/// kube-proxy read them (validation warns about them, SVC153).
/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is the IPv4 address, as Go's
/// `net.ParseIP` and so the API server and kube-proxy read it.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    if s.contains('%') {
        return None;
    }
    match s.parse().ok().or_else(|| sloppy_v4(s))? {
        IpAddr::V6(a) => Some(a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)),
        v4 => Some(v4),
    }
}

/// A dotted quad with leading zeros in some octet, read as decimal.
fn sloppy_v4(s: &str) -> Option<IpAddr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p
            .trim_start_matches('0')
            .parse::<u8>()
            .ok()
            .or((p.bytes().all(|b| b == b'0')).then_some(0))?;
    }
    parts.next().is_none().then_some(IpAddr::from(octets))
}

/// Does an IPv4 address written as text have an octet with a leading zero?
pub fn has_leading_zeros(s: &str) -> bool {
    sloppy_v4(s).is_some() && s.split('.').any(|o| o.len() > 1 && o.starts_with('0'))
}

/// `ip:port`, with brackets for IPv6, as Go's `net.JoinHostPort` writes it.
pub fn join_host_port(ip: &IpAddr, port: u16) -> String {
    HostPort::new(ip, port).as_str().to_string()
}

/// [`join_host_port`] on the stack: kube-proxy orders endpoints by this string, so it is
/// the sort key of every endpoint list.
#[derive(Clone, Copy)]
pub struct HostPort {
    len: u8,
    /// `[` + the longest IPv6 text (45) + `]:` + 5 digits.
    buf: [u8; 53],
}

impl HostPort {
    pub fn new(ip: &IpAddr, port: u16) -> HostPort {
        let mut w = HostPort {
            len: 0,
            buf: [0; 53],
        };
        match ip {
            IpAddr::V4(a) => {
                // The common case, without the formatting machinery.
                for (i, octet) in a.octets().into_iter().enumerate() {
                    if i > 0 {
                        w.push(b'.');
                    }
                    w.push_decimal(octet.into());
                }
            }
            IpAddr::V6(a) => {
                use std::fmt::Write;
                let _ = write!(w, "[{a}]");
            }
        }
        w.push(b':');
        w.push_decimal(port.into());
        w
    }
    fn push(&mut self, b: u8) {
        self.buf[self.len as usize] = b;
        self.len += 1;
    }
    fn push_decimal(&mut self, n: u32) {
        let mut digits = [0u8; 5];
        let mut k = 0;
        let mut n = n;
        loop {
            digits[k] = b'0' + (n % 10) as u8;
            k += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for &d in digits[..k].iter().rev() {
            self.push(d);
        }
    }
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len as usize]).expect("ASCII")
    }
}

impl std::fmt::Write for HostPort {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len as usize + s.len();
        self.buf
            .get_mut(self.len as usize..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end as u8;
        Ok(())
    }
}

impl PartialEq for HostPort {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for HostPort {}

impl PartialOrd for HostPort {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for HostPort {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

/// An address written as `Display` writes it, IPv4 without the formatting machinery (the
/// writers print hundreds of thousands of them).
#[derive(Clone, Copy)]
pub struct FastIp<'a>(pub &'a IpAddr);

impl fmt::Display for FastIp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(_) => {
                let hp = HostPort::new(self.0, 0);
                // Without the `:0`.
                f.write_str(&hp.as_str()[..hp.len as usize - 2])
            }
            IpAddr::V6(a) => fmt::Display::fmt(a, f),
        }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn cidr_contains_and_nth() {
        let c: Cidr = "10.96.0.0/12".parse().unwrap();
        assert!(c.contains(&"10.96.0.1".parse().unwrap()));
        assert!(c.contains(&"10.111.255.255".parse().unwrap()));
        assert!(!c.contains(&"10.112.0.0".parse().unwrap()));
        assert_eq!(c.nth(1).to_string(), "10.96.0.1");
        assert_eq!(c.size(), 1 << 20);
        let v6: Cidr = "fd00:10:96::/112".parse().unwrap();
        assert!(v6.contains(&"fd00:10:96::ffff".parse().unwrap()));
        assert_eq!(v6.nth(10).to_string(), "fd00:10:96::a");
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert_eq!(
            parse_ip("::ffff:10.244.1.5"),
            Some("10.244.1.5".parse().unwrap())
        );
    }

    #[test]
    fn host_port() {
        for (ip, port) in [
            ("10.0.0.1", 80),
            ("255.255.255.255", 65535),
            ("0.0.0.0", 0),
            ("fd00::1", 8080),
            ("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", 65535),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let want = match ip {
                IpAddr::V4(a) => format!("{a}:{port}"),
                IpAddr::V6(a) => format!("[{a}]:{port}"),
            };
            assert_eq!(join_host_port(&ip, port), want);
            assert_eq!(FastIp(&ip).to_string(), ip.to_string());
        }
    }
}
