use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    (dir, s)
}

fn new(name: &str) -> NewCluster<'_> {
    NewCluster {
        name,
        num_nodes: 2,
        client_token: "tok-1",
        provider_config: None,
    }
}

#[test]
fn reopening_keeps_rows_and_schema_version() {
    let (dir, s) = store();
    assert!(matches!(
        s.reserve_cluster(&new("a")).unwrap(),
        Reserved::New(_)
    ));
    drop(s);
    let s = Store::open(dir.path()).unwrap();
    let v: i64 = s
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, MIGRATIONS.len() as i64);
    assert_eq!(s.clusters().unwrap().len(), 1);
    let mode: String = s
        .conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn a_newer_schema_is_refused_not_clobbered() {
    let (dir, s) = store();
    s.conn.pragma_update(None, "user_version", 99).unwrap();
    drop(s);
    let err = Store::open(dir.path()).err().expect("must refuse");
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

#[test]
fn reserve_is_new_then_resumed_then_existing() {
    let (_d, s) = store();
    let Reserved::New(row) = s.reserve_cluster(&new("a")).unwrap() else {
        panic!("first reserve must be new")
    };
    assert_eq!(row.status, ClusterStatus::Init);
    assert_eq!(row.client_token, "tok-1");
    // Still INIT (the launcher died): the next launcher resumes with the same token.
    let again = NewCluster {
        client_token: "tok-2",
        ..new("a")
    };
    let Reserved::Resumed(row) = s.reserve_cluster(&again).unwrap() else {
        panic!("an INIT cluster is resumed")
    };
    assert_eq!(row.client_token, "tok-1");
    s.set_nodes("a", ClusterStatus::Up, &[]).unwrap();
    assert!(matches!(
        s.reserve_cluster(&new("a")).unwrap(),
        Reserved::Existing(r) if r.status == ClusterStatus::Up
    ));
}

#[test]
fn the_owner_lock_excludes_a_second_owner_until_dropped() {
    let (_d, s) = store();
    let held = s.lock_cluster("a", "launching").unwrap();
    assert!(s.cluster_locked("a"));
    let err = s.lock_cluster("a", "launching").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cluster 'a' is busy") && msg.contains(&std::process::id().to_string()),
        "{msg}"
    );
    drop(held);
    assert!(!s.cluster_locked("a"));
    s.lock_cluster("a", "launching").unwrap();
}

#[test]
fn nodes_are_replaced_in_rank_order_and_removed_with_the_cluster() {
    let (_d, s) = store();
    s.reserve_cluster(&new("a")).unwrap();
    let node = |rank: u32, ip: &str| NodeRow {
        rank,
        instance_id: format!("i-{rank}"),
        private_ip: ip.into(),
        public_ip: None,
        zone: "local-a".into(),
        topology: "s1/l1".into(),
        state: "running".into(),
        extra: [("dir".to_string(), "/x".to_string())].into(),
    };
    s.set_nodes(
        "a",
        ClusterStatus::Up,
        &[node(1, "127.0.10.2"), node(0, "127.0.10.9")],
    )
    .unwrap();
    let got = s.nodes("a").unwrap();
    assert_eq!(got.iter().map(|n| n.rank).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(got[0].private_ip, "127.0.10.9");
    assert_eq!(got[0].extra["dir"], "/x");
    let job = s.add_job("a", Some("t"), "{}").unwrap();
    s.remove_cluster("a").unwrap();
    assert!(s.nodes("a").unwrap().is_empty());
    assert!(s.job(job).unwrap().is_none());
}

#[test]
fn a_job_keeps_its_first_ending() {
    let (_d, s) = store();
    s.reserve_cluster(&new("a")).unwrap();
    let id = s.add_job("a", None, "{}").unwrap();
    s.set_job_status(id, JobStatus::Running, None).unwrap();
    let j = s.job(id).unwrap().unwrap();
    assert!(j.started_at.is_some() && j.ended_at.is_none());
    s.set_job_status(id, JobStatus::Failed, Some("rank 1 exited with 3"))
        .unwrap();
    s.set_job_status(id, JobStatus::Cancelled, Some("late"))
        .unwrap();
    let j = s.job(id).unwrap().unwrap();
    assert_eq!(j.status, JobStatus::Failed);
    assert_eq!(j.detail.as_deref(), Some("rank 1 exited with 3"));
    assert!(j.ended_at.is_some());
}

#[test]
fn a_job_whose_driver_lock_is_gone_is_reaped() {
    let (_d, s) = store();
    s.reserve_cluster(&new("a")).unwrap();
    let live = s.add_job("a", None, "{}").unwrap();
    let dead = s.add_job("a", None, "{}").unwrap();
    s.set_job_driver(live, 1).unwrap();
    s.set_job_driver(dead, 1).unwrap();
    s.set_job_status(live, JobStatus::Running, None).unwrap();
    s.set_job_status(dead, JobStatus::Running, None).unwrap();
    let _held = OwnerLock::try_acquire(&s.job_lock_path(live))
        .unwrap()
        .unwrap();
    let reaped = s.reap_dead_jobs().unwrap();
    assert_eq!(reaped.iter().map(|j| j.id).collect::<Vec<_>>(), [dead]);
    assert_eq!(s.job(live).unwrap().unwrap().status, JobStatus::Running);
    assert_eq!(
        s.job(dead).unwrap().unwrap().status,
        JobStatus::FailedDriver
    );
}

#[test]
fn events_come_back_in_order() {
    let (_d, s) = store();
    s.event("a", None, "provision", "first").unwrap();
    s.event("a", Some(3), "setup", "second").unwrap();
    s.event("b", None, "provision", "other").unwrap();
    let e = s.events("a").unwrap();
    assert_eq!(
        e.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
        ["first", "second"]
    );
    assert_eq!(e[1].job, Some(3));
}

#[test]
fn many_openers_of_a_new_database_all_succeed() {
    // Creating the file and switching it to WAL race; none may fail.
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let home = dir.path().to_path_buf();
                let b = std::sync::Arc::clone(&barrier);
                std::thread::spawn(move || {
                    b.wait();
                    Store::open(&home).map(|s| s.clusters().unwrap().len())
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap(), 0);
        }
    }
}

#[test]
fn a_failed_teardown_keeps_the_row_with_its_reason_and_backs_off() {
    let (_d, s) = store();
    s.reserve_cluster(&new("a")).unwrap();
    let t0 = now_ms();
    let first = s.set_teardown_failed("a", "credentials expired").unwrap();
    let row = s.cluster("a").unwrap().expect("the row stays");
    assert_eq!(row.status, ClusterStatus::Terminating);
    assert_eq!(row.last_error.as_deref(), Some("credentials expired"));
    assert_eq!(row.teardown_failures, 1);
    assert_eq!(row.retry_at, Some(first));
    assert!(first >= t0 + 5_000 && first <= now_ms() + 5_000, "{first}");
    let second = s.set_teardown_failed("a", "throttled").unwrap();
    assert!(second - now_ms() > 9_000, "the wait doubles");
    assert_eq!(s.cluster("a").unwrap().unwrap().teardown_failures, 2);
    assert_eq!(teardown_backoff(30), Duration::from_secs(15 * 60));
}
