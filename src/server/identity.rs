//! Where a request's identity comes from, in the server's two modes:
//! - **in-cluster** (`baton server`): the caller's own Kubernetes token, from
//!   `Authorization: Bearer …` (the API) or from the console's cookie (a browser that signed
//!   in with its token), passed through to the API server;
//! - **behind an authenticating proxy** (`--proxy-user-header`): the proxy sends its own
//!   token and, in that header, the person it signed in; the server makes the request with the
//!   proxy's token impersonating that person, so the API server decides both whether the proxy
//!   may impersonate and what the person may do (baton trusts no header by itself);
//! - **local** (`baton console`): the kubeconfig's user, for the one browser that opened the
//!   one-time sign-in URL printed at start (its cookie then holds a random session secret).
//!
//! The in-cluster cookie holds the token sealed under the replicas' key (`session.rs`), never
//! the token itself.
//!
//! A write authenticated by the cookie must also carry `X-Baton-CSRF` with the credential's
//! CSRF token, which a page of another origin cannot know: the cookie alone (SameSite=Strict
//! as well) never authorizes a write.

use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Method, header};
use kube::Client;
use sha2::{Digest, Sha256};

use super::ServerState;
use super::caller::{Caller, Callers, Person, bearer_token, well_formed};
use super::error::ApiError;
use super::session::SessionKey;

/// The console's cookie: the sealed session (in-cluster, `session.rs`) or the session secret
/// (local); over TLS it is `__Host-` prefixed, so only this host's own secure pages may set it.
pub const COOKIE: &str = "baton_session";
/// The sign-in form's cookie: a random value the form repeats, so a sign-in posted from
/// another site (which can neither read nor set it) is refused.
pub const LOGIN_COOKIE: &str = "baton_login";
/// The header a cookie-authenticated write must carry.
pub const CSRF_HEADER: &str = "x-baton-csrf";

/// The headers an authenticating proxy names its signed-in person in.
#[derive(Debug, Clone)]
pub struct ProxyHeaders {
    pub user: String,
    pub groups: Option<String>,
}

impl ProxyHeaders {
    /// The person the request's headers name, if it names one (groups: the header repeated,
    /// or comma-separated). A `system:` name is Kubernetes' own (its components, and groups
    /// such as `system:masters`): never one a proxy's person is given, so such a user is
    /// refused and such groups are dropped, whatever the proxy may impersonate.
    fn person(&self, parts: &Parts) -> Option<Result<Person, ApiError>> {
        let user = parts.headers.get(self.user.as_str())?.to_str().ok()?.trim();
        if user.is_empty() {
            return None;
        }
        if is_system_name(user) {
            return Some(Err(ApiError::Forbidden(format!(
                "{}: {user:?} is a name of Kubernetes' own: baton impersonates no system: user",
                self.user
            ))));
        }
        let groups = self
            .groups
            .as_deref()
            .map(|name| {
                parts
                    .headers
                    .get_all(name)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(','))
                    .map(|g| g.trim().to_string())
                    .filter(|g| !g.is_empty() && !is_system_name(g))
                    .collect()
            })
            .unwrap_or_default();
        Some(Ok(Person {
            user: user.to_string(),
            groups,
        }))
    }
}

/// A user or group name of Kubernetes' own (`system:masters`, `system:kube-controller-manager`,
/// `system:serviceaccount:…`).
fn is_system_name(name: &str) -> bool {
    name.to_ascii_lowercase().starts_with("system:")
}

/// How the server knows who asks.
pub enum Identity {
    /// Each caller's own token, passed through (impersonating the person a proxy names, in
    /// proxy mode).
    PassThrough(Box<Callers>, Option<ProxyHeaders>),
    /// `baton console`: the local user's client, for the holder of the session.
    Local(LocalUser),
}

/// `baton console`'s one user.
pub struct LocalUser {
    client: Client,
    session: String,
    /// The sign-in secret of the printed URL, until it is used once.
    one_time: Mutex<Option<String>>,
}

