//! The long connection's frames: protobuf messages of package `pbbp2` (PROTOCOL.md,
//! "Long-connection mode"), carried as binary WebSocket messages.
//!
//! It owns the wire types (proto2: fields 1–4 `required`, so always encoded, even when zero —
//! decoders of other implementations reject frames without them), the ping, the reading of
//! headers, and the acknowledgement built from the received frame. It never does I/O.

use base64::Engine as _;
use prost::Message as _;

/// `method` of a control frame (ping, pong).
pub const METHOD_CONTROL: i32 = 0;
/// `method` of a data frame (an event or a card callback, or a fragment of one).
pub const METHOD_DATA: i32 = 1;

/// One header of a frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    #[prost(string, required, tag = "1")]
    pub key: String,
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// A frame of the long connection.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<Header>,
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    #[prost(bytes = "vec", optional, tag = "8")]
    pub payload: Option<Vec<u8>>,
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

impl Frame {
    /// The client's ping for the connection's `service_id`.
    pub fn ping(service_id: i32) -> Frame {
        Frame {
            service: service_id,
            method: METHOD_CONTROL,
            headers: vec![header("type", "ping")],
            ..Frame::default()
        }
    }

    /// The value of header `key`, if present.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }

    /// The frame as bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    /// A frame read from bytes; `None` when they are not one.
    pub fn decode(bytes: &[u8]) -> Option<Frame> {
        <Frame as prost::Message>::decode(bytes).ok()
    }

    /// The acknowledgement of this (data) frame: the frame echoed with `biz_rt` (handling
    /// time, ms) added and its payload replaced by `{"code":200}` (with `data`, the base64 of
    /// a callback's response, when there is one) or `{"code":500}` when handling failed.
    pub fn ack(&self, outcome: Result<Option<&[u8]>, ()>, handled_ms: u64) -> Frame {
        let payload = match outcome {
            Ok(None) => br#"{"code":200}"#.to_vec(),
            Ok(Some(data)) => {
                let data = base64::engine::general_purpose::STANDARD.encode(data);
                serde_json::to_vec(&serde_json::json!({ "code": 200, "data": data }))
                    .unwrap_or_else(|_| br#"{"code":200}"#.to_vec())
            }
            Err(()) => br#"{"code":500}"#.to_vec(),
        };
        let mut ack = self.clone();
        ack.method = METHOD_DATA;
        ack.headers.retain(|h| h.key != "biz_rt");
        ack.headers.push(header("biz_rt", &handled_ms.to_string()));
        ack.payload = Some(payload);
        ack
    }
}

/// A header.
pub fn header(key: &str, value: &str) -> Header {
    Header {
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

/// The client configuration the endpoint and pongs carry (seconds; a negative count: retry
/// forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct ClientConfig {
    #[serde(rename = "ReconnectCount", default = "forever")]
    pub reconnect_count: i64,
    #[serde(rename = "ReconnectInterval", default = "two_minutes")]
    pub reconnect_interval: u64,
    #[serde(rename = "ReconnectNonce", default = "half_a_minute")]
    pub reconnect_nonce: u64,
    #[serde(rename = "PingInterval", default = "two_minutes")]
    pub ping_interval: u64,
}

fn forever() -> i64 {
    -1
}
fn two_minutes() -> u64 {
    120
}
fn half_a_minute() -> u64 {
    30
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            reconnect_count: forever(),
            reconnect_interval: two_minutes(),
            reconnect_nonce: half_a_minute(),
            ping_interval: two_minutes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ping_is_the_bytes_protocol_md_gives() {
        let hex = "08 00 10 00 18 f6 81 80 10 20 00 2a 0c 0a 04 74 79 70 65 12 04 70 69 6e 67";
        let expected: Vec<u8> = hex
            .split(' ')
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        assert_eq!(Frame::ping(33554678).encode(), expected);
        let back = Frame::decode(&expected).unwrap();
        assert_eq!(back.header("type"), Some("ping"));
        assert_eq!(back.service, 33554678);
    }

    #[test]
    fn an_ack_echoes_the_frame_with_its_outcome() {
        let frame = Frame {
            seq_id: 7,
            log_id: 9,
            service: 3,
            method: METHOD_DATA,
            headers: vec![header("type", "event"), header("message_id", "m1")],
            payload_type: Some("json".into()),
            payload: Some(b"{\"event\":1}".to_vec()),
            log_id_new: Some("n".into()),
            ..Frame::default()
        };
        let ack = frame.ack(Ok(None), 12);
        assert_eq!((ack.seq_id, ack.log_id, ack.service), (7, 9, 3));
        assert_eq!(ack.header("message_id"), Some("m1"));
        assert_eq!(ack.header("biz_rt"), Some("12"));
        assert_eq!(ack.payload.as_deref(), Some(&br#"{"code":200}"#[..]));
        assert_eq!(ack.log_id_new.as_deref(), Some("n"));
        let toast = frame.ack(Ok(Some(br#"{"toast":{}}"#)), 1);
        let body: serde_json::Value =
            serde_json::from_slice(toast.payload.as_deref().unwrap()).unwrap();
        let data = base64::engine::general_purpose::STANDARD
            .decode(body["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(data, br#"{"toast":{}}"#);
        let failed = frame.ack(Err(()), 1);
        assert_eq!(failed.payload.as_deref(), Some(&br#"{"code":500}"#[..]));
        // Zero required fields are still on the wire.
        let zero = Frame::default().encode();
        assert_eq!(&zero[..8], &[0x08, 0, 0x10, 0, 0x18, 0, 0x20, 0]);
    }
}
