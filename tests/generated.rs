//! Generated files must match the code that generates them.

use std::path::Path;

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let stale = baton::crd::stale_crd_files(&dir).unwrap();
    assert!(
        stale.is_empty(),
        "crds/ is stale ({}): run `make generate` and commit",
        stale.join(", ")
    );
}

#[test]
fn the_charts_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/baton/crds");
    let stale = baton::crd::stale_crd_files(&dir).unwrap();
    assert!(
        stale.is_empty(),
        "charts/baton/crds is stale ({}): run `make generate` and commit",
        stale.join(", ")
    );
}
