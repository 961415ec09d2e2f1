//! The release the upgrade lane and the mixed-version tests start from: the one
//! `hack/previous-release` names, as `hack/images.sh previous` built it from its commit into
//! `$BATON_CACHE_DIR/previous/<commit>/` (its source, chart and CRDs; its binaries in `bin/`).

use std::path::PathBuf;

#[allow(dead_code)] // The controller tests read no commit.
pub struct PreviousRelease {
    pub version: String,
    pub commit: String,
    /// Where `hack/images.sh previous` keeps it.
    pub dir: PathBuf,
}

impl PreviousRelease {
    /// The previous release, its source (chart and CRDs) built by `hack/images.sh previous`.
    pub fn with_chart() -> Self {
        let release = Self::named();
        release.built("charts/baton/Chart.yaml");
        release
    }

    /// Its chart's folder.
    pub fn chart(&self) -> String {
        self.dir.join("charts/baton").display().to_string()
    }

    /// Its CRDs' folder.
    pub fn crds(&self) -> String {
        self.dir.join("charts/baton/crds").display().to_string()
    }

    /// The release `hack/previous-release` names (built or not).
    pub fn named() -> Self {
        let root = crate::repo_root();
        let named = std::fs::read_to_string(root.join("hack/previous-release"))
            .expect("reading hack/previous-release");
        let field = |key: &str| {
            named
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("hack/previous-release names no {key}"))
                .to_string()
        };
        let (version, commit) = (field("version"), field("commit"));
        let dir = crate::cache_dir().join("previous").join(&commit);
        Self {
            version,
            commit,
            dir,
        }
    }

    /// `relative` (a path in [`PreviousRelease::dir`]), which must have been built: the test
    /// fails saying how to build it.
    pub fn built(&self, relative: &str) -> PathBuf {
        let path = self.dir.join(relative);
        assert!(
            path.exists(),
            "no {} of the previous release {}: `bash hack/images.sh previous` builds it \
             (make test does)",
            path.display(),
            self.version
        );
        path
    }
}
