//! Drives `hack/helm.py` (PyPI's helm-python-sdk: Helm's Go SDK, no helm binary) from Rust.

use std::process::Command;

use serde_json::Value;

pub const CHART: &str = "charts/baton";

/// Runs `python3 hack/helm.py ARGS` in the repository; `Ok(stdout JSON)` or `Err(stderr)`.
pub fn helm(args: &[&str]) -> Result<Value, String> {
    let root = crate::repo_root();
    let out = Command::new("python3")
        .arg(root.join("hack/helm.py"))
        .args(args)
        .current_dir(root)
        .output()
        .expect("running python3 (needed for the chart tests)");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if stderr.contains("helm-python-sdk is missing") {
        panic!("{stderr} (CI installs it in .ci/run)");
    }
    if !out.status.success() {
        return Err(format!("{stderr}{}", String::from_utf8_lossy(&out.stdout)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("helm.py output: {e}"))
}

/// The chart rendered with `values` (and extra capabilities), as `(template path, object)`.
pub fn render(values: Value, api_versions: &[&str]) -> Result<Vec<(String, Value)>, String> {
    let values = values.to_string();
    let caps = api_versions.join(",");
    let mut args = vec![
        "render",
        CHART,
        "--name",
        "baton",
        "--namespace",
        "baton-system",
        "--values",
        &values,
    ];
    if !caps.is_empty() {
        args.extend(["--api-versions", &caps]);
    }
    let rendered = helm(&args)?;
    let mut objects = Vec::new();
    for (path, text) in rendered["manifests"].as_object().unwrap() {
        if path.ends_with("NOTES.txt") {
            continue;
        }
        objects.extend(
            yaml_docs(text.as_str().unwrap())
                .into_iter()
                .map(|o| (path.clone(), o)),
        );
    }
    Ok(objects)
}

/// The non-empty YAML documents of a manifest, as JSON values.
pub fn yaml_docs(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The objects of `kind`.
pub fn of_kind<'a>(objects: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| o["kind"] == kind)
        .collect()
}

/// The object of `kind` named `name`.
pub fn named<'a>(objects: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    of_kind(objects, kind)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} named {name}"))
}

/// The one object of `kind`.
pub fn one<'a>(objects: &'a [(String, Value)], kind: &str) -> &'a Value {
    let found = of_kind(objects, kind);
    assert_eq!(found.len(), 1, "expected one {kind}, found {}", found.len());
    found[0]
}
