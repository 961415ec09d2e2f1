//! Request bodies, read only once the caller is known and only up to their route's bound
//! (docs/security.md, "The server"): a handler takes the raw body last and reads it after
//! authenticating from the headers, so an unauthenticated sender is answered before a byte
//! of what it sends is held.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The JSON body of at most `limit` bytes, read now; a body over it is refused without
/// reading the rest.
pub async fn json_within<T: DeserializeOwned>(body: Body, limit: usize) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|err| {
        let over = std::error::Error::source(&err)
            .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
        match over {
            true => ApiError::TooLarge { limit },
            false => ApiError::BadRequest(format!("the body could not be read: {err}")),
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest(format!("body: {e}")))
}

/// Refuses (413) a request whose announced length is over `limit` before its body is read; a
/// body sent without a length is bounded as it is read ([`json_within`], or axum's limit).
pub async fn announced_within(
    State(limit): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let announced = crate::serving::bounds::announced_length(request.headers());
    if announced.is_some_and(|length| length > limit as u64) {
        return ApiError::TooLarge { limit }.into_response();
    }
    next.run(request).await
}
