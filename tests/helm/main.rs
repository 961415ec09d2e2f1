//! The Helm chart, with Helm's own SDK (hack/helm.py). One test binary (each file a module):
//! - `chart`: linted and rendered: restricted pods, exactly the controller's RBAC, values
//!   validated by the schema, CRDs in sync;
//! - `install`: installed into the real local API server, its RBAC proven with real requests;
//! - `webhook`: the admission webhook's objects, with either certificate issuer;
//! - `server`: `baton server`'s Deployment, Service and PDB, its ServiceAccount bound to nothing.
//!
//! The chart running for real, with its controller pods and worker pods, is on the node
//! (tests/node_e2e.rs).

mod chart;
mod install;
mod server;
mod webhook;
