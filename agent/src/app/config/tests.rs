use super::*;

fn parse(text: &str) -> Result<ConfigFile> {
    ConfigFile::parse(Path::new("/etc/lifeline.yaml"), text)
}

#[test]
fn parses_the_spec_example() {
    let file = parse(
        r#"
endpoints: ["10.96.0.1:443", "192.168.0.0/24:6443", "[fd00::1]:6443"]
listen: "0.0.0.0:9477"
thresholds:
  disconnect_grace: 15s
  stale_after: 90s
  blackhole_after: 20s
  connect_failures: 3
  connect_window: 60s
  min_client_age: 10s
select:
  comm: ["kube-controller", "my-operator"]
receivers:
  - { name: am,   alertmanager: { url: "http://alertmanager:9093" } }
  - { name: hook, webhook: { url: "http://sink:8080/hook", timeout: 5s } }
remediation:
  mode: none
  dry_run: false
  cooldown: 10m
  budget_per_hour: 3
"#,
    )
    .expect("SPEC example parses");
    assert_eq!(file.thresholds(&ThresholdsFile::default()), Thresholds::default());
    let flags = ThresholdsFile {
        stale_after: Some(Duration::from_secs(7)),
        ..Default::default()
    };
    assert_eq!(
        file.thresholds(&flags).stale_after,
        Duration::from_secs(7),
        "flags override the file"
    );
    assert!(file.select.matches("kube-controller", ""));
    assert!(
        !file.select.matches("kube-controller-manager", ""),
        "no * means the whole name"
    );
    assert_eq!(file.endpoint_list(Path::new("x")).unwrap().len(), 3);
    assert_eq!(file.remediation.cooldown, Duration::from_secs(600));
    assert_eq!(
        file.receivers[1].webhook.as_ref().unwrap().timeout,
        Some(Duration::from_secs(5))
    );
}

#[test]
fn an_empty_file_is_rejected_and_braces_mean_defaults() {
    for empty in ["", "\n  \n", "# only a comment\n---\n"] {
        let err = parse(empty).expect_err(empty).to_string();
        assert!(err.contains("/etc/lifeline.yaml is empty"), "{err}");
    }
    assert_eq!(parse("{}").unwrap(), ConfigFile::default());
}

