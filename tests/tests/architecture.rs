//! The repository's two halves: the product (`crates/`: the core, the Lambdas, semctl) is what
//! users deploy and run; the harness (`harness/`: the local AWS, the local run, the bench, the
//! model checker, the charts) runs, checks and measures it. The product must never need the
//! harness to build or run: no product crate may have a harness crate among its dependencies
//! or build dependencies. Its tests may use the harness (dev-dependencies): that is what the
//! harness is for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace root")
        .to_path_buf()
}

/// A workspace package: its name, the folder it sits in (from the workspace root), and its
/// dependencies as `(name, kind)` (`normal`, `build` or `dev`).
struct Package {
    name: String,
    folder: PathBuf,
    dependencies: Vec<(String, String)>,
}

fn packages() -> Vec<Package> {
    let root = workspace_root();
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| {
            let manifest = PathBuf::from(package["manifest_path"].as_str().expect("a path"));
            let folder = manifest
                .parent()
                .and_then(|dir| dir.strip_prefix(&root).ok())
                .expect("a package inside the workspace")
                .to_path_buf();
            let dependencies = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .map(|d| {
                    let name = d["name"].as_str().expect("a name").to_owned();
                    let kind = d["kind"].as_str().unwrap_or("normal").to_owned();
                    (name, kind)
                })
                .collect();
            Package {
                name: package["name"].as_str().expect("a name").to_owned(),
                folder,
                dependencies,
            }
        })
        .collect()
}

fn top_folder(folder: &Path) -> String {
    folder
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[test]
fn no_product_crate_depends_on_the_harness() {
    let packages = packages();
    let half: BTreeMap<&str, String> = packages
        .iter()
        .map(|p| (p.name.as_str(), top_folder(&p.folder)))
        .collect();
    let product: Vec<&str> = half
        .iter()
        .filter(|(_, top)| *top == "crates")
        .map(|(name, _)| *name)
        .collect();
    let harness: Vec<&str> = half
        .iter()
        .filter(|(_, top)| *top == "harness")
        .map(|(name, _)| *name)
        .collect();
    // The split this test guards is there at all.
    for name in ["semaphore-core", "lambda-acquire", "semctl"] {
        assert!(product.contains(&name), "{name} not in crates/: {half:?}");
    }
    for name in ["local-aws", "local-run", "semaphore-model"] {
        assert!(harness.contains(&name), "{name} not in harness/: {half:?}");
    }
    let mut wrong = Vec::new();
    for package in packages
        .iter()
        .filter(|p| product.contains(&p.name.as_str()))
    {
        for (dependency, kind) in &package.dependencies {
            if kind != "dev" && harness.contains(&dependency.as_str()) {
                wrong.push(format!("{} -> {dependency} ({kind})", package.name));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "product crates (crates/) depend on harness crates (harness/): {wrong:?}; move the \
         shared code into the product, or use the harness only from tests (dev-dependencies)"
    );
}
