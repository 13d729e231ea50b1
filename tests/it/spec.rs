//! Good task files parse into the model they mean.

use gangway::spec::{
    parse_str, Accel, Accelerators, Choice, Infra, MountSource, PortRange, Quantity, Workdir,
};

fn accel(name: &str, count: f32) -> Accel {
    Accel {
        name: name.into(),
        count,
    }
}

#[test]
fn full_task_parses() {
    let t = parse_str(
        r#"
name: train
workdir: .
num_nodes: 4
resources:
  infra: aws/us-east-1/us-east-1a
  accelerators: A100:8
  cpus: 32+
  memory: "256"
  use_spot: True
  disk_size: 1TB
  disk_tier: best
  network_tier: best
  image_id: docker:nvcr.io/nvidia/pytorch:24.01-py3
  ports: [8080, "9000-9010"]
  labels: {team: ml}
  max_hourly_cost: 40
  job_recovery:
    strategy: failover
    max_restarts_on_errors: 3
    recover_on_exit_codes: [33, 34]
envs:
  MODEL: gpt2
  STEPS: 100
  QUOTED: "007"
  NEEDED:
secrets:
  HF_TOKEN: null
  EMPTY: ""
file_mounts:
  /data: s3://bucket/data
  ~/code: ./code
  /ckpt:
    name: my-bucket
    store: s3
    mode: mount
    persistent: false
setup: pip install -r requirements.txt
run: |
  torchrun train.py
config:
  local:
    capacity: {local-a: 2}
checkpoint:
  path: /ckpt
  sync_interval: 5m
  signal: USR1
  grace_period: 90
deadline: 2d
"#,
        "t.yaml",
    )
    .unwrap();
    assert_eq!(t.name.as_deref(), Some("train"));
    assert_eq!(t.workdir, Some(Workdir::Path(".".into())));
    assert_eq!(t.num_nodes, 4);
    let r = &t.resources.base;
    assert_eq!(
        r.infra,
        Infra {
            cloud: Some("aws".into()),
            region: Some("us-east-1".into()),
            zone: Some("us-east-1a".into())
        }
    );
    assert_eq!(r.accelerators, Some(Accelerators::One(accel("A100", 8.0))));
    assert_eq!(
        r.cpus,
        Some(Quantity {
            value: 32.0,
            at_least: true
        })
    );
    assert_eq!(
        r.memory,
        Some(Quantity {
            value: 256.0,
            at_least: false
        })
    );
    assert_eq!(r.use_spot, Some(true));
    assert_eq!(r.disk_size, Some(1024));
    assert_eq!(r.disk_tier.as_deref(), Some("best"));
    assert_eq!(
        r.ports,
        vec![
            PortRange {
                start: 8080,
                end: 8080
            },
            PortRange {
                start: 9000,
                end: 9010
            }
        ]
    );
    assert_eq!(r.labels.get("team").map(String::as_str), Some("ml"));
    assert_eq!(r.max_hourly_cost, Some(40.0));
    let jr = t.resources.job_recovery.as_ref().unwrap();
    assert_eq!(jr.strategy.as_deref(), Some("FAILOVER"));
    assert_eq!(jr.max_restarts_on_errors, 3);
    assert_eq!(jr.recover_on_exit_codes, vec![33, 34]);
    assert_eq!(
        t.envs,
        vec![
            ("MODEL".into(), Some("gpt2".into())),
            ("STEPS".into(), Some("100".into())),
            ("QUOTED".into(), Some("007".into())),
            ("NEEDED".into(), None),
        ]
    );
    assert_eq!(t.missing_values(), vec!["NEEDED", "HF_TOKEN"]);
    assert_eq!(t.secrets[1].1.as_ref().map(|s| s.expose()), Some(""));
    assert_eq!(t.file_mounts.len(), 3);
    assert_eq!(
        t.file_mounts[0].source,
        MountSource::Uri("s3://bucket/data".into())
    );
    assert_eq!(t.file_mounts[1].source, MountSource::Local("./code".into()));
    assert!(
        matches!(&t.file_mounts[2].source, MountSource::Storage { mode: Some(m), persistent: Some(false), .. } if m == "MOUNT")
    );
    assert_eq!(t.run.as_deref(), Some("torchrun train.py\n"));
    assert_eq!(
        t.config.as_ref().unwrap()["local"]["capacity"]["local-a"],
        2
    );
    let c = t.checkpoint.as_ref().unwrap();
    assert_eq!(
        (c.sync_interval_s, c.signal.as_str(), c.grace_s),
        (300, "SIGUSR1", 90)
    );
    assert_eq!(t.deadline_s, Some(172_800));
}

