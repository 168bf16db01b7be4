//! The Lark/Feishu platform: the event callback (verification, decryption, envelopes), event
//! types, and the Open API client. Decides nothing about what a message means.
