//! The domain of SSH Mode in chats: sections, the typed chat commands (whose doc comments are
//! the help text), bindings and grants (one authorisation function), target approval. Talks to
//! the network only through the Lark client.
