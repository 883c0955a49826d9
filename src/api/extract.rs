//! Extractors whose rejections are problem+json: JSON bodies (415, 413, 400 in that order; a key given twice
//! in one object is a 400 too) and query strings.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::error::Category;
use serde_json::{Map, Number, Value};

use super::AppState;
use super::error::ApiError;

/// A JSON object body deserialized into `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.http.max_body_bytes;
        if !is_json(request.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body must be JSON: send Content-Type: application/json",
            ));
        }
        let declared_length = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<usize>().ok());
        if declared_length.is_some_and(|length| length > limit) {
            return Err(too_large(limit));
        }
        let bytes = body_bytes(request, state).await?;
        let value = unique_json(&bytes).map_err(|fault| {
            ApiError::bad_request(match fault {
                JsonFault::Ambiguous(detail) | JsonFault::Invalid(detail) => detail,
            })
        })?;
        if !value.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        serde_json::from_value(value)
            .map(JsonBody)
            .map_err(|error| ApiError::bad_request(format!("the body does not have the expected shape: {error}")))
    }
}

/// The request's body, whole: `413` past `http.max_body_bytes`, `400` when it cannot be read.
pub(super) async fn body_bytes(request: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => too_large(state.http.max_body_bytes),
            status => ApiError::new(status, rejection.body_text()),
        })
}

/// Whether the headers say the body is JSON (`application/json` or `application/…+json`).
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
}

/// Why a body is not one JSON value in which no object has a key twice.
pub(super) enum JsonFault {
    /// It is JSON, but an object in it has a key twice; says which.
    Ambiguous(String),
    /// It is not JSON; says where.
    Invalid(String),
}

/// The JSON value of `bytes`, refused when an object in it has a key twice.
pub(super) fn unique_json(bytes: &[u8]) -> Result<Value, JsonFault> {
    match serde_json::from_slice::<UniqueKeys>(bytes) {
        Ok(UniqueKeys(value)) => Ok(value),
        Err(error) if error.classify() == Category::Data => {
            Err(JsonFault::Ambiguous(format!("the body is ambiguous: {error}")))
        }
        Err(error) => Err(JsonFault::Invalid(format!("the body is not valid JSON: {error}"))),
    }
}

/// Checks, without building it, that no object in a JSON value has a key twice (as [`unique_json`] does), and
/// gives the top-level object's `method` when it is a string: what `/mcp` needs of a JSON-RPC message before
/// the MCP transport reads it.
pub(super) fn unrepeated_method(bytes: &[u8]) -> Result<Option<String>, JsonFault> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let checked = Unrepeated(Place::Message)
        .deserialize(&mut deserializer)
        .and_then(|method| deserializer.end().map(|()| method));
    checked.map_err(|error| match error.classify() {
        Category::Data => JsonFault::Ambiguous(format!("the body is ambiguous: {error}")),
        _ => JsonFault::Invalid(format!("the body is not valid JSON: {error}")),
    })
}

/// How many keys of one object are compared one by one before they are hashed.
const FEW_KEYS: usize = 16;

/// Walks a value, refusing an object's repeated key; keeps the `method` of the message.
struct Unrepeated(Place);

/// Where in the message a value is.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// The whole message.
    Message,
    /// The message's `method`.
    Method,
    /// Anywhere else.
    Inside,
}

impl<'de> DeserializeSeed<'de> for Unrepeated {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unrepeated {
    type Value = Option<String>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
        Ok((self.0 == Place::Method).then(|| value.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
        while items.next_element_seed(Unrepeated(Place::Inside))?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Self::Value, A::Error> {
        let mut few: Vec<Cow<'de, str>> = Vec::new();
        let mut many: HashSet<Cow<'de, str>> = HashSet::new();
        let mut method = None;
        while let Some(Key(key)) = entries.next_key()? {
            if few.len() == FEW_KEYS {
                many.extend(few.drain(..));
            }
            let repeated = if many.is_empty() {
                few.contains(&key)
            } else {
                many.contains(&key)
            };
            if repeated {
                return Err(de::Error::custom(format_args!(
                    "the key {key:?} appears more than once in one object"
                )));
            }
            let place = if self.0 == Place::Message && key == "method" {
                Place::Method
            } else {
                Place::Inside
            };
            let value = entries.next_value_seed(Unrepeated(place))?;
            if place == Place::Method {
                method = value;
            }
            if many.is_empty() {
                few.push(key)
            } else {
                many.insert(key);
            }
        }
        Ok(method)
    }
}

/// An object's key, borrowed from the body unless it has escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Cow<'de, str>;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a key")
            }

