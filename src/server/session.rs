//! The console's sessions (docs/security.md, "The console"): the browser's cookie holds its
//! Kubernetes token sealed (ChaCha20-Poly1305, from `ring`) under a key only the server's
//! replicas hold, with the time it was issued; never the raw token, so a cookie leaked to
//! another local server of the same host (cookies are per host, not per port) or read from a
//! browser's profile gives no Kubernetes credential. Stateless: every replica that holds the
//! key opens every session (the chart keeps the key in a Secret mounted into each replica);
//! a server started without a key makes one of its own, whose sessions end with it.
//! A session lasts [`LIFETIME`].

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// How long a signed-in browser stays signed in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Bound to every sealed session: a value sealed for anything else does not open as one.
const AAD: &[u8] = b"baton-console-session-v1";

/// Why the session key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("--console-session-key-file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("--console-session-key-file {path}: at least 32 bytes of key are needed, it has {len}")]
    Short { path: String, len: usize },
}

/// The key sessions are sealed under.
pub struct SessionKey {
    key: LessSafeKey,
    random: SystemRandom,
}

impl SessionKey {
    /// The key in `path` (its first 32 bytes; at least 32 are needed).
    pub fn from_file(path: &Path) -> Result<Self, SessionError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| SessionError::Read {
            path: shown.clone(),
            error,
        })?;
        let bytes = trim_ascii(&bytes);
        if bytes.len() < 32 {
            let len = bytes.len();
            return Err(SessionError::Short { path: shown, len });
        }
        Ok(Self::of(&bytes[..32]))
    }

    /// A key of this process alone.
    pub fn random() -> Self {
        Self::of(&rand::random::<[u8; 32]>())
    }

    fn of(bytes: &[u8]) -> Self {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes).expect("a 32-byte key");
        Self {
            key: LessSafeKey::new(unbound),
            random: SystemRandom::new(),
        }
    }

    /// `token`, sealed with the time `now` (what the cookie holds).
    pub fn seal(&self, token: &str, now: SystemTime) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .expect("the system's randomness");
        let issued = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let mut sealed = format!("{issued}\n{token}").into_bytes();
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(AAD),
                &mut sealed,
            )
            .expect("sealing a session");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        out.extend_from_slice(tag.as_ref());
        B64.encode(out)
    }

    /// The token `cookie` holds, if it was sealed under this key less than [`LIFETIME`]
    /// before `now`.
    pub fn open(&self, cookie: &str, now: SystemTime) -> Option<String> {
        let bytes = B64.decode(cookie).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, rest) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut rest = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(AAD), &mut rest)
            .ok()?;
        let (issued, token) = std::str::from_utf8(plain).ok()?.split_once('\n')?;
        let issued = UNIX_EPOCH + Duration::from_secs(issued.parse().ok()?);
        let age = now.duration_since(issued).ok()?;
        (age < LIFETIME).then(|| token.to_string())
    }
}

fn trim_ascii(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_opens_under_its_key_only_and_for_its_lifetime_only() {
        let key = SessionKey::random();
        let now = SystemTime::now();
        let cookie = key.seal("eyJhbGciOi.token", now);
        assert!(
            !cookie.contains("token"),
            "the cookie does not hold the token"
        );
        assert_eq!(key.open(&cookie, now).as_deref(), Some("eyJhbGciOi.token"));
        assert_eq!(key.open(&cookie, now + LIFETIME), None, "expired");
        assert_eq!(SessionKey::random().open(&cookie, now), None, "another key");
        let mut forged = B64.decode(&cookie).unwrap();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        assert_eq!(key.open(&B64.encode(forged), now), None, "tampered");
        assert_eq!(key.open("not base64 at all!", now), None);
        assert_ne!(
            key.seal("t", now),
            key.seal("t", now),
            "a fresh nonce each time"
        );
    }

    #[test]
    fn a_key_file_needs_32_bytes_and_replicas_with_one_file_share_sessions() {
        let dir = std::env::temp_dir().join(format!("baton-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short");
        std::fs::write(&short, "too short\n").unwrap();
        assert!(matches!(
            SessionKey::from_file(&short),
            Err(SessionError::Short { len: 9, .. })
        ));
        let file = dir.join("key");
        std::fs::write(&file, format!("{}\n", "k".repeat(64))).unwrap();
        let (one, other) = (
            SessionKey::from_file(&file).unwrap(),
            SessionKey::from_file(&file).unwrap(),
        );
        let now = SystemTime::now();
        assert_eq!(other.open(&one.seal("t", now), now).as_deref(), Some("t"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
