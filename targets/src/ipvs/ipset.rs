//! The `ipset` part: `ipset save` syntax, loadable with `ipset restore`.
//!
//! Every set kube-proxy creates, in its order, created as kube-proxy creates them (hash
//! sets `family inet|inet6 hashsize 1024 maxelem 65536`, bitmap sets `range 0-65535`),
//! each followed by its entries (sorted). Empty sets are written too: kube-proxy creates
//! them all, and its iptables rules name some whatever they hold.

use super::model::{State, ALL_SETS};
use std::fmt::Write as _;
use svc_compiler::net::IpFamily;

pub(super) fn write(st: &State, family: IpFamily, out: &mut String) {
    let fam = match family {
        IpFamily::IPv4 => "inet",
        IpFamily::IPv6 => "inet6",
    };
    for set in ALL_SETS {
        let name = set.name(family);
        let kind = set.kind();
        if kind.starts_with("bitmap:") {
            let _ = writeln!(out, "create {name} {kind} range 0-65535");
        } else {
            let _ = writeln!(
                out,
                "create {name} {kind} family {fam} hashsize 1024 maxelem 65536"
            );
        }
        for e in st.set(set) {
            let _ = writeln!(out, "add {name} {e}");
        }
    }
}