            fn visit_borrowed_str<E>(self, value: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(value))
            }

            fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(value.to_owned()))
            }
        }
        deserializer.deserialize_str(KeyVisitor).map(Key)
    }
}

/// A JSON value in which no object has a key twice. serde_json keeps the last of a repeated key, so
/// `{"ok": true, "ok": false}` would mean what the last reader happens to see; the API refuses it instead,
/// at any depth, naming the key.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor).map(UniqueKeys)
    }
}

/// Builds the value as serde_json's own `Value` visitor does, refusing an object's repeated key.
struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut array = Vec::with_capacity(items.size_hint().unwrap_or(0));
        while let Some(UniqueKeys(item)) = items.next_element()? {
            array.push(item);
        }
        Ok(Value::Array(array))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "the key {key:?} appears more than once in one object"
                )));
            }
            let UniqueKeys(value) = entries.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A query string deserialized into `T`.
#[derive(Debug)]
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(query)
            .map(QueryParams)
            .map_err(|error| ApiError::bad_request(format!("invalid query string: {error}")))
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is larger than {limit} bytes (http.max_body_bytes)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Value, String> {
        serde_json::from_str::<UniqueKeys>(json)
            .map(|UniqueKeys(value)| value)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn without_a_repeated_key_the_value_is_serde_jsons() {
        let json = r#"{"ok": true, "n": [-1, 18446744073709551615, 2.5e-3, null, "\u00e9"],
            "data": {"a": {"b": [{"c": 1}, {"c": 2}]}, "b": {}}, "": ""}"#;
        assert_eq!(parse(json).unwrap(), serde_json::from_str::<Value>(json).unwrap());
    }

    #[test]
    fn the_check_that_builds_nothing_refuses_what_the_value_builder_refuses_and_finds_the_method() {
        let many: String = (0..40).map(|key| format!("\"k{key}\": {key},")).collect();
        for json in [
            r#"{"ok": true, "ok": true}"#,
            r#"{"data": {"a": 1, "b": 2, "a": 3}}"#,
            r#"[{"x": [{"y": 1, "y": 1}]}]"#,
            r#"{"ok": 1, "\u006fk": 2}"#,
            r#"{"method": "tools/call", "params": {"arguments": {"t": "a", "t": "b"}}}"#,
            &format!("{{{many} \"k3\": 0}}"),
            &format!("{{{many} \"last\": 0}}"),
            r#"{"jsonrpc": "2.0", "method": "initialize", "params": {}}"#,
            r#"{"method": {"a": 1}}"#,
            r#"[1, "x", null]"#,
            r#"{"a": 1"#,
        ] {
            let built = parse(json).map_err(|error| error.to_string());
            let checked = unrepeated_method(json.as_bytes());
            assert_eq!(
                built.is_ok(),
                checked.is_ok(),
                "{json}: {built:?} / {}",
                checked.is_ok()
            );
            if let (Err(built), Err(JsonFault::Ambiguous(checked))) = (&built, &checked) {
                assert!(checked.ends_with(built.as_str()), "{json}: {checked} / {built}");
            }
        }
        let method = |json: &str| unrepeated_method(json.as_bytes()).ok().flatten();
        assert_eq!(
            method(r#"{"id": 1, "method": "initialize"}"#).as_deref(),
            Some("initialize")
        );
        assert_eq!(method(r#"{"params": {"method": "initialize"}}"#), None);
        assert_eq!(method(r#"{"method": 3}"#), None);
        assert_eq!(method(r#""initialize""#), None);
    }

    #[test]
    fn a_repeated_key_is_refused_at_any_depth_and_named() {
        for (json, key) in [
            (r#"{"ok": true, "ok": true}"#, "ok"),
            (r#"{"data": {"a": 1, "b": 2, "a": 3}}"#, "a"),
            (r#"[{"x": [{"y": 1, "y": 1}]}]"#, "y"),
            (r#"{"ok": 1, "\u006fk": 2}"#, "ok"),
        ] {
            let error = parse(json).unwrap_err();
            assert!(
                error.starts_with(&format!("the key {key:?} appears more than once in one object at line")),
                "{json}: {error}"
            );
        }
    }
}
