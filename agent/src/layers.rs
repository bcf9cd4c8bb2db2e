//! The layering of `agent/src`, and the unit test that holds it.
//!
//! The agent is a pipeline (kernel events → connection table → client health → actions)
//! beside what it reads from the host and the cluster, what it serves, and the program that
//! wires it all. Its top-level modules are steps, from the bottom up ([`STEPS`]):
//!
//! 0. `error`, `endpoint`, `times`: what every step shares (error chains, apiserver
//!    endpoints, timestamps and config durations).
//! 1. `host`: this machine (`/proc`, netlink sock_diag, network namespaces, privileges, Go
//!    binaries, the endpoint prober, redaction).
//! 2. `cluster`: the Kubernetes API (pods, endpoints discovery, Events, evictions).
//! 3. `kernel`: the eBPF programs, their maps and their decoded events.
//! 4. `table`: the connection table the events and the samples build.
//! 5. `health`: the judgement of every client and endpoint from the table.
//! 6. `act`: alerts, metrics and remediation from the judgement.
//! 7. `serve`: the HTTP API, `lifeline status`, the kubectl plugin.
//! 8. `app`: the program (command line, config file, run, worker threads) and `main.rs`.
//!
//! **The rule**: a module imports (`crate::…`, `super::…`) only from its own step or one
//! below, and no two top-level modules import each other, directly or round a circle.
//! Inside a step, modules are free (each step keeps its own order; `kernel/` for instance:
//! `programs.rs` → `go_probes.rs`, `ssl_probes.rs` → `uprobes.rs` → `object.rs`).
//!
//! `testkit.rs` (compiled for tests only) builds fixtures of every step for every step's
//! tests, and is outside the rule; so are this file (tests only, it imports nothing) and
//! `docs_tests.rs` (tests only: the docs against the whole program's flags and metrics).
//! Every other module counts as its directory's step: the event pump, which writes the table,
//! counts into the metrics and wakes the judgement, is `app/pump.rs`, and what the table reads
//! of the kernel's counters (`KernelStats`) lives in `kernel::programs`.
//!
//! `tests::the_tree_has_no_import_from_a_lower_step_to_a_higher_one_and_no_circle` reads every
//! `.rs` file under `src/` (comments and string literals aside) and fails naming each import
//! that breaks the rule, and each circle. It runs with the unit tests
//! (`cargo test -p lifeline --bins layers`, and `cargo xtask test`).
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// The steps, bottom first: (top-level module, step).
pub const STEPS: [(&str, u8); 11] = [
    ("error", 0),
    ("endpoint", 0),
    ("times", 0),
    ("host", 1),
    ("cluster", 2),
    ("kernel", 3),
    ("table", 4),
    ("health", 5),
    ("act", 6),
    ("serve", 7),
    ("app", 8),
];

/// Outside the rule (see the module comment).
const UNRULED: [&str; 3] = ["testkit", "layers", "docs_tests"];

/// The unit a module path counts as: its top-level module, but the crate root (`main.rs`)
/// counts as `app`. `None`: outside the rule, or not a module of the crate.
fn unit_of(path: &[String]) -> Option<&'static str> {
    let first = match path.first() {
        None => return Some("app"),
        Some(first) => first.as_str(),
    };
    STEPS.iter().find(|(m, _)| *m == first).map(|(m, _)| *m)
}

fn step_of(unit: &str) -> u8 {
    STEPS
        .iter()
        .find(|(m, _)| *m == unit)
        .map_or(u8::MAX, |(_, s)| *s)
}

