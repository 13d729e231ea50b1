//! Bucket `file_mounts` end to end on the local provider, against the S3
//! and GCS emulators behind the request-logging front: every rank sees a
//! COPY and a MOUNT, the bytes move between the nodes' rclone and the store
//! (the front's log says who asked), a missing bucket stops the launch
//! before anything is provisioned, and `down` unmounts without touching
//! the bucket.

use std::process::Output;

use gangway_test::storage::{Store, StoreEmulator, GCS_NO_AUTH_KEY, S3_KEY, S3_REGION};

use crate::common::{assert_no_marker_procs, command_in, parts, Running, TestHome};

/// How a user points gangway at a store other than AWS's or Google's.
#[derive(Clone, Copy, Debug)]
enum Pointed {
    /// gangway's own `GANGWAY_S3_ENDPOINT` / `GANGWAY_GCS_ENDPOINT`.
    Gangway,
    /// The ecosystem's: the AWS SDKs' `AWS_ENDPOINT_URL_S3` (with
    /// `AWS_ENDPOINT_URL` naming another endpoint for everything else),
    /// Google's libraries' `STORAGE_EMULATOR_HOST` (`host:port`, and no
    /// credentials at all).
    Ecosystem,
}

/// The user's credentials for `emu`'s store in `c`'s environment.
fn with_store(c: &mut std::process::Command, emu: &StoreEmulator) {
    with_store_as(c, emu, Pointed::Gangway)
}

fn with_store_as(c: &mut std::process::Command, emu: &StoreEmulator, how: Pointed) {
    // rclone 1.60's S3 client refuses any AWS_CA_BUNDLE; the storage step
    // passes it on as RCLONE_CA_CERT, which a plain-HTTP emulator ignores.
    match (emu.store, how) {
        // STS (for the nodes' session credentials) is the EC2 emulator's
        // moto; S3 is the store emulator.
        (Store::S3, _) => {
            c.envs(
                crate::ec2_emulator::Ec2Emulator::shared()
                    .expect("S3 tests run with the EC2 emulator")
                    .env(),
            )
            .env("AWS_ACCESS_KEY_ID", S3_KEY)
            .env("AWS_SECRET_ACCESS_KEY", S3_KEY)
            .env("AWS_REGION", S3_REGION)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE");
            match how {
                Pointed::Gangway => c.env("GANGWAY_S3_ENDPOINT", &emu.endpoint),
                Pointed::Ecosystem => c
                    .env_remove("GANGWAY_S3_ENDPOINT")
                    .env("AWS_ENDPOINT_URL_S3", &emu.endpoint),
            }
        }
        (Store::Gcs, Pointed::Gangway) => c
            .env("GANGWAY_GCS_ENDPOINT", &emu.endpoint)
            .env("GANGWAY_GCS_STS_ENDPOINT", &emu.endpoint)
            .env("GOOGLE_SERVICE_ACCOUNT_KEY", GCS_NO_AUTH_KEY)
            .env("GOOGLE_CLOUD_PROJECT", "test"),
        (Store::Gcs, Pointed::Ecosystem) => c
            .env_remove("GANGWAY_GCS_ENDPOINT")
            .env_remove("GOOGLE_SERVICE_ACCOUNT_KEY")
            .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
            .env(
                "STORAGE_EMULATOR_HOST",
                emu.endpoint.trim_start_matches("http://"),
            ),
    };
}

/// gangway in `home`, with the user's credentials for `emu`'s store.
fn run(emu: &StoreEmulator, home: &TestHome, args: &[&str]) -> Output {
    run_as(emu, home, args, Pointed::Gangway)
}

fn run_as(emu: &StoreEmulator, home: &TestHome, args: &[&str], how: Pointed) -> Output {
    let mut c = command_in(home.path());
    with_store_as(&mut c, emu, how);
    c.args(args);
    Running::start(c).wait()
}

/// The S3 emulator, when the EC2 emulator (STS, for the nodes' session
/// credentials) is there too.
fn s3() -> Option<&'static StoreEmulator> {
    let emu = StoreEmulator::s3();
    crate::ec2_emulator::Ec2Emulator::shared()?;
    emu
}

fn scheme(emu: &StoreEmulator) -> &'static str {
    match emu.store {
        Store::S3 => "s3",
        Store::Gcs => "gs",
    }
}

/// A COPY and a MOUNT at absolute paths, as a cloud task writes them (on
/// the local provider they are put in place by each node's mount
/// namespace), and a COPY under the home.
fn copy_and_mount_reach_every_rank(emu: &StoreEmulator, how: Pointed) {
    let home = TestHome::new();
    let bucket = format!("gw-{}-data", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "train/a.txt", b"alpha");
    emu.put_object(&bucket, "train/sub/b.txt", b"beta");
    emu.put_object(&bucket, "one.txt", b"single");
    let s = scheme(emu);
    let task = home.file(
        "b.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n  BUCKET: {bucket}\n\
             file_mounts:\n  /data: {s}://$BUCKET/train\n  ~/one.txt: {s}://{bucket}/one.txt\n  /ckpt/m:\n    source: {s}://{bucket}/train\n    mode: MOUNT\n\
             run: |\n  echo \"rank-$NODE_RANK copy=$(cat /data/a.txt)/$(cat /data/sub/b.txt) one=$(cat ~/one.txt) mount=$(cat /ckpt/m/sub/b.txt)\"\n  echo from-rank-$NODE_RANK > /ckpt/m/out-$NODE_RANK.txt\n",
            m = home.marker
        ),
    );
    let before = emu.last_request_id();
    let (code, out, err) = parts(&run_as(
        emu,
        &home,
        &["launch", &task, "-c", "bk", "-y"],
        how,
    ));
    assert_eq!(code, 0, "{how:?}: stdout:\n{out}\nstderr:\n{err}");
    for rank in 0..2 {
        let want = format!("rank-{rank} copy=alpha/beta one=single mount=beta");
        assert!(out.contains(&want), "{want} missing:\n{out}\n{err}");
    }
    // What the ranks wrote through the mount is in the bucket.
    let keys: Vec<String> = emu
        .list(&bucket, "train/")
        .into_iter()
        .map(|l| l.key)
        .collect();
    for rank in 0..2 {
        assert!(
            keys.contains(&format!("train/out-{rank}.txt")),
            "rank {rank}'s write through the mount: {keys:?}"
        );
    }
    // gangway itself (object_store) only looked: no object's bytes came to
    // or from this machine's gangway process; rclone moved them.
    // This test's bucket only: other tests share the emulator.
    let log: Vec<_> = emu
        .requests_since(before)
        .into_iter()
        .filter(|r| unescaped(&r.path).contains(&bucket))
        .collect();
    let ours: Vec<_> = log
        .iter()
        .filter(|r| {
            r.user_agent
                .as_deref()
                .is_some_and(|u| u.starts_with("object_store"))
        })
        .collect();
    assert!(!ours.is_empty(), "the preflight asked the store: {log:?}");
    for r in &ours {
        assert!(
            r.bytes_out == 0 || r.path.contains("list-type") || r.path.contains("prefix="),
            "gangway's own process read an object: {r:?}"
        );
        assert!(
            r.bytes_in == 0,
            "gangway's own process wrote to the store: {r:?}"
        );
    }
    assert!(
        log.iter().any(|r| r
            .user_agent
            .as_deref()
            .is_some_and(|u| u.starts_with("rclone"))
            && r.bytes_out > 0),
        "rclone on the nodes downloaded: {log:?}"
    );

    let (code, out, err) = parts(&run_as(emu, &home, &["down", "-y", "bk"], how));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // The mount was taken down before the node's directory: the bucket
    // keeps every object.
    let after: Vec<String> = emu.list(&bucket, "").into_iter().map(|l| l.key).collect();
    for k in [
        "train/a.txt",
        "train/sub/b.txt",
        "one.txt",
        "train/out-0.txt",
    ] {
        assert!(
            after.iter().any(|a| a == k),
            "{k} gone after down: {after:?}"
        );
    }
    assert_no_marker_procs(&home.marker, "down of a cluster with bucket mounts");
}

fn a_missing_bucket_stops_the_launch_before_provisioning(emu: &StoreEmulator) {
    let home = TestHome::new();
    let s = scheme(emu);
    let task = home.file(
        "missing.yaml",
        &format!(
            "resources:\n  infra: local\nfile_mounts:\n  /data: {s}://gw-no-such-bucket-{}/x\nrun: echo never\n",
            home.marker.to_ascii_lowercase()
        ),
    );
    let err = refused_before_provisioning(emu, &home, &task, "nb");
    assert!(
        err.contains("gw-no-such-bucket") && err.contains("does not exist"),
        "names the bucket and the reason: {err}"
    );
}

/// Launches `task` (its `/data` mount on line 4, its run `echo never`) as
/// `cluster`: exit 2 naming the file, line and field, nothing provisioned,
/// nothing run. Returns stderr.
fn refused_before_provisioning(
    emu: &StoreEmulator,
    home: &TestHome,
    task: &str,
    cluster: &str,
) -> String {
    let (code, out, err) = parts(&run(emu, home, &["launch", task, "-c", cluster, "-y"]));
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    let file = std::path::Path::new(task)
        .file_name()
        .unwrap()
        .to_string_lossy();
    assert!(
        err.contains(&format!("{file}:4:")) && err.contains("file_mounts./data"),
        "names the file, line and field: {err}"
    );
    assert!(
        home.cluster_opt(cluster).is_none(),
        "nothing was provisioned"
    );
    assert!(!out.contains("never"));
    err
}

