//! Whether the API server trusts the webhook yet. Serving the certificate whose CA is in the
//! configuration's `caBundle` is not enough: the API server reads the configuration through
//! its own watch, a moment later, and until then every review fails closed (a user's first
//! `kubectl apply` after `helm install --wait` would be refused). So a replica is Ready only
//! once a review has gone through: a dry-run create of a segment for a run that does not
//! exist, in its own namespace, which the webhook refuses by name. The refusal proves the
//! call arrived; a TLS failure says the API server does not trust it yet. (A namespace the
//! webhook does not select, or `failurePolicy: Ignore`, admits the dry run: nothing to wait
//! for.)

use std::time::Duration;

use kube::Client;
use kube::api::{Api, PostParams};

use crate::crd::v1alpha1::{LEDGER_FORMAT_VERSION, LedgerSegment, LedgerSegmentSpec};
use crate::fence::segment_name;

/// The run the probe names. Were a run of that name to exist, the probe's segment (at fence 1
/// from the controller) would be admitted: a dry run, so nothing is written either way.
const PROBE_RUN: &str = "baton-webhook-trust-probe";
/// How often the probe is tried while the API server does not trust the webhook yet.
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Returns once a review from the API server has reached the webhook (or cannot, by design).
pub async fn wait_trusted(client: &Client, namespace: &str) {
    let api = Api::<LedgerSegment>::namespaced(client.clone(), namespace);
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe = LedgerSegment::new(
        &segment_name(PROBE_RUN, 1),
        LedgerSegmentSpec {
            run: PROBE_RUN.into(),
            seq: 1,
            fence: 1,
            format: LEDGER_FORMAT_VERSION,
            events: vec![],
        },
    );
    loop {
        match reached(api.create(&params, &probe).await) {
            Ok(()) => return,
            Err(why) => tracing::info!(%why, "the API server does not reach the webhook yet"),
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// Whether the answer to the probe shows that the review reached the webhook.
fn reached(answer: Result<LedgerSegment, kube::Error>) -> Result<(), String> {
    match answer {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if is_our_refusal(status.code, &status.message) => Ok(()),
        Err(err) => Err(err.to_string()),
    }
}

/// A refusal by baton's segment webhook, as the API server relays it.
fn is_our_refusal(code: u16, message: &str) -> bool {
    code == 403 && message.contains("segments.baton.dev\" denied the request")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_by_the_webhook_shows_it_was_reached() {
        let refused = "admission webhook \"segments.baton.dev\" denied the request: spec.run: \
                       no run \"baton-webhook-trust-probe\"";
        assert!(is_our_refusal(403, refused));
        let untrusted = "Internal error occurred: failed calling webhook \"segments.baton.dev\": \
                         Post \"https://baton-webhook.baton-system.svc:443/validate\": x509: \
                         certificate signed by unknown authority";
        assert!(!is_our_refusal(500, untrusted));
        let rbac = "ledgersegments.baton.dev is forbidden: User \"x\" cannot create resource";
        assert!(!is_our_refusal(403, rbac));
    }
}
