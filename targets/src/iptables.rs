//! iptables-restore output at kube-proxy (iptables mode) parity.
