//! Small helpers over kube's client config and error type, shared by every module that talks
//! to the API server.

use http::HeaderValue;
use http::header::USER_AGENT;

/// The cluster config from the environment (in-cluster or KUBECONFIG), its requests naming the
/// baton component that sends them (`baton-<component>/<version>`). The API server takes the
/// User-Agent's product as the field manager of every write, so `managedFields` and audit logs
/// say `baton-controller` or `baton-worker` instead of `unknown`. One name per component, not
/// per pod: every distinct manager adds a `managedFields` entry that stays on the object, so a
/// per-pod name would grow a run's status with each attempt.
pub async fn config_for(component: &str) -> Result<kube::Config, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    let agent = HeaderValue::from_str(&user_agent(component))
        .map_err(|e| kube::Error::HttpError(http::Error::from(e)))?;
    config.headers.push((USER_AGENT, agent));
    Ok(config)
}

/// A client from the environment for `component` (see [`config_for`]).
pub async fn client_for(component: &str) -> Result<kube::Client, kube::Error> {
    kube::Client::try_from(config_for(component).await?)
}

/// `baton-<component>/<crate version>`.
pub fn user_agent(component: &str) -> String {
    format!("baton-{component}/{}", env!("CARGO_PKG_VERSION"))
}

/// The API server's status for an error, when it answered with one.
fn status(err: &kube::Error) -> Option<&kube::core::Status> {
    match err {
        kube::Error::Api(status) => Some(status),
        _ => None,
    }
}

/// 409 on a stale resourceVersion: the object changed since we read it.
pub fn is_conflict(err: &kube::Error) -> bool {
    status(err).is_some_and(|s| s.is_conflict())
}

/// 409 AlreadyExists on create.
pub fn is_already_exists(err: &kube::Error) -> bool {
    status(err).is_some_and(|s| s.is_already_exists())
}

/// 404.
pub fn is_not_found(err: &kube::Error) -> bool {
    status(err).is_some_and(|s| s.is_not_found())
}

/// The API server's message when it refuses an object for what it is, not for who asks: an
/// admission plugin's "pod rejected" or Pod Security "violates" (403), or an invalid field
/// (422). Asking again with the same object gets the same answer. (A 403 for a missing RBAC
/// permission, "cannot create resource", is the controller's setup, not the object's.)
pub fn refused_for_what_it_is(err: &kube::Error) -> Option<String> {
    let status = status(err)?;
    let message = &status.message;
    let admission = status.is_forbidden()
        && !message.contains("cannot create resource")
        && (message.contains("pod rejected") || message.contains("violates PodSecurity"));
    (admission || status.code == 422).then(|| message.clone())
}

/// 403.
pub fn is_forbidden(err: &kube::Error) -> bool {
    status(err).is_some_and(|s| s.is_forbidden())
}

/// A refusal that the server means to be retried soon: 429, 500 "... retry after" (the
/// ServiceAccount admission plugin's answer while a new account has no token yet), 503.
pub fn is_retry_soon(err: &kube::Error) -> bool {
    status(err).is_some_and(|s| match s.code {
        429 | 503 => true,
        500 => s.message.contains("retry after") || s.message.contains("No API token found"),
        _ => false,
    })
}

/// reqwest is built without a default TLS crypto provider (kube brings its own rustls
/// setup): every reqwest client of the process (model endpoints, HTTP and MCP tools, the
/// ledger server) is built after this installs ring's, once.
pub fn ensure_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Another component may have installed one first; any provider will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(message, "").with_code(code),
        ))
    }

    #[test]
    fn a_new_accounts_missing_token_is_a_refusal_to_retry_soon() {
        let no_token = "pods \"r-w1\" is forbidden: error looking up service account ns/baton-run-r: \
                        No API token found for service account \"baton-run-r\", retry after the token is \
                        automatically created and added to the service account";
        assert!(is_retry_soon(&api_error(500, no_token)));
        assert!(is_retry_soon(&api_error(
            503,
            "the server is currently unable to handle the request"
        )));
        assert!(is_retry_soon(&api_error(429, "too many requests")));
        assert!(!is_retry_soon(&api_error(
            500,
            "Internal error occurred: something else"
        )));
        assert!(!is_retry_soon(&api_error(403, "forbidden")));
        assert!(!is_retry_soon(&api_error(422, "Pod \"x\" is invalid")));
    }

    #[test]
    fn the_user_agent_names_the_component_and_version() {
        let agent = user_agent("controller");
        assert_eq!(
            agent,
            format!("baton-controller/{}", env!("CARGO_PKG_VERSION"))
        );
        assert!(HeaderValue::from_str(&agent).is_ok());
    }
}
