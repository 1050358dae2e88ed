//! The API server's validation rules for the objects svc-compile reads.

use crate::diag::Diagnostics;
use crate::k8s::Objects;
use crate::passes::Settings;

/// Check every object; push every problem found (never stop at the first).
pub fn validate(_objects: &Objects, _settings: &Settings, _diags: &mut Diagnostics) {}
