//! An error with every error under it, for messages: a refused TLS handshake or a failed
//! connection says why only in its sources (an unknown issuer, a name that does not match,
//! a refused port), which `Display` of the outer error leaves out.

/// `err` and its sources, joined by `: `.
pub fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}
