//! Tests of `controller/pod.rs`.
use super::*;
use crate::crd::v1alpha1::SecretKeyRef;

fn run() -> AgentRun {
    let mut run = AgentRun::builder("r1")
        .namespace("ns")
        .stored("u-1")
        .reply("x")
        .build();
    run.spec.agent_mut().model.api_key_secret_ref = Some(SecretKeyRef {
        name: "s".into(),
        key: "k".into(),
    });
    run
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn mounts(c: &Container) -> Vec<(&str, &str)> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect()
}

fn env_names(c: &Container) -> Vec<&str> {
    c.env.iter().flatten().map(|e| e.name.as_str()).collect()
}

#[test]
fn the_pod_carries_name_labels_owner_and_env() {
    let pod = worker_pod(&run(), Fence::new(3), "img:1");
    assert_eq!(pod.name_any(), "r1-w3");
    assert_eq!(pod.labels()[FENCE_LABEL], "3");
    assert_eq!(pod.owner_references()[0].uid, "u-1");
    assert_eq!(pod_image(&pod), "img:1");
    let spec = pod.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let env = container(&spec, CONTAINER_NAME).env.clone().unwrap();
    let get = |n: &str| env.iter().find(|e| e.name == n).cloned().unwrap();
    assert_eq!(get(env::POD).value.as_deref(), Some("r1-w3"));
    assert_eq!(get(env::FENCE).value.as_deref(), Some("3"));
    assert!(get(env::MODEL_API_KEY).value.is_none());
    assert_eq!(get("TMPDIR").value.as_deref(), Some("/tmp"));
    assert_eq!(
        get(env::EXECUTOR_SOCKET).value.as_deref(),
        Some(EXECUTOR_SOCKET)
    );
}

#[test]
fn the_pod_declares_the_workers_metrics_port() {
    let spec = worker_pod(&run(), Fence::new(1), "img").spec.unwrap();
    let ports = container(&spec, CONTAINER_NAME).ports.clone().unwrap();
    let admin: std::net::SocketAddr = crate::serving::admin::WORKER_ADMIN_ADDR.parse().unwrap();
    assert_eq!(ports[0].name.as_deref(), Some(METRICS_PORT_NAME));
    assert_eq!(ports[0].container_port, i32::from(admin.port()));
}

#[test]
fn the_pod_runs_as_the_runs_own_service_account_unless_the_run_names_one() {
    let mut r = run();
    let spec = worker_pod(&r, Fence::new(1), "img").spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("baton-run-r1"));
    r.spec.worker.service_account_name = Some("custom".into());
    let spec = worker_pod(&r, Fence::new(1), "img").spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("custom"));
}

#[test]
fn every_container_is_restricted_and_the_tools_run_as_another_user() {
    let spec = worker_pod(&run(), Fence::new(1), "img").spec.unwrap();
    let pod_sc = spec.security_context.clone().unwrap();
    assert_eq!(pod_sc.run_as_non_root, Some(true));
    assert_eq!(pod_sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    for (name, uid) in [
        (CONTAINER_NAME, WORKER_UID),
        (INSTALL_CONTAINER_NAME, WORKER_UID),
        (TOOLS_CONTAINER_NAME, TOOLS_UID),
    ] {
        let sc = container(&spec, name).security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(sc.run_as_non_root, Some(true), "{name}");
        assert_eq!(sc.run_as_user, Some(uid), "{name}");
        assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }
    assert_ne!(TOOLS_UID, WORKER_UID);
    assert_eq!(spec.share_process_namespace, Some(false));
}

#[test]
fn only_the_worker_container_holds_a_token_or_the_model_key() {
    let spec = worker_pod(&run(), Fence::new(1), "img").spec.unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));
    let worker = container(&spec, CONTAINER_NAME);
    assert!(mounts(worker).contains(&(volume::API_ACCESS, API_ACCESS_DIR)));
    assert!(env_names(worker).contains(&env::MODEL_API_KEY));
    for name in [TOOLS_CONTAINER_NAME, INSTALL_CONTAINER_NAME] {
        let c = container(&spec, name);
        assert!(
            mounts(c).iter().all(|(v, _)| *v != volume::API_ACCESS),
            "{name} mounts the token"
        );
        assert!(
            !env_names(c).contains(&env::MODEL_API_KEY),
            "{name} has the key"
        );
        assert!(c.env_from.is_none(), "{name}");
    }
    let projected = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume::API_ACCESS);
    let sources = projected
        .unwrap()
        .projected
        .clone()
        .unwrap()
        .sources
        .unwrap();
    assert!(sources[0].service_account_token.is_some());
}

