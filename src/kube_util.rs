//! Small helpers over kube's error type, shared by every module that talks to the API server.

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

/// 403.
pub fn is_forbidden(err: &kube::Error) -> bool {
    status(err).is_some_and(|s| s.is_forbidden())
}
