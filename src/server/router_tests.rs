//! The router in process (`tower::ServiceExt::oneshot`), for what it answers before any
//! request reaches the API server: the name checks, authentication, the CSRF check, the body
//! bounds, the ledger endpoint's refusals, and each error's status. The API server it is
//! pointed at is a closed loopback port, so an answer that needed it says so (502).

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use tower::ServiceExt;

use super::identity::{COOKIE, CSRF_HEADER, csrf_token};
use super::{ConsoleSettings, ServerState, SessionKey, router};

/// A loopback port nothing listens on: a request that reaches "the API server" fails there.
const NO_API_SERVER: &str = "https://127.0.0.1:1";

fn console() -> ConsoleSettings {
    ConsoleSettings {
        namespace: "default".into(),
        namespaces: Vec::new(),
        secure_cookies: false,
    }
}

fn base() -> kube::Config {
    kube::Config::new(NO_API_SERVER.parse().unwrap())
}

fn in_cluster(sessions: SessionKey) -> Arc<ServerState> {
    Arc::new(ServerState::new(base(), console()).with_session_key(sessions))
}

/// The answer's code and its Status body (`reason`, `message`).
async fn ask(state: Arc<ServerState>, request: Request<Body>) -> (StatusCode, serde_json::Value) {
    let response = router(state).oneshot(request).await.unwrap();
    let code = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (code, body)
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

fn post(uri: &str) -> axum::http::request::Builder {
    Request::builder().method(Method::POST).uri(uri)
}

#[tokio::test]
async fn a_name_that_is_not_a_kubernetes_name_is_refused_naming_its_parameter() {
    let state = in_cluster(SessionKey::random());
    let cases = [
        ("/api/v1/namespaces/Team/runs", "ns"),
        ("/api/v1/namespaces/team/runs/a..b", "run"),
        ("/api/v1/namespaces/team/threads/-t", "thread"),
        (
            "/ledger/v1/namespaces/team/runs/R/segments?uid=u&after=0",
            "run",
        ),
    ];
    for (uri, param) in cases {
        let (code, body) = ask(state.clone(), get(uri)).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert_eq!(body["reason"], "BadRequest");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{param}: ")),
            "{uri}: {message}"
        );
    }
}

#[tokio::test]
async fn a_request_without_a_credential_is_401() {
    let state = in_cluster(SessionKey::random());
    let (code, body) = ask(state, get("/api/v1/namespaces/team/runs")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
}

#[tokio::test]
async fn a_write_with_the_session_cookie_needs_the_credentials_csrf_token() {
    let state = in_cluster(SessionKey::random());
    let sealed = state.sessions.seal("alices-token", SystemTime::now());
    let cookie = format!("{COOKIE}={sealed}");
    let stop = |csrf: Option<String>| {
        let mut request = post("/api/v1/namespaces/team/runs/r/stop")
            .header(header::COOKIE, &cookie)
            .header(header::CONTENT_LENGTH, "0");
        if let Some(csrf) = csrf {
            request = request.header(CSRF_HEADER, csrf);
        }
        request.body(Body::empty()).unwrap()
    };
    let (code, body) = ask(state.clone(), stop(None)).await;
    assert_eq!(
        (code, &body["reason"]),
        (StatusCode::FORBIDDEN, &"Forbidden".into())
    );
    let (code, _) = ask(state.clone(), stop(Some(csrf_token("someone-else")))).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "another credential's token");
    // The right token passes the check; the credential is then asked of the API server, which
    // is not there.
    let (code, body) = ask(state, stop(Some(csrf_token("alices-token")))).await;
    assert_eq!(
        (code, &body["reason"]),
        (StatusCode::BAD_GATEWAY, &"Unreachable".into())
    );
}

#[tokio::test]
async fn a_proxy_may_not_name_a_system_user_and_its_writes_need_the_csrf_token() {
    let proxied = ServerState::behind_proxy(base(), console(), "X-Forwarded-User", None);
    let state = Arc::new(proxied);
    let request = |user: &str| {
        Request::get("/api/v1/namespaces/team/runs")
            .header(header::AUTHORIZATION, "Bearer proxys-token")
            .header("x-forwarded-user", user)
            .body(Body::empty())
            .unwrap()
    };
    let (code, body) = ask(state.clone(), request("system:admin")).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert!(body["message"].as_str().unwrap().contains("system:admin"));
    let write = post("/api/v1/namespaces/team/runs/r/stop")
        .header(header::AUTHORIZATION, "Bearer proxys-token")
        .header("x-forwarded-user", "alice")
        .header(header::CONTENT_LENGTH, "0")
        .body(Body::empty())
        .unwrap();
    let (code, body) = ask(state, write).await;
    assert_eq!(
        (code, &body["reason"]),
        (StatusCode::FORBIDDEN, &"Forbidden".into())
    );
}

#[tokio::test]
async fn a_body_announced_over_its_routes_bound_is_refused_before_its_sender_is_asked() {
    let state = in_cluster(SessionKey::random());
    let cases = [
        ("/api/v1/namespaces/team/runs/r/inputs", 512 * 1024 + 1),
        (
            "/ledger/v1/namespaces/team/runs/r/segments",
            super::APPEND_BODY_LIMIT + 1,
        ),
    ];
    for (uri, length) in cases {
        // No credential at all: the bound answers first, and nothing of the body is read.
        let request = post(uri)
            .header(header::CONTENT_LENGTH, length.to_string())
            .body(Body::empty())
            .unwrap();
        let (code, body) = ask(state.clone(), request).await;
        assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE, "{uri}: {body}");
        assert_eq!(body["reason"], "RequestEntityTooLarge");
    }
}