/// `src` with comments, string literals and char literals blanked (lifetimes kept).
fn code_only(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::with_capacity(c.len());
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || c[i - 1] == 'b')
            && matches!(c.get(i + 1), Some('#' | '"'))
        {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push(' ');
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{1b}', '"'), or a lifetime ('a, 'static).
            if c.get(i + 1) == Some(&'\\') {
                // The backslash and the escaped character, then up to the closing quote.
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push(' ');
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push(' ');
            } else {
                out.push(c[i]);
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Every path a file names through `crate::` or `super::`, made absolute (segments from the
/// crate root; a `use` group gives one path per item). `module` is the file's module path.
fn imports(module: &[String], src: &str) -> Vec<Vec<String>> {
    let c = code_only(src);
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    let word_at = |i: usize| -> Option<(String, usize)> {
        let mut j = i;
        while j < c.len() && ident_char(c[j]) {
            j += 1;
        }
        (j > i).then(|| (c[i..j].iter().collect(), j))
    };
    let skip_ws = |mut i: usize| {
        while i < c.len() && c[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let sep_at = |i: usize| {
        let i = skip_ws(i);
        (c.get(i) == Some(&':') && c.get(i + 1) == Some(&':')).then(|| skip_ws(i + 2))
    };
    // A path tree from `i`: `a::b::c`, `a::{b, c::{d}}`, `*`; appends the paths to `out`.
    fn tree(
        c: &[char],
        i: usize,
        prefix: Vec<String>,
        out: &mut Vec<Vec<String>>,
        word_at: &dyn Fn(usize) -> Option<(String, usize)>,
        sep_at: &dyn Fn(usize) -> Option<usize>,
        skip_ws: &dyn Fn(usize) -> usize,
    ) -> usize {
        let mut path = prefix;
        let mut i = skip_ws(i);
        loop {
            if c.get(i) == Some(&'{') {
                i += 1;
                loop {
                    i = skip_ws(i);
                    match c.get(i) {
                        Some('}') => return i + 1,
                        Some(',') => i += 1,
                        None => return i,
                        _ => i = tree(c, i, path.clone(), out, word_at, sep_at, skip_ws),
                    }
                }
            }
            if c.get(i) == Some(&'*') {
                out.push(path);
                return i + 1;
            }
            match word_at(i) {
                Some((w, j)) => {
                    path.push(w);
                    match sep_at(j) {
                        Some(k) => i = k,
                        None => {
                            out.push(path);
                            return j;
                        }
                    }
                }
                None => {
                    out.push(path);
                    return i;
                }
            }
        }
    }
    let mut out = Vec::new();
    // Inline modules (`mod tests { … }`) open, with the brace depth they close at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut last_words: [String; 2] = Default::default();
    let mut i = 0;
    while i < c.len() {
        if c[i] == '{' {
            depth += 1;
            if last_words[0] == "mod" {
                inline.push((last_words[1].clone(), depth));
            }
            last_words = Default::default();
            i += 1;
            continue;
        }
        if c[i] == '}' {
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            depth -= 1;
            i += 1;
            continue;
        }
        let Some((word, j)) = (i == 0 || !(ident_char(c[i - 1]) || c[i - 1] == '$'))
            .then(|| word_at(i))
            .flatten()
        else {
            if !c[i].is_whitespace() {
                last_words = Default::default();
            }
            i += 1;
            continue;
        };
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(m, _)| m.clone()))
            .collect();
        let base = match word.as_str() {
            "crate" => sep_at(j).map(|k| (Vec::new(), k)),
            "super" => {
                let mut base = here.clone();
                let mut k = j;
                base.pop();
                loop {
                    let Some(next) = sep_at(k) else { break None };
                    match word_at(next) {
                        Some((w, after)) if w == "super" => {
                            base.pop();
                            k = after;
                        }
                        _ => break Some((base, next)),
                    }
                }
            }
            _ => None,
        };
        match base {
            Some((base, k)) => {
                i = tree(&c, k, base, &mut out, &word_at, &sep_at, &skip_ws);
                last_words = Default::default();
            }
            None => {
                last_words = [last_words[1].clone(), word];
                i = j;
            }
        }
    }
    out
}

/// The module path of a file under `src/`: `main.rs` is the root, `a/mod.rs` is `a`,
/// `a/b.rs` is `a::b`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "main") {
        parts.pop();
    }
    parts
}

/// What breaks the rule in `files` ((module path, source)): one line per upward import, and
/// one per circle between top-level modules.
fn violations(files: &[(Vec<String>, String)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut edges: BTreeMap<&str, BTreeMap<&str, String>> = BTreeMap::new();
    for (module, src) in files {
        let Some(from) = unit_of(module) else {
            if module.first().is_some_and(|m| !UNRULED.contains(&m.as_str())) {
                found.push(format!(
                    "{}: a top-level module in no step of STEPS",
                    module.join("::")
                ));
            }
            continue;
        };
        for path in imports(module, src) {
            if path.first().is_some_and(|m| UNRULED.contains(&m.as_str())) {
                continue;
            }
            let Some(to) = unit_of(&path).filter(|_| !path.is_empty()) else {
                continue;
            };
            if to == from {
                continue;
            }
            let shown = format!("{} imports crate::{}", module.join("::"), path.join("::"));
            if step_of(to) > step_of(from) {
                found.push(format!(
                    "{shown}: step {from} ({}) imports from step {to} ({}), above it",
                    step_of(from),
                    step_of(to)
                ));
            }
            edges.entry(from).or_default().entry(to).or_insert(shown);
        }
    }
    // Circles: a depth-first search from every unit, in order, reporting each back edge.
    let units: BTreeSet<&str> = edges.keys().copied().collect();
    let mut done = BTreeSet::new();
    for &start in &units {
        let mut stack: Vec<&str> = Vec::new();
        visit(start, &edges, &mut stack, &mut done, &mut found);
    }
    found
}

fn visit<'a>(
    unit: &'a str,
    edges: &BTreeMap<&'a str, BTreeMap<&'a str, String>>,
    stack: &mut Vec<&'a str>,
    done: &mut BTreeSet<&'a str>,
    found: &mut Vec<String>,
) {
    if let Some(at) = stack.iter().position(|u| *u == unit) {
        let circle = &stack[at..];
        let why: Vec<&str> = circle
            .iter()
            .zip(circle.iter().skip(1).chain([&unit]))
            .map(|(a, b)| edges[a][b].as_str())
            .collect();
        found.push(format!(
            "circle {} → {unit}: {}",
            circle.join(" → "),
            why.join("; ")
        ));
        return;
    }
    if !done.insert(unit) {
        return;
    }
    stack.push(unit);
    for &next in edges.get(unit).map(|e| e.keys()).into_iter().flatten() {
        visit(next, edges, stack, done, found);
    }
    stack.pop();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(dir: &Path, root: &Path, out: &mut Vec<(Vec<String>, String)>) {
        for entry in std::fs::read_dir(dir).expect("reading src/") {
            let path = entry.expect("reading src/").path();
            if path.is_dir() {
                sources(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).expect("under src/");
                let text = std::fs::read_to_string(&path).expect("reading a source file");
                out.push((module_of(relative), text));
            }
        }
    }

    fn module(path: &str) -> Vec<String> {
        path.split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_tree_has_no_import_from_a_lower_step_to_a_higher_one_and_no_circle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &root, &mut files);
        assert!(
            files.len() > 100,
            "read only {} files under {root:?}",
            files.len()
        );
        let found = violations(&files);
        assert!(
            found.is_empty(),
            "the layering of agent/src/layers.rs is broken:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn paths_are_read_from_use_groups_super_and_inline_modules_not_from_comments() {
        let src = r#"
            //! See crate::app::run.
            use super::{events::{self, Change}, programs::Probes};
            use crate::{host::{process::ProcessInfo, netns}, table::Tuple};
            const S: &str = "crate::app::cli";
            const C: char = '"';
            fn f<'a>(x: &'a str) -> crate::health::State { todo!() }
            mod tests {
                use super::*;
                use super::super::filter::FILTER_OBJECT;
            }
        "#;
        let found: Vec<String> = imports(&module("kernel::golang"), src)
            .iter()
            .map(|p| p.join("::"))
            .collect();
        assert_eq!(
            found,
            [
                "kernel::events::self",
                "kernel::events::Change",
                "kernel::programs::Probes",
                "host::process::ProcessInfo",
                "host::netns",
                "table::Tuple",
                "health::State",
                "kernel::golang",
                "kernel::filter::FILTER_OBJECT",
            ]
        );
    }

    #[test]
    fn an_upward_import_and_a_circle_are_caught() {
        let file = |m: &str, src: &str| (module(m), src.to_owned());
        let found = violations(&[
            file("host::privileges", "use crate::app::config::RemediationMode;"),
            file("table::sampler", "use crate::app::pump::KernelStats;"),
            file("times", "use crate::error::chain;"),
            file("error", "fn f() -> crate::times::Stamp { todo!() }"),
        ]);
        let has = |needle: &str| found.iter().any(|f| f.contains(needle));
        assert!(
            has("host::privileges imports crate::app::config::RemediationMode: step host (1) imports from step app (8)"),
            "{found:#?}"
        );
        assert!(
            has("table::sampler imports crate::app::pump::KernelStats: step table (4) imports from step app (8)"),
            "{found:#?}"
        );
        assert!(has("circle error → times → error"), "{found:#?}");
        assert_eq!(found.len(), 3, "{found:#?}");
        // The pump is app's: it may import the kernel, the table and app's own modules.
        let pump = file(
            "app::pump",
            "use crate::{kernel::events::Record, table::Applied, app::workers::Refresher};",
        );
        assert_eq!(violations(&[pump]), Vec::<String>::new());
        // A kernel module reaching up to the table or the program is caught.
        let up = file("kernel::events", "use crate::table::Applied;");
        assert_eq!(violations(&[up]).len(), 1);
    }
}
