//! A span per request, on every listener: the handlers' own events (an append refused, a
//! stream cut) land in it, with the listener, method and path. The query is left out: the
//! console's sign-in carries a one-time code there.

use axum::Router;
use axum::http::Request;
use tower_http::trace::TraceLayer;

/// `router` with a `request` span around each request it answers. Failures are the handlers'
/// to log (a 503 "busy" is an answer, not an error), so the layer logs none itself.
pub(super) fn per_request(router: Router, listener: &'static str) -> Router {
    let span = move |request: &Request<axum::body::Body>| {
        tracing::info_span!(
            "request",
            listener,
            method = %request.method(),
            path = request.uri().path(),
        )
    };
    router.layer(
        TraceLayer::new_for_http()
            .make_span_with(span)
            .on_failure(()),
    )
}