/// A task whose one bucket the store refuses (injected by the front for
/// this bucket only), launched: exit 2 before anything is provisioned, the
/// file, line and field, and the store's own words.
fn refused_bucket_launch(emu: &StoreEmulator, rule: serde_json::Value) -> String {
    let home = TestHome::new();
    let bucket = format!("gw-{}-refused", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    let s = scheme(emu);
    let task = home.file(
        "refused.yaml",
        &format!(
            "resources:\n  infra: local\nfile_mounts:\n  /data: {s}://{bucket}\nrun: echo never\n"
        ),
    );
    let mut rule = rule;
    // The marker, not the bucket: object_store's GCS client escapes the
    // bucket's dashes in the path (`gw%2D...`).
    rule["path_contains"] = serde_json::json!([home.marker.to_ascii_lowercase()]);
    rule["times"] = serde_json::json!(-1);
    let id = emu.fault(&rule);
    let err = refused_before_provisioning(emu, &home, &task, "rf");
    let fired = emu.fired(id);
    emu.remove_fault(id);
    assert!(fired > 0, "the store was asked");
    assert!(err.contains(&bucket), "names the bucket: {err}");
    err
}

fn access_denied_is_exit_2_with_the_stores_reason(emu: &StoreEmulator) {
    let err = refused_bucket_launch(
        emu,
        serde_json::json!({"action": "status", "status": 403,
                           "message": "the bucket policy says no to gw-test"}),
    );
    assert!(
        err.contains("access denied") && err.contains("the bucket policy says no to gw-test"),
        "the reason the store gave: {err}"
    );
    let permission = match emu.store {
        Store::S3 => "s3:ListBucket",
        Store::Gcs => "storage.objects.list",
    };
    assert!(err.contains(permission), "the hint: {err}");
}

#[test]
fn an_s3_bucket_that_refuses_is_exit_2_with_the_stores_reason() {
    let Some(emu) = s3() else {
        return;
    };
    access_denied_is_exit_2_with_the_stores_reason(emu);
}

#[test]
fn a_gcs_bucket_that_refuses_is_exit_2_with_the_stores_reason() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    access_denied_is_exit_2_with_the_stores_reason(emu);
}

/// S3 answers a request signed for the wrong region with a redirect that
/// names the bucket's region (`x-amz-bucket-region`, as real S3 does):
/// gangway says where the bucket is and what to set.
#[test]
fn an_s3_bucket_in_another_region_is_exit_2_naming_its_region() {
    let Some(emu) = s3() else {
        return;
    };
    assert_ne!(S3_REGION, "ap-south-1");
    let err = refused_bucket_launch(
        emu,
        serde_json::json!({"action": "status", "status": 301, "code": "PermanentRedirect",
                           "message": "The bucket you are attempting to access must be addressed using the specified endpoint.",
                           "headers": {"x-amz-bucket-region": "ap-south-1"}}),
    );
    assert!(
        err.contains(&format!(
            "the bucket is in ap-south-1, and requests were signed for {S3_REGION}"
        )),
        "says where the bucket is: {err}"
    );
    assert!(err.contains("AWS_REGION=ap-south-1"), "the hint: {err}");
}

#[test]
fn s3_copy_and_mount_reach_every_rank_and_down_keeps_the_bucket() {
    let Some(emu) = s3() else {
        return;
    };
    copy_and_mount_reach_every_rank(emu, Pointed::Gangway);
}

#[test]
fn gcs_copy_and_mount_reach_every_rank_and_down_keeps_the_bucket() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    copy_and_mount_reach_every_rank(emu, Pointed::Gangway);
}

/// An S3-compatible store named as the AWS SDKs and CLI read it
/// (`AWS_ENDPOINT_URL_S3`, plain http, while `AWS_ENDPOINT_URL` names
/// another endpoint): gangway and the nodes' rclone use it.
#[test]
fn an_s3_store_named_by_aws_endpoint_url_s3_is_used_by_gangway_and_the_nodes() {
    let Some(emu) = s3() else {
        return;
    };
    copy_and_mount_reach_every_rank(emu, Pointed::Ecosystem);
}

/// A GCS emulator named as Google's client libraries read it
/// (`STORAGE_EMULATOR_HOST=host:port`, no credentials anywhere).
#[test]
fn a_gcs_emulator_named_by_storage_emulator_host_is_used_without_credentials() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    copy_and_mount_reach_every_rank(emu, Pointed::Ecosystem);
}

/// The nodes' S3 credentials reach only the bucket and prefix they are
/// for: a federation session whose policy names nothing else, instead of a
/// session with all of the user's permissions. (moto does not enforce
/// session policies: what is checked is the policy gangway asks STS for,
/// parsed as IAM reads it.)
#[test]
fn a_nodes_s3_credentials_reach_only_their_bucket_and_prefix() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-scoped", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "data/x.txt", b"v1");
    let task = home.file(
        "scoped.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             file_mounts:\n  ~/d: s3://{bucket}/data\nrun: cat ~/d/x.txt\n",
            m = home.marker
        ),
    );
    let (code, out, err) = parts(&run(
        emu,
        &home,
        &["launch", &task, "-c", "scoped", "-y", "--down"],
    ));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("v1"), "{out}");
    let ec2 = crate::ec2_emulator::Ec2Emulator::shared().unwrap();
    let mine: Vec<serde_json::Value> = ec2
        .sts_policies(gangway_test::storage::S3_KEY)
        .iter()
        .filter(|p| p.contains(&bucket))
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert!(!mine.is_empty(), "no federation session for {bucket}");
    for p in &mine {
        assert_reaches_only_data_of(p, &bucket);
    }
}

/// A configured `aws.node_role` is what nodes' S3 sessions come from:
/// `AssumeRole` of that role with the same session policy (one bucket and
/// prefix), and no federation session; a value that is no role's ARN
/// fails the launch naming the key and the file. (moto does not enforce
/// the policy; the request is what is checked.)
#[test]
fn a_configured_node_role_is_assumed_with_the_bucket_and_prefix_policy() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-role", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "data/x.txt", b"v1");
    let role = format!(
        "arn:aws:iam::123456789012:role/gw-{}-nodes",
        home.marker.to_ascii_lowercase()
    );
    std::fs::write(
        home.path().join("config.yaml"),
        format!("aws:\n  node_role: {role}\n"),
    )
    .unwrap();
    let task = home.file(
        "role.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             file_mounts:\n  ~/d: s3://{bucket}/data\nrun: cat ~/d/x.txt\n",
            m = home.marker
        ),
    );
    let ec2 = crate::ec2_emulator::Ec2Emulator::shared().unwrap();
    let (code, out, err) = parts(&run(
        emu,
        &home,
        &["launch", &task, "-c", "role", "-y", "--down"],
    ));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("v1"), "{out}");
    let mine: Vec<serde_json::Value> = ec2
        .assumed_roles(gangway_test::storage::S3_KEY)
        .into_iter()
        .filter(|a| a["role_arn"] == role)
        .collect();
    assert!(!mine.is_empty(), "{role} was not assumed");
    for a in &mine {
        assert_eq!(a["session_name"], "gangway-node", "{a}");
        let p: serde_json::Value = serde_json::from_str(a["policy"].as_str().unwrap()).unwrap();
        assert_reaches_only_data_of(&p, &bucket);
    }
    assert!(
        !ec2.sts_policies(gangway_test::storage::S3_KEY)
            .iter()
            .any(|p| p.contains(&bucket)),
        "no federation session besides the role's"
    );
    std::fs::write(
        home.path().join("config.yaml"),
        "aws:\n  node_role: admin\n",
    )
    .unwrap();
    let (code, out, err) = parts(&run(
        emu,
        &home,
        &["launch", &task, "-c", "role2", "-y", "--down"],
    ));
    assert_ne!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("aws.node_role") && err.contains("config.yaml"),
        "{err}"
    );
}

/// `p`, a session policy, allows S3 actions on `bucket`'s `data` prefix
/// (and listing it) and nothing else.
fn assert_reaches_only_data_of(p: &serde_json::Value, bucket: &str) {
    {
        let mut resources = Vec::new();
        for st in p["Statement"].as_array().unwrap() {
            assert_eq!(st["Effect"], "Allow", "{p}");
            for a in st["Action"].as_array().unwrap() {
                assert!(a.as_str().unwrap().starts_with("s3:"), "{p}");
                assert_ne!(a, "s3:*", "{p}");
            }
            match &st["Resource"] {
                serde_json::Value::String(r) => resources.push(r.clone()),
                serde_json::Value::Array(l) => {
                    resources.extend(l.iter().map(|r| r.as_str().unwrap().to_string()))
                }
                other => panic!("{other}"),
            }
            if st["Action"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "s3:ListBucket")
            {
                assert_eq!(
                    st["Condition"]["StringLike"]["s3:prefix"],
                    serde_json::json!(["data", "data/*"]),
                    "{p}"
                );
            }
        }
        let arn = format!("arn:aws:s3:::{bucket}");
        for r in &resources {
            assert!(
                r == &arn || r == &format!("{arn}/data") || r == &format!("{arn}/data/*"),
                "{r} reaches past s3://{bucket}/data: {p}"
            );
        }
    }
}

