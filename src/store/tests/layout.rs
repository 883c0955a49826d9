//! The shape of the store's source: no file over 600 lines, and no two of its modules (other than one inside
//! the other) that use each other, directly or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MOST_LINES: usize = 600;

/// Every Rust file of the store, with its module path (`store::postgres::writer`).
fn files() -> Vec<(Vec<String>, PathBuf)> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = vec![src.join("store.rs")];
    walk(&src.join("store"), &mut found);
    found
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(&src).unwrap().with_extension("");
            let module = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            (module, path)
        })
        .collect()
}

/// A file's code without its comments and without the tests at its end.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a file names that start at `super` or `crate`, with each `use` group spread out.
fn paths(code: &str) -> Vec<String> {
    fn spread(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let tree = tree.trim();
        let Some(open) = tree.find('{') else {
            out.push(format!("{prefix}{tree}"));
            return;
        };
        let prefix = format!("{prefix}{}", &tree[..open]);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut depth, mut start) = (0, 0);
        for (at, char) in inner.char_indices() {
            match char {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    spread(&prefix, &inner[start..at], out);
                    start = at + 1;
                }
                _ => {}
            }
        }
        if !inner[start..].trim().is_empty() {
            spread(&prefix, &inner[start..], out);
        }
    }
    let mut out = Vec::new();
    for statement in code.split(';') {
        let statement = statement.trim_start();
        let tree = statement
            .strip_prefix("pub(super) use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
            .or_else(|| statement.strip_prefix("pub use "))
            .or_else(|| statement.strip_prefix("use "));
        if let Some(tree) = tree {
            spread("", tree, &mut out);
        }
    }
    let words: Vec<&str> = code
        .split(|char: char| !(char.is_alphanumeric() || char == '_' || char == ':'))
        .collect();
    out.extend(
        words
            .into_iter()
            .filter(|word| word.starts_with("super::") || word.starts_with("crate::store"))
            .map(str::to_owned),
    );
    out
}

/// The module of `modules` that `path`, named in `from`, leads to, if any.
fn target(from: &[String], path: &str, modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut parts = path
        .split("::")
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .peekable();
    let mut at: Vec<String> = match parts.peek() {
        Some(&"crate") => {
            parts.next();
            Vec::new()
        }
        Some(&"super") => from.to_vec(),
        _ => return None,
    };
    while parts.peek() == Some(&"super") {
        parts.next();
        at.pop();
    }
    let mut found = None;
    for part in parts {
        at.push(part.to_owned());
        if modules.contains(&at) {
            found = Some(at.clone());
        }
    }
    found
}

#[test]
fn no_file_of_the_store_is_over_600_lines() {
    let long: Vec<String> = files()
        .into_iter()
        .filter_map(|(_, path)| {
            let lines = std::fs::read_to_string(&path).unwrap().lines().count();
            (lines > MOST_LINES).then(|| format!("{} ({lines})", path.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MOST_LINES} lines: {long:?}");
}

#[test]
fn the_modules_of_the_store_use_each_other_in_no_circle() {
    let files = files();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(module, _)| module.clone()).collect();
    let mut uses: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, path) in &files {
        if module.iter().any(|part| part == "tests") {
            continue;
        }
        let code = code(&std::fs::read_to_string(path).unwrap());
        for path in paths(&code) {
            let Some(used) = target(module, &path, &modules) else {
                continue;
            };
            let nested = used.starts_with(module) || module.starts_with(&used);
            if !nested && !used.iter().any(|part| part == "tests") {
                uses.entry(module.clone()).or_default().insert(used);
            }
        }
    }
    // A depth-first walk: a module reached again while it is on the walk's path closes a circle.
    fn walk(
        module: &Vec<String>,
        uses: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|on| on == module) {
            let circle = path[at..]
                .iter()
                .chain([module])
                .map(|module| module.join("::"))
                .collect();
            return Some(circle);
        }
        if !done.insert(module.clone()) {
            return None;
        }
        path.push(module.clone());
        let circle = uses
            .get(module)
            .into_iter()
            .flatten()
            .find_map(|used| walk(used, uses, path, done));
        path.pop();
        circle
    }
    let mut done = BTreeSet::new();
    for module in uses.keys() {
        let circle = walk(module, &uses, &mut Vec::new(), &mut done);
        assert!(circle.is_none(), "modules that use each other: {circle:?}");
    }
}
