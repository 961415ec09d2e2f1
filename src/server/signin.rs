//! Signing in to the console, and its script and stylesheet. In-cluster, a Kubernetes token
//! (checked by the API server first) goes into the session cookie; for `baton console`, the
//! one-time address trades for the session secret, once.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use askama::Template;
use axum::Form;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{MethodRouter, get};
use serde::Deserialize;

use super::ServerState;
use super::caller::well_formed;
use super::console::{guarded, html};
use super::identity::{COOKIE, Cookies, Identity, LOGIN_COOKIE, random_secret, same};
use super::session::LIFETIME;

#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    problem: Option<String>,
    /// The value the form repeats from its cookie ([`LOGIN_COOKIE`]).
    nonce: String,
}

/// How long a sign-in form may wait to be sent.
const FORM_LIFETIME: Duration = Duration::from_secs(3600);

#[derive(Deserialize, Default)]
pub struct SignInQuery {
    once: Option<String>,
}

/// The largest sign-in form: it is read before its token can be checked (the token is in it),
/// and a token is a few KiB at most (an OIDC ID token with many groups, ~8 KiB).
const SIGN_IN_LIMIT: usize = 16 * 1024;

/// `/console/login`: the page, and the form posted from it within [`SIGN_IN_LIMIT`] (a body
/// announced larger is refused unread).
pub fn route() -> MethodRouter<Arc<ServerState>> {
    let bounded = tower::ServiceBuilder::new()
        .layer(axum::middleware::from_fn_with_state(
            SIGN_IN_LIMIT,
            super::body::announced_within,
        ))
        .layer(DefaultBodyLimit::max(SIGN_IN_LIMIT));
    get(login_page).post(login).layer(bounded)
}

pub async fn login_page(
    State(state): State<Arc<ServerState>>,
    Query(query): Query<SignInQuery>,
) -> Response {
    let Identity::Local(user) = &state.identity else {
        return form(&state, None, StatusCode::OK);
    };
    match query.once.as_deref().and_then(|s| user.sign_in(s)) {
        Some(session) => signed_in_as(&state, &session),
        None => form(
            &state,
            Some("Open the address `baton console` printed; it signs in once.".into()),
            StatusCode::OK,
        ),
    }
}

/// The sign-in page with a fresh form nonce, its cookie set beside it.
fn form(state: &ServerState, problem: Option<String>, status: StatusCode) -> Response {
    let nonce = random_secret();
    let cookie = state.cookies().set(LOGIN_COOKIE, &nonce, FORM_LIFETIME);
    let mut response = html(LoginPage { problem, nonce });
    *response.status_mut() = status;
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

#[derive(Deserialize)]
pub struct SignInForm {
    token: String,
    /// The form's nonce: equal to its cookie's for a form this server served to this browser.
    #[serde(default)]
    nonce: String,
}

/// Signs in with a Kubernetes token, checked by the API server first (a
/// SelfSubjectAccessReview, which any authenticated user may create). The form must come from
/// this server's own page in this browser (its nonce equals its cookie's, which another
/// site's page can neither read nor set), and from a page of this host (its `Origin`): a
/// sign-in posted from elsewhere would sign the victim in as the attacker (login CSRF).
pub async fn login(
    State(state): State<Arc<ServerState>>,
    parts: Parts,
    Form(sign_in): Form<SignInForm>,
) -> Response {
    let refused = |problem: String| form(&state, Some(problem), StatusCode::UNAUTHORIZED);
    if let Some(problem) = foreign_form(&parts, state.cookies(), &sign_in.nonce) {
        let mut r = refused(problem);
        *r.status_mut() = StatusCode::FORBIDDEN;
        return r;
    }
    let token = sign_in.token.trim();
    if !well_formed(token) || matches!(state.identity, Identity::Local(_)) {
        return refused("That is not a token this console takes.".into());
    }
    let caller = match state.identity.caller(token) {
        Ok(c) => c,
        Err(e) => return refused(e.to_string()),
    };
    match super::caller::check_token(caller.client()).await {
        Ok(()) => signed_in_as(&state, &state.sessions.seal(token, SystemTime::now())),
        Err(e) => refused(format!("The API server refused this token: {e}")),
    }
}

/// Why a sign-in form is not this server's own, in this browser, or None.
fn foreign_form(parts: &Parts, cookies: Cookies, nonce: &str) -> Option<String> {
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let origin = parts
        .headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok());
    if let Some(origin) = origin {
        let authority = origin.split_once("://").map(|(_, a)| a);
        if authority.is_none() || authority != host {
            return Some(format!(
                "This sign-in came from another site ({origin}); sign in from this console's \
                 own page."
            ));
        }
    }
    match cookies.value(parts, LOGIN_COOKIE) {
        Some(expected) if !nonce.is_empty() && same(expected, nonce) => None,
        _ => Some(
            "This sign-in form is not one this console gave this browser (or it is over an \
             hour old); sign in from the page now shown."
                .into(),
        ),
    }
}

/// Signed in: the session cookie (sealed token, or the local session secret) set, the form's
/// own cookie forgotten.
fn signed_in_as(state: &ServerState, cookie: &str) -> Response {
    let mut response = Redirect::to("/console").into_response();
    let cookies = state.cookies();
    let set = [
        cookies.set(COOKIE, cookie, LIFETIME),
        cookies.clear(LOGIN_COOKIE),
    ];
    for value in set {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    guarded(response)
}

pub async fn logout(State(state): State<Arc<ServerState>>) -> Response {
    let mut response = Redirect::to("/console/login").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&state.cookies().clear(COOKIE)) {
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
