//! The one integration-test binary.

mod kernel;
