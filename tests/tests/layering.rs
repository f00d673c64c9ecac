//! The shared crate's modules import each other without a circle: between
//! the crate's top-level modules (the layers: API types and pure core below,
//! adapters beside, the function shells on top), and between the files of
//! each folder module (a concept per file, over shared helpers). A circle
//! means two concepts cannot be read, tested or moved apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module: its path below the crate root (`["sweep", "disrupt"]`).
type Module = Vec<String>;

/// Every source file of the crate (not its binaries), with its module path.
fn modules(src: &Path) -> Vec<(Module, PathBuf)> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel: Vec<String> = path
                .strip_prefix(src)
                .unwrap()
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if rel[0] == "bin" {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if let Some(last) = rel.last().and_then(|l| l.strip_suffix(".rs")) {
                let mut m: Module = rel[..rel.len() - 1].to_vec();
                if last != "mod" && last != "lib" {
                    m.push(last.to_string());
                }
                if !m.is_empty() && !m.iter().any(|p| p == "tests") {
                    out.push((m, path));
                }
            }
        }
    }
    out
}

/// The code of a file without its test module and comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first name of every path that starts with `prefix`, including the
/// items of a group (`prefix{a::b, c}` names `a` and `c`).
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        out.insert(ident(&group[i..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest).to_string());
        }
    }
    out
}

/// Import edges between top-level modules, and between sibling files of each folder module.
fn edges(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let all = modules(src);
    let tops: BTreeSet<&str> = all.iter().map(|(m, _)| m[0].as_str()).collect();
    let mut out: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, path) in &all {
        let code = code(&std::fs::read_to_string(path).unwrap());
        for name in names_after(&code, "crate::") {
            if tops.contains(name.as_str()) && name != m[0] {
                out.entry(vec![m[0].clone()]).or_default().insert(vec![name]);
            }
        }
        if m.len() >= 2 {
            let parent = &m[..m.len() - 1];
            let siblings: BTreeSet<&str> = all
                .iter()
                .filter(|(o, _)| o.len() == m.len() && o[..parent.len()] == *parent)
                .map(|(o, _)| o[m.len() - 1].as_str())
                .collect();
            let mut named = names_after(&code, "super::");
            named.extend(names_after(&code, &format!("crate::{}::", parent.join("::"))));
            for name in named {
                if siblings.contains(name.as_str()) && name != m[m.len() - 1] {
                    let mut to = parent.to_vec();
                    to.push(name);
                    out.entry(m.clone()).or_default().insert(to);
                }
            }
        }
    }
    out
}

/// A circle through the graph, if there is one.
fn circle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        m: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        path: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.clone());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.clone());
        for next in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|m| visit(m, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_shared_crate_has_no_import_circle() {
    let src = nodesmith_tests::moto::repo_root().join("shared/src");
    let edges = edges(&src);
    // The check sees the imports it must (else it proves nothing).
    let sweep = edges.get(&vec!["sweep".to_string()]).expect("the sweep imports");
    assert!(sweep.contains(&vec!["capacity".to_string()]), "{sweep:?}");
    let consolidation = vec!["disruption".to_string(), "consolidation".to_string()];
    assert!(
        edges[&consolidation].contains(&vec!["disruption".to_string(), "candidate".to_string()]),
        "{edges:?}"
    );
    if let Some(c) = circle(&edges) {
        let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
        panic!("modules import each other in a circle: {}", names.join(" -> "));
    }
}

#[test]
fn a_circle_is_found_where_there_is_one() {
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Module>();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    edges.entry(m("a")).or_default().insert(m("b"));
    edges.entry(m("b")).or_default().insert(m("c"));
    assert_eq!(circle(&edges), None);
    edges.entry(m("c")).or_default().insert(m("a"));
    assert_eq!(circle(&edges), Some(vec![m("a"), m("b"), m("c"), m("a")]));
    assert_eq!(
        names_after("use crate::{a::b, c, d::{e, f}};\nlet x = crate::g::h;", "crate::"),
        ["a", "c", "d", "g"].into_iter().map(str::to_string).collect()
    );
}

/// The modules `parent_file` declares under `#[cfg(feature = "autoscaler")]`.
fn gated_children(parent_file: &Path) -> BTreeSet<String> {
    let Ok(text) = std::fs::read_to_string(parent_file) else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    let mut gated = false;
    for line in text.lines().map(str::trim) {
        if line == r#"#[cfg(feature = "autoscaler")]"# {
            gated = true;
        } else if let Some(rest) = line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod ")) {
            if gated {
                out.insert(ident(rest).to_string());
            }
            gated = false;
        } else if !line.starts_with("///") && !line.starts_with("#[") {
            gated = false;
        }
    }
    out
}