#[test]
fn accelerator_forms() {
    let one = |y: &str| {
        parse_str(&format!("resources:\n  accelerators: {y}\n"), "t")
            .unwrap()
            .resources
            .base
            .accelerators
    };
    assert_eq!(one("A100"), Some(Accelerators::One(accel("A100", 1.0))));
    assert_eq!(one("K80:0.5"), Some(Accelerators::One(accel("K80", 0.5))));
    assert_eq!(
        one("{H100:8, H200:8}"),
        Some(Accelerators::AnyOf(vec![
            accel("H100", 8.0),
            accel("H200", 8.0)
        ]))
    );
    assert_eq!(
        one("{'A100': 8, 'H100': 8}"),
        Some(Accelerators::AnyOf(vec![
            accel("A100", 8.0),
            accel("H100", 8.0)
        ]))
    );
    assert_eq!(
        one("{A100: 4}"),
        Some(Accelerators::One(accel("A100", 4.0)))
    );
    assert_eq!(
        one("[V100, 'A100:2']"),
        Some(Accelerators::Ordered(vec![
            accel("V100", 1.0),
            accel("A100", 2.0)
        ]))
    );
    let t = parse_str(
        "resources:\n  accelerators:\n    - T4: 1\n    - V100: 2\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        t.resources.base.accelerators,
        Some(Accelerators::Ordered(vec![
            accel("T4", 1.0),
            accel("V100", 2.0)
        ]))
    );
}

#[test]
fn legacy_cloud_fields_wildcards_and_recovery_forms() {
    let t = parse_str(
        "resources:\n  cloud: GCP\n  region: us-central1\n  spot_recovery: EAGER_NEXT_REGION\n",
        "t",
    )
    .unwrap();
    assert_eq!(t.resources.base.infra.cloud.as_deref(), Some("gcp"));
    assert_eq!(
        t.resources.base.infra.region.as_deref(),
        Some("us-central1")
    );
    assert_eq!(
        t.resources.job_recovery.unwrap().strategy.as_deref(),
        Some("EAGER_NEXT_REGION")
    );
    let t = parse_str("resources:\n  infra: '*/us-east-1'\n", "t").unwrap();
    assert_eq!(
        t.resources.base.infra,
        Infra {
            cloud: None,
            region: Some("us-east-1".into()),
            zone: None
        }
    );
    let t = parse_str("resources:\n  memory: 64GB+\n", "t").unwrap();
    assert_eq!(
        t.resources.base.memory,
        Some(Quantity {
            value: 64.0,
            at_least: true
        })
    );
    let t = parse_str("resources:\n  infra: k8s\n", "t").unwrap();
    assert_eq!(t.resources.base.infra.cloud.as_deref(), Some("kubernetes"));
    let t = parse_str(
        "workdir:\n  url: https://github.com/org/repo\n  ref: main\nrun: x\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        t.workdir,
        Some(Workdir::Git {
            url: "https://github.com/org/repo".into(),
            git_ref: Some("main".into())
        })
    );
}