#[test]
fn an_mcp_servers_headers_secret_is_mounted_in_the_worker_container_only() {
    let mut r = run();
    let server: crate::crd::v1alpha1::ToolSpec = serde_json::from_value(serde_json::json!({
        "name": "files", "kind": "mcp",
        "mcp": {"url": "http://files:8000/mcp", "headersFromSecret": "files-auth"}
    }))
    .unwrap();
    r.spec.agent_mut().tools.push(server);
    let spec = worker_pod(&r, Fence::new(1), "img").spec.unwrap();
    let worker = container(&spec, CONTAINER_NAME);
    let at = "/baton/mcp-headers/files";
    let volume = mounts(worker)
        .into_iter()
        .find(|(_, path)| *path == at)
        .map(|(v, _)| v.to_string())
        .expect("the worker mounts the headers");
    let source = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume)
        .and_then(|v| v.secret.clone())
        .expect("a Secret volume");
    assert_eq!(source.secret_name.as_deref(), Some("files-auth"));
    for name in [TOOLS_CONTAINER_NAME, INSTALL_CONTAINER_NAME] {
        let c = container(&spec, name);
        assert!(
            mounts(c).iter().all(|(v, _)| *v != volume),
            "{name} mounts the headers"
        );
    }
}

#[test]
fn the_tools_container_runs_the_executor_in_the_runs_tools_image() {
    let mut r = run();
    let spec = worker_pod(&r, Fence::new(1), "baton:1").spec.unwrap();
    let tools = container(&spec, TOOLS_CONTAINER_NAME);
    assert_eq!(
        tools.image.as_deref(),
        Some("baton:1"),
        "defaults to baton's image"
    );
    assert_eq!(tools.command.as_ref().unwrap()[0], "/baton/bin/baton-exec");
    assert_eq!(
        spec.containers[0].name, TOOLS_CONTAINER_NAME,
        "started first"
    );
    let install = container(&spec, INSTALL_CONTAINER_NAME);
    assert_eq!(
        install.image.as_deref(),
        Some("baton:1"),
        "the executor comes from baton's image"
    );
    assert!(mounts(tools).contains(&(volume::EXECUTOR, EXECUTOR_DIR)));
    assert!(mounts(tools).contains(&(volume::WORKSPACE, WORKSPACE_DIR)));
    assert!(mounts(tools).contains(&(volume::TOOLS_TMP, SCRATCH_DIR)));
    r.spec.worker.tools_image = Some("debian:12".into());
    r.spec.worker.runtime_class_name = Some("gvisor".into());
    let spec = worker_pod(&r, Fence::new(1), "baton:1").spec.unwrap();
    assert_eq!(
        container(&spec, TOOLS_CONTAINER_NAME).image.as_deref(),
        Some("debian:12")
    );
    assert_eq!(
        pod_image(&worker_pod(&r, Fence::new(1), "baton:1")),
        "baton:1"
    );
    assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
}

#[test]
fn the_workspace_is_the_runs_claim_when_it_asks_for_one() {
    let mut r = run();
    let workspace = |spec: &PodSpec| {
        spec.volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume::WORKSPACE)
            .cloned()
            .unwrap()
    };
    let spec = worker_pod(&r, Fence::new(1), "img").spec.unwrap();
    assert!(workspace(&spec).empty_dir.is_some());
    r.spec.workspace = Some(serde_json::from_value(serde_json::json!({"size": "1Gi"})).unwrap());
    let spec = worker_pod(&r, Fence::new(2), "img").spec.unwrap();
    let claim = workspace(&spec).persistent_volume_claim.unwrap();
    assert_eq!(claim.claim_name, "r1-workspace");
    let made = workspace_claim(&r).unwrap();
    assert_eq!(made.name_any(), "r1-workspace");
    assert_eq!(made.owner_references()[0].uid, "u-1");
    let spec = made.spec.unwrap();
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"].0,
        "1Gi"
    );
}