#[tokio::test]
async fn the_ledger_endpoint_of_a_server_without_a_ledger_refuses_every_call() {
    let state = in_cluster(SessionKey::random());
    let uri = "/ledger/v1/namespaces/team/runs/r/segments?uid=u&after=0";
    let token = "Bearer a-workers-token";
    for method in [Method::GET, Method::POST, Method::DELETE] {
        let request = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::AUTHORIZATION, token)
            .header(header::CONTENT_LENGTH, "2")
            .body(Body::from("{}"))
            .unwrap();
        let (code, body) = ask(state.clone(), request).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{method}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("keeps no ledger"), "{method}: {message}");
    }
}

#[tokio::test]
async fn probes_and_metrics_answer_without_a_credential() {
    let state = in_cluster(SessionKey::random());
    for path in ["/livez", "/readyz"] {
        let response = router(state.clone()).oneshot(get(path)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let response = router(state).oneshot(get("/metrics")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let kind = response.headers()[header::CONTENT_TYPE].to_str().unwrap();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
}

/// An error the server answers with, its HTTP code and its Kubernetes `reason`.
type Case = (super::ApiError, u16, &'static str);

fn run() -> String {
    "r".to_string()
}

fn ns() -> String {
    "team".to_string()
}

fn forbidden() -> kube::core::Status {
    kube::core::Status::failure("runs \"r\" is forbidden", "Forbidden").with_code(403)
}

/// The server's own refusals and failures.
fn server_errors() -> Vec<Case> {
    use super::ApiError as E;
    vec![
        (E::Unauthenticated, 401, "Unauthorized"),
        (E::BadRequest("ns: bad".into()), 400, "BadRequest"),
        (E::Csrf, 403, "Forbidden"),
        (E::TooManyStreams { limit: 8 }, 429, "TooManyRequests"),
        (E::TooManyHubs { limit: 8 }, 503, "ServiceUnavailable"),
        (E::TooLarge { limit: 8 }, 413, "RequestEntityTooLarge"),
        (
            E::ThreadNotFound {
                name: run(),
                namespace: ns(),
            },
            404,
            "NotFound",
        ),
        (
            E::ThreadBusy {
                thread: run(),
                live: "r-1".into(),
            },
            409,
            "ThreadBusy",
        ),
        (E::Kube(Box::new(forbidden())), 403, "Forbidden"),
        (E::Unreachable("refused".into()), 502, "Unreachable"),
        (
            E::Forbidden("not the run's worker".into()),
            403,
            "Forbidden",
        ),
        (E::Gone("run r is gone".into()), 409, "RunGone"),
        (
            E::LedgerUnavailable("down".into()),
            503,
            "LedgerUnavailable",
        ),
        (E::LedgerBroken("a gap".into()), 500, "LedgerBroken"),
    ]
}

/// What a person's request to a run may meet (`requests.rs`).
fn request_errors() -> Vec<Case> {
    use super::ApiError as E;
    use crate::approval::DecisionError as D;
    use crate::requests::RequestError as R;
    vec![
        (
            E::Request(R::NotFound {
                name: run(),
                namespace: ns(),
            }),
            404,
            "NotFound",
        ),
        (
            E::Request(R::NotWaitingForInput {
                name: run(),
                phase: Default::default(),
            }),
            409,
            "NotWaitingForInput",
        ),
        (
            E::Request(R::Decision(D::NotWaiting {
                run: run(),
                phase: Default::default(),
            })),
            409,
            "NotWaitingForApproval",
        ),
        (
            E::Request(R::Decision(D::OtherStep {
                run: run(),
                asked: 2,
                pending: 1,
                tool: "sh".into(),
            })),
            409,
            "OtherStep",
        ),
        (
            E::Request(R::Decision(D::AlreadyDecided {
                run: run(),
                step: 1,
                verdict: crate::crd::v1alpha1::Verdict::Approve,
            })),
            409,
            "AlreadyDecided",
        ),
        (
            E::Request(R::CallNotShown {
                name: run(),
                step: 1,
            }),
            409,
            "CallNotShown",
        ),
        (E::Request(R::Contended { name: run() }), 409, "Conflict"),
        (
            E::Request(R::Ledger {
                name: run(),
                detail: "a gap".into(),
                transient: false,
            }),
            502,
            "LedgerUnreadable",
        ),
        (
            E::Request(R::Kube(kube::Error::Api(Box::new(forbidden())))),
            403,
            "Forbidden",
        ),
    ]
}

#[tokio::test]
async fn each_error_is_answered_as_a_kubernetes_status_with_its_code_and_reason() {
    for (error, code, reason) in server_errors().into_iter().chain(request_errors()) {
        let said = error.to_string();
        let response = axum::response::IntoResponse::into_response(error);
        assert_eq!(response.status().as_u16(), code, "{said}");
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["kind"], "Status", "{said}");
        assert_eq!(body["code"], code, "{said}");
        assert_eq!(body["reason"], reason, "{said}");
        assert!(!body["message"].as_str().unwrap().is_empty(), "{said}");
    }
}