#[test]
fn any_of_and_ordered_items_inherit_outside_fields() {
    let t = parse_str(
        "resources:\n  use_spot: true\n  disk_size: 100\n  any_of:\n    - {accelerators: A100:8, disk_size: 200}\n    - {accelerators: H100:8, use_spot: false}\n",
        "t",
    )
    .unwrap();
    let Choice::AnyOf(items) = &t.resources.choice else {
        panic!("not any_of")
    };
    assert_eq!(items.len(), 2);
    let groups = t.resources.preference_groups();
    assert_eq!(groups.len(), 1, "any_of is one group");
    assert_eq!(groups[0][0].use_spot, Some(true));
    assert_eq!(groups[0][0].disk_size, Some(200));
    assert_eq!(groups[0][1].use_spot, Some(false));
    assert_eq!(groups[0][1].disk_size, Some(100));
    let t = parse_str(
        "resources:\n  ordered:\n    - infra: gcp\n    - infra: aws\n  accelerators: A100:8\n",
        "t",
    )
    .unwrap();
    let groups = t.resources.preference_groups();
    assert_eq!(groups.len(), 2, "ordered is one group per item");
    assert_eq!(groups[1][0].infra.cloud.as_deref(), Some("aws"));
    assert_eq!(
        groups[1][0].accelerators,
        Some(Accelerators::One(accel("A100", 8.0)))
    );
    // A list of accelerators is an order of preference: one group each.
    let t = parse_str(
        "resources:\n  accelerators: [H100:8, A100:8, V100:8]\n",
        "t",
    )
    .unwrap();
    assert_eq!(t.resources.preference_groups().len(), 3);
}

#[test]
fn overrides_and_secrets() {
    let mut t = parse_str("envs:\n  A: null\nsecrets:\n  TOKEN: null\nrun: x\n", "t").unwrap();
    t.set_envs(&[("A".into(), "1".into()), ("B".into(), "2".into())]);
    t.set_secrets(&[("TOKEN".into(), "s3cr3t-value".into())]);
    assert!(t.missing_values().is_empty());
    let debug = format!("{t:?}");
    let json = serde_json::to_string(&t).unwrap();
    assert!(!debug.contains("s3cr3t-value") && !json.contains("s3cr3t-value"));
    assert!(json.contains("<redacted>"));
    assert_eq!(t.secrets[0].1.as_ref().unwrap().expose(), "s3cr3t-value");
}

#[test]
fn deadline_takes_a_duration_or_within_work_and_policy() {
    let t = gangway::spec::parse_str("run: x\ndeadline: 48h\n", "t.yaml").unwrap();
    assert_eq!((t.deadline_s, t.deadline_work_s), (Some(172_800), None));
    let t = gangway::spec::parse_str(
        "run: x\ndeadline: {within: 52h, work: 48h, policy: greedy}\n",
        "t.yaml",
    )
    .unwrap();
    assert_eq!(t.deadline_s, Some(52 * 3600));
    assert_eq!(t.deadline_work_s, Some(48 * 3600));
    assert_eq!(t.deadline_policy.as_deref(), Some("greedy"));
}

/// `gangway launch FILE` parses the file's bytes: text that is not UTF-8 is
/// refused at the first bad byte's line and column, a file over the limit
/// as a whole (the `task` fuzz target starts at `parse_bytes` too).
#[test]
fn bytes_that_are_not_utf8_or_too_many_are_refused() {
    let e = gangway::spec::parse_bytes(b"name: a\nrun: echo \xc3\xa9\xff\n", "t.yaml").unwrap_err();
    assert_eq!((e.line, e.col), (2, 12), "{e}");
    assert!(e.to_string().contains("not valid UTF-8"), "{e}");
    let big = vec![b'#'; gangway::spec::MAX_FILE_BYTES as usize + 1];
    let e = gangway::spec::parse_bytes(&big, "t.yaml").unwrap_err();
    assert!(e.to_string().contains("larger than"), "{e}");
    let t = gangway::spec::parse_bytes(b"run: echo \xc3\xa9\n", "t.yaml").unwrap();
    assert_eq!(t.run.as_deref(), Some("echo é"));
}

