//! What the HTTP providers share about their endpoint: the HTTP client, the API key (which
//! never reaches a log, an error or a `Debug` string) and the mapping of HTTP failures onto
//! `ModelError`. Requests are sent and their answers sorted by [`super::answer`].

use std::error::Error as _;
use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::Value;

use super::ModelError;
use super::retry::parse_retry_after;

/// Connecting is quick or it is broken: fail fast so the retry can try another backend.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Provider messages end up in the run's status: keep them short.
const MAX_MESSAGE_CHARS: usize = 2000;
/// An error body is read up to this size; the rest is noise.
pub(super) const MAX_ERROR_BODY: usize = 64 * 1024;
/// A word sharing this many consecutive characters with the key is treated as the key.
const KEY_PIECE: usize = 12;
const REDACTED: &str = "[REDACTED]";

/// The HTTP client the providers use: connection pool, timeouts, user agent, redirects only
/// within the endpoint's origin.
pub fn http_client() -> Result<reqwest::Client, ModelError> {
    crate::kube_util::ensure_crypto_provider();
    reqwest::Client::builder()
        .redirect(redirect_policy())
        .connect_timeout(CONNECT_TIMEOUT)
        // No read timeout here: a call's silence is bounded per model (`body::Bounds`).
        .user_agent(concat!("baton/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ModelError::Permanent {
            status: None,
            message: format!("building the HTTP client: {}", error_chain(&e)),
        })
}

/// How many redirects within the endpoint's origin are followed.
const MAX_REDIRECTS: usize = 5;

/// Redirects are followed only to the same scheme, host and port: the key travels in a header
/// (Anthropic's is `x-api-key`, which reqwest does not strip on a redirect to another host as
/// it does `Authorization`), and must reach no other server. Any other redirect is answered
/// as the 3xx it is, and the call fails naming where it pointed.
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let within = attempt
            .previous()
            .last()
            .is_some_and(|from| same_origin(from, attempt.url()));
        if within && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// True when `a` and `b` have the same scheme, host and port.
pub fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Checks a configured endpoint and returns it without a trailing slash.
pub fn base_url(endpoint: Option<&str>, default: &str) -> Result<String, ModelError> {
    let endpoint = endpoint.map(str::trim).filter(|e| !e.is_empty());
    let url = endpoint
        .unwrap_or(default)
        .trim_end_matches('/')
        .to_string();
    match reqwest::Url::parse(&url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => Ok(url),
        _ => Err(ModelError::Permanent {
            status: None,
            message: format!("model endpoint {url:?} is not an http(s) URL"),
        }),
    }
}

// === impl ApiKey ===

/// An API key. Its `Debug` is redacted, and `redact` scrubs it from anything a server says.
#[derive(Clone, Default)]
pub struct ApiKey(Option<String>);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = if self.0.is_some() { REDACTED } else { "none" };
        write!(f, "ApiKey({shown})")
    }
}

impl ApiKey {
    /// Secrets made with `echo key | kubectl create secret` end in a newline: trim it, or the
    /// header would be invalid. An empty key is no key (local servers need none).
    pub fn new(key: Option<String>) -> Self {
        Self(key.map(|k| k.trim().to_string()).filter(|k| !k.is_empty()))
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// The key as a header value (with `prefix`, e.g. `Bearer `), marked sensitive so HTTP/2
    /// never puts it in its compression table.
    pub fn header(&self, prefix: &str) -> Result<Option<HeaderValue>, ModelError> {
        let Some(key) = &self.0 else { return Ok(None) };
        let mut value = HeaderValue::from_str(&format!("{prefix}{key}")).map_err(|_| {
            ModelError::Permanent {
                status: None,
                message: "the API key contains characters not allowed in an HTTP header".into(),
            }
        })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// `text` without the key, nor any word carrying a long piece of it (servers echo keys,
    /// sometimes abbreviated).
    pub fn redact(&self, text: &str) -> String {
        let Some(key) = self.0.as_deref() else {
            return text.to_string();
        };
        let text = text.replace(key, REDACTED);
        if key.len() < KEY_PIECE {
            return text;
        }
        text.split_inclusive(char::is_whitespace)
            .map(|word| match shares_piece(word, key) {
                true => format!("{REDACTED}{}", &word[word.trim_end().len()..]),
                false => word.to_string(),
            })
            .collect()
    }
}

fn shares_piece(word: &str, key: &str) -> bool {
    let word = word.as_bytes();
    word.len() >= KEY_PIECE
        && key
            .as_bytes()
            .windows(KEY_PIECE)
            .any(|piece| word.windows(KEY_PIECE).any(|w| w == piece))
}

// === errors ===

/// Maps a failed HTTP exchange. 408, 429 and 5xx are worth waiting for; every other status
/// (400 bad request, 401/403 bad key, 404 unknown model or endpoint) will fail again.
pub fn status_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
    key: &ApiKey,
    url: &str,
) -> ModelError {
    let code = status.as_u16();
    let said = match headers.get(reqwest::header::LOCATION) {
        Some(to) if status.is_redirection() => format!(
            "a redirect to {} (another scheme, host or port: not followed, the key is not sent there)",
            to.to_str().unwrap_or("an unreadable location")
        ),
        _ => provider_message(body),
    };
    let message = clean(key, &format!("POST {url}: HTTP {code}: {said}"));
    if code == 408 || code == 429 || status.is_server_error() {
        let retry_after = parse_retry_after(headers, SystemTime::now());
        ModelError::Retryable {
            message,
            retry_after,
        }
    } else {
        ModelError::Permanent {
            status: Some(code),
            message,
        }
    }
}

/// Maps a transport failure: connection refused, reset, timeout, a body cut short. Only a
/// request that could not even be built is permanent.
pub fn transport_error(err: &reqwest::Error, key: &ApiKey, url: &str) -> ModelError {
    let message = clean(key, &format!("POST {url}: {}", error_chain(err)));
    if err.is_builder() {
        ModelError::Permanent {
            status: None,
            message,
        }
    } else {
        ModelError::Retryable {
            message,
            retry_after: None,
        }
    }
}

/// Maps an error the provider reported in an answer that had started well (in its stream, or
/// as its whole JSON answer). The request was accepted, so unless the provider says it was
/// invalid, trying again may work.
pub fn stream_error(error: &Value, key: &ApiKey) -> ModelError {
    const PERMANENT: &[&str] = &[
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
    ];
    let message = clean(
        key,
        &format!(
            "the model server reported an error: {}",
            error_message(error)
        ),
    );
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    match PERMANENT.contains(&kind) {
        true => ModelError::Permanent {
            status: None,
            message,
        },
        false => ModelError::Retryable {
            message,
            retry_after: None,
        },
    }
}

/// The provider's own words from an error body (OpenAI, Anthropic, vLLM, Ollama shapes),
/// or the raw body when it is not one of those.
pub fn provider_message(body: &str) -> String {
    let parsed = serde_json::from_str::<Value>(body).ok();
    match parsed.as_ref().and_then(|v| v.get("error").or(Some(v))) {
        Some(error) if error.is_object() || error.is_string() => error_message(error),
        _ if body.trim().is_empty() => "no error message".into(),
        _ => body.trim().to_string(),
    }
}

fn error_message(error: &Value) -> String {
    if let Some(text) = error.as_str() {
        return text.to_string();
    }
    let text = ["message", "detail"]
        .iter()
        .find_map(|f| error.get(*f).and_then(Value::as_str));
    let kind = ["type", "code"]
        .iter()
        .find_map(|f| error.get(*f).and_then(Value::as_str));
    match (text, kind) {
        (Some(text), Some(kind)) => format!("{text} ({kind})"),
        (Some(text), None) => text.to_string(),
        _ => error.to_string(),
    }
}

/// Redacts first (so truncation cannot leave a short piece of the key), then bounds.
pub(super) fn clean(key: &ApiKey, message: &str) -> String {
    let redacted = key.redact(message);
    match redacted.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &redacted[..cut]),
        None => redacted,
    }
}

