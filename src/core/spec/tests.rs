use super::*;

#[test]
fn redacted_task_copies_keep_everything_but_literal_secret_values() {
    let text = "name: t\nsecrets:\n  HF_TOKEN: hf_abc123\n  WANDB: \"w-key 9\"\n  LATER: null\n  BLOCK: |\n    multi\n    line-secret\n# a comment\nrun: echo $HF_TOKEN\nenvs:\n  A: 1\n";
    let out = redact_secrets(text, "t.yaml").unwrap();
    for v in ["hf_abc123", "w-key 9", "line-secret"] {
        assert!(!out.contains(v), "{v} left in:\n{out}");
    }
    let task = parse_str(&out, "t.yaml").unwrap();
    let names: Vec<&str> = task.secrets.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["HF_TOKEN", "WANDB", "LATER", "BLOCK"]);
    assert!(task.secrets.iter().all(|(_, v)| v.is_none()));
    assert_eq!(task.run.as_deref(), Some("echo $HF_TOKEN"));
    assert_eq!(task.name.as_deref(), Some("t"));
    // Flow style and secrets as the last key work too.
    let out = redact_secrets("run: x\nsecrets: {A: s3cr3t, B: two}\n", "t.yaml").unwrap();
    assert!(!out.contains("s3cr3t") && !out.contains("two"), "{out}");
    // Nothing literal: the text is kept byte for byte.
    let plain = "run: x\nsecrets:\n  A: null\n";
    assert_eq!(redact_secrets(plain, "t.yaml").unwrap(), plain);
    // A document whose top level is a flow mapping cannot be cut by lines:
    // refused with what to do, never copied with the value.
    let err = redact_secrets("{run: x, secrets: {A: s3cr3t}}\n", "t.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("--secret"), "{err}");
    assert!(!err.contains("s3cr3t"), "{err}");
}

#[test]
fn secret_files_never_quote_a_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.env");
    std::fs::write(&f, "# keys\nexport A=one\nB='two'\n").unwrap();
    let got = read_secret_file(&f).unwrap();
    assert_eq!(
        got,
        [("A".into(), "one".into()), ("B".into(), "two".into())]
    );
    std::fs::write(&f, "A=one\nnot a line hunter2\n").unwrap();
    let err = read_secret_file(&f).unwrap_err();
    assert!(err.contains(":2:"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}
