//! Retrying model calls. A rate limit or a provider outage must not lose the turn: the call
//! is made again after a backoff (or after what the provider asked for), a bounded number of
//! times, and a cancellation (lost lease, SIGTERM, stop) ends the wait at once.

use std::future::Future;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use tokio_util::sync::CancellationToken;

use super::{ModelError, ModelTurn};

/// How model calls are retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Calls made in all, the first one included.
    pub max_attempts: u32,
    /// Backoff before the second call; it doubles for each further call.
    pub base_delay: Duration,
    /// Bound on the computed backoff.
    pub max_delay: Duration,
    /// Bound on a provider's `retry-after`: a provider asking for an hour is waited on for
    /// this long, then asked again.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// 8 calls spread over about two minutes: long enough to ride out a rate-limit window.
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            max_retry_after: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed call number `attempt` (1-based). `jitter` is in [0, 1).
    /// The provider's `retry_after` wins when given. Otherwise "equal jitter": half of the
    /// exponential delay is fixed, so a crowd of workers still backs off; half is random, so
    /// they do not come back in lockstep.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_retry_after);
        }
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let full = self.base_delay.saturating_mul(factor).min(self.max_delay);
        full / 2 + full.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
    }
}

/// Makes `call` until it succeeds, fails permanently, or `policy.max_attempts` calls have
/// failed (then the last error is returned, still `Retryable`). Cancelling `cancel` aborts
/// the call in flight or the wait and returns a `Retryable` error: the turn was not lost,
/// the next owner of the run makes the call again.
pub async fn with_retries<F, Fut>(
    policy: &RetryPolicy,
    cancel: &CancellationToken,
    mut call: F,
) -> Result<ModelTurn, ModelError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<ModelTurn, ModelError>>,
{
    let mut attempt = 1;
    loop {
        let err = match cancellable(cancel, call()).await? {
            Ok(turn) => return Ok(turn),
            Err(err) => err,
        };
        let ModelError::Retryable { retry_after, .. } = &err else {
            return Err(err);
        };
        if attempt >= policy.max_attempts {
            return Err(gave_up(err, attempt));
        }
        let delay = policy.delay(attempt, *retry_after, rand::random::<f64>());
        tracing::warn!(attempt, delay_ms = delay.as_millis() as u64, error = %err, "model call failed, retrying");
        cancellable(cancel, tokio::time::sleep(delay)).await?;
        attempt += 1;
    }
}

/// `work`, unless `cancel` fires first.
async fn cancellable<T>(
    cancel: &CancellationToken,
    work: impl Future<Output = T>,
) -> Result<T, ModelError> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(ModelError::Retryable {
            message: "the model call was cancelled".into(),
            retry_after: None,
        }),
        out = work => Ok(out),
    }
}

fn gave_up(err: ModelError, attempts: u32) -> ModelError {
    match err {
        ModelError::Retryable {
            message,
            retry_after,
        } => ModelError::Retryable {
            message: format!("{message} (gave up after {attempts} attempts)"),
            retry_after,
        },
        permanent => permanent,
    }
}

/// How long the provider asked us to wait: `retry-after-ms` (OpenAI), else `retry-after` in
/// seconds or as an HTTP date (compared with `now`; a date in the past means "now").
pub fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tokio::time::Instant;

    use super::*;

    fn retryable(after: Option<Duration>) -> ModelError {
        ModelError::Retryable {
            message: "busy".into(),
            retry_after: after,
        }
    }

    fn turn() -> ModelTurn {
        ModelTurn {
            text: "ok".into(),
            ..ModelTurn::default()
        }
    }

    /// A call that fails with `errors` in order, then succeeds; counts its calls.
    fn scripted(
        errors: Vec<ModelError>,
    ) -> (
        Arc<AtomicU32>,
        impl FnMut() -> std::future::Ready<Result<ModelTurn, ModelError>>,
    ) {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let mut errors = errors.into_iter();
        let call = move || {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(errors.next().map_or_else(|| Ok(turn()), Err))
        };
        (calls, call)
    }

    #[test]
    fn delays_grow_exponentially_with_bounded_jitter() {
        let policy = RetryPolicy::default();
        let secs = |attempt, jitter| policy.delay(attempt, None, jitter).as_secs_f64();
        assert_eq!((secs(1, 0.0), secs(1, 0.999_999)), (0.5, 0.999_999_5));
        assert_eq!(secs(3, 0.0), 2.0);
        assert_eq!(secs(10, 0.0), 30.0, "bounded by max_delay");
        assert_eq!(secs(u32::MAX, 1.0), 60.0, "no overflow");
        let after = Some(Duration::from_secs(7));
        assert_eq!(policy.delay(1, after, 0.5), Duration::from_secs(7));
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(policy.delay(1, hour, 0.5), policy.max_retry_after);
    }

    #[test]
    fn retry_after_headers() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let parse = |name: &'static str, value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(name, value.parse().unwrap());
            parse_retry_after(&headers, now)
        };
        assert_eq!(parse("retry-after", "12"), Some(Duration::from_secs(12)));
        assert_eq!(
            parse("retry-after", " 1.5 "),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse("retry-after-ms", "250"),
            Some(Duration::from_millis(250))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(parse("retry-after", &later), Some(Duration::from_secs(30)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse("retry-after", &earlier), Some(Duration::ZERO));
        assert_eq!(parse("retry-after", "soon"), None);
        assert_eq!(parse("retry-after", "-3"), None);
        assert_eq!(parse_retry_after(&HeaderMap::new(), now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_until_success_honouring_retry_after() {
        let policy = RetryPolicy::default();
        let errors = vec![retryable(Some(Duration::from_secs(20))), retryable(None)];
        let (calls, call) = scripted(errors);
        let start = Instant::now();
        let result = with_retries(&policy, &CancellationToken::new(), call).await;
        assert_eq!(result.unwrap(), turn());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // 20 s as asked, then the second backoff: between 1 and 2 s.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(21) && waited < Duration::from_secs(22),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_attempts() {
        let policy = RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        };
        let (calls, call) = scripted((0..10).map(|_| retryable(None)).collect());
        let err = with_retries(&policy, &CancellationToken::new(), call)
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(matches!(err, ModelError::Retryable { .. }));
        assert!(
            err.to_string().contains("gave up after 3 attempts"),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_error_is_not_retried() {
        let permanent = ModelError::Permanent {
            status: Some(401),
            message: "bad key".into(),
        };
        let (calls, call) = scripted(vec![permanent]);
        let err = with_retries(&RetryPolicy::default(), &CancellationToken::new(), call).await;
        assert!(matches!(
            err,
            Err(ModelError::Permanent {
                status: Some(401),
                ..
            })
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_ends_the_wait_at_once() {
        let cancel = CancellationToken::new();
        let (calls, call) = scripted(vec![retryable(Some(Duration::from_secs(100)))]);
        let canceller = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            canceller.cancel();
        });
        let start = Instant::now();
        let err = with_retries(&RetryPolicy::default(), &cancel, call)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cancelled"), "{err}");
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_aborts_the_call_in_flight() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let call = || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(turn())
        };
        let err = with_retries(&RetryPolicy::default(), &cancel, call)
            .await
            .unwrap_err();
        assert!(matches!(err, ModelError::Retryable { .. }));
    }
}