#[test]
fn a_served_ledger_reaches_the_worker_container_only_with_a_token_for_ledgers() {
    let plain = with_served_ledger(
        worker_pod(&run(), Fence::new(1), "img"),
        "http://s:80",
        None,
    );
    let plain = plain.spec.unwrap();
    assert!(!env_names(container(&plain, CONTAINER_NAME)).contains(&env::LEDGER_SERVER_CA));
    let ca = Some("-----BEGIN CERTIFICATE-----");
    let pod = with_served_ledger(worker_pod(&run(), Fence::new(1), "img"), "https://s", ca);
    let spec = pod.spec.unwrap();
    let worker = container(&spec, CONTAINER_NAME);
    assert!(env_names(worker).contains(&env::LEDGER_SERVER));
    assert!(env_names(worker).contains(&env::LEDGER_SERVER_CA));
    assert!(mounts(worker).contains(&(volume::LEDGER_TOKEN, crate::crd::LEDGER_TOKEN_DIR)));
    let tools = container(&spec, TOOLS_CONTAINER_NAME);
    assert!(!env_names(tools).contains(&env::LEDGER_SERVER));
    assert!(
        mounts(tools)
            .iter()
            .all(|(v, _)| *v != volume::LEDGER_TOKEN)
    );
    let token = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume::LEDGER_TOKEN)
        .and_then(|v| v.projected.as_ref())
        .and_then(|p| p.sources.as_ref())
        .and_then(|s| s[0].service_account_token.as_ref())
        .expect("a projected token");
    assert_eq!(
        token.audience.as_deref(),
        Some(crate::ledger::served::LEDGER_AUDIENCE)
    );
}

#[test]
fn an_agent_container_runs_the_users_image_through_the_executor_with_no_credential() {
    use crate::controller::pod_agent::{AGENT_CONTAINER_NAME, AGENT_DIR, AGENT_UID};
    use crate::crd::v1alpha1::{AgentContainer, PlainEnvVar};
    let mut r = run();
    r.spec.agent_mut().container = Some(AgentContainer {
        image: "team/agent:7".into(),
        command: vec!["python".into(), "agent.py".into()],
        env: vec![PlainEnvVar {
            name: "AGENT_MODE".into(),
            value: "fast".into(),
        }],
        ..AgentContainer::default()
    });
    let pod = worker_pod(&r, Fence::new(1), "baton:1");
    let spec = crate::controller::pod_agent::with_agent_container(pod, &r)
        .spec
        .unwrap();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [TOOLS_CONTAINER_NAME, AGENT_CONTAINER_NAME, CONTAINER_NAME]
    );
    let agent = container(&spec, AGENT_CONTAINER_NAME);
    assert_eq!(agent.image.as_deref(), Some("team/agent:7"));
    let command = agent.command.clone().unwrap();
    assert_eq!(
        command[0], "/baton/bin/baton-exec",
        "the executor starts the agent"
    );
    assert_eq!(
        agent.security_context.as_ref().unwrap().run_as_user,
        Some(AGENT_UID)
    );
    // No token, no key, no ledger: only the executor, the shared directory and scratch.
    let agent_mounts = mounts(agent);
    assert_eq!(
        agent_mounts
            .iter()
            .map(|(_, path)| *path)
            .collect::<Vec<_>>(),
        [EXECUTOR_DIR, AGENT_DIR, SCRATCH_DIR]
    );
    assert_eq!(env_names(agent), ["AGENT_MODE", "TMPDIR", "HOME"]);
    assert!(agent.env.iter().flatten().all(|e| e.value_from.is_none()));
    // The worker shares the directory; the tools container does not.
    let worker = container(&spec, CONTAINER_NAME);
    assert!(mounts(worker).contains(&("baton-agent", AGENT_DIR)));
    assert!(env_names(worker).contains(&env::AGENT_DIR));
    let tools = container(&spec, TOOLS_CONTAINER_NAME);
    assert!(mounts(tools).iter().all(|(_, path)| *path != AGENT_DIR));
    // Without the field, no agent container.
    let plain = worker_pod(&run(), Fence::new(1), "baton:1");
    let plain = crate::controller::pod_agent::with_agent_container(plain, &run());
    assert_eq!(plain.spec.unwrap().containers.len(), 2);
}
