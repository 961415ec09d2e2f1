//! The ledger tokens the API server accepted a moment ago (pure: the caller brings the
//! clock). A worker appends every step with the same token, and a TokenReview per append
//! would double the API server's share of each step. An accepted token is trusted again for
//! [`TRUST_FOR`]: a pod deleted meanwhile keeps its token that much longer, which the fence
//! makes harmless (a superseded writer's append is refused by the database, whatever its
//! token). A refusal is never kept: the next request asks again.
//!
//! Written by hand: a map with an expiry and a bound is all it needs, and no cache crate in
//! the tree already does both without a background task.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::UserInfo;
use sha2::{Digest, Sha256};

/// How long an accepted token is trusted without asking again (a bound token lives ten
/// minutes at least).
pub const TRUST_FOR: Duration = Duration::from_secs(10);
/// At most this many tokens are kept (each a live worker or controller).
pub const MAX_TOKENS: usize = 4096;

/// Accepted tokens, by their SHA-256 (the tokens themselves are not kept).
#[derive(Default)]
pub struct TokenCache {
    accepted: HashMap<[u8; 32], (UserInfo, Instant)>,
}

impl TokenCache {
    /// The user `token` was accepted as, if that was less than [`TRUST_FOR`] before `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<UserInfo> {
        let (user, at) = self.accepted.get(&digest(token))?;
        (now.saturating_duration_since(*at) < TRUST_FOR).then(|| user.clone())
    }

    /// Keeps `token` as accepted for `user` at `now`; when full, the expired go first, then
    /// the oldest.
    pub fn accept(&mut self, token: &str, user: UserInfo, now: Instant) {
        if self.accepted.len() >= MAX_TOKENS {
            self.accepted
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < TRUST_FOR);
        }
        if self.accepted.len() >= MAX_TOKENS
            && let Some(oldest) = self.oldest()
        {
            self.accepted.remove(&oldest);
        }
        self.accepted.insert(digest(token), (user, now));
    }

    fn oldest(&self) -> Option<[u8; 32]> {
        self.accepted
            .iter()
            .min_by_key(|(_, (_, at))| *at)
            .map(|(key, _)| *key)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.accepted.len()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserInfo {
        UserInfo {
            username: Some(name.into()),
            ..UserInfo::default()
        }
    }

    #[test]
    fn an_accepted_token_is_trusted_for_a_while_then_asked_about_again() {
        let mut cache = TokenCache::default();
        let t0 = Instant::now();
        assert_eq!(cache.get("tok", t0), None);
        cache.accept("tok", user("worker"), t0);
        let seen = cache
            .get("tok", t0 + TRUST_FOR / 2)
            .and_then(|u| u.username);
        assert_eq!(seen.as_deref(), Some("worker"));
        assert_eq!(cache.get("tok", t0 + TRUST_FOR), None);
        assert_eq!(cache.get("another", t0), None);
    }

    #[test]
    fn a_full_cache_drops_the_expired_then_the_oldest() {
        let mut cache = TokenCache::default();
        let t0 = Instant::now();
        for i in 0..MAX_TOKENS {
            cache.accept(
                &format!("t{i}"),
                user("u"),
                t0 + Duration::from_millis(i as u64),
            );
        }
        let later = t0 + Duration::from_secs(1);
        cache.accept("new", user("n"), later);
        assert_eq!(cache.len(), MAX_TOKENS);
        assert_eq!(cache.get("t0", later), None, "the oldest went");
        assert!(cache.get("t1", later).is_some() && cache.get("new", later).is_some());
        let expired = t0 + TRUST_FOR + Duration::from_secs(5);
        cache.accept("fresh", user("f"), expired);
        assert_eq!(cache.len(), 1, "the expired all went first");
    }
}
