//! The local stack for nodesmith's tests: moto's server (AWS), a Kubernetes API
//! test server, a fault-injecting proxy, EventBridge rules as the template
//! declares them, and a Lambda Runtime API for running
//! the function binaries — shared by every integration test.

pub mod bench_scale;
pub mod calls;
pub mod capacity_units;
pub mod eventbridge;
pub mod fault_proxy;
pub mod kube_server;
pub mod kubectl;
pub mod lambda_runtime;
pub mod local_cloud;
pub mod moto;
pub mod sqs;

use std::path::PathBuf;

/// Where the workspace's binaries are: the directory above this test
/// executable's `deps/` (`cargo build --workspace --bins` puts them there;
/// `scripts/test` builds them before any test runs).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let dir = exe.parent().expect("the executable's directory");
    if dir.ends_with("deps") {
        dir.parent().expect("the profile directory").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// A memory figure of a process (`field` is `VmRSS:` or `VmHWM:`; `process`
/// a pid or `self`), in MB; 0 once the process is gone.
pub fn memory_mb(process: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{process}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// The one Lambda binary of the four functions (`functions/lambda`).
pub const LAMBDA_BINARY: &str = "nodesmith-lambda";

/// The workspace binary `name`, which must have been built.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace's binaries first (`cargo build --workspace --bins`; scripts/test does)",
        path.display()
    );
    path
}

/// The variable `scripts/test --full` sets to `full`: every crash point, both
/// local-cloud stories, the large burst. Unset (the default level, what CI
/// runs), each of those tests plays a smaller set that still covers every
/// behaviour it asserts.
pub const LEVEL_ENV: &str = "NODESMITH_TEST_LEVEL";

/// Whether this run is at the full level ([`LEVEL_ENV`] is `full`).
pub fn full_level() -> bool {
    std::env::var(LEVEL_ENV).is_ok_and(|v| v.trim() == "full")
}