impl LocalUser {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            session: random_secret(),
            one_time: Mutex::new(Some(random_secret())),
        }
    }

    /// The sign-in secret for the URL to print (None once used).
    pub fn one_time(&self) -> Option<String> {
        self.one_time
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Trades the one-time secret (once) for the session secret to keep in the cookie.
    pub fn sign_in(&self, secret: &str) -> Option<String> {
        let mut once = self.one_time.lock().unwrap_or_else(|e| e.into_inner());
        let matches = once.as_deref().is_some_and(|s| same(s, secret));
        if matches {
            *once = None;
            return Some(self.session.clone());
        }
        None
    }

    fn caller(&self, credential: &str) -> Result<Caller, ApiError> {
        if same(credential, &self.session) {
            Ok(Caller::new(credential, self.client.clone()))
        } else {
            Err(ApiError::Unauthenticated)
        }
    }
}

impl Identity {
    /// The caller holding `credential`.
    pub fn caller(&self, credential: &str) -> Result<Caller, ApiError> {
        match self {
            Identity::PassThrough(callers, _) => callers.client_for(credential),
            Identity::Local(user) => user.caller(credential),
        }
    }

    /// The credential a session cookie stands for: in-cluster the token it holds sealed
    /// (None once expired, or sealed under another key), locally the session secret itself.
    pub fn session_credential(&self, sessions: &SessionKey, cookie: &str) -> Option<String> {
        match self {
            Identity::PassThrough(..) => sessions.open(cookie, std::time::SystemTime::now()),
            Identity::Local(_) => Some(cookie.to_string()),
        }
    }

    /// In proxy mode, the holder of `token` (the proxy) impersonating the person the headers
    /// name; a request that names nobody is refused, so the proxy's own identity never acts
    /// for a request. None in any other mode.
    fn proxied(&self, token: &str, parts: &Parts) -> Option<Result<Caller, ApiError>> {
        let Identity::PassThrough(callers, Some(headers)) = self else {
            return None;
        };
        let Some(person) = headers.person(parts) else {
            return Some(Err(ApiError::Forbidden(format!(
                "{}: behind an authenticating proxy every request names its person; this one \
                 names nobody",
                headers.user
            ))));
        };
        Some(person.and_then(|person| callers.client_as(token, Some(&person))))
    }
}

/// The CSRF token of a credential: a page that cannot read the cookie cannot compute it.
pub fn csrf_token(credential: &str) -> String {
    hex(&Sha256::digest(
        format!("baton-csrf\0{credential}").as_bytes(),
    ))
}

/// How the console's cookies are written: `Secure` and `__Host-` prefixed when the browser
/// reaches the server over TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cookies {
    pub secure: bool,
}

impl Cookies {
    /// The cookie `base` is called: `__Host-base` when secure.
    pub fn name(self, base: &str) -> String {
        match self.secure {
            true => format!("__Host-{base}"),
            false => base.to_string(),
        }
    }

    /// The value the browser's cookie `base` holds, if any.
    pub fn value<'p>(self, parts: &'p Parts, base: &str) -> Option<&'p str> {
        let name = self.name(base);
        parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(found, _)| *found == name)
            .map(|(_, value)| value)
            .filter(|v| well_formed(v))
    }

    /// The `Set-Cookie` value that keeps `value` as `base` for this browser for `max_age`:
    /// unreadable by scripts, never sent by another site's requests.
    pub fn set(self, base: &str, value: &str, max_age: std::time::Duration) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!(
            "{}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            self.name(base),
            max_age.as_secs()
        )
    }

    /// The `Set-Cookie` value that forgets `base`.
    pub fn clear(self, base: &str) -> String {
        self.set(base, "", std::time::Duration::ZERO)
    }
}

