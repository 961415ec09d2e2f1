//! End to end on the real node, the tools container: the model's commands run in a container
//! of their own, in the run's tools image, through baton's executor, with no token and no key
//! to reach; a kill -9 of either container leaves the step unknown and never run twice; stop
//! and SIGTERM kill a running command; a workspace claim survives the pod.
//! The tests' shared helpers are in tests/node_tools_support/.

mod node_tools_support;

use baton::crd::v1alpha1::{AgentRun, Phase};
use baton_testkit::e2e::{Effects, effect_command, run_with, shell_tool};
use baton_testkit::node::*;
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use node_tools_support::{
    all_logs, answer, effect_then_marker, provide_volume, step_outputs, turn, wait_tools_gone,
    wait_workspace_ready,
};

/// A plain user image: Debian's static busybox alone (hack/images.sh busybox), no libc, no baton.
const BUSYBOX: &str = "busybox:baton";

/// A tool that looks everywhere a tool could look for the model key or an API token: its
/// environment, every process it can see through /proc, the ServiceAccount paths, the files
/// of the container, the executor's socket. It finds neither, and nothing the run wrote (its
/// ledger, status, Events, both containers' logs) holds the key or a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_tool_hunting_for_the_key_and_the_token_finds_neither() {
    let env = NodeEnv::start("hunt").await;
    let name = "hunt";
    let key = format!("sk-baton-hunt-{:016x}", rand::random::<u64>());
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    let secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "model-key"},
        "stringData": {"apiKey": key},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let hunt = [
        "echo '== env'; env",
        "echo '== processes'; for p in /proc/[0-9]*; do echo \"$p: $(tr '\\0' ' ' < $p/cmdline)\"; tr '\\0' '\\n' < $p/environ; done",
        "echo '== service account'; ls -la /var/run/secrets/kubernetes.io/serviceaccount /run/secrets 2>&1; cat /var/run/secrets/kubernetes.io/serviceaccount/token 2>&1",
        "echo '== tokens anywhere'; find / -xdev \\( -name token -o -name '*.key' -o -name ca.crt \\) 2>/dev/null",
        "echo '== files'; grep -rl 'sk-baton' /baton /workspace /tmp /etc /var /run /home /root 2>/dev/null",
        "echo '== socket'; ls -la /baton /baton/socket 2>&1",
        "echo '== uid'; id",
    ]
    .join("; ");
    let mut run = run_with(
        name,
        vec![turn("hunting", &hunt), answer("found nothing")],
        vec![shell_tool("sh")],
    );
    run.spec.agent_mut().model.api_key_secret_ref = Some(baton::crd::v1alpha1::SecretKeyRef {
        name: "model-key".into(),
        key: "apiKey".into(),
    });
    env.create(&run).await;
    env.wait_succeeded(name).await;

    let outputs = step_outputs(&env, name).await;
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    let seen = &outputs[0].1;
    // The hunt ran and saw what a tool sees: its own processes and its own user, nothing more.
    assert!(
        seen.contains("baton-exec serve"),
        "the executor is visible to its tools:\n{seen}"
    );
    assert!(
        !seen.contains("baton worker"),
        "the worker's process is visible:\n{seen}"
    );
    assert!(
        seen.contains("uid=65533"),
        "the tools run as their own user:\n{seen}"
    );
    assert!(
        seen.contains(
            "/var/run/secrets/kubernetes.io/serviceaccount/token: No such file or directory"
        ),
        "a ServiceAccount token is mounted in the tools container:\n{seen}"
    );
    // A projected token is a JWT: its header always encodes to "eyJ".
    let st = env.status(name).await;
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(env.client.clone(), &env.ns);
    let events = events.list(&ListParams::default()).await.unwrap();
    let everything = [
        serde_json::to_string(&env.ledger(name).await).unwrap(),
        serde_json::to_string(&st).unwrap(),
        serde_json::to_string(&events.items).unwrap(),
        all_logs(&env, name).await,
    ];
    for (what, text) in ["ledger", "status", "events", "logs"]
        .iter()
        .zip(&everything)
    {
        assert!(!text.contains(&key), "the model key is in the run's {what}");
        assert!(
            !text.contains(&key[..12]),
            "a prefix of the key is in the run's {what}"
        );
        assert!(
            !text.contains("eyJhbGciOi"),
            "a token is in the run's {what}"
        );
    }
    env.finish().await;
}

