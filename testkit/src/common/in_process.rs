//! baton's components run in the test's own process: the controller scoped to one test
//! namespace, and any task that must end with the test.

use baton::controller::{self, Config};
use tokio::task::JoinHandle;

use super::TestNamespace;

/// A task that is aborted when the test lets go of it.
pub struct Running(JoinHandle<()>);

impl Running {
    pub fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A controller's settings for `ns` alone: no election, no admin server.
pub fn controller_config(ns: &TestNamespace) -> Config {
    Config {
        namespace: Some(ns.name.clone()),
        leader_election: false,
        leader_namespace: ns.name.clone(),
        admin_addr: None,
        ..Config::default()
    }
}

/// The controller, scoped to the test's namespace.
pub fn start_controller(ns: &TestNamespace) -> Running {
    start_controller_with(ns, controller_config(ns))
}

/// The controller with `config`, for as long as the test holds it.
pub fn start_controller_with(ns: &TestNamespace, config: Config) -> Running {
    let client = ns.client.clone();
    Running::spawn(async move {
        if let Err(err) = controller::run(client, config).await {
            eprintln!("controller stopped: {err}");
        }
    })
}
