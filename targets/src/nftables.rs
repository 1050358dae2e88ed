//! nftables output at kube-proxy (nftables mode) parity.
