//! The admission webhook: baton checks who asks (docs/security.md).
pub mod cert;
pub mod rules;