/// A ref or URL that begins with `-` would reach git as an option
/// (`--upload-pack=...` ran a command on the node): refused where it
/// stands.
#[test]
fn a_git_ref_or_url_that_looks_like_an_option_is_refused_where_it_stands() {
    let e = parse_str(
        "workdir:\n  url: https://example.com/r.git\n  ref: \"--upload-pack=touch /tmp/pwned\"\nrun: echo\n",
        "t.yaml",
    )
    .unwrap_err();
    assert_eq!(
        (e.line, e.col, e.field.as_str()),
        (3, 8, "workdir.ref"),
        "{e}"
    );
    assert!(e.message.contains("begins with '-'"), "{e}");
    let e = parse_str("workdir: {url: -oProxyCommand=x}\nrun: echo\n", "t.yaml").unwrap_err();
    assert_eq!(e.field, "workdir.url", "{e}");
}

/// A URL's credentials are taken out of it: the task (stored, logged,
/// shown) holds the URL without them, and they travel as a secret.
#[test]
fn a_git_urls_credentials_become_a_secret() {
    let t = parse_str(
        "workdir:\n  url: https://bot:s3cr%40t@github.com/org/repo.git\nrun: echo\n",
        "t.yaml",
    )
    .unwrap();
    assert_eq!(
        t.workdir,
        Some(Workdir::Git {
            url: "https://github.com/org/repo.git".into(),
            git_ref: None
        })
    );
    let (name, value) = t.secrets.last().unwrap();
    assert_eq!(name, "GANGWAY_GIT_CREDENTIALS");
    assert_eq!(value.as_ref().unwrap().expose(), "bot:s3cr@t");
    assert!(!format!("{t:?}").contains("s3cr"), "{t:?}");
    // ssh's user is not a credential.
    let t = parse_str(
        "workdir: {url: \"ssh://git@host/r.git\"}\nrun: echo\n",
        "t.yaml",
    )
    .unwrap();
    assert!(t.secrets.is_empty());
}

#[test]
fn a_file_mount_destination_that_climbs_out_is_refused_at_parse_time() {
    let e = parse_str(
        "file_mounts:\n  /data: ./d\n  ~/../../etc/cron.d/x: ./f\nrun: echo\n",
        "t.yaml",
    )
    .unwrap_err();
    assert_eq!((e.line, e.col), (3, 3), "{e}");
    assert!(e.message.contains("climbs out"), "{e}");
}

/// `--env NAME=...` names follow the YAML's rule (not starting with a
/// digit), as every shell's do.
#[test]
fn env_flag_names_are_checked_like_the_yamls() {
    assert!(gangway::spec::parse_assignment("1X=y").is_err());
    assert!(gangway::spec::parse_assignment("A-B=y").is_err());
    assert_eq!(
        gangway::spec::parse_assignment("X_1=a=b").unwrap(),
        ("X_1".to_string(), "a=b".to_string())
    );
}

/// A managed job keeps its task file for its recoveries: a git URL's
/// credentials are cut out of that copy like `secrets:` values, and come
/// back as the secret they became.
#[test]
fn the_kept_copy_of_a_task_holds_no_git_credentials() {
    let text =
        "workdir:\n  url: https://bot:tok3n@github.com/org/repo.git\n  ref: main\nrun: echo hi\n";
    let copy = gangway::spec::redact_secrets(text, "t.yaml").unwrap();
    assert!(!copy.contains("tok3n"), "{copy}");
    let again = parse_str(&copy, "t.yaml").unwrap();
    assert_eq!(
        again.workdir,
        Some(Workdir::Git {
            url: "https://github.com/org/repo.git".into(),
            git_ref: Some("main".into())
        })
    );
    assert_eq!(again.secrets.len(), 1);
    assert_eq!(again.secrets[0].0, "GANGWAY_GIT_CREDENTIALS");
    assert!(again.secrets[0].1.is_none());
}

/// Every port is a variable of every rank's environment: `1-65535` made
/// one too large to start a process. Refused where it stands.
#[test]
fn ports_are_capped_to_what_an_environment_carries() {
    let e = parse_str(
        "resources:\n  ports: [8080, 1-65535]\nrun: echo\n",
        "t.yaml",
    )
    .unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (2, "resources.ports"), "{e}");
    assert!(e.message.contains("65535 ports"), "{e}");
    assert!(parse_str(
        "resources:\n  ports: [8080, 9000-9998]\nrun: echo\n",
        "t.yaml"
    )
    .is_ok());
}
