use super::*;
use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, ConfigMapKeySelector, EnvVarSource, ObjectFieldSelector, PodSpec,
    SecretEnvSource, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn pod(container: Container) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("run-a-1".into()),
            namespace: Some("ns".into()),
            uid: Some("u-1".into()),
            labels: Some([("app".to_string(), "baton".to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container(command: &[&str], args: &[&str]) -> Container {
    Container {
        name: "worker".into(),
        image: Some("baton:dev".into()),
        command: (!command.is_empty()).then(|| command.iter().map(|s| s.to_string()).collect()),
        args: (!args.is_empty()).then(|| args.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

fn literal(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn from(name: &str, source: EnvVarSource) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(source),
        ..Default::default()
    }
}

fn secret_ref(name: &str, key: &str, optional: bool) -> EnvVarSource {
    EnvVarSource {
        secret_key_ref: Some(SecretKeySelector {
            name: name.into(),
            key: key.into(),
            optional: Some(optional),
        }),
        ..Default::default()
    }
}

fn field_ref(path: &str) -> EnvVarSource {
    EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            field_path: path.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

const BATON: &str = "/opt/bin/baton";

fn build(pod: &Pod, sources: &EnvSources) -> Result<ProcessSpec, SpecError> {
    let host = vec![
        ("PATH".to_string(), "/usr/bin".to_string()),
        ("KUBECONFIG".to_string(), "/kc".to_string()),
    ];
    let images = BTreeMap::from([("baton:v2".to_string(), PathBuf::from("/opt/v2/baton"))]);
    let ctx = SpecContext {
        baton_bin: Path::new(BATON),
        image_bins: &images,
        host_env: &host,
        node_name: "node-1",
    };
    process_spec(pod, sources, &ctx)
}

fn get<'a>(spec: &'a ProcessSpec, key: &str) -> Option<&'a str> {
    spec.env
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn baton_command_maps_to_local_binary() {
    let spec = build(
        &pod(container(&["baton"], &["worker"])),
        &EnvSources::default(),
    )
    .unwrap();
    assert_eq!(spec.program, PathBuf::from(BATON));
    assert_eq!(spec.args, vec!["worker"]);
    let spec = build(
        &pod(container(&["/usr/local/bin/baton", "worker"], &["--x"])),
        &EnvSources::default(),
    )
    .unwrap();
    assert_eq!(
        (spec.program, spec.args),
        (
            PathBuf::from(BATON),
            vec!["worker".to_string(), "--x".to_string()]
        )
    );
}

#[test]
fn image_specific_baton_binary() {
    let mut c = container(&["baton", "worker"], &[]);
    c.image = Some("baton:v2".into());
    let spec = build(&pod(c), &EnvSources::default()).unwrap();
    assert_eq!(spec.program, PathBuf::from("/opt/v2/baton"));
}

#[test]
fn image_entrypoint_is_baton() {
    let spec = build(&pod(container(&[], &["worker"])), &EnvSources::default()).unwrap();
    assert_eq!(
        (spec.program, spec.args),
        (PathBuf::from(BATON), vec!["worker".to_string()])
    );
}

#[test]
fn other_commands_run_as_written() {
    let spec = build(
        &pod(container(&["sh", "-c"], &["exit 3"])),
        &EnvSources::default(),
    )
    .unwrap();
    assert_eq!(spec.program, PathBuf::from("sh"));
    assert_eq!(spec.args, vec!["-c", "exit 3"]);
    assert!(!is_baton("batonx") && !is_baton("/bin/baton-runner") && is_baton("./baton"));
}

#[test]
fn env_passthrough_hostname_and_literals() {
    let mut c = container(&["true"], &[]);
    c.env = Some(vec![
        literal("BATON_RUN", "run-a"),
        literal("PATH", "/custom"),
    ]);
    let spec = build(&pod(c), &EnvSources::default()).unwrap();
    assert_eq!(get(&spec, "KUBECONFIG"), Some("/kc"));
    assert_eq!(get(&spec, "HOSTNAME"), Some("run-a-1"));
    assert_eq!(get(&spec, "BATON_RUN"), Some("run-a"));
    assert_eq!(get(&spec, "PATH"), Some("/custom"), "the pod's env wins");
    assert_eq!(spec.env.iter().filter(|(k, _)| k == "PATH").count(), 1);
}

#[test]
fn secret_key_ref_resolved_or_reported() {
    let mut c = container(&["true"], &[]);
    c.env = Some(vec![from(
        "BATON_MODEL_API_KEY",
        secret_ref("model", "apiKey", false),
    )]);
    let p = pod(c);
    assert_eq!(
        build(&p, &EnvSources::default()),
        Err(SpecError::SecretNotFound("model".into()))
    );
    let mut sources = EnvSources::default();
    sources.secrets.insert("model".into(), BTreeMap::new());
    assert_eq!(
        build(&p, &sources),
        Err(SpecError::SecretKeyNotFound {
            name: "model".into(),
            key: "apiKey".into()
        })
    );
    sources
        .secrets
        .get_mut("model")
        .unwrap()
        .insert("apiKey".into(), "sk-1".into());
    assert_eq!(
        get(&build(&p, &sources).unwrap(), "BATON_MODEL_API_KEY"),
        Some("sk-1")
    );
    assert_eq!(
        env_refs(crate::runner::spec::container(&p).unwrap()).secrets,
        BTreeSet::from(["model".to_string()])
    );
}

#[test]
fn optional_missing_secret_leaves_var_unset() {
    let mut c = container(&["true"], &[]);
    c.env = Some(vec![from("K", secret_ref("absent", "k", true))]);
    let spec = build(&pod(c), &EnvSources::default()).unwrap();
    assert_eq!(get(&spec, "K"), None);
}

#[test]
fn config_map_and_env_from() {
    let mut c = container(&["true"], &[]);
    c.env_from = Some(vec![
        EnvFromSource {
            prefix: Some("CM_".into()),
            config_map_ref: Some(ConfigMapEnvSource {
                name: "cm".into(),
                optional: None,
            }),
            ..Default::default()
        },
        EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: "gone".into(),
                optional: Some(true),
            }),
            ..Default::default()
        },
    ]);
    c.env = Some(vec![from(
        "ONE",
        EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: "cm".into(),
                key: "a".into(),
                optional: None,
            }),
            ..Default::default()
        },
    )]);
    let mut sources = EnvSources::default();
    sources
        .config_maps
        .insert("cm".into(), [("a".to_string(), "1".to_string())].into());
    let spec = build(&pod(c), &sources).unwrap();
    assert_eq!(get(&spec, "CM_a"), Some("1"));
    assert_eq!(get(&spec, "ONE"), Some("1"));
}

