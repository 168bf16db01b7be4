//! Workspaces: the directory and permission a section's task tools work with.

pub mod judge;
