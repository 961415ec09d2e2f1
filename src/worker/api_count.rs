//! Counts every request the worker's client sends to the API server, by kind, so the
//! benchmark can report requests per step. A tower layer under kube's client.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use kube::client::{Body, ClientBuilder};

/// Request counters, shared by every clone of the client.
#[derive(Debug, Default)]
pub struct ApiCounters {
    pub get: AtomicU64,
    pub list: AtomicU64,
    pub watch: AtomicU64,
    pub create: AtomicU64,
    pub update: AtomicU64,
    pub patch: AtomicU64,
    pub delete: AtomicU64,
    /// Round trips the agent loop awaited (the hot path).
    pub awaited: AtomicU64,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApiCounts {
    pub get: u64,
    pub list: u64,
    pub watch: u64,
    pub create: u64,
    pub update: u64,
    pub patch: u64,
    pub delete: u64,
    pub awaited: u64,
}

impl ApiCounts {
    /// Every request sent.
    pub fn total(&self) -> u64 {
        self.get + self.list + self.watch + self.create + self.update + self.patch + self.delete
    }
}

impl ApiCounters {
    pub fn snapshot(&self) -> ApiCounts {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ApiCounts {
            get: l(&self.get),
            list: l(&self.list),
            watch: l(&self.watch),
            create: l(&self.create),
            update: l(&self.update),
            patch: l(&self.patch),
            delete: l(&self.delete),
            awaited: l(&self.awaited),
        }
    }

    pub fn add_awaited(&self, n: u64) {
        self.awaited.fetch_add(n, Ordering::Relaxed);
    }

    fn count(&self, method: &http::Method, query: &str) {
        let counter = match *method {
            http::Method::GET if query.contains("watch=") => &self.watch,
            http::Method::GET => &self.get,
            http::Method::POST => &self.create,
            http::Method::PUT => &self.update,
            http::Method::PATCH => &self.patch,
            http::Method::DELETE => &self.delete,
            _ => &self.get,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// True for a collection path (a list), false for an object or subresource path.
fn is_list(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(
        parts.as_slice(),
        ["apis", _, _, "namespaces", _, _]
            | ["api", _, "namespaces", _, _]
            | ["apis", _, _, _]
            | ["api", _, _]
    )
}

/// The layer that counts.
#[derive(Clone)]
pub struct CountLayer(pub Arc<ApiCounters>);

impl<S> tower::Layer<S> for CountLayer {
    type Service = CountService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CountService {
            inner,
            counters: self.0.clone(),
        }
    }
}

/// The counting service.
#[derive(Clone)]
pub struct CountService<S> {
    inner: S,
    counters: Arc<ApiCounters>,
}

impl<S> tower::Service<http::Request<Body>> for CountService<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let query = req.uri().query().unwrap_or_default();
        if req.method() == http::Method::GET
            && !query.contains("watch=")
            && is_list(req.uri().path())
        {
            self.counters.list.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.count(req.method(), query);
        }
        self.inner.call(req)
    }
}

/// A client from the environment (in-cluster or KUBECONFIG) whose requests are counted.
pub async fn counted_client(counters: Arc<ApiCounters>) -> Result<kube::Client, kube::Error> {
    let config = crate::kube_util::config_for("worker").await?;
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&CountLayer(counters)).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collections_are_lists_and_objects_are_gets() {
        assert!(is_list(
            "/apis/baton.dev/v1alpha1/namespaces/ns/ledgersegments"
        ));
        assert!(!is_list(
            "/apis/baton.dev/v1alpha1/namespaces/ns/ledgersegments/r-000001"
        ));
        assert!(!is_list(
            "/apis/baton.dev/v1alpha1/namespaces/ns/agentruns/r/status"
        ));
        assert!(is_list("/api/v1/namespaces/ns/pods"));
        assert!(!is_list("/api/v1/namespaces/ns/pods/p"));
    }
}
