//! baton's executor. It runs in the tools container, the one that runs the model's commands,
//! apart from the worker's credentials (docs/security.md, "The tools container"). An init
//! container copies it there from baton's image (`baton-exec install`), the way Argo's
//! emissary and Tekton's entrypoint reach a user's image; the worker drives it over a Unix
//! socket in a volume the two containers share (`protocol`).

pub mod capture;
pub mod command;
pub mod protocol;
pub mod reaper;
pub mod server;

/// Copies this very binary into `dir` as `baton-exec` (what the init container runs): it needs
/// nothing from the image it is copied from, not even `cp`.
pub fn install(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let target = dir.join("baton-exec");
    let partial = dir.join(".baton-exec.partial");
    std::fs::copy("/proc/self/exe", &partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &target)?;
    Ok(target)
}
