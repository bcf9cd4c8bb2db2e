//! The docs against the code (issue 27): every flag, default, metric and alert that README.md and
//! docs/*.md name exists in the code with that name and that default, and every flag, metric and
//! alert of the code is documented. A flag renamed on one side only fails here.
//!
//! Run alone: `cargo test -p lifeline docs_`.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use clap::{Args, CommandFactory, Parser};

use crate::{
    app::cli::{Cli, Command, ThresholdArgs},
    app::config::{ConfigFile, DEFAULT_LISTEN},
    health::Thresholds,
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every page of docs/, by their path from the workspace.
fn pages() -> Vec<(String, String)> {
    let root = workspace();
    let mut names: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    names.sort();
    names.insert(0, "README.md".to_owned());
    names
        .into_iter()
        .map(|n| (n.clone(), read(&root.join(&n))))
        .collect()
}

/// Every `--flag` a text names (`--` then a lowercase name; not `---` of a table rule, not a
/// bare `--`).
fn flags_in(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'-');
        let name: String = text[start + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if before_ok && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.insert(format!("--{}", name.trim_end_matches('-')));
        }
        i = start + 2 + name.len();
    }
    out
}

/// Words that start with `prefix` and go on while `more` holds.
fn words(text: &str, prefix: &str, more: fn(char) -> bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let tail = &rest[i..];
        let before = text.len() - rest.len() + i;
        let end = tail[prefix.len()..]
            .find(|c: char| !more(c))
            .map_or(tail.len(), |e| e + prefix.len());
        let boundary = before == 0 || !text.as_bytes()[before - 1].is_ascii_alphanumeric();
        if boundary && end > prefix.len() {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end.max(1)..];
    }
    out
}