/// A run whose tools image is a plain busybox (no baton, no libc): its shell steps run in
/// `/workspace` as the tools user, and a file one step wrote is read back by a later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_a_plain_busybox_tools_image_runs_steps_that_share_files() {
    let env = NodeEnv::start("busybox").await;
    let name = "plain";
    let mut run = run_with(
        name,
        vec![
            turn(
                "writing",
                "pwd; echo \"written by step $BATON_STEP\" > notes.txt; id -u",
            ),
            turn("reading", "cat /workspace/notes.txt; ls /bin/busybox"),
            answer("the notes were there"),
        ],
        vec![shell_tool("sh")],
    );
    run.spec.worker.tools_image = Some(BUSYBOX.into());
    env.create(&run).await;
    env.wait_succeeded(name).await;
    let outputs = step_outputs(&env, name).await;
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(
        outputs[0].1.starts_with("/workspace\n65533\n"),
        "{outputs:?}"
    );
    assert!(outputs[1].1.contains("written by step 1"), "{outputs:?}");
    assert!(outputs[1].1.contains("/bin/busybox"), "{outputs:?}");
    let pod = env.pods().get(&format!("{name}-w1")).await.unwrap();
    let images: Vec<_> = pod
        .spec
        .unwrap()
        .containers
        .iter()
        .map(|c| c.image.clone().unwrap())
        .collect();
    assert!(images.contains(&BUSYBOX.to_string()), "{images:?}");
    env.finish().await;
}

/// `examples/plain-tools-image.yaml` as a user applies it: a plain Debian tools image, end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_plain_tools_image_example_runs_end_to_end() {
    let env = NodeEnv::start("example-plain").await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/plain-tools-image.yaml"
    );
    kubectl(&["-n", &env.ns, "apply", "-f", path]).expect("kubectl apply -f the example");
    let st = env.wait_succeeded("plain-tools").await;
    let outputs = step_outputs(&env, "plain-tools").await;
    assert_eq!(outputs.len(), 3, "{outputs:?}");
    assert!(outputs[0].1.contains("Debian GNU/Linux 12"), "{outputs:?}");
    assert!(
        outputs[0].1.contains("no baton in this image"),
        "{outputs:?}"
    );
    assert!(outputs[0].1.contains("65533\n/workspace"), "{outputs:?}");
    assert!(outputs[2].1.contains("noted at step 2"), "{outputs:?}");
    assert!(st.output.unwrap_or_default().contains("plain Debian"));
    env.finish().await;
}

/// kill -9 of the tools container's process (the executor) mid-step: the worker cannot know
/// what the command did, so it records nothing for it and ends the attempt; the next pod
/// resumes with the step reported unknown, and its effect ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_kill9_of_the_tools_container_resumes_with_the_step_unknown() {
    let env = NodeEnv::start("kill9-tools").await;
    let name = "k9tools";
    let sink = env.effects.addr.clone();
    let run = run_with(
        name,
        vec![
            turn("one", &effect_then_marker(&sink, name, 1, 60)),
            turn("two", &effect_command(&sink, name, 2, 0)),
            answer("done"),
        ],
        vec![shell_tool("sh")],
    );
    env.create(&run).await;
    let (pod, _) = env.wait_worker(name, 1).await;
    env.wait_effect(name, 1).await;
    let tools = env
        .container_pid_of(&pod, "tools")
        .await
        .expect("the tools container's host PID");
    signal_pid(tools, libc::SIGKILL);

    let st = env.wait_succeeded(name).await;
    assert_eq!(st.fence.get(), 2, "resumed once, in a new pod: {st:#?}");
    assert_eq!(
        st.failed_attempts, 1,
        "the attempt without its tools died: {st:#?}"
    );
    assert_eq!(st.unknown_effects.len(), 1, "{st:#?}");
    assert_eq!(st.unknown_effects[0].step, 1);
    let effects = Effects::read(&env.effects.file);
    assert_eq!(effects.count(name, 1), 1, "step 1 ran once");
    assert_eq!(
        effects.count(name, 101),
        0,
        "the killed command did not go on"
    );
    assert_eq!(effects.count(name, 2), 1, "the run went on to step 2");
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}

/// spec.stop kills the running command itself: its container is gone and the command never
/// got past its sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stop_kills_the_running_command() {
    let env = NodeEnv::start("stop-cmd").await;
    let name = "stopcmd";
    let sink = env.effects.addr.clone();
    let run = run_with(
        name,
        vec![
            turn("long", &effect_then_marker(&sink, name, 1, 60)),
            answer("never"),
        ],
        vec![shell_tool("sh")],
    );
    env.create(&run).await;
    let (pod, _) = env.wait_worker(name, 1).await;
    env.wait_effect(name, 1).await;
    env.stop(name).await;
    let st = env
        .wait_run(name, RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
    assert_eq!(st.phase, Phase::Stopped, "{st:#?}");
    wait_tools_gone(&env, &pod).await;
    assert_eq!(
        Effects::read(&env.effects.file).count(name, 101),
        0,
        "the command went on"
    );
    env.finish().await;
}

