//! The real `kubectl` binary, for tests: run against a kubeconfig with its
//! discovery and OpenAPI caches (and `HOME`) in a scratch directory, so
//! runs never touch the user's own. A missing kubectl fails the test.

use std::path::PathBuf;

use serde_json::Value;

/// What one kubectl run printed.
#[derive(Debug)]
pub struct KubectlRun {
    /// Whether it exited 0.
    pub ok: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// kubectl with a kubeconfig and a scratch directory.
#[derive(Clone, Debug)]
pub struct Kubectl {
    /// The kubeconfig file.
    pub kubeconfig: PathBuf,
    /// Where caches and `HOME` go.
    pub dir: PathBuf,
}

impl Kubectl {
    /// Runs kubectl with `args` (and `stdin` when given).
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> KubectlRun {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.dir.join("cache"))
            .env("HOME", &self.dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!("these tests need the kubectl binary on PATH: running kubectl failed: {e}"),
        };
        if let Some(mut input) = child.stdin.take() {
            if let Some(s) = stdin {
                let _ = input.write_all(s.as_bytes()).await;
            }
            drop(input);
        }
        match child.wait_with_output().await {
            Ok(out) => KubectlRun {
                ok: out.status.success(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            },
            Err(e) => KubectlRun {
                ok: false,
                stdout: String::new(),
                stderr: format!("kubectl did not finish: {e}"),
            },
        }
    }

    /// Runs kubectl and fails the test when it fails; returns stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args, None).await;
        assert!(r.ok, "kubectl {} failed: {}{}", args.join(" "), r.stderr, r.stdout);
        r.stdout
    }

    /// `kubectl ... -o json`, parsed (fails the test when it cannot be).
    pub async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.ok(&a).await;
        match serde_json::from_str(&out) {
            Ok(v) => v,
            Err(e) => panic!("kubectl {} printed no JSON ({e}): {out}", args.join(" ")),
        }
    }

    /// `kubectl apply -f -` of `manifest`; fails the test when it fails.
    pub async fn apply(&self, manifest: &str) -> String {
        let r = self.run(&["apply", "-f", "-"], Some(manifest)).await;
        assert!(r.ok, "kubectl apply failed: {}{}", r.stderr, r.stdout);
        r.stdout
    }
}
