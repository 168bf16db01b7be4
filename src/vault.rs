//! The vault: SSH secrets encrypted with AES-256-GCM under a master key file (mode 0600), a
//! fresh nonce per record, the target alias as associated data. Plaintext leaves only towards
//! SSH authentication.
