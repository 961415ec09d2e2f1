//! PostgreSQL for the node: started by the project's script (hack/postgres.sh) inside the
//! node's network namespace, listening on the node's address, where its pods (baton server)
//! reach it; the test reaches it through a loopback relay. Taken down when dropped.

use super::*;
use k8s_openapi::api::core::v1::Secret;

/// A throwaway PostgreSQL in the node's network namespace.
pub struct NodePostgres {
    dir: PathBuf,
    /// Its URL as pods use it (the node's address).
    pub url: String,
    /// Its URL from this process (through the relay).
    pub local_url: String,
    _relay: Relay,
}

impl NodePostgres {
    pub fn up() -> Self {
        let dir = std::env::temp_dir().join(format!("baton-node-pg-{:08x}", rand::random::<u32>()));
        script(&dir, "up");
        let printed = script(&dir, "env");
        let url = printed
            .trim()
            .strip_prefix("export BATON_TEST_POSTGRES_URL=")
            .unwrap_or_else(|| panic!("hack/postgres.sh env printed {printed:?}"))
            .to_string();
        let address = url
            .rsplit_once('@')
            .and_then(|(_, rest)| rest.split_once('/'))
            .map(|(address, _)| address.to_string())
            .expect("an address in the URL");
        let relay = Relay::start(&address);
        let local_url = url.replace(&address, &format!("127.0.0.1:{}", relay.port));
        Self {
            dir,
            url,
            local_url,
            _relay: relay,
        }
    }

    /// Stops it the way a crash does.
    pub fn crash(&self) {
        script(&self.dir, "crash");
    }

    /// Starts it again after a crash: same data, same address.
    pub fn start(&self) {
        script(&self.dir, "start");
    }
}

impl Drop for NodePostgres {
    fn drop(&mut self) {
        let _ = in_node()
            .args(["bash", "hack/postgres.sh", "down"])
            .env("BATON_PG_DIR", &self.dir)
            .status();
    }
}

/// The Secret holding the database's URL.
const DB_SECRET: &str = "baton-node-ledger-db";

/// The release switched to the PostgreSQL ledger for as long as this lives; switched back
/// (default values) when dropped.
pub struct InPostgres {
    /// The values that keep the release on PostgreSQL (`ledger`).
    pub values: serde_json::Value,
}

impl InPostgres {
    pub async fn switch(client: &Client, db: &NodePostgres) -> Self {
        Self::switch_release(client, db, THIS_CHART, &serde_json::json!({})).await
    }

    /// [`InPostgres::switch`] by a `helm upgrade` of `chart` (a directory) with `extra` values
    /// besides the ledger's: the upgrade lane switches the previous release.
    pub async fn switch_release(
        client: &Client,
        db: &NodePostgres,
        chart: &str,
        extra: &serde_json::Value,
    ) -> Self {
        servers_ready(client).await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NS);
        let _ = secrets.delete(DB_SECRET, &DeleteParams::default()).await;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(DB_SECRET.into()),
                ..Default::default()
            },
            string_data: Some([("url".to_string(), db.url.clone())].into()),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("the database's Secret");
        // The node runs no cluster DNS: the server is reached at its Service's cluster IP.
        let server = format!("http://{}:80", server_cluster_ip(client).await);
        let switched = Self {
            values: serde_json::json!({"ledger": {
                "backend": "PostgreSQL",
                "postgres": {"urlSecret": {"name": DB_SECRET}},
                "serverURL": server,
            }}),
        };
        let mut values = extra.clone();
        merge(&mut values, &switched.values);
        helm("upgrade", chart, &[], &values);
        wait_rolled_out(client, SERVER, Duration::from_secs(180)).await;
        wait_controllers_ready(client, Duration::from_secs(180)).await;
        switched
    }
}

impl InPostgres {
    /// Switches the release back and waits for it, before the test lets the next one run
    /// (its [`NodeEnv::finish`]): a test that started meanwhile would have its runs kept in
    /// a database the server is about to forget.
    pub async fn switch_back(self, client: &Client) {
        std::mem::forget(self);
        helm_upgrade(&serde_json::json!({}));
        wait_rolled_out(client, SERVER, Duration::from_secs(180)).await;
        wait_controllers_ready(client, Duration::from_secs(180)).await;
    }
}

/// A test that failed before [`InPostgres::switch_back`] still switches the release back.
impl Drop for InPostgres {
    fn drop(&mut self) {
        helm_upgrade(&serde_json::json!({}));
    }
}

/// `hack/postgres.sh command` in the node's network namespace, on the node's address; its
/// standard output.
fn script(dir: &Path, command: &str) -> String {
    let out = in_node()
        .args(["bash", "hack/postgres.sh", command])
        .env("BATON_PG_DIR", dir)
        .env("BATON_PG_LISTEN", NODE_IP)
        .env_remove("BATON_PG_PORT")
        .output()
        .expect("running hack/postgres.sh in the node's network namespace");
    assert!(
        out.status.success(),
        "hack/postgres.sh {command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn in_node() -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net={NETNS}"))
        .current_dir(crate::repo_root());
    command
}
