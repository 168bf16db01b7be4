//! The execution layer: one [`Backend`](self) interface with a local and an SSH implementation,
//! the command guard and output truncation. Knows nothing of chats or models.

pub mod guard;
pub mod truncate;
