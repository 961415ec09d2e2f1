//! Shared by the controller integration tests: start a controller in-process, create runs,
//! play the worker (renew or not, write status by fenced CAS, append to the ledger), wait.

use std::time::{Duration, Instant};

use baton::controller::{self, Config};
use baton::crd::v1alpha1::{AgentRun, AgentRunStatus, LedgerEvent, LedgerSegment, Phase};
use baton::fence::Fence;
use baton::lease::{LeaseClient, WorkerLease, lease_fence, lease_holder};
use baton::ledger::{Appended, LedgerError, SegmentStore};
use baton::status::{StatusError, fenced_update};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

pub use crate::common::TestNamespace;

/// A controller running in this process, scoped to one namespace.
pub struct Running {
    pub handle: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

pub fn config(ns: &str) -> Config {
    Config {
        namespace: Some(ns.into()),
        leader_election: false,
        leader_namespace: ns.into(),
        leader_lease: Duration::from_secs(3),
        admin_addr: None,
        ..Config::default()
    }
}

pub fn start(client: &Client, config: Config) -> Running {
    let client = client.clone();
    let handle = tokio::spawn(async move {
        if let Err(err) = controller::run(client, config).await {
            eprintln!("controller stopped: {err}");
        }
    });
    Running { handle }
}

/// A namespace with a controller running and `run` created and started: its Lease names
/// `<name>-w1` at fence 1. Returns the created run.
pub async fn started(test: &str, run: AgentRun) -> (TestNamespace, Running, AgentRun) {
    let ns = TestNamespace::new(test).await;
    let controller = start(&ns.client, config(&ns.name));
    let name = run.name_any();
    let created = create(&ns, run).await;
    wait_lease(&ns, &name, &format!("{name}-w1"), 1, T).await;
    (ns, controller, created)
}

/// Merge-patches a run's spec, as a user would with `kubectl patch`.
pub async fn patch_spec(ns: &TestNamespace, name: &str, spec: serde_json::Value) {
    let patch = serde_json::json!({ "spec": spec });
    ns.api::<AgentRun>()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patching the run's spec");
}

/// A run whose lease outlasts the test (duration 60 s): only a pod's end or a handoff moves it.
pub fn long_lease_run(name: &str) -> AgentRun {
    let mut run = agent_run(name, 60);
    run.spec.lease.duration_seconds = 60;
    run.spec.lease.renew_seconds = 20;
    run
}

/// A run with short leases: duration 3 s, renew 1 s, startup `startup` s.
pub fn agent_run(name: &str, startup: i32) -> AgentRun {
    AgentRun::builder(name)
        .input("hello")
        .lease(3, 1, startup)
        .build()
}

pub async fn create(ns: &TestNamespace, run: AgentRun) -> AgentRun {
    ns.api::<AgentRun>()
        .create(&PostParams::default(), &run)
        .await
        .expect("creating run")
}

pub async fn get(ns: &TestNamespace, name: &str) -> AgentRun {
    ns.api::<AgentRun>().get(name).await.expect("reading run")
}

pub fn status(run: &AgentRun) -> AgentRunStatus {
    run.status.clone().unwrap_or_default()
}

/// Polls the run until `ok` holds; panics with the last status after `timeout`.
pub async fn wait_run(
    ns: &TestNamespace,
    name: &str,
    timeout: Duration,
    ok: impl Fn(&AgentRunStatus) -> bool,
) -> AgentRun {
    let deadline = Instant::now() + timeout;
    loop {
        let run = get(ns, name).await;
        if ok(&status(&run)) {
            return run;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting on run {name}; status: {:#?}", run.status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn wait_fence(ns: &TestNamespace, name: &str, fence: i64, timeout: Duration) -> AgentRun {
    wait_run(ns, name, timeout, |s| {
        s.fence.get() >= fence && s.phase == Phase::Running
    })
    .await
}

pub async fn lease(ns: &TestNamespace, run: &str) -> Option<Lease> {
    LeaseClient::new(ns.client.clone(), &ns.name)
        .get(run)
        .await
        .expect("reading lease")
}

/// The first `events.k8s.io/v1` Event about run `run` with `reason`.
pub async fn wait_event(
    ns: &TestNamespace,
    run: &str,
    reason: &str,
    timeout: Duration,
) -> k8s_openapi::api::events::v1::Event {
    crate::common::events::wait_event(&ns.api(), run, reason, timeout).await
}

/// Waits until the run Lease names `pod` under `fence`.
pub async fn wait_lease(
    ns: &TestNamespace,
    run: &str,
    pod: &str,
    fence: i64,
    timeout: Duration,
) -> Lease {
    wait_lease_held_by(ns, run, Some(pod), fence, timeout).await
}

/// Waits for the run's Lease to be released at `fence`. A terminal end releases it after its
/// status and its ledger record, so a test that saw the end must wait for this too.
pub async fn wait_lease_released(
    ns: &TestNamespace,
    run: &str,
    fence: i64,
    timeout: Duration,
) -> Lease {
    wait_lease_held_by(ns, run, None, fence, timeout).await
}

async fn wait_lease_held_by(
    ns: &TestNamespace,
    run: &str,
    holder: Option<&str>,
    fence: i64,
    timeout: Duration,
) -> Lease {
    let deadline = Instant::now() + timeout;
    loop {
        let found = lease(ns, run).await;
        if let Some(l) = &found
            && lease_holder(l) == holder
            && lease_fence(l) == Some(baton::fence::Fence::new(fence))
        {
            return found.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "lease of {run} never held by {holder:?} at fence {fence}; last seen: {:?}",
            found.as_ref().map(|l| (lease_holder(l), lease_fence(l)))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn wait_pod(ns: &TestNamespace, name: &str, timeout: Duration) -> Pod {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = ns.api::<Pod>().get_opt(name).await.expect("reading pod") {
            return p;
        }
        assert!(Instant::now() < deadline, "pod {name} never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn pod_names(ns: &TestNamespace) -> Vec<String> {
    let mut names: Vec<String> = ns
        .api::<Pod>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    names.sort();
    names
}

/// Marks a pod terminated, as a kubelet would after its process died.
pub async fn terminate_pod(ns: &TestNamespace, name: &str) {
    let patch = serde_json::json!({"status": {"phase": "Failed"}});
    ns.api::<Pod>()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("terminating pod");
}

/// Marks a pod running with the given image, as a kubelet would.
pub async fn mark_pod_running(ns: &TestNamespace, name: &str) {
    let patch = serde_json::json!({"status": {"phase": "Running"}});
    ns.api::<Pod>()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("marking pod running");
}

/// The worker of one attempt, played by the test.
pub struct FakeWorker {
    pub run: String,
    pub pod: String,
    pub fence: Fence,
    pub lease: WorkerLease,
    pub tail: i64,
    ns: String,
    client: Client,
}

impl FakeWorker {
    pub fn new(ns: &TestNamespace, run: &str, fence: i64) -> Self {
        let fence = Fence::new(fence);
        let pod = baton::fence::worker_pod_name(run, fence);
        Self {
            run: run.into(),
            lease: WorkerLease::new(ns.client.clone(), &ns.name, run, &pod, fence),
            pod,
            fence,
            tail: 0,
            ns: ns.name.clone(),
            client: ns.client.clone(),
        }
    }

    fn runs(&self) -> Api<AgentRun> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn renew(&self) -> Result<Lease, baton::lease::LeaseError> {
        self.lease.renew().await
    }

    /// Renews every `every` until `n` renewals are done.
    pub async fn renew_for(&self, n: usize, every: Duration) {
        for _ in 0..n {
            self.renew().await.expect("renewing");
            tokio::time::sleep(every).await;
        }
    }

    async fn store(&self) -> SegmentStore {
        let run = self.runs().get(&self.run).await.expect("reading run");
        SegmentStore::for_run(self.client.clone(), &run)
    }

    /// Lists the ledger (as a resuming worker does) and remembers its tail.
    pub async fn resume(&mut self) -> Vec<LedgerSegment> {
        let segments = self.store().await.list().await.expect("listing ledger");
        self.tail = segments.last().map_or(0, |s| s.spec.seq);
        segments
    }

    pub async fn append(&mut self, events: Vec<LedgerEvent>) -> Result<Appended, LedgerError> {
        let appended = self
            .store()
            .await
            .append(self.tail, self.fence, events)
            .await?;
        self.tail = appended.tail;
        Ok(appended)
    }

    /// Ends the attempt as a worker does with a final answer ("done"): `before` (the
    /// attempt's own events), then `final`, then the status `Finishing` with the outcome.
    pub async fn finish(&mut self, before: Vec<LedgerEvent>) {
        let done = LedgerEvent::Final {
            output: "done".into(),
        };
        self.append(before.into_iter().chain([done]).collect())
            .await
            .unwrap();
        self.write_status(|s| {
            s.phase = Phase::Finishing;
            s.outcome = Some(Phase::Succeeded);
            s.output = Some("done".into());
        })
        .await
        .unwrap();
    }

    pub async fn write_status(
        &self,
        change: impl Fn(&mut AgentRunStatus),
    ) -> Result<AgentRun, StatusError> {
        // A fake worker is handed its run by name: it writes for the run of that name now.
        let run = self.runs().get(&self.run).await?;
        fenced_update(
            &self.runs(),
            &baton::fence::RunHolder::of(&run, self.fence),
            change,
        )
        .await
    }
}

/// Ends run `name`'s first attempt as its worker would: once the Lease names the attempt's
/// pod (the claim writes the status before it moves the Lease), the `final`, the status, the
/// Lease released; returns when the run has Succeeded.
pub async fn finish_first_attempt(ns: &TestNamespace, name: &str) -> AgentRun {
    let pod = baton::fence::worker_pod_name(name, Fence::new(1));
    wait_lease(ns, name, &pod, 1, Duration::from_secs(30)).await;
    let mut w = FakeWorker::new(ns, name, 1);
    w.resume().await;
    w.renew().await.expect("renewing");
    w.finish(vec![]).await;
    match w.lease.release().await {
        Ok(_) | Err(baton::lease::LeaseError::Lost { holder: None, .. }) => {}
        Err(err) => panic!("releasing the lease: {err}"),
    }
    wait_run(ns, name, Duration::from_secs(30), |s| {
        s.phase == Phase::Succeeded
    })
    .await
}

/// What an attempt of `fence` wrote before it died in the middle of step 1: its start, a
/// partial answer, and the step's intent (a non-idempotent `rm -rf /tmp/x`).
pub fn died_mid_step(fence: i64, pod: &str) -> Vec<LedgerEvent> {
    vec![
        LedgerEvent::AttemptStarted {
            fence: Fence::new(fence),
            pod: pod.into(),
        },
        LedgerEvent::Message {
            role: baton::crd::v1alpha1::Role::Assistant,
            content: "partial answer".into(),
        },
        LedgerEvent::StepIntent {
            step: 1,
            tool: "sh".into(),
            call_id: "c1".into(),
            input: "rm -rf /tmp/x".into(),
            idempotent: false,
        },
    ]
}

pub async fn ledger(ns: &TestNamespace, run: &str) -> Vec<LedgerSegment> {
    let r = get(ns, run).await;
    SegmentStore::for_run(ns.client.clone(), &r)
        .list()
        .await
        .expect("listing ledger")
}

/// The run's ledger once it holds a `closed` record (a terminal claim appends it right after
/// its status lands); panics after `T`.
pub async fn ledger_recorded(ns: &TestNamespace, run: &str) -> Vec<LedgerSegment> {
    let deadline = Instant::now() + T;
    loop {
        let segments = ledger(ns, run).await;
        if seals(&segments).iter().any(|(_, closed)| *closed) {
            return segments;
        }
        assert!(
            Instant::now() < deadline,
            "no closed record in the ledger of {run}: {:?}",
            seals(&segments)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every `claimed`/`closed` seal in the ledger, as (fence, is_closed).
pub fn seals(segments: &[LedgerSegment]) -> Vec<(i64, bool)> {
    segments
        .iter()
        .flat_map(|s| s.spec.events.iter())
        .filter_map(|e| match e {
            LedgerEvent::Claimed { fence, .. } => Some((fence.get(), false)),
            LedgerEvent::Closed { fence, .. } => Some((fence.get(), true)),
            _ => None,
        })
        .collect()
}

/// Pod name → every UID seen under it.
pub type SeenPods = std::sync::Arc<
    std::sync::Mutex<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>>,
>;

/// Records the UID of every pod ever seen per name, to prove no name got two pods.
pub fn watch_pods(ns: &TestNamespace) -> (JoinHandle<()>, SeenPods) {
    use futures::StreamExt;
    let seen = SeenPods::default();
    let api = ns.api::<Pod>();
    let out = seen.clone();
    let handle = tokio::spawn(async move {
        let stream = kube::runtime::watcher(api, Default::default());
        let mut stream = std::pin::pin!(kube::runtime::WatchStreamExt::touched_objects(stream));
        while let Some(Ok(pod)) = stream.next().await {
            out.lock()
                .unwrap()
                .entry(pod.name_any())
                .or_default()
                .insert(pod.uid().unwrap_or_default());
        }
    });
    (handle, seen)
}

pub const T: Duration = Duration::from_secs(20);
