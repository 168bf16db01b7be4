//! SSH tests (written next).
