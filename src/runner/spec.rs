//! Pure translation of a pod's container into a local process: the command line (with `baton`
//! mapped to a local binary) and the environment (literals, Secret and ConfigMap keys, field
//! references, `$(VAR)` expansion), given the Secrets and ConfigMaps the caller has read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, EnvVarSource, Pod};

/// The loopback address every local "pod" gets as its pod IP and host IP.
pub const LOCAL_IP: &str = "127.0.0.1";

/// What to run for a pod: one local process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The program: the container's first command word, or the local baton binary.
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The whole environment of the process (it does not inherit the runner's), in order.
    pub env: Vec<(String, String)>,
    pub working_dir: Option<PathBuf>,
}

/// The contents of the Secrets and ConfigMaps a pod refers to, read by the caller.
/// A name that is absent here does not exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvSources {
    pub secrets: BTreeMap<String, BTreeMap<String, String>>,
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
}

/// The names of the Secrets and ConfigMaps a pod's container environment refers to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvRefs {
    pub secrets: BTreeSet<String>,
    pub config_maps: BTreeSet<String>,
}

/// Why a pod cannot be turned into a process (the kubelet's `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the pod has no containers")]
    NoContainer,
    #[error("the pod has {0} containers; the local runner runs exactly one")]
    TooManyContainers(usize),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in Secret {name}")]
    SecretKeyNotFound { name: String, key: String },
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("couldn't find key {key} in ConfigMap {name}")]
    ConfigMapKeyNotFound { name: String, key: String },
    #[error("env var {var}: unsupported fieldRef {path:?}")]
    UnsupportedField { var: String, path: String },
    #[error("env var {0}: unsupported valueFrom source")]
    UnsupportedSource(String),
}

/// What the translation needs besides the pod.
#[derive(Debug, Clone)]
pub struct SpecContext<'a> {
    /// The local binary that stands for the container command `baton` (and for an image's
    /// entrypoint when the container gives no command).
    pub baton_bin: &'a Path,
    /// Per-image overrides of `baton_bin` (e.g. an "old" and a "new" worker for rollouts).
    pub image_bins: &'a BTreeMap<String, PathBuf>,
    /// Variables passed through from the runner's own environment (e.g. `PATH`, `KUBECONFIG`).
    pub host_env: &'a [(String, String)],
    /// The node the pod is bound to.
    pub node_name: &'a str,
}

/// The pod's single container.
pub fn container(pod: &Pod) -> Result<&Container, SpecError> {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    match containers {
        [] => Err(SpecError::NoContainer),
        [one] => Ok(one),
        many => Err(SpecError::TooManyContainers(many.len())),
    }
}

/// The Secrets and ConfigMaps the container's `env` and `envFrom` read.
pub fn env_refs(container: &Container) -> EnvRefs {
    let mut refs = EnvRefs::default();
    for from in container.env_from.iter().flatten() {
        if let Some(s) = &from.secret_ref {
            refs.secrets.insert(s.name.clone());
        }
        if let Some(c) = &from.config_map_ref {
            refs.config_maps.insert(c.name.clone());
        }
    }
    for source in container
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value_from.as_ref())
    {
        if let Some(s) = &source.secret_key_ref {
            refs.secrets.insert(s.name.clone());
        }
        if let Some(c) = &source.config_map_key_ref {
            refs.config_maps.insert(c.name.clone());
        }
    }
    refs
}

/// Translates the pod into the process to run.
pub fn process_spec(
    pod: &Pod,
    sources: &EnvSources,
    ctx: &SpecContext<'_>,
) -> Result<ProcessSpec, SpecError> {
    let container = container(pod)?;
    let env = environment(pod, container, sources, ctx)?;
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let command: Vec<String> = container
        .command
        .iter()
        .flatten()
        .map(|c| expand(c, lookup))
        .collect();
    let args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .map(|a| expand(a, lookup))
        .collect();
    let baton_bin = container
        .image
        .as_ref()
        .and_then(|i| ctx.image_bins.get(i))
        .map_or(ctx.baton_bin, PathBuf::as_path);
    let (program, args) = argv(&command, args, baton_bin);
    let working_dir = container
        .working_dir
        .as_ref()
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    Ok(ProcessSpec {
        program,
        args,
        env,
        working_dir,
    })
}

/// Kubernetes' command rules with baton mapped locally: `command` replaces the image's
/// entrypoint and `args` follow it; with no command the image's entrypoint (baton's image:
/// `baton`) runs with `args`. A command named `baton` (any directory) runs `baton_bin`.
pub fn argv(command: &[String], args: Vec<String>, baton_bin: &Path) -> (PathBuf, Vec<String>) {
    match command.split_first() {
        None => (baton_bin.to_path_buf(), args),
        Some((first, rest)) => {
            let program = if is_baton(first) {
                baton_bin.to_path_buf()
            } else {
                PathBuf::from(first)
            };
            (program, rest.iter().cloned().chain(args).collect())
        }
    }
}

fn is_baton(command: &str) -> bool {
    Path::new(command).file_name().is_some_and(|n| n == "baton")
}