#[test]
fn field_refs() {
    let mut c = container(&["true"], &[]);
    c.env = Some(vec![
        from("BATON_POD", field_ref("metadata.name")),
        from("BATON_NAMESPACE", field_ref("metadata.namespace")),
        from("UID", field_ref("metadata.uid")),
        from("NODE", field_ref("spec.nodeName")),
        from("IP", field_ref("status.podIP")),
        from("APP", field_ref("metadata.labels['app']")),
    ]);
    let spec = build(&pod(c), &EnvSources::default()).unwrap();
    let expected = [
        ("BATON_POD", "run-a-1"),
        ("BATON_NAMESPACE", "ns"),
        ("UID", "u-1"),
        ("NODE", "node-1"),
        ("IP", "127.0.0.1"),
        ("APP", "baton"),
    ];
    for (k, v) in expected {
        assert_eq!(get(&spec, k), Some(v), "{k}");
    }
    let mut c = container(&["true"], &[]);
    c.env = Some(vec![from("X", field_ref("spec.nope"))]);
    assert!(matches!(
        build(&pod(c), &EnvSources::default()),
        Err(SpecError::UnsupportedField { .. })
    ));
}

#[test]
fn dollar_expansion_in_env_and_args() {
    let mut c = container(&["sh", "-c", "echo $(GREETING) $(MISSING) $$(LIT)"], &[]);
    c.env = Some(vec![
        literal("WHO", "world"),
        literal("GREETING", "hello $(WHO)"),
    ]);
    let spec = build(&pod(c), &EnvSources::default()).unwrap();
    assert_eq!(get(&spec, "GREETING"), Some("hello world"));
    assert_eq!(spec.args, vec!["-c", "echo hello world $(MISSING) $(LIT)"]);
}

#[test]
fn expand_edge_cases() {
    let lookup = |n: &str| (n == "A").then_some("x");
    assert_eq!(expand("$", lookup), "$");
    assert_eq!(expand("a$b", lookup), "a$b");
    assert_eq!(expand("$(A", lookup), "$(A");
    assert_eq!(expand("$(A)$(A)", lookup), "xx");
    assert_eq!(expand("$$$(A)", lookup), "$x");
}

#[test]
fn container_count() {
    let mut p = pod(container(&["true"], &[]));
    p.spec.as_mut().unwrap().containers.clear();
    assert_eq!(
        build(&p, &EnvSources::default()),
        Err(SpecError::NoContainer)
    );
    p.spec.as_mut().unwrap().containers = vec![container(&["a"], &[]), container(&["b"], &[])];
    assert_eq!(
        build(&p, &EnvSources::default()),
        Err(SpecError::TooManyContainers(2))
    );
}