/// Every long flag of the agent's CLI, every subcommand's, with its clap default values.
fn cli_flags() -> BTreeMap<String, BTreeSet<String>> {
    fn walk(cmd: &clap::Command, out: &mut BTreeMap<String, BTreeSet<String>>) {
        for arg in cmd.get_arguments() {
            if let Some(long) = arg.get_long() {
                let defaults = arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned());
                out.entry(format!("--{long}")).or_default().extend(defaults);
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = BTreeMap::new();
    walk(&cmd, &mut out);
    out
}

/// The threshold flags (`thresholds:` keys), from their clap group.
fn threshold_flags() -> BTreeSet<String> {
    ThresholdArgs::augment_args(clap::Command::new("thresholds"))
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

/// Flags of other programs that the docs name (the program, and where in this repository it is
/// checked that the flag is real). Anything else spelled `--flag` must be the agent's.
const OTHER_PROGRAMS: &[(&str, &str)] = &[
    // kube-apiserver's, whose defaults the thresholds are measured against.
    ("--min-request-timeout", "kube-apiserver"),
    ("--request-timeout", "kube-apiserver"),
    // Command-line arguments the redaction examples show (agent/src/host/redact.rs).
    ("--token", "redact"),
    ("--password", "redact"),
    ("--client-key-data", "redact"),
    ("--token-auth-file", "redact"),
    ("--password-file", "redact"),
    ("--secret-name", "redact"),
    ("--token-ttl", "redact"),
    // cargo, kubectl, capsh.
    ("--release", "cargo"),
    ("--check", "cargo"),
    ("--lib", "cargo"),
    ("--bins", "cargo"),
    ("--include-ignored", "cargo"),
    ("--raw", "kubectl"),
    ("--drop", "capsh"),
    // The fake apiserver of the suites (tests/src/apiserver/).
    ("--hang-lists", "ll-apiserver"),
    // The client-go informer of the real-cluster tier and the streams bench.
    ("--pods", "ll-informer"),
    // cargo xtask's (xtask/src/main.rs).
    ("--only", "xtask"),
    ("--kernel", "xtask"),
    ("--modules", "xtask"),
    ("--suite", "xtask"),
    ("--no-suites", "xtask"),
    ("--name", "xtask"),
    ("--out", "xtask"),
    ("--no-build", "xtask"),
    ("--verify", "xtask"),
];

/// Where a flag of another program is checked to exist in this repository, if anywhere.
fn other_program_knows(program: &str, flag: &str) -> bool {
    let root = workspace();
    let bare = flag.trim_start_matches("--");
    match program {
        "redact" => read(&root.join("agent/src/host/redact.rs")).contains(flag),
        "xtask" => {
            let text = read(&root.join("xtask/src/main.rs"));
            text.contains(&format!(" {}: ", bare.replace('-', "_")))
                || text.contains(&format!("long = \"{bare}\""))
        }
        "ll-informer" => {
            read(&root.join("tests/clients/informer/main.go")).contains(&format!("flag.Bool(\"{bare}\""))
        }
        "ll-apiserver" => {
            let dir = root.join("tests/src/apiserver");
            std::fs::read_dir(&dir)
                .expect("tests/src/apiserver")
                .any(|e| read(&e.expect("entry").path()).contains(&format!("\"{flag}\"")))
        }
        _ => true,
    }
}

#[test]
fn docs_name_only_flags_the_cli_has_and_document_every_one() {
    let cli = cli_flags();
    let others: BTreeMap<&str, &str> = OTHER_PROGRAMS.iter().copied().collect();
    let mut unknown = Vec::new();
    let mut named = BTreeSet::new();
    for (page, text) in pages() {
        for flag in flags_in(&text) {
            named.insert(flag.clone());
            if cli.contains_key(&flag) {
                continue;
            }
            match others.get(flag.as_str()) {
                Some(program) if other_program_knows(program, &flag) => {}
                Some(program) => unknown.push(format!("{page}: {flag} (not a flag of {program} any more)")),
                None => unknown.push(format!("{page}: {flag}")),
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "flags the docs name that the agent's CLI (agent/src/app/cli.rs) does not have: {unknown:?}"
    );
    let undocumented: Vec<&String> = cli
        .keys()
        .filter(|f| !["--help", "--version"].contains(&f.as_str()) && !named.contains(*f))
        .collect();
    assert!(
        undocumented.is_empty(),
        "flags of the CLI no page documents: {undocumented:?}"
    );
    for (program, flag) in OTHER_PROGRAMS.iter().map(|(f, p)| (p, f)) {
        assert!(
            named.contains(*flag),
            "{flag} ({program}) is in OTHER_PROGRAMS but no page names it any more: drop it"
        );
    }
}

/// A config file that sets only `key` (dotted) to `value` is the file with every default.
fn config_value_is_default(key: &str, value: &str) -> Result<(), String> {
    let mut yaml = String::new();
    for (depth, part) in key.split('.').enumerate() {
        yaml.push_str(&"  ".repeat(depth));
        yaml.push_str(part);
        yaml.push(':');
        yaml.push(if depth + 1 == key.split('.').count() {
            ' '
        } else {
            '\n'
        });
    }
    yaml.push_str(value);
    yaml.push('\n');
    let file =
        ConfigFile::parse(Path::new("docs/configuration.md"), &yaml).map_err(|e| format!("{yaml:?}: {e}"))?;
    is_default(file)
}

/// `file`, with what it sets resolved, is the file with every default.
fn is_default(mut file: ConfigFile) -> Result<(), String> {
    let thresholds = file.thresholds(&Default::default());
    if thresholds != Thresholds::default() {
        return Err(format!(
            "thresholds {thresholds:?}, not {:?}",
            Thresholds::default()
        ));
    }
    file.thresholds = Default::default();
    if file.listen == Some(DEFAULT_LISTEN.parse().expect("DEFAULT_LISTEN")) {
        file.listen = None;
    }
    if file != ConfigFile::default() {
        return Err(format!("{file:?} is not the default file"));
    }
    Ok(())
}

/// `lifeline run FLAG VALUE` runs as `lifeline run` does, where the code has a default for FLAG
/// but clap does not (the thresholds, `--listen`).
fn run_flag_value_is_default(flag: &str, value: &str) -> Result<(), String> {
    let cli = Cli::try_parse_from(["lifeline", "run", flag, value]).map_err(|e| e.to_string())?;
    let Command::Run(args) = cli.command else {
        unreachable!("run")
    };
    is_default(ConfigFile {
        listen: args.listen,
        thresholds: args.thresholds.as_file(),
        ..Default::default()
    })
}

/// The `` `value` `` of a table cell, if it holds exactly one.
fn backticked(cell: &str) -> Option<&str> {
    let cell = cell.trim();
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

#[test]
fn docs_configuration_states_the_codes_defaults() {
    let path = workspace().join("docs/configuration.md");
    let text = read(&path);
    let cli = cli_flags();
    let thresholds = threshold_flags();
    let mut checked_flags = BTreeSet::new();
    let mut checked = 0;
    let mut wrong = Vec::new();
    let mut header: Option<Vec<String>> = None;
    for line in text.lines() {
        let Some(row) = line.trim().strip_prefix('|').and_then(|r| r.strip_suffix('|')) else {
            header = None;
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(columns) = &header else {
            header = Some(cells.iter().map(|c| c.to_lowercase()).collect());
            continue;
        };
        if cells.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':')) {
            continue;
        }
        let column = |name: &str| {
            columns
                .iter()
                .position(|c| c.starts_with(name))
                .and_then(|i| cells.get(i))
        };
        let Some(default) = column("default").and_then(|c| backticked(c)) else {
            continue;
        };
        // The key column: `key (`thresholds.`)` prefixes its keys.
        if let Some(keys) = column("key") {
            let prefix = if columns[0].contains("`thresholds.`") {
                "thresholds."
            } else {
                ""
            };
            for key in words(keys, "`", |c| c.is_ascii_lowercase() || c == '_' || c == '.') {
                let key = format!("{prefix}{}", key.trim_start_matches('`'));
                checked += 1;
                if let Err(e) = config_value_is_default(&key, default) {
                    wrong.push(format!("key {key}: documented default {default}: {e}"));
                }
            }
        }
        let Some(flag) = column("flag").and_then(|c| flags_in(c).into_iter().next()) else {
            continue;
        };
        checked += 1;
        checked_flags.insert(flag.clone());
        match cli.get(&flag) {
            None => wrong.push(format!("{flag}: not a flag of the CLI")),
            Some(code) if !code.is_empty() => {
                if !code.contains(default) {
                    wrong.push(format!(
                        "{flag}: documented default {default}, the code's {code:?}"
                    ));
                }
            }
            Some(_) if thresholds.contains(&flag) || flag == "--listen" => {
                if let Err(e) = run_flag_value_is_default(&flag, default) {
                    wrong.push(format!("{flag}: documented default {default}: {e}"));
                }
            }
            Some(_) => wrong.push(format!("{flag}: documented default {default}, the code has none")),
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md's defaults disagree with the code: {wrong:#?}"
    );
    assert!(
        checked >= 20,
        "only {checked} defaults found in docs/configuration.md's tables"
    );
    // Every flag the code gives a default has its row, with that default.
    let mut with_default: BTreeSet<String> = cli
        .iter()
        .filter(|(flag, defaults)| !defaults.is_empty() && !["--help", "--version"].contains(&flag.as_str()))
        .map(|(flag, _)| flag.clone())
        .collect();
    with_default.extend(thresholds);
    with_default.insert("--listen".to_owned());
    let missing: Vec<&String> = with_default
        .iter()
        .filter(|f| !checked_flags.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "flags with a default in the code and no row with that default in docs/configuration.md: {missing:?}"
    );
}

/// Every `lifeline_*` metric the agent registers: a `lifeline_…` name as the first argument of a
/// constructor (`Opts::new`, `IntCounter::new`, ...) anywhere in agent/src but this file;
/// histograms add their series' suffixes.
fn registered_metrics() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("agent/src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("docs_tests.rs") {
                continue;
            }
            let text = read(&path);
            for (at, _) in text.match_indices("::new(") {
                let args = text[at + "::new(".len()..].trim_start();
                let Some(name) = args.strip_prefix("\"lifeline_") else {
                    continue;
                };
                let name = &name[..name.find('"').expect("closing quote")];
                let histogram = text[..at].ends_with("Histogram") || text[..at].ends_with("HistogramOpts");
                let suffixes: &[&str] = if histogram {
                    &["", "_bucket", "_sum", "_count"]
                } else {
                    &[""]
                };
                for suffix in suffixes {
                    out.insert(format!("lifeline_{name}{suffix}"));
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&workspace().join("agent/src"), &mut out);
    out
}

fn is_metric_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
}

#[test]
fn docs_name_only_metrics_the_agent_registers_and_document_every_one() {
    let registered = registered_metrics();
    assert!(
        registered.contains("lifeline_client_state") && registered.contains("lifeline_agent_blind"),
        "the registry scan found {registered:?}"
    );
    let mut named = BTreeSet::new();
    let mut unknown = Vec::new();
    for (page, text) in pages() {
        for name in words(&text, "lifeline_", is_metric_char) {
            if !registered.contains(&name) {
                unknown.push(format!("{page}: {name}"));
            }
            named.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics the docs name that the agent does not register: {unknown:?}"
    );
    let undocumented: Vec<&String> = registered
        .iter()
        .filter(|m| !["_bucket", "_sum", "_count"].iter().any(|s| m.ends_with(s)) && !named.contains(*m))
        .collect();
    assert!(
        undocumented.is_empty(),
        "metrics no page documents: {undocumented:?}"
    );
}

#[test]
fn docs_name_only_alerts_deploy_defines_and_document_every_one() {
    let root = workspace();
    let rules = read(&root.join("deploy/components/monitoring/prometheus-rules.yaml"));
    let alerts: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|a| a.trim().to_owned())
        .collect();
    assert!(alerts.len() >= 5, "alerts in prometheus-rules.yaml: {alerts:?}");
    let mut named = BTreeSet::new();
    let mut unknown = Vec::new();
    for (page, text) in pages() {
        for name in words(&text, "Lifeline", |c| c.is_ascii_alphanumeric()) {
            if name == "Lifeline" {
                continue;
            }
            if !alerts.contains(&name) {
                unknown.push(format!("{page}: {name}"));
            }
            named.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "alerts the docs name that deploy/components/monitoring/prometheus-rules.yaml lacks: {unknown:?}"
    );
    let undocumented: Vec<&String> = alerts.iter().filter(|a| !named.contains(*a)).collect();
    assert!(
        undocumented.is_empty(),
        "alerts no page documents: {undocumented:?}"
    );
    // The alerts the agent sends itself are the rules' too.
    let book = read(&root.join("agent/src/act/alerts/book.rs"));
    for sent in words(&book, "\"LifelineClient", |c| c.is_ascii_alphanumeric()) {
        let sent = sent.trim_start_matches('"');
        assert!(
            alerts.contains(sent),
            "the agent sends {sent}, which the rules lack"
        );
    }
}

#[test]
fn the_flag_scanner_reads_flags_and_nothing_else() {
    let text = "| --- | `--stale-after 2m` `lifeline status -o json` ds/lifeline -- lifeline x --a-b=1 x--y";
    assert_eq!(
        flags_in(text),
        ["--a-b", "--stale-after"].into_iter().map(String::from).collect()
    );
}