/// reqwest's own message is "error sending request"; the cause is in its sources.
pub fn error_chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_redirect_within_the_origin_is_followed() {
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        let from = url("https://api.example.test/v1/messages");
        assert!(same_origin(
            &from,
            &url("https://api.example.test:443/v2/messages")
        ));
        for elsewhere in [
            "https://other.example.test/v1/messages",
            "http://api.example.test/v1/messages",
            "https://api.example.test:8443/v1/messages",
        ] {
            assert!(!same_origin(&from, &url(elsewhere)), "{elsewhere}");
        }
    }

    #[test]
    fn statuses_sort_into_retryable_and_permanent() {
        let key = ApiKey::default();
        let headers = HeaderMap::new();
        let kind = |code: u16| {
            let status = StatusCode::from_u16(code).unwrap();
            status_error(status, &headers, "", &key, "http://x").label()
        };
        for code in [408, 429, 500, 502, 503, 529] {
            assert_eq!(kind(code), "retryable", "{code}");
        }
        for code in [400, 401, 403, 404, 422] {
            assert_eq!(kind(code), "permanent", "{code}");
        }
    }

    #[test]
    fn provider_messages_of_each_shape() {
        let openai = r#"{"error":{"message":"bad","type":"invalid_request_error","code":null}}"#;
        assert_eq!(provider_message(openai), "bad (invalid_request_error)");
        let anthropic =
            r#"{"type":"error","error":{"type":"not_found_error","message":"model: x"}}"#;
        assert_eq!(provider_message(anthropic), "model: x (not_found_error)");
        assert_eq!(
            provider_message(r#"{"error":"model 'x' not found"}"#),
            "model 'x' not found"
        );
        assert_eq!(provider_message(r#"{"object":"error","message":"m"}"#), "m");
        assert_eq!(provider_message("<html>oops</html>"), "<html>oops</html>");
        assert_eq!(provider_message(""), "no error message");
    }

    #[test]
    fn the_key_is_redacted_whole_and_in_pieces() {
        let key = ApiKey::new(Some("sk-abcdefghijklmnopqrstuvwxyz0123\n".into()));
        let text = "bad key sk-abcdefghijklmnopqrstuvwxyz0123, or 'sk-abcdefghijkl...0123' \
                    or xxmnopqrstuvwxyzxx; fine words stay";
        let clean = key.redact(text);
        assert!(!clean.contains("abcdefghijkl"), "{clean}");
        assert!(!clean.contains("mnopqrstuvwxyz"), "{clean}");
        assert!(clean.ends_with("fine words stay"), "{clean}");
        assert_eq!(format!("{key:?}"), "ApiKey([REDACTED])");
        let header = key.header("Bearer ").unwrap().unwrap();
        assert!(header.is_sensitive());
        assert!(!format!("{header:?}").contains("abcdef"));
    }

    #[test]
    fn long_messages_are_bounded() {
        let message = clean(&ApiKey::default(), &"x".repeat(10_000));
        assert!(message.len() <= MAX_MESSAGE_CHARS + 3);
    }

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(
            base_url(Some("http://h:1/v1/"), "x").unwrap(),
            "http://h:1/v1"
        );
        assert_eq!(base_url(None, "https://d").unwrap(), "https://d");
        assert!(base_url(Some("ftp://h"), "x").is_err());
        assert!(base_url(Some("not a url"), "x").is_err());
    }
}
