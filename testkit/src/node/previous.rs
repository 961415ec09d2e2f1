//! The release the upgrade lane starts from (`hack/previous-release`), as `hack/images.sh
//! previous` built it: its image `baton:previous` in the node's containerd, its source tree,
//! chart and CRDs included, under the cache. And the node's release switched to it, then
//! upgraded as docs/operations.md ("Upgrading") says.

use super::*;

/// The previous release's image tag on the node (`hack/images.sh previous`).
pub const PREVIOUS_TAG: &str = "previous";

pub use crate::common::previous_release::PreviousRelease;

/// The node's release replaced by the previous one (this tree's uninstalled, the previous
/// CRDs applied over this tree's, its chart installed with its image). Dropped before
/// [`OnPreviousRelease::upgrade`], it uninstalls the previous release and puts this tree's
/// CRDs back: the next test binary installs this tree's chart afresh.
pub struct OnPreviousRelease {
    upgraded: bool,
}

impl OnPreviousRelease {
    /// `values`: besides the previous image, what the release is installed with (the same
    /// values go to [`Self::upgrade`], as a user passes the file they installed with).
    pub async fn install(
        client: &Client,
        previous: &PreviousRelease,
        values: &serde_json::Value,
    ) -> Self {
        helm("uninstall", THIS_CHART, &[], &serde_json::json!({}));
        let switched = Self { upgraded: false };
        wait_no_controller_pods(client, Duration::from_secs(120)).await;
        apply_crds(&previous.crds()).expect("applying the previous release's CRDs");
        let mut values = values.clone();
        merge(
            &mut values,
            &serde_json::json!({"image": {"tag": PREVIOUS_TAG}}),
        );
        helm(
            "install",
            &previous.chart(),
            &["--create-namespace"],
            &values,
        );
        wait_controllers_ready(client, Duration::from_secs(180)).await;
        wait_webhook_answers(client, Duration::from_secs(60)).await;
        switched
    }

    /// The upgrade of docs/operations.md ("Upgrading"), in its order: this tree's CRDs applied, then the
    /// release upgraded to this tree's chart with the new image named.
    /// `values`: what the release was switched to meanwhile (as a user passes the values file
    /// they installed with), besides the new image.
    pub fn upgrade(mut self, values: &serde_json::Value) {
        apply_crds(THIS_CHART_CRDS)
            .expect("applying this tree's CRDs (docs/operations.md, \"Upgrading\")");
        let mut values = values.clone();
        merge(&mut values, &serde_json::json!({"image": {"tag": "dev"}}));
        helm_upgrade(&values);
        self.upgraded = true;
    }
}

const THIS_CHART_CRDS: &str = "charts/baton/crds/";

/// The CRD command of docs/operations.md ("Upgrading") on the CRDs in `dir`. `--force-conflicts`: Helm created the CRDs,
/// so their fields belong to Helm's field manager, and changing them by another is a conflict
/// (without it the apply fails on every CRD that changed).
fn apply_crds(dir: &str) -> Result<String, String> {
    kubectl(&["apply", "--server-side", "--force-conflicts", "-f", dir])
}

impl Drop for OnPreviousRelease {
    fn drop(&mut self) {
        if self.upgraded {
            return;
        }
        // No panic in a drop: each step is tried, and the next test's install says the rest.
        let _ = Command::new("python3")
            .env("KUBECONFIG", kubeconfig())
            .arg(root().join("hack/helm.py"))
            .args(["uninstall", "--name", RELEASE, "--namespace", SYSTEM_NS])
            .status();
        let _ = apply_crds(&root().join(THIS_CHART_CRDS).display().to_string());
    }
}

/// Waits until no controller pod of the release is left (an uninstall's pods terminate).
async fn wait_no_controller_pods(client: &Client, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let (pods, _) = controller_pods(client).await;
        if pods.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "controller pods still there {timeout:?} after the uninstall: {:?}",
            pods.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
