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

/// The header of kubectl's table output (no column name has a space).
pub fn header(out: &str) -> Vec<&str> {
    out.lines().next().unwrap_or("").split_whitespace().collect()
}

/// The row of a table whose first cell is `name`, as column name -> cell,
/// cut at the header's column starts (an empty cell prints as nothing).
pub fn row<'a>(out: &'a str, name: &str) -> std::collections::BTreeMap<&'a str, &'a str> {
    let head = out.lines().next().unwrap_or("");
    let starts: Vec<usize> = head
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || head.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{out}"));
    let cell = |k: usize| {
        let end = starts.get(k + 1).copied().unwrap_or(line.len()).min(line.len());
        line.get(starts[k].min(end)..end).unwrap_or("").trim()
    };
    header(out).into_iter().enumerate().map(|(k, h)| (h, cell(k))).collect()
}