/// Whether module `m` is built without the `autoscaler` feature: neither it
/// nor a folder module above it is declared under the feature.
fn without_autoscaler(src: &Path, m: &[String]) -> bool {
    (0..m.len()).all(|i| {
        let parent = if i == 0 {
            src.join("lib.rs")
        } else {
            src.join(m[..i].join("/")).join("mod.rs")
        };
        !gated_children(&parent).contains(&m[i])
    })
}

/// The crates the `autoscaler` feature adds, as Rust names (`aws_sdk_ec2`).
fn autoscaler_crates(root: &Path) -> Vec<String> {
    let manifest: toml_edit::DocumentMut = std::fs::read_to_string(root.join("shared/Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    manifest["features"]["autoscaler"]
        .as_array()
        .expect("shared/Cargo.toml has the autoscaler feature")
        .iter()
        .filter_map(|d| d.as_str()?.strip_prefix("dep:").map(|n| n.replace('-', "_")))
        .collect()
}

/// The forwarder's image builds nodesmith without the `autoscaler` feature,
/// so what the library keeps without it imports nothing the feature gates,
/// and the forwarder uses only that (`cargo build -p nodesmith-forwarder`
/// is the compiler's word; this keeps the suite from needing that build).
#[test]
fn the_forwarders_part_of_the_library_stands_without_the_autoscaler() {
    let root = nodesmith_tests::moto::repo_root();
    let src = root.join("shared/src");
    let crates = autoscaler_crates(&root);
    assert!(crates.iter().any(|c| c == "aws_sdk_ec2"), "{crates:?}");
    let all = modules(&src);
    let tops: BTreeSet<String> = all.iter().map(|(m, _)| m[0].clone()).collect();
    let kept = |m: &[String]| without_autoscaler(&src, m);
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Module>();
    // The check sees the gates (else it proves nothing).
    assert!(kept(&m("messages::pending_pods")) && kept(&m("kubernetes::pods")));
    assert!(!kept(&m("kubernetes::client")) && !kept(&m("sweep")) && !kept(&m("state::table")));
    let mut wrong = Vec::new();
    for (module, path) in all.iter().filter(|(module, _)| kept(module)) {
        let code = code(&std::fs::read_to_string(path).unwrap());
        for name in names_after(&code, "crate::") {
            if tops.contains(&name) && !kept(std::slice::from_ref(&name)) {
                wrong.push(format!("{} imports crate::{name}", module.join("::")));
            }
        }
        let parent = &module[..module.len() - 1];
        let mut siblings = names_after(&code, "super::");
        if !parent.is_empty() {
            siblings.extend(names_after(&code, &format!("crate::{}::", parent.join("::"))));
        }
        for name in siblings {
            let mut sibling = parent.to_vec();
            sibling.push(name.clone());
            if all.iter().any(|(o, _)| *o == sibling) && !kept(&sibling) {
                wrong.push(format!("{} imports {}", module.join("::"), sibling.join("::")));
            }
        }
        for c in &crates {
            if code.contains(&format!("{c}::")) {
                wrong.push(format!("{} uses {c}", module.join("::")));
            }
        }
    }
    for entry in std::fs::read_dir(root.join("infra/forwarder/src")).unwrap() {
        let path = entry.unwrap().path();
        let code = code(&std::fs::read_to_string(&path).unwrap());
        let mut used: Vec<Module> = names_after(&code, "nodesmith::").into_iter().map(|n| vec![n]).collect();
        for top in used.clone() {
            let prefix = format!("nodesmith::{}::", top[0]);
            used.extend(names_after(&code, &prefix).into_iter().map(|n| vec![top[0].clone(), n]));
        }
        for module in used.iter().filter(|u| all.iter().any(|(o, _)| o == *u)) {
            if !kept(module) {
                wrong.push(format!(
                    "the forwarder ({}) uses nodesmith::{}",
                    path.display(),
                    module.join("::")
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "not built without the autoscaler feature:\n{}",
        wrong.join("\n")
    );
}

/// The forwarder's dependency tree, as its image's `cargo build -p
/// nodesmith-forwarder` resolves it, has the SQS SDK and kube but none of
/// the crates the autoscaler feature adds.
#[test]
fn the_forwarder_depends_on_none_of_the_autoscalers_crates() {
    let root = nodesmith_tests::moto::repo_root();
    let out = std::process::Command::new("cargo")
        .current_dir(&root)
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            "nodesmith-forwarder",
            "-e",
            "normal",
        ])
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|n| n.replace('-', "_"))
        .collect();
    assert!(names.contains("aws_sdk_sqs") && names.contains("kube"), "{names:?}");
    let linked: Vec<String> = autoscaler_crates(&root)
        .into_iter()
        .filter(|c| names.contains(c))
        .collect();
    assert!(linked.is_empty(), "the forwarder depends on {linked:?}");
}