/// A MOUNT outlives the storage step, so its credentials are renewed while
/// the run goes on: the files its rclone rereads (0600, in a 0700
/// directory) are rewritten with a fresh STS session every renewal, the
/// mount picks them up when the ones it holds expire, and reads never stop.
#[test]
fn a_mounts_s3_credentials_are_renewed_while_the_run_goes_on() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-renew", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "x.txt", b"v1");
    let task = home.file(
        "renew.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             file_mounts:\n  ~/m:\n    source: s3://{bucket}\n    mode: MOUNT\n\
             run: |\n  d=$(ls -d ~/.gangway/creds/*)\n  echo \"modes=$(stat -c %a \"$d\") $(stat -c %a \"$d\"/* | sort -u | tr '\\n' ' ')\"\n\
             \x20 for i in $(seq 1 24); do echo \"read-$i=$(cat ~/m/x.txt)\"; sleep 1; done\n",
            m = home.marker
        ),
    );
    let before = emu.last_request_id();
    let mut c = command_in(home.path());
    with_store(&mut c, emu);
    c.env("GANGWAY_CREDENTIAL_RENEW_SECONDS", "2")
        .args(["launch", &task, "-c", "rn", "-y"]);
    let (code, out, err) = parts(&Running::start(c).wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("modes=700 600 "), "{out}");
    for i in 1..=24 {
        assert!(out.contains(&format!("read-{i}=v1")), "read {i}:\n{out}");
    }
    assert!(
        out.contains("renewed the bucket mounts' credentials on 1 node(s)"),
        "{out}"
    );
    let keys: std::collections::BTreeSet<String> = emu
        .requests_since(before)
        .into_iter()
        .filter(|r| {
            r.method == "GET"
                && r.path.contains("x.txt")
                && r.user_agent
                    .as_deref()
                    .is_some_and(|u| u.starts_with("rclone"))
        })
        .filter_map(|r| r.key_id)
        .collect();
    assert!(
        keys.len() >= 2,
        "the mount read with renewed keys, not only its first ones: {keys:?}"
    );
    assert!(
        !keys.contains(S3_KEY),
        "the user's own keys never reach a node: {keys:?}"
    );
    let (code, out, err) = parts(&run(emu, &home, &["down", "-y", "rn"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_no_marker_procs(&home.marker, "down of a cluster with a renewed mount");
}

/// The same for a GCS MOUNT, with a real token: a service-account key
/// (an RSA key made here) signs a fresh bearer for every renewal; the
/// token file the mount rereads (0600) carries it and its expiry, the
/// mount takes each renewed one when the one it holds runs out, and reads
/// never stop. (The other GCS tests use a key that signs nothing: no
/// token, nothing to renew.)
/// A node's GCS token is the user's narrowed to the task's bucket and
/// prefix (issue 32): gangway exchanges it at STS (the GCS front's
/// emulation, which enforces the boundary on every request) for one whose
/// Credential Access Boundary is objectAdmin on `B/x/...` and listings of
/// `x/`; with it the node's own rclone reads and writes under the prefix
/// and is refused (403) elsewhere in the bucket and in another bucket of
/// the user's. The user's token never reaches the node. (Main before this
/// handed nodes the user's token itself.)
#[test]
fn a_nodes_gcs_token_reaches_only_its_bucket_and_prefix() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    let home = TestHome::new();
    let key = service_account_key();
    let m = home.marker.to_ascii_lowercase();
    let (bucket, other) = (format!("gw-{m}-scoped"), format!("gw-{m}-other"));
    emu.create_bucket(&bucket);
    emu.create_bucket(&other);
    emu.put_object(&bucket, "x/a.txt", b"inside");
    emu.put_object(&bucket, "y/secret.txt", b"sibling");
    emu.put_object(&other, "secret.txt", b"elsewhere");
    let task = home.file(
        "scoped.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {marker}\n\
             file_mounts:\n  ~/m:\n    source: gs://{bucket}/x\n    mode: MOUNT\n\
             run: |\n  c=$(ls ~/.gangway/creds/*/*.conf | head -1)\n\
             \x20 echo \"mounted=$(cat ~/m/a.txt)\"\n\
             \x20 echo \"prefix=$(rclone --config \"$c\" cat gw0:{bucket}/x/a.txt 2>&1)\"\n\
             \x20 echo w | rclone --config \"$c\" rcat gw0:{bucket}/x/new.txt && echo wrote-inside\n\
             \x20 rclone --config \"$c\" cat gw0:{bucket}/y/secret.txt >/dev/null 2>&1 || echo sibling-refused\n\
             \x20 rclone --config \"$c\" cat gw0:{other}/secret.txt >/dev/null 2>&1 || echo other-bucket-refused\n\
             \x20 echo w | rclone --config \"$c\" rcat gw0:{bucket}/y/planted.txt 2>/dev/null || echo write-outside-refused\n",
            marker = home.marker
        ),
    );
    let mut c = command_in(home.path());
    with_store(&mut c, emu);
    c.env("GOOGLE_SERVICE_ACCOUNT_KEY", &key)
        .args(["launch", &task, "-c", "sc", "-y", "--down"]);
    let (code, out, err) = parts(&Running::start(c).wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for said in [
        "mounted=inside",
        "prefix=inside",
        "wrote-inside",
        "sibling-refused",
        "other-bucket-refused",
        "write-outside-refused",
    ] {
        assert!(out.contains(said), "{said}:\n{out}");
    }
    assert_eq!(
        emu.get_object(&bucket, "x/new.txt").as_deref(),
        Some(&b"w\n"[..])
    );
    assert_eq!(emu.get_object(&bucket, "y/planted.txt"), None);
    // What gangway asked STS for: this bucket, this prefix, objects only.
    let asked: Vec<serde_json::Value> = emu
        .token_exchanges()
        .into_iter()
        .filter(|x| x["boundary"].to_string().contains(&bucket))
        .collect();
    assert!(!asked.is_empty(), "no token exchange for {bucket}");
    for x in &asked {
        let rules = x["boundary"]["accessBoundaryRules"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{x}");
        assert_eq!(
            rules[0]["availableResource"],
            format!("//storage.googleapis.com/projects/_/buckets/{bucket}"),
            "{x}"
        );
        assert_eq!(
            rules[0]["availablePermissions"],
            serde_json::json!(["inRole:roles/storage.objectAdmin"]),
            "{x}"
        );
        let e = rules[0]["availabilityCondition"]["expression"].to_string();
        assert!(e.contains(&format!("buckets/{bucket}/objects/x/")), "{e}");
    }
}

/// A service account key whose tokens the GCS front sees (object_store
/// signs a JWT with it): a user's credentials that carry a token.
fn service_account_key() -> String {
    let pem = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl genpkey");
    assert!(pem.status.success(), "openssl: {pem:?}");
    serde_json::json!({
        "type": "service_account",
        "client_email": "gw-renew@test.iam.gserviceaccount.com",
        "private_key_id": "k1",
        "private_key": String::from_utf8(pem.stdout).unwrap(),
    })
    .to_string()
}

#[test]
fn a_mounts_gcs_token_is_renewed_while_the_run_goes_on() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    let home = TestHome::new();
    let key = service_account_key();
    let bucket = format!("gw-{}-renew", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "x.txt", b"v1");
    let task = home.file(
        "renew.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             file_mounts:\n  ~/m:\n    source: gs://{bucket}\n    mode: MOUNT\n\
             run: |\n  d=$(ls -d ~/.gangway/creds/*)\n  echo \"modes=$(stat -c %a \"$d\") $(stat -c %a \"$d\"/* | sort -u | tr '\\n' ' ')\"\n\
             \x20 grep -c '\"expiry\"' \"$d\"/*.conf | sed 's/^/expiry-lines=/'\n\
             \x20 for i in $(seq 1 24); do echo \"read-$i=$(cat ~/m/x.txt)\"; sleep 1; done\n",
            m = home.marker
        ),
    );
    let before = emu.last_request_id();
    let mut c = command_in(home.path());
    with_store(&mut c, emu);
    c.env("GOOGLE_SERVICE_ACCOUNT_KEY", &key)
        .env("GANGWAY_CREDENTIAL_RENEW_SECONDS", "2")
        .args(["launch", &task, "-c", "rn", "-y"]);
    let (code, out, err) = parts(&Running::start(c).wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("modes=700 600 "), "{out}");
    assert!(
        out.contains("expiry-lines=1"),
        "the token file says when it ends: {out}"
    );
    for i in 1..=24 {
        assert!(out.contains(&format!("read-{i}=v1")), "read {i}:\n{out}");
    }
    assert!(
        out.contains("renewed the bucket mounts' credentials on 1 node(s)"),
        "{out}"
    );
    let reads: Vec<_> = emu
        .requests_since(before)
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.contains("x.txt"))
        .collect();
    let bearers: std::collections::BTreeSet<String> =
        reads.iter().filter_map(|r| r.key_id.clone()).collect();
    assert!(
        bearers.iter().all(|b| b.starts_with("bearer-sha256:")),
        "every read carried a token: {bearers:?}"
    );
    assert!(
        reads.iter().all(|r| r.key_id.is_some()),
        "no read went without a token: {} reads",
        reads.len()
    );
    assert!(
        bearers.len() >= 2,
        "the mount read with renewed tokens, not only its first: {bearers:?}"
    );
    assert!(
        !err.contains("PRIVATE KEY") && !out.contains("PRIVATE KEY"),
        "the key is never printed"
    );
    let (code, out, err) = parts(&run(emu, &home, &["down", "-y", "rn"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_no_marker_procs(&home.marker, "down of a cluster with a renewed GCS mount");
}

#[test]
fn a_missing_s3_bucket_is_exit_2_naming_the_line_before_anything_starts() {
    let Some(emu) = s3() else {
        return;
    };
    a_missing_bucket_stops_the_launch_before_provisioning(emu);
}

#[test]
fn a_missing_gcs_bucket_is_exit_2_naming_the_line_before_anything_starts() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    a_missing_bucket_stops_the_launch_before_provisioning(emu);
}

/// `{name: ..., source: ./dir}` mounts: the bucket is made when missing,
/// filled from the local source (changed files only, on every launch or
/// exec), seen by every rank, and deleted at `down` unless persistent;
/// a persistent one (SkyPilot's default) stays with what the ranks wrote.
fn named_buckets_are_made_filled_and_deleted_unless_persistent(emu: &StoreEmulator) {
    let home = TestHome::new();
    let m = home.marker.to_ascii_lowercase();
    let (tmp, keep) = (format!("gw-{m}-tmp"), format!("gw-{m}-keep"));
    let src = home.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), "alpha").unwrap();
    std::fs::write(src.join("sub/b.txt"), "beta").unwrap();
    let store = match emu.store {
        Store::S3 => "s3",
        Store::Gcs => "gcs",
    };
    let task = home.file(
        "named.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {mk}\n  STORE: {store}\n\
             file_mounts:\n  ~/src:\n    name: {tmp}\n    source: {src}\n    store: $STORE\n    mode: COPY\n    persistent: false\n\
             \x20 ~/keep:\n    name: {keep}\n    store: {store}\n    mode: MOUNT\n\
             run: |\n  echo \"rank-$NODE_RANK src=$(cat ~/src/a.txt)/$(cat ~/src/sub/b.txt)\"\n  echo x > ~/keep/from-$NODE_RANK\n",
            mk = home.marker,
            src = src.display()
        ),
    );
    assert!(!emu.bucket_exists(&tmp) && !emu.bucket_exists(&keep));
    let (code, out, err) = parts(&run(emu, &home, &["launch", &task, "-c", "nb", "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for rank in 0..2 {
        let want = format!("rank-{rank} src=alpha/beta");
        assert!(out.contains(&want), "{want} missing:\n{out}\n{err}");
    }
    assert!(
        err.contains(&format!("Created bucket {}://{tmp}", scheme(emu))),
        "{err}"
    );
    assert!(err.contains("2 file(s)"), "{err}");
    let keys = |b: &str| -> Vec<String> { emu.list(b, "").into_iter().map(|l| l.key).collect() };
    assert_eq!(keys(&tmp), ["a.txt", "sub/b.txt"]);
    // Again on the same cluster: nothing changed, nothing is sent; then
    // one file changes and only it is.
    let (code, _, err) = parts(&run(emu, &home, &["exec", "nb", &task]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("0 file(s), 0 byte(s); 2 unchanged"), "{err}");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(src.join("a.txt"), "alpha-2").unwrap();
    let (code, out, err) = parts(&run(emu, &home, &["exec", "nb", &task]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 file(s), 7 byte(s); 1 unchanged"), "{err}");
    assert!(out.contains("rank-1 src=alpha-2/beta"), "{out}");

    let (code, out, err) = parts(&run(emu, &home, &["down", "-y", "nb"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        !emu.bucket_exists(&tmp),
        "persistent: false was deleted at down"
    );
    assert!(emu.bucket_exists(&keep), "a persistent bucket stays");
    let kept = keys(&keep);
    assert!(
        kept.contains(&"from-0".to_string()) && kept.contains(&"from-1".to_string()),
        "{kept:?}"
    );
    assert_no_marker_procs(&home.marker, "down of a cluster with named buckets");
}

#[test]
fn s3_named_buckets_are_made_filled_and_deleted_at_down_unless_persistent() {
    let Some(emu) = s3() else {
        return;
    };
    named_buckets_are_made_filled_and_deleted_unless_persistent(emu);
}

#[test]
fn gcs_named_buckets_are_made_filled_and_deleted_at_down_unless_persistent() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    named_buckets_are_made_filled_and_deleted_unless_persistent(emu);
}

/// The shipped spot trainer with its checkpoints in a bucket: three
/// preemptions (one without notice), every recovery resumes from the
/// bucket with the exact step count, and the checkpoint's bytes only ever
/// moved between the nodes' rclone and the store.
fn a_managed_job_resumes_from_its_bucket_checkpoint(emu: &StoreEmulator) {
    let home = TestHome::new();
    let bucket = format!("gw-{}-ck", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    let s = scheme(emu);
    let text = std::fs::read_to_string(crate::jobs::spot_train(&home)).unwrap();
    assert!(
        text.contains("\ncheckpoint:\n"),
        "the example has a checkpoint block"
    );
    let text = text.replace(
        "\ncheckpoint:\n",
        &format!("\ncheckpoint:\n  storage: {s}://{bucket}/spot-train\n  keep: 2\n"),
    );
    // Restoring from a bucket takes the storage step a second or two of
    // rclone: the local cloud reclaims later and the steps are slower, so
    // the reclaims still fall in the runs (three preempted runs, a fourth
    // that finishes), not in their storage steps.
    // A notice of 5 s, not 2 (clouds give 30 to 120): the upload on
    // notice is rclone's whole round on a loaded 2-core machine.
    assert!(text.contains("after_s: 3") && text.contains("notice_s: 2"));
    assert!(text.contains("STEP_SECONDS: 0.1"));
    let text = text
        .replace("after_s: 3", "after_s: 8")
        .replace("notice_s: 2", "notice_s: 5")
        .replace("STEP_SECONDS: 0.1", "STEP_SECONDS: 0.3");
    let task = home.file("spot-train-bucket.yaml", &text);
    let before = emu.last_request_id();
    let (code, out, err) = parts(&run(
        emu,
        &home,
        &["jobs", "launch", &task, "-y", "--env", &home.marker_env()],
    ));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let job = crate::jobs::managed(&home, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["preemptions"], 3, "{job}");
    crate::jobs::check_training(&home, 1);
    // Nothing of the checkpoint was kept on this machine.
    assert!(
        !home.path().join("jobs/managed-1/checkpoint").exists(),
        "a checkpoint copy on the laptop"
    );
    // Complete checkpoints are in the bucket, pruned to the newest two.
    let keys: Vec<String> = emu
        .list(&bucket, "spot-train/")
        .into_iter()
        .map(|l| l.key)
        .collect();
    let complete: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with("spot-train/manifests/") && k.ends_with(".json"))
        .collect();
    assert_eq!(
        complete.len(),
        2,
        "keep: 2 of the complete checkpoints: {keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.starts_with("spot-train/gen-")),
        "{keys:?}"
    );
    // gangway's own process wrote manifests and listed; the checkpoint's
    // files went up and came down through rclone only.
    let log: Vec<_> = emu
        .requests_since(before)
        .into_iter()
        .filter(|r| unescaped(&r.path).contains(&bucket))
        .collect();
    for r in &log {
        let ours = r
            .user_agent
            .as_deref()
            .is_some_and(|u| u.starts_with("object_store"));
        if ours && unescaped(&r.path).contains("/gen-") {
            assert!(
                r.method == "DELETE"
                    || r.method == "POST"
                    || (r.bytes_in == 0 && r.bytes_out < 4096),
                "gangway's own process moved checkpoint bytes: {r:?}"
            );
        }
    }
    let uploads = log
        .iter()
        .filter(|r| {
            r.user_agent
                .as_deref()
                .is_some_and(|u| u.starts_with("rclone"))
                && r.bytes_in > 0
                && unescaped(&r.path).contains("/gen-")
        })
        .count();
    assert!(uploads > 0, "the nodes uploaded the checkpoint: {log:?}");
    // A generation's prefix is new: no object is looked up before it is
    // written (rclone's per-file destination check would double the
    // requests of a checkpoint of many small files).
    for (i, put) in log.iter().enumerate().filter(|(_, r)| r.method == "PUT") {
        let key = unescaped(put.path.split('?').next().unwrap_or(""));
        if !key.contains("/gen-") {
            continue;
        }
        assert!(
            !log[..i]
                .iter()
                .any(|r| r.method == "HEAD"
                    && unescaped(r.path.split('?').next().unwrap_or("")) == key),
            "{key} was looked up before its upload"
        );
    }
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

#[test]
fn a_managed_job_resumes_from_its_s3_checkpoint_with_the_exact_step_count() {
    let Some(emu) = s3() else {
        return;
    };
    a_managed_job_resumes_from_its_bucket_checkpoint(emu);
}

#[test]
fn a_managed_job_resumes_from_its_gcs_checkpoint_with_the_exact_step_count() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    a_managed_job_resumes_from_its_bucket_checkpoint(emu);
}

/// A logged path with the escapes object_store and rclone use undone.
fn unescaped(path: &str) -> String {
    path.replace("%2F", "/")
        .replace("%2f", "/")
        .replace("%2D", "-")
        .replace("%2d", "-")
}

/// The complete generations under `prefix` (their `manifests/<G>.json`).
fn complete_generations(emu: &StoreEmulator, bucket: &str, prefix: &str) -> Vec<u64> {
    let mut g: Vec<u64> = emu
        .list(bucket, &format!("{prefix}/manifests/"))
        .into_iter()
        .filter_map(|l| {
            l.key
                .strip_prefix(&format!("{prefix}/manifests/"))?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect();
    g.sort_unstable();
    g
}

/// Uploads cut off by the network never become a checkpoint: while every
/// checkpoint upload is dropped, no generation completes and no rank
/// writes its manifest; the recovery after a preemption restores the last
/// complete checkpoint, to the step.
#[test]
fn a_killed_checkpoint_upload_never_becomes_the_checkpoint_that_is_restored() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-kill", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    let task = home.file(
        "kill.yaml",
        &format!(
            "resources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {m}\n\
             checkpoint:\n  storage: s3://{bucket}/k\n  sync_interval: 1\n\
             config:\n  local:\n    preemptions:\n      - {{after_s: 14}}\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  step=0\n  [ -f \"$ck\" ] && step=$(cat \"$ck\")\n\
             \x20 echo \"resuming at step $step\"\n\
             \x20 while [ $step -lt 100 ]; do step=$((step+1)); echo $step > \"$ck\"; sleep 0.2; done\n\
             \x20 echo done-at-$step\n",
            m = home.marker
        ),
    );
    let (code, out, err) = parts(&run(emu, &home, &["jobs", "launch", &task, "-d"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    crate::common::wait_for(
        "a first complete checkpoint",
        crate::common::DEADLINE,
        || match complete_generations(emu, &bucket, "k").len() {
            0 => Err("none yet".to_string()),
            _ => Ok(()),
        },
    );
    // From now on every checkpoint file upload is cut off before its body.
    let rule = emu.fault(&serde_json::json!({
        "method": "PUT", "path_contains": [bucket.as_str(), "/gen-"],
        "action": "drop", "after_bytes": 0, "times": -1,
    }));
    // A sync already past its uploads when the rule came may still
    // complete: the kept generation is the last one once a sync that began
    // after the rule has been cut off (fired) and, after it, another
    // (fired again) without a new generation completing in between.
    let fired_more_than = |n: u64| {
        crate::common::wait_for(
            "a checkpoint upload cut off",
            crate::common::DEADLINE,
            || match emu.fired(rule) {
                f if f > n => Ok(f),
                f => Err(format!("{f} cut off")),
            },
        )
    };
    let mut fired = fired_more_than(0);
    let kept = crate::common::wait_for(
        "the last complete generation to settle",
        crate::common::DEADLINE,
        || {
            let before = complete_generations(emu, &bucket, "k");
            fired = fired_more_than(fired);
            let after = complete_generations(emu, &bucket, "k");
            if before == after {
                Ok(*after.last().unwrap())
            } else {
                Err(format!("{before:?} became {after:?}"))
            }
        },
    );
    let key = {
        let manifest = emu
            .get_object(&bucket, &format!("k/manifests/{kept}/rank-0.tsv"))
            .expect("the kept generation's manifest");
        let text = String::from_utf8(manifest).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("step\t"))
            .expect("step in the manifest");
        line.split('\t').nth(3).unwrap().to_string()
    };
    let kept_step: u32 = String::from_utf8(emu.get_object(&bucket, &format!("k/{key}")).unwrap())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The preemption (no notice) comes; the recovery starts from `kept`.
    let log = || parts(&home.run(["jobs", "logs", "1"])).1;
    crate::common::wait_for("the recovered run", crate::common::DEADLINE, || {
        let l = log();
        if l.matches("resuming at step").count() >= 2 {
            Ok(())
        } else {
            Err(l)
        }
    });
    assert!(emu.fired(rule) > 0, "the fault cut uploads off");
    assert_eq!(
        *complete_generations(emu, &bucket, "k").last().unwrap(),
        kept,
        "a generation completed while every upload was cut off"
    );
    // The cut-off generations wrote no manifest either.
    let rank_manifests: Vec<String> = emu
        .list(&bucket, "k/manifests/")
        .into_iter()
        .map(|l| l.key)
        .filter(|k| k.ends_with("/rank-0.tsv"))
        .collect();
    for m in &rank_manifests {
        let g: u64 = m.split('/').nth(2).unwrap().parse().unwrap();
        assert!(g <= kept, "a rank manifest of a cut-off generation: {m}");
    }
    let l = log();
    let resumed: Vec<u32> = l
        .lines()
        .filter_map(|x| x.split("resuming at step ").nth(1)?.trim().parse().ok())
        .collect();
    assert_eq!(
        resumed[1], kept_step,
        "restored the last complete checkpoint:\n{l}"
    );
    emu.remove_fault(rule);
    let j = crate::jobs::managed(&home, 1);
    let j = if j["state"] == "SUCCEEDED" {
        j
    } else {
        crate::common::wait_for("the job to end", crate::common::DEADLINE, || {
            let j = crate::jobs::managed(&home, 1);
            match j["state"].as_str() {
                Some("SUCCEEDED" | "FAILED" | "CANCELLED") => Ok(j),
                _ => Err(j.to_string()),
            }
        })
    };
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert!(log().contains("done-at-100"));
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// `git` in `dir`, as a test's author.
fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `workdir: {url, ref}`: every node clones the repository at the ref (a
/// tag, a branch, a commit that is not a branch's tip) into the workdir
/// the run starts in; a ref that is not there stops the job before setup,
/// naming the repository.
#[test]
fn a_git_workdir_is_cloned_on_every_node_at_its_ref() {
    let home = TestHome::new();
    let repo = home.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("f.txt"), "one").unwrap();
    git(&repo, &["add", "f.txt"]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    git(&repo, &["tag", "v1"]);
    let first = git(&repo, &["rev-parse", "HEAD"]);
    std::fs::write(repo.join("f.txt"), "two").unwrap();
    git(&repo, &["commit", "-q", "-am", "two"]);
    std::fs::write(repo.join("f.txt"), "three").unwrap();
    git(&repo, &["commit", "-q", "-am", "three"]);
    let url = format!("file://{}", repo.display());
    let task = |name: &str, git_ref: &str| {
        home.file(
            name,
            &format!(
                "num_nodes: 2\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
                 workdir:\n  url: {url}\n  ref: {git_ref}\n\
                 run: echo \"rank-$NODE_RANK f=$(cat f.txt) in=$(basename \"$PWD\")\"\n",
                m = home.marker
            ),
        )
    };
    let (code, out, err) = parts(&home.run(["launch", &task("tag.yaml", "v1"), "-c", "g", "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for rank in 0..2 {
        let want = format!("rank-{rank} f=one in=sky_workdir");
        assert!(out.contains(&want), "{want} missing:\n{out}\n{err}");
    }
    for (file, git_ref, want) in [
        ("branch.yaml", "main", "three"),
        ("commit.yaml", first.as_str(), "one"),
    ] {
        let (code, out, err) = parts(&home.run(["exec", "g", &task(file, git_ref)]));
        assert_eq!(code, 0, "{git_ref}: stdout:\n{out}\nstderr:\n{err}");
        assert!(
            out.contains(&format!("rank-1 f={want} in=sky_workdir")),
            "{git_ref}:\n{out}\n{err}"
        );
    }
    let (code, out, err) = parts(&home.run(["exec", "g", &task("none.yaml", "no-such-ref")]));
    assert_ne!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains("no-such-ref") && all.contains(&url),
        "names the ref and the repository:\n{all}"
    );
    assert!(!all.contains(" f="), "the run did not start:\n{all}");
    let (code, _, err) = parts(&home.run(["down", "-y", "g"]));
    assert_eq!(code, 0, "{err}");
    assert_no_marker_procs(&home.marker, "down of a cluster with a git workdir");
}

/// What a corpus file with buckets does here.
enum Corpus {
    /// Launches on the local provider: its file mounts, buckets and
    /// workdir made on both nodes, the run started.
    Launches,
    /// Refused before anything starts (exit 2), naming the file, the line
    /// and this.
    Refused(&'static str),
}

/// The real SkyPilot task files that use buckets (or a git workdir), with
/// their `file_mounts`, `workdir` and `envs` unmodified, against both
/// emulators: those that name their buckets launch on the local provider
/// (buckets made, local sources uploaded, S3 and GCS objects copied,
/// mounts made on every node, the non-persistent bucket deleted at
/// `down`); the ones that leave the bucket name for the user to fill in
/// are refused with the line to fix. Their `setup` and `run` install CUDA
/// software, so they are replaced by a line each rank prints; the files'
/// resources are overridden to the local provider. The two multi-document
/// pipelines among them are refused as such by the corpus test.
#[test]
fn the_corpus_files_with_buckets_launch_against_the_emulators() {
    let (Some(s3), Some(gcs), Some(_)) = (
        StoreEmulator::s3(),
        StoreEmulator::gcs(),
        crate::ec2_emulator::Ec2Emulator::shared(),
    ) else {
        return;
    };
    let Some(shared) = crate::common::shared() else {
        crate::skip::skipped(
            "compat",
            "../shared not found: the corpus files with buckets were NOT launched",
        );
        return;
    };
    let corpus = shared.join("compat/skypilot-tasks");
    let home = TestHome::new();
    let m = home.marker.to_ascii_lowercase();
    // What the files point at: a working directory with their local
    // sources, a HOME with their ~ files, the public buckets they read.
    let cwd = home.path().join("cwd");
    let user = home.path().join("user");
    for (path, text) in [
        (cwd.join("examples/managed_job_with_storage.yaml"), "x"),
        (cwd.join("setup.py"), "print()"),
        (cwd.join("configs/8B-lora.yaml"), "x: 1"),
        (cwd.join("mistral/qlora-checkpoint.yaml"), "x: 1"),
        (cwd.join("llama_hf_assets.yaml"), "x: 1"),
        (cwd.join("resnet_ddp/train.py"), "print()"),
        (cwd.join("dummy.json"), "{}"),
        (user.join("tmpfile"), "tmp"),
        (user.join("tmp-workdir/tmp file"), "spaced"),
        (user.join(".ssh/id_rsa.pub"), "ssh-ed25519 AAAA test"),
    ] {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    for (emu, bucket, key) in [
        (s3, "sky-imagenet-data", "datasets/x"),
        (
            s3,
            "fah-public-data-covid19-cryptic-pockets",
            "human/il6/PROJ14534/RUN999/CLONE0/results0/frame0.xtc",
        ),
        (
            gcs,
            "cloud-tpu-test-datasets",
            "fake_imagenet/train-00001-of-01024",
        ),
    ] {
        if !emu.bucket_exists(bucket) {
            emu.create_bucket(bucket);
        }
        emu.put_object(bucket, key, b"data");
    }
    let files: &[(&str, Corpus, &[&str])] = &[
        ("examples__airflow__train.yaml", Corpus::Launches, &[]),
        (
            "examples__managed_job_with_storage.yaml",
            Corpus::Launches,
            &[],
        ),
        ("examples__using_file_mounts.yaml", Corpus::Launches, &[]),
        (
            "llm__llama-3_1-finetuning__lora.yaml",
            Corpus::Launches,
            &["--env", "HF_TOKEN=x"],
        ),
        (
            "llm__axolotl__axolotl-spot.yaml",
            Corpus::Launches,
            &["--env", "HF_TOKEN=x", "--env", "BUCKET=gw-axolotl-test"],
        ),
        (
            "llm__fairseq2__multinode.sky.yaml",
            Corpus::Launches,
            &["--secret", "HF_TOKEN=x"],
        ),
        (
            "examples__spot__bert_qa.yaml",
            Corpus::Refused("name:"),
            &[],
        ),
        (
            "examples__spot__lightning_cifar10.yaml",
            Corpus::Refused("name:"),
            &[],
        ),
        ("examples__spot__resnet.yaml", Corpus::Refused("name:"), &[]),
        (
            "examples__spot__torchelastic.yaml",
            Corpus::Refused("name:"),
            &[],
        ),
        (
            "llm__vicuna__train.yaml",
            Corpus::Refused("YOUR_OWN_BUCKET_NAME"),
            &[],
        ),
    ];
    let mut failures = Vec::new();
    for (i, (name, expect, extra)) in files.iter().enumerate() {
        let text = std::fs::read_to_string(corpus.join(name)).unwrap();
        let file = cwd.join(name);
        std::fs::write(&file, with_run_replaced(&text, &m)).unwrap();
        let cluster = format!("corpus{i}");
        let mut c = in_corpus_env(&home, &cwd, &user, [s3, gcs]);
        c.arg("launch")
            .arg(&file)
            .args(["-c", &cluster, "-y", "--infra", "local", "--cpus", "1+"])
            .args(["--memory", "1+"])
            .args(*extra);
        let (code, out, err) = parts(&Running::start(c).wait());
        let ok = match expect {
            // No internet here: a git workdir on GitHub cannot be
            // fetched, and the node says so, naming the repository.
            Corpus::Launches
                if err.contains("Could not resolve host")
                    || out.contains("Could not resolve host") =>
            {
                code != 0
                    && format!("{out}{err}").contains("cannot fetch main of https://github.com/")
            }
            Corpus::Launches => code == 0 && out.contains(&format!("corpus-ran-0-{m}")),
            Corpus::Refused(what) => {
                code == 2
                    && err.contains(&format!("{}:", file.display()))
                    && err.contains("file_mounts")
                    && err.contains(what)
                    && home.cluster_opt(&cluster).is_none()
            }
        };
        if !ok {
            failures.push(format!(
                "{name}: exit {code}\nstdout:\n{out}\nstderr:\n{err}"
            ));
        }
        if matches!(expect, Corpus::Launches) {
            let mut c = in_corpus_env(&home, &cwd, &user, [s3, gcs]);
            c.args(["down", "-y", &cluster]);
            let (code, _, err) = parts(&Running::start(c).wait());
            if code != 0 {
                failures.push(format!("{name}: down: {err}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // What the files made: the named buckets (persistent by default)
    // stay; the one marked persistent: false went at down.
    assert!(s3.bucket_exists("sky-demo-data-test"));
    assert!(s3.bucket_exists("gw-axolotl-test"));
    assert!(s3.bucket_exists("sky-llama-31-checkpoints"));
    assert!(!s3.bucket_exists("sky-workdir-zhwu"));
    assert_no_marker_procs(&home.marker, "the corpus clusters went down");
}

/// gangway in `home`, run from `cwd` with `user` as HOME, with the user's
/// credentials for both store emulators (and STS for S3's).
fn in_corpus_env(
    home: &TestHome,
    cwd: &std::path::Path,
    user: &std::path::Path,
    [s3, gcs]: [&StoreEmulator; 2],
) -> std::process::Command {
    let mut c = command_in(home.path());
    c.current_dir(cwd).env("HOME", user);
    with_store(&mut c, s3);
    with_store(&mut c, gcs);
    c
}

/// `text` with its top-level `setup:` and `run:` blocks replaced by one
/// line each rank prints.
fn with_run_replaced(text: &str, marker: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let top = !line.starts_with([' ', '\t', '#']) && !line.trim().is_empty();
        if top {
            skipping = line.starts_with("setup:") || line.starts_with("run:");
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "run: echo corpus-ran-$SKYPILOT_NODE_RANK-{marker}\n"
    ));
    out
}

/// `jobs.bucket`: a managed job's workdir and local file mounts go to the
/// bucket once, from this machine, at `jobs launch`; every run's nodes
/// (the first and the recovery after a preemption) fetch them from the
/// store with rclone; they are deleted when the job ends.
fn a_managed_jobs_files_travel_through_jobs_bucket(emu: &StoreEmulator) {
    let home = TestHome::new();
    let bucket = format!("gw-{}-jobs", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    std::fs::write(
        home.path().join("config.yaml"),
        format!("jobs:\n  bucket: {}://{bucket}\n", scheme(emu)),
    )
    .unwrap();
    let wd = home.path().join("wd");
    std::fs::create_dir_all(&wd).unwrap();
    std::fs::write(wd.join("code.txt"), "code-v1").unwrap();
    let data = home.path().join("data.txt");
    std::fs::write(&data, "data-v1").unwrap();
    let task = home.file(
        "jb.yaml",
        &format!(
            "resources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {m}\n\
             workdir: {wd}\nfile_mounts:\n  ~/in/data.txt: {data}\n\
             config:\n  local:\n    preemptions:\n      - {{after_s: 4}}\n\
             run: |\n  echo \"run $GANGWAY_RESTART_COUNT code=$(cat code.txt) data=$(cat ~/in/data.txt)\"\n\
             \x20 [ \"$GANGWAY_RESTART_COUNT\" -ge 1 ] || sleep 60\n",
            m = home.marker,
            wd = wd.display(),
            data = data.display()
        ),
    );
    let before = emu.last_request_id();
    let (code, out, err) = parts(&run(emu, &home, &["jobs", "launch", &task, "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let job = crate::jobs::managed(&home, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["preemptions"], 1, "{job}");
    let logs = parts(&home.run(["jobs", "logs", "1"])).1;
    for run in 0..2 {
        let want = format!("run {run} code=code-v1 data=data-v1");
        assert!(logs.contains(&want), "{want} missing:\n{logs}");
    }
    let log: Vec<_> = emu
        .requests_since(before)
        .into_iter()
        .filter(|r| unescaped(&r.path).contains(&bucket))
        .collect();
    let agent = |r: &gangway_test::storage::RequestRecord, a: &str| {
        r.user_agent.as_deref().is_some_and(|u| u.starts_with(a))
    };
    // Two files went up once, from gangway; both runs' node fetched both.
    let put_here = log
        .iter()
        .filter(|r| agent(r, "object_store") && r.method != "POST" && r.bytes_in > 0)
        .count();
    // (S3's batch delete is a POST with a body; GCS uploads are POSTs too.)
    let put_here = put_here
        + log
            .iter()
            .filter(|r| {
                agent(r, "object_store")
                    && r.method == "POST"
                    && unescaped(&r.path).contains("uploadType")
            })
            .count();
    assert_eq!(put_here, 2, "uploaded once from here: {log:?}");
    let fetched = log
        .iter()
        .filter(|r| agent(r, "rclone") && r.method == "GET" && r.bytes_out == 7)
        .count();
    assert!(fetched >= 4, "each run's node fetched both files: {log:?}");
    // Gone with the job (the controller deletes them after the teardown,
    // once the job's end is recorded).
    crate::common::wait_for(
        "the job's files deleted",
        crate::common::DEADLINE,
        || match emu.list(&bucket, "gangway-jobs/") {
            l if l.is_empty() => Ok(()),
            l => Err(format!("{l:?}")),
        },
    );
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

#[test]
fn a_managed_jobs_files_travel_through_an_s3_jobs_bucket() {
    let Some(emu) = s3() else {
        return;
    };
    a_managed_jobs_files_travel_through_jobs_bucket(emu);
}

#[test]
fn a_managed_jobs_files_travel_through_a_gcs_jobs_bucket() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    a_managed_jobs_files_travel_through_jobs_bucket(emu);
}

/// A directory for PATH with every command of this machine but those
/// whose names start with `left_out` (symlinks, in `home`).
fn path_without(home: &TestHome, left_out: &str) -> std::path::PathBuf {
    let bin = home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for dir in ["/usr/local/bin", "/usr/bin", "/bin"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if !name.to_string_lossy().starts_with(left_out) && !bin.join(&name).exists() {
                let _ = std::os::unix::fs::symlink(e.path(), bin.join(&name));
            }
        }
    }
    bin
}

/// A node without rclone gets rclone's static build in `~/.gangway/bin`
/// (from `GANGWAY_RCLONE_URL` here: a local mirror serving a zip laid out
/// as rclone's downloads are), once per node; the bucket mount then works.
#[test]
fn a_node_without_rclone_gets_one_installed_once() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    let home = TestHome::new();
    let bin = path_without(&home, "rclone");
    // The mirror: rclone's zip layout, holding a wrapper of the real one.
    let site = home.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    gangway_test::storage::rclone().expect("rclone on this machine");
    let real = std::process::Command::new("sh")
        .args(["-c", "command -v rclone"])
        .output()
        .unwrap();
    let real = String::from_utf8_lossy(&real.stdout).trim().to_string();
    assert!(real.starts_with('/'), "rclone's path: {real}");
    std::fs::write(
        site.join("rclone"),
        format!("#!/bin/sh\nexec {real} \"$@\"\n"),
    )
    .unwrap();
    let zipped = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w') as z:\n    z.write(sys.argv[2], 'rclone-v1.68.2-linux-amd64/rclone')",
        ])
        .arg(site.join("rclone.zip"))
        .arg(site.join("rclone"))
        .status()
        .unwrap();
    assert!(zipped.success());
    let log = home.path().join("mirror.log");
    /// The mirror stops with the test, however it ends.
    struct Mirror(std::process::Child);
    impl Drop for Mirror {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut server = std::process::Command::new("python3")
        .args([
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(&site)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = server.stdout.take().unwrap();
    let _mirror = Mirror(server);
    let port = {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        line.split(" port ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("the mirror's port")
            .to_string()
    };
    let bucket = format!("gw-{}-nr", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "x/a.txt", b"alpha");
    let task = home.file(
        "nr.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             file_mounts:\n  ~/d: gs://{bucket}/x\n\
             run: echo \"rank-$NODE_RANK a=$(cat ~/d/a.txt) rclone=$(command -v rclone || echo none)\"\n",
            m = home.marker
        ),
    );
    let gangway = |args: &[&str]| {
        let mut c = command_in(home.path());
        c.env("PATH", &bin)
            .env(
                "GANGWAY_RCLONE_URL",
                format!("http://127.0.0.1:{port}/rclone.zip"),
            )
            .env("GANGWAY_GCS_ENDPOINT", &emu.endpoint)
            .env("GOOGLE_SERVICE_ACCOUNT_KEY", GCS_NO_AUTH_KEY)
            .args(args);
        parts(&Running::start(c).wait())
    };
    let downloads = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("GET /rclone.zip")
            .count()
    };
    // A zip whose checksum is not the one published beside it is not
    // installed: the storage step fails naming the URL.
    std::fs::write(
        site.join("SHA256SUMS"),
        format!("{}  rclone.zip\n", "0".repeat(64)),
    )
    .unwrap();
    let (code, out, err) = gangway(&["launch", &task, "-c", "bad", "-y"]);
    assert_ne!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let said = format!("{out}{err}");
    assert!(
        said.contains("/rclone.zip has SHA-256 ") && said.contains("not installed"),
        "{said}"
    );
    assert!(!said.contains("installed rclone from"), "{said}");
    let (code, _, err) = gangway(&["down", "-y", "bad"]);
    assert_eq!(code, 0, "{err}");
    let sha = std::process::Command::new("sha256sum")
        .arg(site.join("rclone.zip"))
        .output()
        .unwrap();
    let sha = String::from_utf8_lossy(&sha.stdout);
    std::fs::write(
        site.join("SHA256SUMS"),
        format!(
            "-----BEGIN PGP SIGNED MESSAGE-----\n\n{}  rclone.zip\n",
            sha.split_whitespace().next().unwrap()
        ),
    )
    .unwrap();
    let before = downloads();
    let (code, out, err) = gangway(&["launch", &task, "-c", "nr", "-y"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for rank in 0..2 {
        let want = format!("rank-{rank} a=alpha rclone=none");
        assert!(out.contains(&want), "{want} missing:\n{out}\n{err}");
    }
    assert!(
        format!("{out}{err}").contains("installed rclone from http://127.0.0.1"),
        "{out}\n{err}"
    );
    assert_eq!(downloads() - before, 2, "once per node");
    let (code, out, err) = gangway(&["exec", "nr", &task]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(downloads() - before, 2, "kept on the nodes");
    let (code, _, err) = gangway(&["down", "-y", "nr"]);
    assert_eq!(code, 0, "{err}");
    assert_no_marker_procs(&home.marker, "down");
}

/// A checkpoint's bytes go up once: syncs in which nothing changed write
/// nothing (no new generation), and after a recovery restores the
/// checkpoint on both nodes, neither node uploads the restored files again.
#[test]
fn unchanged_checkpoint_files_are_uploaded_once_even_across_a_restore() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-once", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    let task = home.file(
        "once.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {m}\n\
             checkpoint:\n  storage: s3://{bucket}/o\n  sync_interval: 1\n\
             config:\n  local:\n    preemptions:\n      - {{after_s: 8, notice_s: 0}}\n\
             run: |\n  m=\"$GANGWAY_CHECKPOINT_DIR/model.bin\"\n\
             \x20 if [ -f \"$m\" ]; then echo \"rank $SKYPILOT_NODE_RANK resumed with $(wc -c < \"$m\") bytes\"; sleep 4; exit 0; fi\n\
             \x20 [ \"$SKYPILOT_NODE_RANK\" = 0 ] && head -c 300000 /dev/urandom > \"$m\"\n\
             \x20 sleep 60\n",
            m = home.marker
        ),
    );
    let before = emu.last_request_id();
    let (code, out, err) = parts(&run(emu, &home, &["jobs", "launch", &task, "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let job = crate::jobs::managed(&home, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["preemptions"], 1, "{job}");
    let logs = parts(&home.run(["jobs", "logs", "1"])).1;
    for rank in 0..2 {
        let want = format!("rank {rank} resumed with 300000 bytes");
        assert!(logs.contains(&want), "{want} missing:\n{logs}");
    }
    let model_puts: Vec<_> = emu
        .requests_since(before)
        .into_iter()
        .filter(|r| {
            let p = unescaped(&r.path);
            p.contains(&bucket) && p.contains("/gen-") && p.contains("model.bin") && r.bytes_in > 0
        })
        .collect();
    assert_eq!(
        model_puts.len(),
        1,
        "model.bin went up once: {model_puts:?}"
    );
    let generations = complete_generations(emu, &bucket, "o");
    assert_eq!(
        generations.len(),
        1,
        "no generation after the first: nothing changed"
    );
    // The manifest's row of model.bin: the size and MD5 of the bytes its
    // key holds in the store.
    let manifest = emu
        .get_object(
            &bucket,
            &format!("o/manifests/{}/rank-0.tsv", generations[0]),
        )
        .expect("rank 0's manifest");
    let manifest = String::from_utf8(manifest).unwrap();
    let row: Vec<&str> = manifest
        .lines()
        .find(|l| l.starts_with("model.bin\t"))
        .unwrap_or_else(|| panic!("model.bin in the manifest:\n{manifest}"))
        .split('\t')
        .collect();
    let bytes = emu
        .get_object(&bucket, &format!("o/{}", row[3]))
        .expect("the object the manifest names");
    assert_eq!(row[1], bytes.len().to_string(), "{row:?}");
    assert_eq!(row[4], md5_hex(&bytes), "{row:?}");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// A file written to while its upload goes never enters a checkpoint as
/// something it was not: every upload is held 3 s while the run appends a
/// line every 0.2 s, so such a sync fails and keeps nothing; once the writing
/// stops a sync keeps the file whole, and every manifest row of every
/// complete generation holds the size and MD5 of the bytes its key holds.
#[test]
fn a_file_written_while_it_uploads_is_kept_only_whole() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-busy", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    let task = home.file(
        "busy.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             checkpoint:\n  storage: s3://{bucket}/b\n  sync_interval: 1\n\
             run: |\n  w=\"$GANGWAY_CHECKPOINT_DIR/w\"\n\
             \x20 i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo \"line $i\" >> \"$w\"; sleep 0.2; done\n\
             \x20 sleep 8\n",
            m = home.marker
        ),
    );
    let rule = emu.fault(&serde_json::json!({
        "method": "PUT", "path_contains": [bucket.as_str(), "/gen-"],
        "action": "delay", "delay_ms": 3000, "times": -1,
    }));
    let (code, out, err) = parts(&run(emu, &home, &["jobs", "launch", &task, "-y"]));
    emu.remove_fault(rule);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let log = std::fs::read_to_string(home.path().join("jobs/controller.log")).unwrap();
    // rclone finds most such files itself (the bytes it read differ from
    // the file's hash after); gangway's own check (size and mtime before
    // and after) catches a change between its listing and rclone's read.
    assert!(
        log.contains("checkpoint sync failed")
            && [
                "corrupted on transfer",
                "being updated",
                "changed while it was uploaded"
            ]
            .iter()
            .any(|w| log.contains(w)),
        "a sync during the writing failed on the moving file:\n{log}"
    );
    let want: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    let generations = complete_generations(emu, &bucket, "b");
    assert!(!generations.is_empty(), "a checkpoint was kept:\n{log}");
    for g in &generations {
        let manifest = emu
            .get_object(&bucket, &format!("b/manifests/{g}/rank-0.tsv"))
            .expect("the rank's manifest");
        for line in String::from_utf8(manifest).unwrap().lines() {
            let row: Vec<&str> = line.split('\t').collect();
            let bytes = emu
                .get_object(&bucket, &format!("b/{}", row[3]))
                .expect("the object the manifest names");
            assert_eq!(row[1], bytes.len().to_string(), "generation {g}: {row:?}");
            assert_eq!(row[4], md5_hex(&bytes), "generation {g}: {row:?}");
        }
    }
    let newest = generations.last().unwrap();
    let manifest = emu
        .get_object(&bucket, &format!("b/manifests/{newest}/rank-0.tsv"))
        .unwrap();
    let key = String::from_utf8(manifest)
        .unwrap()
        .split('\t')
        .nth(3)
        .unwrap()
        .to_string();
    assert_eq!(
        String::from_utf8(emu.get_object(&bucket, &format!("b/{key}")).unwrap()).unwrap(),
        want,
        "the newest checkpoint holds the file as the run left it"
    );
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// Pruning that fails never costs a checkpoint: with every delete refused
/// (403), the syncs still complete and the run hears of them; the
/// controller's log says what failed, and the old checkpoints stay. (The
/// run writes a new file each time: a file rewritten during an upload
/// fails that sync, see above.)
#[test]
fn a_failed_prune_keeps_the_new_checkpoint() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-prune", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    let task = home.file(
        "prune.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             checkpoint:\n  storage: s3://{bucket}/p\n  sync_interval: 1\n  keep: 1\n\
             run: |\n  d=\"$GANGWAY_CHECKPOINT_DIR\"; seen=\"\"; n=0\n\
             \x20 for i in $(seq 1 60); do\n\
             \x20   echo $i > \"$d/step-$i\"; sleep 0.25\n\
             \x20   s=$(cat \"$d/.gangway-synced\" 2>/dev/null)\n\
             \x20   if [ -n \"$s\" ] && [ \"$s\" != \"$seen\" ]; then seen=$s; n=$((n+1)); fi\n\
             \x20   [ $n -ge 3 ] && break\n\
             \x20 done\n\
             \x20 echo heard-$n-syncs\n",
            m = home.marker
        ),
    );
    let rule = emu.fault(&serde_json::json!({
        "method": "POST", "path_contains": [bucket.as_str(), "delete"],
        "action": "status", "status": 403, "times": -1,
    }));
    let (code, out, err) = parts(&run(emu, &home, &["jobs", "launch", &task, "-y"]));
    let refused = emu.fired(rule);
    emu.remove_fault(rule);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(refused > 0, "a prune tried to delete");
    let job = crate::jobs::managed(&home, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    let logs = parts(&home.run(["jobs", "logs", "1"])).1;
    assert!(logs.contains("heard-3-syncs"), "{logs}");
    let log = std::fs::read_to_string(home.path().join("jobs/controller.log")).unwrap();
    assert!(
        log.contains("checkpoint kept, but pruning older ones failed"),
        "{log}"
    );
    assert!(!log.contains("checkpoint sync failed"), "{log}");
    assert!(
        complete_generations(emu, &bucket, "p").len() >= 3,
        "nothing was pruned: {:?}",
        complete_generations(emu, &bucket, "p")
    );
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// The MD5 of `bytes` in hex, by md5sum.
fn md5_hex(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("md5sum");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..32].to_string()
}

/// A periodic checkpoint upload that takes long (every checkpoint PUT held
/// 12 s by the front) does not hide the preemption notice: the controller
/// reads it while the upload goes and signals the run within the notice.
#[test]
fn a_slow_checkpoint_upload_does_not_delay_the_preemption_notice() {
    let Some(emu) = s3() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-slow", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    let signal_file = home.path().join("signalled");
    let task = home.file(
        "slow.yaml",
        &format!(
            "resources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {m}\n  SIGNAL_FILE: {f}\n\
             checkpoint:\n  storage: s3://{bucket}/s\n  sync_interval: 1\n  signal: SIGUSR1\n  grace_period: 10\n\
             config:\n  local:\n    preemptions:\n      - {{after_s: 9, notice_s: 5}}\n\
             run: |\n  [ \"$GANGWAY_RESTART_COUNT\" = 0 ] || exit 0\n\
             \x20 echo x > \"$GANGWAY_CHECKPOINT_DIR/w\"\n\
             \x20 trap 'date +%s%3N > \"$SIGNAL_FILE\"; exit 0' USR1\n\
             \x20 while true; do sleep 0.02; done\n",
            m = home.marker,
            f = signal_file.display()
        ),
    );
    let rule = emu.fault(&serde_json::json!({
        "method": "PUT", "path_contains": [bucket.as_str(), "/gen-"],
        "action": "delay", "delay_ms": 12000, "times": -1,
    }));
    let (code, out, err) = parts(&run(emu, &home, &["jobs", "launch", &task, "-y"]));
    let held = emu.fired(rule);
    emu.remove_fault(rule);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(held > 0, "an upload was held");
    let job = crate::jobs::managed(&home, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert!(
        signal_file.exists(),
        "the run was signalled on the notice while the upload was held:\n{out}\n{err}"
    );
    let events = parts(&home.run(["jobs", "events", "1"])).1;
    assert!(events.contains("NOTICE"), "{events}");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// A MOUNT on a node that cannot mount fails the launch with one message
/// naming the node and the mount, before the run starts: once without
/// fusermount on the node's PATH, once with no `/dev/fuse` (gangway and
/// its local nodes in a mount namespace whose `/dev` lacks it). The
/// failed cluster still goes down cleanly.
#[test]
fn a_node_that_cannot_mount_is_named_with_the_mount() {
    let Some(emu) = StoreEmulator::gcs() else {
        return;
    };
    let home = TestHome::new();
    let bucket = format!("gw-{}-nofuse", home.marker.to_ascii_lowercase());
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "a.txt", b"alpha");
    let task = home.file(
        "m.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {m}\n\
             file_mounts:\n  ~/copied: gs://{bucket}\n  ~/mounted:\n    source: gs://{bucket}\n    mode: MOUNT\n\
             run: echo ran-$(cat ~/mounted/a.txt)\n",
            m = home.marker
        ),
    );
    // The node's own words come with the node's output (stdout), prefixed
    // with its rank and address.
    let check = |what: &str, out: &str, err: &str, code: i32, reason: &str| {
        assert_ne!(code, 0, "{what}: stdout:\n{out}\nstderr:\n{err}");
        assert!(!out.contains("ran-"), "{what}: the run started:\n{out}");
        let line = out
            .lines()
            .find(|l| l.contains(reason))
            .unwrap_or_else(|| panic!("{what}: no '{reason}' in:\n{out}\nstderr:\n{err}"));
        assert!(
            line.contains("rank 0, 127.") && line.contains("-> ~/mounted:"),
            "{what}: names the node and the mount: {line}"
        );
        assert!(
            out.contains("storage failed on rank 0; setup does not start"),
            "{what}: {out}"
        );
        assert!(!err.contains("panicked"), "{what}: {err}");
    };

    let bin = path_without(&home, "fusermount");
    let mut c = command_in(home.path());
    with_store(&mut c, emu);
    c.env("PATH", &bin)
        .args(["launch", &task, "-c", "nf1", "-y"]);
    let (code, out, err) = parts(&Running::start(c).wait());
    check(
        "without fusermount",
        &out,
        &err,
        code,
        "fusermount is not installed",
    );
    let (code, out, err) = parts(&run(emu, &home, &["down", "-y", "nf1"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");

    // No /dev/fuse: gangway and its nodes see a /dev of their own.
    let mut c = std::process::Command::new("unshare");
    with_store(&mut c, emu);
    c.env_remove("GANGWAY_CATALOG_DIR")
        .env_remove("RUST_LOG")
        .env("GANGWAY_HOME", home.path())
        .current_dir(crate::common::root())
        .stdin(std::process::Stdio::null())
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "set -e; gw=\"$0\"; task=\"$1\"\n\
             mount -t tmpfs -o mode=755 gw-dev /dev\n\
             for d in 'null 1 3' 'zero 1 5' 'full 1 7' 'random 1 8' 'urandom 1 9' 'tty 5 0'; do\n\
               set -- $d; mknod -m 666 /dev/$1 c $2 $3; done\n\
             mkdir /dev/shm /dev/pts; ln -s /proc/self/fd /dev/fd\n\
             for i in 0 1 2; do ln -s /proc/self/fd/$i /dev/$(echo stdin stdout stderr | cut -d' ' -f$((i+1))); done\n\
             [ ! -e /dev/fuse ]; exec \"$gw\" launch \"$task\" -c nf2 -y",
        )
        .arg(env!("CARGO_BIN_EXE_gangway"))
        .arg(&task);
    let o = Running::start(c).wait();
    let (code, out, err) = parts(&o);
    if err.contains("unshare failed") || err.contains("Operation not permitted") {
        gangway_test::skip::skipped(
            "gcs",
            format!("no mount namespace for a node without /dev/fuse (needs root): {err}"),
        );
        return;
    }
    check("without /dev/fuse", &out, &err, code, "no /dev/fuse");
    let (code, out, err) = parts(&run(emu, &home, &["down", "-y", "nf2"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_no_marker_procs(&home.marker, "down of clusters whose mounts failed");
    // Nothing was mounted, and the bucket is as it was.
    let keys: Vec<String> = emu.list(&bucket, "").into_iter().map(|l| l.key).collect();
    assert_eq!(keys, ["a.txt"]);
}
