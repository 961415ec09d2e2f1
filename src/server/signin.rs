//! Signing in to the console, and its script and stylesheet. In-cluster, a Kubernetes token
//! (checked by the API server first) goes into the session cookie; for `baton console`, the
//! one-time address trades for the session secret, once.

use std::sync::Arc;

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use kube::Api;
use kube::api::PostParams;
use serde::Deserialize;

use super::ServerState;
use super::caller::well_formed;
use super::console::{guarded, html};
use super::identity::{Identity, cleared_cookie, session_cookie};

#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    problem: Option<String>,
}

#[derive(Deserialize, Default)]
pub struct SignInQuery {
    once: Option<String>,
}

pub async fn login_page(
    State(state): State<Arc<ServerState>>,
    Query(query): Query<SignInQuery>,
) -> Response {
    let Identity::Local(user) = &state.identity else {
        return html(LoginPage { problem: None });
    };
    match query.once.as_deref().and_then(|s| user.sign_in(s)) {
        Some(session) => signed_in_as(&session),
        None => html(LoginPage {
            problem: Some("Open the address `baton console` printed; it signs in once.".into()),
        }),
    }
}

#[derive(Deserialize)]
pub struct SignInForm {
    token: String,
}

/// Signs in with a Kubernetes token, checked by the API server first (a
/// SelfSubjectAccessReview, which any authenticated user may create).
pub async fn login(
    State(state): State<Arc<ServerState>>,
    Form(form): Form<SignInForm>,
) -> Response {
    let token = form.token.trim();
    let refused = |problem: String| {
        let mut r = html(LoginPage {
            problem: Some(problem),
        });
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        r
    };
    if !well_formed(token) || matches!(state.identity, Identity::Local(_)) {
        return refused("That is not a token this console takes.".into());
    }
    let caller = match state.identity.caller(token) {
        Ok(c) => c,
        Err(e) => return refused(e.to_string()),
    };
    match check_token(caller.client()).await {
        Ok(()) => signed_in_as(token),
        Err(e) => refused(format!("The API server refused this token: {e}")),
    }
}

async fn check_token(client: &kube::Client) -> Result<(), kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("baton.dev".into()),
                resource: Some("agentruns".into()),
                verb: Some("list".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    api.create(&PostParams::default(), &review)
        .await
        .map(|_| ())
}

fn signed_in_as(credential: &str) -> Response {
    let mut response = Redirect::to("/console").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&session_cookie(credential)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    guarded(response)
}

pub async fn logout() -> Response {
    let mut response = Redirect::to("/console/login").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&cleared_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

pub async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/console.js"),
    )
}

pub async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/console.css"),
    )
}
