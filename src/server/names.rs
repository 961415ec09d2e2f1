//! The names in a request's path (namespace, run, thread), checked before any of them goes
//! into a request to the API server.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// Every name in a path (namespace, run, thread) must be a Kubernetes object name before it
/// goes into a request to the API server: 400 naming the parameter otherwise.
pub(super) async fn checked(
    params: axum::extract::RawPathParams,
    request: Request,
    next: Next,
) -> Response {
    for (param, value) in &params {
        if !is_object_name(value) {
            let message = format!(
                "{param}: {:?} is not a Kubernetes name (lowercase letters, digits, '-' and '.', at most 253)",
                value.chars().take(80).collect::<String>()
            );
            return ApiError::BadRequest(message).into_response();
        }
    }
    next.run(request).await
}

/// A DNS subdomain name, as the API server requires of namespaces and of baton's objects: at
/// most 253 characters, dot-separated labels of lowercase letters, digits and '-', each
/// starting and ending with a letter or digit.
pub(crate) fn is_object_name(value: &str) -> bool {
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let label = |l: &str| {
        let bytes = l.as_bytes();
        bytes.first().is_some_and(edge)
            && bytes.last().is_some_and(edge)
            && bytes.iter().all(|b| edge(b) || *b == b'-')
    };
    !value.is_empty() && value.len() <= 253 && value.split('.').all(label)
}

#[cfg(test)]
mod tests {
    use super::is_object_name;

    #[test]
    fn only_kubernetes_names_reach_the_api_server() {
        for ok in ["default", "team-a", "run.1", "a", "a.b-c.d", "1-2"] {
            assert!(is_object_name(ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "a/b",
            "..",
            "a/../../secrets",
            "a..b",
            "a.-b",
            "a-.b",
            "-a",
            "a-",
            "a b",
            "ä",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }
}