/// SIGTERM (the pod deleted, as a drain does): after the handoff grace the worker kills the
/// running command, records the step unknown and hands off; the next pod goes on, and the
/// killed command never got past its sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_sigterm_kills_the_running_command_and_hands_off() {
    let env = NodeEnv::start("sigterm-cmd").await;
    let name = "termcmd";
    let sink = env.effects.addr.clone();
    let run = run_with(
        name,
        vec![
            turn("long", &effect_then_marker(&sink, name, 1, 90)),
            turn("two", &effect_command(&sink, name, 2, 0)),
            answer("done"),
        ],
        vec![shell_tool("sh")],
    );
    env.create(&run).await;
    let (pod, _) = env.wait_worker(name, 1).await;
    env.wait_effect(name, 1).await;
    env.delete_pod(&pod).await;
    let st = env.wait_succeeded(name).await;
    assert_eq!(st.failed_attempts, 0, "a handoff costs no attempt: {st:#?}");
    assert_eq!(st.unknown_effects.len(), 1, "the killed step: {st:#?}");
    let effects = Effects::read(&env.effects.file);
    assert_eq!(effects.count(name, 1), 1);
    assert_eq!(
        effects.count(name, 101),
        0,
        "the command went on after SIGTERM"
    );
    assert_eq!(effects.count(name, 2), 1);
    env.check_invariants(&[name.to_string()]).await;
    env.finish().await;
}

/// spec.workspace: the run's own claim, mounted in every attempt's tools container. While no
/// volume can bind it, the run says so (WorkspaceReady False, ClaimPending) instead of
/// looking stuck; once the test provides one, the run goes on. A file written before a kill -9
/// of the worker is there after the resume, in the next pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_workspace_claim_survives_a_kill9_and_the_resume() {
    let env = NodeEnv::start("workspace").await;
    let name = "ws";
    let class = format!("baton-test-{}", env.ns);
    let sink = env.effects.addr.clone();
    let mut run: AgentRun = run_with(
        name,
        vec![
            turn("checkout", "echo 'a checkout' > checkout.txt"),
            turn("long", &effect_then_marker(&sink, name, 2, 60)),
            turn("reading", "cat /workspace/checkout.txt"),
            answer("the checkout survived"),
        ],
        vec![shell_tool("sh")],
    );
    run.spec.workspace = Some(
        serde_json::from_value(serde_json::json!({
            "size": "16Mi",
            "storageClassName": class,
        }))
        .unwrap(),
    );
    // The first pod waits for the volume the test provides only once the condition showed.
    run.spec.lease.startup_seconds = 120;
    env.create(&run).await;
    wait_workspace_ready(&env, name, ("False", "ClaimPending")).await;
    let dir = provide_volume(&env, &class).await;
    let (pod, _) = env.wait_worker(name, 1).await;
    wait_workspace_ready(&env, name, ("True", "Mounted")).await;
    env.wait_effect(name, 2).await;
    env.signal_worker(&pod, libc::SIGKILL).await;
    let st = env.wait_succeeded(name).await;
    assert_eq!(st.fence.get(), 2, "{st:#?}");
    let outputs = step_outputs(&env, name).await;
    let last = outputs.last().expect("step outputs");
    assert!(last.1.contains("a checkout"), "{outputs:?}");
    assert!(
        dir.join("checkout.txt").exists(),
        "the file is on the volume"
    );
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(env.client.clone(), &env.ns);
    let claim = claims.get(&format!("{name}-workspace")).await.unwrap();
    assert_eq!(claim.owner_references()[0].name, name, "owned by the run");
    let _ = Api::<PersistentVolume>::all(env.client.clone())
        .delete(&class, &DeleteParams::default())
        .await;
    env.finish().await;
}

/// spec.worker.runtimeClassName: the pod runs under the RuntimeClass the run names (here one
/// for the node's runc, the only runtime the bed has; gVisor or Kata are named the same way).
/// One that does not exist fails the run at once, with the API server's reason, instead of
/// claiming pod after refused pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_runtime_class_is_the_runs_and_a_missing_one_fails_the_run() {
    let env = NodeEnv::start("runtime-class").await;
    let class = format!("baton-test-{}", env.ns);
    let classes: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(env.client.clone());
    let rc = serde_json::from_value(serde_json::json!({
        "metadata": {"name": class},
        "handler": "runc",
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &rc)
        .await
        .expect("creating the RuntimeClass");

    let mut run = run_with(
        "rc",
        vec![turn("where", "echo ok"), answer("ran")],
        vec![shell_tool("sh")],
    );
    run.spec.worker.runtime_class_name = Some(class.clone());
    env.create(&run).await;
    env.wait_succeeded("rc").await;
    let pod = env.pods().get("rc-w1").await.unwrap();
    assert_eq!(pod.spec.unwrap().runtime_class_name, Some(class.clone()));

    let mut missing = run_with("norc", vec![answer("never")], vec![]);
    missing.spec.worker.runtime_class_name = Some("no-such-class".into());
    env.create(&missing).await;
    let st = env
        .wait_run("norc", RUN_TIMEOUT, "terminal", |s| s.phase.is_terminal())
        .await;
    assert_eq!(st.phase, Phase::Failed, "{st:#?}");
    assert_eq!(st.reason.as_deref(), Some("PodRejected"), "{st:#?}");
    let message = st.message.clone().unwrap_or_default();
    assert!(
        message.contains("RuntimeClass \"no-such-class\" not found"),
        "{message}"
    );
    // One claim (fence 1) whose pod was refused, then the terminal claim's seal (fence 2).
    assert_eq!(st.fence.get(), 2, "no claim after the refusal: {st:#?}");
    let _ = classes.delete(&class, &DeleteParams::default()).await;
    env.finish().await;
}
