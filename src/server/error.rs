//! The server's one error type, answered as a Kubernetes `Status` (code, reason, message), so
//! a client reads baton's refusals and the API server's (forwarded as they came) the same way.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::cursor::CursorError;
use crate::requests::RequestError;

/// Why a request was not served.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "no credentials: send a Kubernetes bearer token (Authorization: Bearer …) or sign in to the console"
    )]
    Unauthenticated,
    #[error("{0}")]
    BadRequest(String),
    /// The caller holds as many streams open as it may.
    #[error(
        "this credential holds {limit} streams open already, as many as it may on this server; \
         close one, or follow a thread's stream instead of each turn's"
    )]
    TooManyStreams { limit: usize },
    /// The server follows as many credential-and-namespace pairs as it may.
    #[error(
        "this server follows {limit} credential-and-namespace pairs already, as many as it may; \
         try again later, or another replica"
    )]
    TooManyHubs { limit: usize },
    /// A body over its route's bound, in bytes; it was not read past the bound.
    #[error("the body is over this route's limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error(transparent)]
    Cursor(#[from] CursorError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("thread {name} not found in namespace {namespace}")]
    ThreadNotFound { name: String, namespace: String },
    #[error(
        "thread {thread} is busy ({live}) and its onBusy policy is Reject: no turn was created"
    )]
    ThreadBusy { thread: String, live: String },
    #[error("the console's sign-in token is missing or wrong (a form posted from elsewhere?)")]
    Csrf,
    /// The API server's own answer (401, 403, 404, 409, 422 …), passed on.
    #[error("{}", .0.message)]
    Kube(Box<kube::core::Status>),
    /// No answer from the API server at all.
    #[error("cannot reach the Kubernetes API server: {0}")]
    Unreachable(String),
    /// A ledger write or read refused by baton's own rule (the reason names it).
    #[error("{0}")]
    Forbidden(String),
    /// The run the request names does not exist (or is another run by now).
    #[error("{0}")]
    Gone(String),
    /// The ledger's database failed or is out of reach: the writer retries.
    #[error("the ledger's database: {0}")]
    LedgerUnavailable(String),
    /// The ledger does not read as one (a gap, a row of another run): no retry mends it.
    #[error("the ledger: {0}")]
    LedgerBroken(String),
}

impl From<kube::Error> for ApiError {
    fn from(err: kube::Error) -> Self {
        match err {
            kube::Error::Api(status) => ApiError::Kube(status),
            other => ApiError::Unreachable(other.to_string()),
        }
    }
}

impl ApiError {
    /// The HTTP code and the `reason` a client can switch on.
    pub fn code_and_reason(&self) -> (StatusCode, String) {
        use RequestError as R;
        let (code, reason) = match self {
            ApiError::Unauthenticated => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            ApiError::BadRequest(_) | ApiError::Cursor(_) => {
                (StatusCode::BAD_REQUEST, "BadRequest")
            }
            ApiError::Csrf => (StatusCode::FORBIDDEN, "Forbidden"),
            ApiError::TooManyStreams { .. } => (StatusCode::TOO_MANY_REQUESTS, "TooManyRequests"),
            ApiError::TooManyHubs { .. } => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
            ApiError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge"),
            ApiError::ThreadNotFound { .. } | ApiError::Request(R::NotFound { .. }) => {
                (StatusCode::NOT_FOUND, "NotFound")
            }
            ApiError::ThreadBusy { .. } => (StatusCode::CONFLICT, "ThreadBusy"),
            ApiError::Request(R::NotWaitingForInput { .. }) => {
                (StatusCode::CONFLICT, "NotWaitingForInput")
            }
            ApiError::Request(R::Decision(d)) => (StatusCode::CONFLICT, decision_reason(d)),
            ApiError::Request(R::CallNotShown { .. }) => (StatusCode::CONFLICT, "CallNotShown"),
            ApiError::Request(R::Contended { .. }) => (StatusCode::CONFLICT, "Conflict"),
            ApiError::Request(R::Ledger { .. }) => (StatusCode::BAD_GATEWAY, "LedgerUnreadable"),
            ApiError::Request(R::Kube(e)) => return kube_code(e),
            ApiError::Kube(status) => {
                let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::BAD_GATEWAY);
                return (code, status.reason.clone());
            }
            ApiError::Unreachable(_) => (StatusCode::BAD_GATEWAY, "Unreachable"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden"),
            ApiError::Gone(_) => (StatusCode::CONFLICT, "RunGone"),
            ApiError::LedgerUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "LedgerUnavailable")
            }
            ApiError::LedgerBroken(_) => (StatusCode::INTERNAL_SERVER_ERROR, "LedgerBroken"),
        };
        (code, reason.to_string())
    }
}

fn decision_reason(d: &crate::approval::DecisionError) -> &'static str {
    use crate::approval::DecisionError as D;
    match d {
        D::NotWaiting { .. } => "NotWaitingForApproval",
        D::OtherStep { .. } => "OtherStep",
        D::AlreadyDecided { .. } => "AlreadyDecided",
    }
}

fn kube_code(err: &kube::Error) -> (StatusCode, String) {
    match err {
        kube::Error::Api(status) => ApiError::Kube(status.clone()).code_and_reason(),
        _ => (StatusCode::BAD_GATEWAY, "Unreachable".into()),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, reason) = self.code_and_reason();
        let message = match &self {
            ApiError::Request(RequestError::Kube(kube::Error::Api(s))) => s.message.clone(),
            other => other.to_string(),
        };
        let body = serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code.as_u16(),
            "reason": reason,
            "message": message,
        });
        (code, Json(body)).into_response()
    }
}
