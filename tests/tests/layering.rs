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
