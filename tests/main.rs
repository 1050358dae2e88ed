//! The one integration-test binary: CLI behaviour, golden snapshots, properties and
//! real-kernel tests.

mod bounds;
mod check;
mod checkers;
mod cli;
mod diff;
mod discovery;
mod dns_servers;
mod docs;
mod golden;
mod kernel;
mod manifests;
mod nft_layout_cli;
mod properties;
mod support;