/// The process environment: the passed-through host variables, `HOSTNAME`, then `envFrom`,
/// then `env` in order (a later entry wins), each value `$(VAR)`-expanded against the earlier ones.
fn environment(
    pod: &Pod,
    container: &Container,
    sources: &EnvSources,
    ctx: &SpecContext<'_>,
) -> Result<Vec<(String, String)>, SpecError> {
    let mut env: Vec<(String, String)> = ctx.host_env.to_vec();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    set(&mut env, "HOSTNAME", pod_name);
    for from in container.env_from.iter().flatten() {
        for (key, value) in env_from(from, sources)? {
            set(&mut env, &key, value);
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(value) = env_value(pod, var, sources, ctx, &env)? {
            set(&mut env, &var.name, value);
        }
    }
    Ok(env)
}

fn set(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value));
}

fn env_from(
    from: &EnvFromSource,
    sources: &EnvSources,
) -> Result<Vec<(String, String)>, SpecError> {
    let prefix = from.prefix.clone().unwrap_or_default();
    let data = if let Some(s) = &from.secret_ref {
        match sources.secrets.get(&s.name) {
            Some(data) => data,
            None if s.optional == Some(true) => return Ok(Vec::new()),
            None => return Err(SpecError::SecretNotFound(s.name.clone())),
        }
    } else if let Some(c) = &from.config_map_ref {
        match sources.config_maps.get(&c.name) {
            Some(data) => data,
            None if c.optional == Some(true) => return Ok(Vec::new()),
            None => return Err(SpecError::ConfigMapNotFound(c.name.clone())),
        }
    } else {
        return Ok(Vec::new());
    };
    Ok(data
        .iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
        .collect())
}

/// One `env` entry's value; `None` when an optional source is missing (the variable is unset).
fn env_value(
    pod: &Pod,
    var: &EnvVar,
    sources: &EnvSources,
    ctx: &SpecContext<'_>,
    earlier: &[(String, String)],
) -> Result<Option<String>, SpecError> {
    match &var.value_from {
        None => {
            let lookup = |name: &str| {
                earlier
                    .iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            Ok(Some(expand(
                var.value.as_deref().unwrap_or_default(),
                lookup,
            )))
        }
        Some(source) => value_from(pod, &var.name, source, sources, ctx),
    }
}

fn value_from(
    pod: &Pod,
    var: &str,
    source: &EnvVarSource,
    sources: &EnvSources,
    ctx: &SpecContext<'_>,
) -> Result<Option<String>, SpecError> {
    if let Some(r) = &source.secret_key_ref {
        let optional = r.optional == Some(true);
        return match sources.secrets.get(&r.name).map(|d| d.get(&r.key)) {
            Some(Some(v)) => Ok(Some(v.clone())),
            _ if optional => Ok(None),
            Some(None) => Err(SpecError::SecretKeyNotFound {
                name: r.name.clone(),
                key: r.key.clone(),
            }),
            None => Err(SpecError::SecretNotFound(r.name.clone())),
        };
    }
    if let Some(r) = &source.config_map_key_ref {
        let optional = r.optional == Some(true);
        return match sources.config_maps.get(&r.name).map(|d| d.get(&r.key)) {
            Some(Some(v)) => Ok(Some(v.clone())),
            _ if optional => Ok(None),
            Some(None) => Err(SpecError::ConfigMapKeyNotFound {
                name: r.name.clone(),
                key: r.key.clone(),
            }),
            None => Err(SpecError::ConfigMapNotFound(r.name.clone())),
        };
    }
    if let Some(f) = &source.field_ref {
        return field(pod, &f.field_path, ctx).map(Some).ok_or_else(|| {
            SpecError::UnsupportedField {
                var: var.to_string(),
                path: f.field_path.clone(),
            }
        });
    }
    Err(SpecError::UnsupportedSource(var.to_string()))
}

/// The downward API fields a local process can be given.
fn field(pod: &Pod, path: &str, ctx: &SpecContext<'_>) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    if let Some(key) = map_key(path, "metadata.labels") {
        return Some(
            meta.labels
                .as_ref()
                .and_then(|m| m.get(key))
                .cloned()
                .unwrap_or_default(),
        );
    }
    if let Some(key) = map_key(path, "metadata.annotations") {
        return Some(
            meta.annotations
                .as_ref()
                .and_then(|m| m.get(key))
                .cloned()
                .unwrap_or_default(),
        );
    }
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => ctx.node_name.to_string(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" | "status.hostIP" | "status.hostIPs" => {
            LOCAL_IP.to_string()
        }
        _ => return None,
    };
    Some(value)
}

/// `metadata.labels['key']` → `key`.
fn map_key<'p>(path: &'p str, map: &str) -> Option<&'p str> {
    let rest = path.strip_prefix(map)?.strip_prefix("['")?;
    rest.strip_suffix("']")
}

/// Kubernetes' `$(VAR)` expansion: `$(NAME)` becomes the value of NAME when it is defined and
/// stays as written otherwise; `$$` is a literal `$`; any other `$` is kept.
pub fn expand<'v>(input: &str, lookup: impl Fn(&str) -> Option<&'v str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|a| a.split_once(')')) {
            match lookup(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
