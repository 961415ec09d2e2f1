//! An error with every error under it, for messages: a refused TLS handshake or a failed
//! connection says why only in its sources (an unknown issuer, a name that does not match,
//! a refused port), which `Display` of the outer error leaves out.

/// `err` and its sources, joined by `: `; a source whose words the text already ends with
/// (an error that shows its source in its own message) is not said twice.
pub fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.ends_with(&said) {
            text.push_str(&format!(": {said}"));
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::with_causes;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("ServiceError: {0}")]
        Shows(#[source] Inner),
        #[error("connecting")]
        Hides(#[source] Inner),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("error reading a body from connection")]
    struct Inner(#[source] std::io::Error);

    fn reset() -> Inner {
        Inner(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        ))
    }

    #[test]
    fn every_cause_is_said_once() {
        assert_eq!(
            with_causes(&Outer::Shows(reset())),
            "ServiceError: error reading a body from connection: connection reset by peer"
        );
        assert_eq!(
            with_causes(&Outer::Hides(reset())),
            "connecting: error reading a body from connection: connection reset by peer"
        );
    }
}
