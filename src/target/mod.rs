//! The registry of SSH targets: what an admin registered (host, port, user, how to
//! authenticate, host-key policy), its approval status, and its pinned host keys. Secrets are
//! referenced in the vault, never stored here in plaintext.

pub mod cli;
