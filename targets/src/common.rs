//! Helpers shared by several back ends. Never copy these into a target module.

use sha2::{Digest, Sha256};
use std::fmt;

/// base32(sha256(s)) without padding, upper case (Go's `base32.StdEncoding`).
pub fn sha256_base32(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    data_encoding::BASE32_NOPAD.encode(&digest)
}

/// kube-proxy iptables: the 16-character hash of `spn + proto` used by
/// KUBE-SVC-/KUBE-SVL-/KUBE-EXT-/KUBE-FW- chains.
pub fn port_proto_hash(spn: &str, proto_lower: &str) -> String {
    chain_hash(&[spn, proto_lower]).to_string()
}

/// kube-proxy iptables: the 16-character hash of a KUBE-SEP- chain,
/// `spn + proto + "ip:port"` (IPv6 bracketed).
pub fn endpoint_hash(spn: &str, proto_lower: &str, addr: &str) -> String {
    chain_hash(&[spn, proto_lower, addr]).to_string()
}

/// The first 16 characters of base32(sha256(concatenated parts)): kube-proxy's iptables
/// chain-name hash, on the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainHash([u8; 16]);

pub fn chain_hash(parts: &[&str]) -> ChainHash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
    }
    // 16 base32 characters are exactly the first 10 bytes (80 bits).
    let mut out = [0u8; 16];
    data_encoding::BASE32_NOPAD.encode_mut(&h.finalize()[..10], &mut out);
    ChainHash(out)
}

impl ChainHash {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("base32 is ASCII")
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// kube-proxy nftables: `hashAndTruncate(s)` = first 8 base32 chars of sha256(s), `-`, s;
/// cut to 240 characters (237 + `...`).
pub fn hash_and_truncate(s: &str) -> String {
    // 8 base32 characters are exactly the first 5 bytes.
    let mut h = [0u8; 8];
    data_encoding::BASE32_NOPAD.encode_mut(&Sha256::digest(s.as_bytes())[..5], &mut h);
    let mut full = String::with_capacity(9 + s.len());
    full.push_str(std::str::from_utf8(&h).expect("base32 is ASCII"));
    full.push('-');
    full.push_str(s);
    if full.len() > 240 {
        let mut cut = 237;
        while !full.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}...", &full[..cut])
    } else {
        full
    }
}

/// A comment string in double quotes, as iptables-restore and nft read it.
pub fn quote(s: &str) -> String {
    Quoted(s).to_string()
}

/// [`quote`] as a `Display` wrapper: `Quoted(format_args!("{spn} cluster IP"))` writes the
/// quoted comment straight into the output.
pub struct Quoted<T>(pub T);

impl<T: fmt::Display> fmt::Display for Quoted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// Escapes `"` in whatever is written through it.
        struct Escape<'a, 'b>(&'a mut fmt::Formatter<'b>);
        impl fmt::Write for Escape<'_, '_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                let mut parts = s.split('"');
                self.0.write_str(parts.next().unwrap_or(""))?;
                for part in parts {
                    self.0.write_str("\\\"")?;
                    self.0.write_str(part)?;
                }
                Ok(())
            }
        }
        f.write_str("\"")?;
        fmt::write(&mut Escape(f), format_args!("{}", self.0))?;
        f.write_str("\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_hash_vectors() {
        assert_eq!(port_proto_hash("ns1/svc1:p80", "tcp"), "XPGD46QRK7WJZT7O");
        assert_eq!(
            endpoint_hash("ns1/svc1:p80", "tcp", "10.180.0.1:80"),
            "SXIVWICOYRO3J4NJ"
        );
        assert_eq!(port_proto_hash("ns2/svc2:p80", "tcp"), "GNZBNJ2PO5MGZ6GT");
        assert_eq!(
            port_proto_hash("default/kubernetes:https", "tcp"),
            "NPX46M4PTMTKRN6Y"
        );
        assert_eq!(
            port_proto_hash("kube-system/kube-dns:dns", "udp"),
            "TCOU7JCQXEZGVUNU"
        );
        assert_eq!(
            chain_hash(&["ns1/svc1:p80", "tcp", "10.180.0.1:80"]).as_str(),
            &sha256_base32("ns1/svc1:p80tcp10.180.0.1:80")[..16]
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(quote(r#"a "b" c"#), r#""a \"b\" c""#);
        assert_eq!(
            Quoted(format_args!("{}-{}", "x\"", 1)).to_string(),
            r#""x\"-1""#
        );
    }

    #[test]
    fn nftables_hash_vectors() {
        assert_eq!(
            hash_and_truncate("ns1/svc1/tcp/p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            hash_and_truncate("ns1/svc1/tcp/p80__10.180.0.1/80"),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        let long = "x".repeat(300);
        assert_eq!(hash_and_truncate(&long).len(), 240);
        assert!(hash_and_truncate(&long).ends_with("..."));
    }
}
