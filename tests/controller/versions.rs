//! Mixed versions (docs/protocol.md, "Versions"): the previous release's controller (its binary
//! as `hack/images.sh previous` built it from the commit `hack/previous-release` names) beside
//! this tree's, as during a rollout of the controller Deployment. Without the election both
//! act on every run: neither may undo what the other wrote, so every expiry is still one claim,
//! one seal and one pod, whichever version makes it.

use std::time::Duration;

use baton_testkit::common::previous_release::PreviousRelease;
use baton_testkit::controller::*;

/// The previous release's controller as a process, watching `namespace` alone, without the
/// election; killed when dropped.
fn start_previous(namespace: &str, log: &std::path::Path) -> tokio::process::Child {
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    tokio::process::Command::new(PreviousRelease::named().built("bin/baton"))
        .args([
            "controller",
            "--namespace",
            namespace,
            "--leader-election=false",
        ])
        .args(["--admin-addr", &admin.to_string()])
        .stderr(std::fs::File::create(log).expect("the previous controller's log"))
        .kill_on_drop(true)
        .spawn()
        .expect("starting the previous release's controller")
}

#[tokio::test]
async fn old_and_new_controllers_racing_make_one_claim_per_expiry() {
    let ns = TestNamespace::new("ctl-versions").await;
    let (_w, seen) = watch_pods(&ns);
    let log = std::env::temp_dir().join(format!("{}-previous-controller.log", ns.name));
    let mut old = start_previous(&ns.name, &log);
    let _new = start(&ns.client, config(&ns.name));
    let n = 6;
    for i in 0..n {
        let mut run = agent_run(&format!("r{i}"), 4);
        run.spec.max_attempts = 10;
        create(&ns, run).await;
    }
    for fence in 1..=3 {
        for i in 0..n {
            let name = format!("r{i}");
            wait_lease(&ns, &name, &format!("{name}-w{fence}"), fence, T).await;
            // Renewed once, then never again: every lease expires once per fence.
            FakeWorker::new(&ns, &name, fence).renew().await.unwrap();
        }
    }
    for i in 0..n {
        wait_fence(&ns, &format!("r{i}"), 4, T).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..n {
        let name = format!("r{i}");
        let s = status(&get(&ns, &name).await);
        assert_eq!((s.fence.get(), s.failed_attempts), (4, 3), "{name}");
        assert_eq!(
            seals(&ledger(&ns, &name).await),
            vec![(1, false), (2, false), (3, false), (4, false)],
            "{name}: one seal per claim"
        );
    }
    for (name, uids) in seen.lock().unwrap().iter() {
        assert_eq!(uids.len(), 1, "pod {name} was created more than once");
    }
    assert!(
        old.try_wait().unwrap().is_none(),
        "the previous release's controller ran throughout"
    );
    old.kill().await.ok();
    // Which version won each race is the scheduler's: said, not asserted.
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let claims = said.lines().filter(|l| l.contains(" claimed ")).count();
    eprintln!(
        "the previous release's controller made {claims} of {} claims",
        n * 4
    );
    let _ = std::fs::remove_file(&log);
    ns.cleanup().await;
}
