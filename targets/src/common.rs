//! Helpers shared by several back ends. Never copy these into a target module.

use sha2::{Digest, Sha256};

/// base32(sha256(s)) without padding, upper case (Go's `base32.StdEncoding`).
pub fn sha256_base32(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    data_encoding::BASE32_NOPAD.encode(&digest)
}

/// kube-proxy iptables: the 16-character hash of `spn + proto` used by
/// KUBE-SVC-/KUBE-SVL-/KUBE-EXT-/KUBE-FW- chains.
pub fn port_proto_hash(spn: &str, proto_lower: &str) -> String {
    let mut s = String::with_capacity(spn.len() + proto_lower.len());
    s.push_str(spn);
    s.push_str(proto_lower);
    sha256_base32(&s)[..16].to_string()
}

/// kube-proxy iptables: the 16-character hash of a KUBE-SEP- chain,
/// `spn + proto + "ip:port"` (IPv6 bracketed).
pub fn endpoint_hash(spn: &str, proto_lower: &str, addr: &str) -> String {
    let s = format!("{spn}{proto_lower}{addr}");
    sha256_base32(&s)[..16].to_string()
}

/// kube-proxy nftables: `hashAndTruncate(s)` = first 8 base32 chars of sha256(s), `-`, s;
/// cut to 240 characters (237 + `...`).
pub fn hash_and_truncate(s: &str) -> String {
    let h = &sha256_base32(s)[..8];
    let full = format!("{h}-{s}");
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
    format!("\"{}\"", s.replace('"', "\\\""))
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
