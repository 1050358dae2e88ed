//! Passes, called in a fixed order by [`crate::compile`]: validate → resolve → allocate →
//! lower; then, per node and family, `node`.

pub mod node;