impl FromRequestParts<Arc<ServerState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ServerState>,
    ) -> Result<Self, Self::Rejection> {
        if let Some(token) = bearer_token(parts) {
            // A proxy adds its credential to whatever a browser sends it, another site's
            // form included: its writes need the CSRF header, as the cookie's do.
            if let Some(proxied) = state.identity.proxied(token, parts) {
                let caller = proxied?;
                check_csrf(parts, caller.token())?;
                return verified_if_writing(parts, state, caller).await;
            }
            let caller = state.identity.caller(token)?;
            return verified_if_writing(parts, state, caller).await;
        }
        let cookie = state.cookies().value(parts, COOKIE);
        let credential = cookie.and_then(|c| state.identity.session_credential(&state.sessions, c));
        let credential = credential.ok_or(ApiError::Unauthenticated)?;
        let caller = state.identity.caller(&credential)?;
        check_csrf(parts, &credential)?;
        verified_if_writing(parts, state, caller).await
    }
}

/// A request that may carry a body (anything but GET and HEAD) is let on only once the API
/// server has accepted its credential, so no body is read for a credential it would refuse.
/// The question is a SelfSubjectAccessReview made as the caller: any credential the API
/// server accepts may create one (`system:basic-user`), it writes nothing, and it answers 401
/// for a credential it does not accept (403 for an impersonation the proxy may not make). An
/// accepted credential is trusted again for a few seconds (`token_cache`).
async fn verified_if_writing(
    parts: &Parts,
    state: &Arc<ServerState>,
    caller: Caller,
) -> Result<Caller, ApiError> {
    if matches!(parts.method, Method::GET | Method::HEAD) || state.recently_verified(&caller) {
        return Ok(caller);
    }
    super::caller::check_token(caller.client()).await?;
    state.verified(&caller);
    Ok(caller)
}

/// A write must carry the CSRF token of the credential it is made with.
fn check_csrf(parts: &Parts, credential: &str) -> Result<(), ApiError> {
    let reads_only = matches!(parts.method, Method::GET | Method::HEAD);
    let csrf = parts.headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    if reads_only || csrf.is_some_and(|c| same(c, &csrf_token(credential))) {
        Ok(())
    } else {
        Err(ApiError::Csrf)
    }
}

/// Compares secrets in time independent of where they differ.
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub(super) fn random_secret() -> String {
    hex(&rand::random::<[u8; 32]>())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_proxy_names_no_system_user_and_no_system_group() {
        let headers = ProxyHeaders {
            user: "x-remote-user".into(),
            groups: Some("x-remote-group".into()),
        };
        let request = |user: &str, groups: &str| {
            let request = axum::http::Request::builder()
                .header("X-Remote-User", user)
                .header("X-Remote-Group", groups)
                .body(())
                .unwrap();
            request.into_parts().0
        };
        let alice = headers
            .person(&request("alice", "team-a, system:masters,SYSTEM:Nodes"))
            .unwrap()
            .unwrap();
        assert_eq!(alice.groups, ["team-a"]);
        let component = headers.person(&request("system:kube-controller-manager", "x"));
        assert!(matches!(component, Some(Err(ApiError::Forbidden(_)))));
        let nobody = axum::http::Request::builder().body(()).unwrap();
        assert!(headers.person(&nobody.into_parts().0).is_none());
    }

    use super::*;

    #[tokio::test]
    async fn the_one_time_secret_signs_in_once() {
        let user = LocalUser {
            client: unreachable_client(),
            session: "s".repeat(64),
            one_time: Mutex::new(Some("o".repeat(64))),
        };
        assert_eq!(user.sign_in(&"x".repeat(64)), None);
        assert_eq!(user.sign_in(&"o".repeat(64)), Some("s".repeat(64)));
        assert_eq!(user.sign_in(&"o".repeat(64)), None, "used once");
        assert!(user.caller(&"s".repeat(64)).is_ok());
        assert!(user.caller(&"o".repeat(64)).is_err());
    }

    #[test]
    fn the_csrf_token_depends_on_the_credential() {
        assert_ne!(csrf_token("a"), csrf_token("b"));
        assert_eq!(csrf_token("a").len(), 64);
    }

    fn unreachable_client() -> Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Client::try_from(config).unwrap()
    }
}