#[test]
fn more_endpoints_than_the_kernel_map_holds_are_refused_naming_the_key_and_the_limit() {
    let list: Vec<String> = (0..=MAX_ENDPOINTS)
        .map(|i| format!("\"10.{}.{}.1:443\"", i / 256, i % 256))
        .collect();
    let err = parse(&format!("endpoints: [{}]", list.join(",")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("endpoints: 4097 endpoints"), "{err}");
    assert!(err.contains("at most 4096"), "{err}");
    let fits = list[..MAX_ENDPOINTS as usize].join(",");
    assert_eq!(
        parse(&format!("endpoints: [{fits}]")).unwrap().endpoints.len(),
        4096
    );
}

#[test]
fn receivers_take_a_ca_bundle_and_bearer_or_basic_auth() {
    let file = parse(
        r#"
receivers:
  - name: am
    alertmanager:
      url: https://am.example:9093
      tls_config: { ca_file: /etc/lifeline/ca.pem }
      authorization: { credentials_file: /run/secrets/token }
  - name: hook
    webhook:
      url: https://hook.example/x
      basic_auth: { username: lifeline, password_file: /run/secrets/pw }
"#,
    )
    .unwrap();
    let am = file.receivers[0].alertmanager.as_ref().unwrap();
    assert_eq!(
        am.tls_config.as_ref().unwrap().ca_file.as_deref(),
        Some(Path::new("/etc/lifeline/ca.pem"))
    );
    assert_eq!(am.authorization.as_ref().unwrap().kind, "Bearer");
    let hook = file.receivers[1].webhook.as_ref().unwrap();
    assert_eq!(hook.basic_auth.as_ref().unwrap().username, "lifeline");
    for (text, needles) in [
        (
            "receivers:\n  - { name: a, webhook: { url: \"http://x\", tls_config: { ca_file: /c } } }",
            vec!["receivers[0].webhook.tls_config", "only for https://"],
        ),
        (
            "receivers:\n  - { name: a, webhook: { url: \"https://x\", authorization: { type: Digest, credentials_file: /t } } }",
            vec!["receivers[0].webhook.authorization.type", "only Bearer"],
        ),
        (
            "receivers:\n  - { name: a, alertmanager: { url: \"https://x\", authorization: { credentials_file: /t }, basic_auth: { username: u, password_file: /p } } }",
            vec!["receivers[0].alertmanager.authorization", "not both"],
        ),
        (
            "receivers:\n  - { name: a, webhook: { url: \"https://x\", basic_auth: { username: u, password: p } } }",
            vec!["unknown field `password`"],
        ),
    ] {
        let err = parse(text).expect_err(text).to_string();
        for needle in needles {
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
    }
}

#[test]
fn the_watch_sees_content_changes_renames_and_configmap_symlink_swaps() {
    let dir = std::env::temp_dir().join(format!("lifeline-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();

    // In place, and by rename.
    let plain = dir.join("plain.yaml");
    write("plain.yaml", "endpoints: []\n");
    let mut watch = Watch::new(&plain);
    assert!(!watch.poll(), "nothing changed");
    write("plain.yaml", "endpoints: [\"10.0.0.1:443\"]\n");
    assert!(watch.poll(), "written in place");
    assert!(!watch.poll(), "seen once");
    let before = std::fs::metadata(&plain).unwrap().modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(&plain)
        .unwrap()
        .set_modified(before + Duration::from_secs(5))
        .unwrap();
    assert!(!watch.poll(), "a touch without a new content is no change");
    write("plain.tmp", "endpoints: [\"10.0.0.2:443\"]\n");
    std::fs::rename(dir.join("plain.tmp"), &plain).unwrap();
    assert!(watch.poll(), "renamed over");

    // A ConfigMap volume: config.yaml -> ..data/config.yaml, ..data -> ..v1, then ..v2.
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::create_dir_all(dir.join("..v2")).unwrap();
    write("..v1/config.yaml", "endpoints: []\n");
    write("..v2/config.yaml", "endpoints: [\"10.0.0.3:443\"]\n");
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", dir.join("config.yaml")).unwrap();
    let mut watch = Watch::new(&dir.join("config.yaml"));
    assert!(!watch.poll());
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    assert!(watch.poll(), "..data swapped");
    assert!(!watch.poll());

    // Gone, then back.
    std::fs::remove_file(&plain).unwrap();
    let mut watch_plain = Watch::new(&plain);
    assert!(!watch_plain.poll(), "still missing");
    write("plain.yaml", "{}\n");
    assert!(watch_plain.poll(), "appeared");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_name_the_key_and_the_reason() {
    for (text, needles) in [
        ("endpoint: []", vec!["/etc/lifeline.yaml", "unknown field `endpoint`"]),
        ("thresholds:\n  stale_after: soon", vec!["\"soon\" is not a duration", "line 2"]),
        ("thresholds:\n  stale: 5s", vec!["unknown field `stale`"]),
        ("thresholds:\n  stale_after: 0s", vec!["thresholds.stale_after", "longer than 0s"]),
        ("thresholds:\n  connect_failures: 0", vec!["thresholds.connect_failures"]),
        ("endpoints: [\"nonsense\"]", vec!["\"nonsense\"", "expected HOST:PORT"]),
        ("listen: here", vec!["listen"]),
        ("remediation:\n  mode: reboot", vec!["unknown variant `reboot`"]),
        ("receivers:\n  - { name: a, webhook: { url: \"ftp://x\" } }", vec!["receivers[0].url", "ftp://x"]),
        ("receivers:\n  - { name: a }", vec!["receivers[0]", "exactly one"]),
        (
            "receivers:\n  - { name: a, webhook: { url: \"http://x\" } }\n  - { name: a, webhook: { url: \"http://y\" } }",
            vec!["receivers[1]", "duplicate receiver name \"a\""],
        ),
    ] {
        let err = parse(text).expect_err(text).to_string();
        for needle in needles {
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
    }
}

#[test]
fn flags_and_file_merge_with_sources() {
    let a = Endpoint::parse_all("127.0.0.1:1").unwrap();
    let b = Endpoint::parse_all("127.0.0.1:2").unwrap();
    let set = endpoint_set(&a, &[a.clone(), b.clone()].concat());
    let sources: Vec<(String, Vec<Source>)> = set.iter().map(|(e, s)| (e.to_string(), s.to_vec())).collect();
    assert_eq!(
        sources,
        vec![
            ("127.0.0.1:1".to_owned(), vec![Source::Flag, Source::Config]),
            ("127.0.0.1:2".to_owned(), vec![Source::Config])
        ]
    );
}

#[test]
fn a_parse_error_is_one_line_with_the_dotted_key_the_line_and_the_column() {
    let text = "receivers:\n  - name: a\n    webhook:\n      url: \"http://x\"\n      timeout: soon\n";
    let err = parse(text).expect_err(text).to_string();
    assert!(
        err.starts_with(
            "config file /etc/lifeline.yaml: receivers[0].webhook.timeout: \"soon\" is not a duration"
        ),
        "{err}"
    );
    assert!(err.ends_with("at line 5, column 16"), "{err}");
    assert_eq!(
        from_yaml::<ConfigFile>("endpoints: []\nlisten: here\n").unwrap_err(),
        "listen: invalid socket address syntax at line 2, column 9"
    );
    // A file that is not a mapping has no key to name.
    let err = from_yaml::<ConfigFile>("[1, 2]").unwrap_err();
    assert!(
        err.ends_with("at line 1, column 1") && !err.starts_with('.'),
        "{err}"
    );
    // No source excerpt under the message: a log line is one line.
    let err = parse("endpoints: [a, b\n").unwrap_err().to_string();
    assert!(!err.contains('\n'), "{err:?}");
}

#[test]
fn dry_run_flag_overrides_the_file() {
    let file = Remediation::default();
    assert!(!file.settings(false).dry_run);
    assert!(file.settings(true).dry_run);
    let file = Remediation {
        dry_run: true,
        ..file
    };
    assert!(file.settings(false).dry_run);
}
