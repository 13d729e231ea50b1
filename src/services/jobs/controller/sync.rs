//! Checkpoint syncs: every node's checkpoint directory copied into the
//! job's kept one, beside the watch loop and at a run's end.

use super::*;

/// A checkpoint copy that ended: when it began, and what the nodes sent
/// that was left out (links out of the directory, devices, ...).
pub(super) struct Synced {
    at: i64,
    skipped: gangway_provider::Skipped,
}

/// Why copying a checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum SyncError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Transport(#[from] crate::core::transport::TransportError),
    #[error("the copy stopped: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Bucket(#[from] checkpoint::CheckpointError),
    /// The checkpoint of `at` is complete; removing older ones failed (the
    /// next sync tries again).
    #[error("checkpoint kept, but pruning older ones failed: {error}")]
    Prune {
        at: i64,
        error: gangway_store::StoreError,
    },
}

/// The sync at a run's end: its time is recorded in the job (saved with
/// the job's next state), a failure said in the controller's log.
pub(super) async fn last_sync(
    sh: &Shared,
    m: &mut Memo,
    mt: &ManagedTask,
    nodes: Arc<Vec<NodeRow>>,
    transport: Arc<dyn Transport>,
) {
    if let Some(t) = synced(sh, m.job().id, sync(mt, nodes, transport).await) {
        m.job().last_sync_at = Some(t);
    }
}

/// Waits for the periodic sync running beside the loop and records its
/// time.
pub(super) async fn sync_ended(
    sh: &Shared,
    m: &mut Memo,
    was: ManagedState,
) -> Result<(), crate::Error> {
    let Some(h) = m.syncing.take() else {
        return Ok(());
    };
    let r = h.await.map_err(SyncError::from).and_then(|r| r);
    if let Some(t) = synced(sh, m.job().id, r) {
        m.job().last_sync_at = Some(t);
        m.save(sh, was, "")?;
    }
    Ok(())
}

/// The sync's time, or `None` after saying in the controller's log why
/// it failed (the previous checkpoint stays the one restored). A sync
/// whose checkpoint completed but whose pruning failed is said and counts.
pub(super) fn synced(sh: &Shared, job: i64, r: Result<Synced, SyncError>) -> Option<i64> {
    match r {
        Ok(Synced { at, skipped }) => {
            if !skipped.is_empty() {
                let shown: Vec<&str> = skipped.iter().take(5).map(String::as_str).collect();
                let more = skipped.len().saturating_sub(shown.len());
                let why = format!(
                    "checkpoint sync left out {} entr{} a node sent: {}{}",
                    skipped.len(),
                    if skipped.len() == 1 { "y" } else { "ies" },
                    shown.join("; "),
                    if more > 0 {
                        format!("; and {more} more")
                    } else {
                        String::new()
                    }
                );
                sh.say(&format!("job {job}: {why}"));
                let _ = sh.store().managed_event(job, "WARNING", None, &why);
            }
            Some(at)
        }
        Err(e @ SyncError::Prune { at, .. }) => {
            sh.say(&format!("job {job}: {e}"));
            Some(at)
        }
        Err(e) => {
            sh.say(&format!("job {job}: checkpoint sync failed: {e}"));
            None
        }
    }
}

/// Copies every node's checkpoint directory into the kept one, atomically
/// (a failed copy keeps the previous one), then tells the nodes
/// (`.gangway-synced` holds the time the copy began: everything written
/// before it is kept). Returns that time. Runs off the runtime.
pub(super) async fn sync(
    mt: &ManagedTask,
    nodes: Arc<Vec<NodeRow>>,
    transport: Arc<dyn Transport>,
) -> Result<Synced, SyncError> {
    let storage = mt.storage.clone();
    let ck = mt
        .spec
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| gang::DEFAULT_CHECKPOINT_DIR.to_string());
    if let Some(url) = &mt.storage_url {
        // The nodes upload to the bucket themselves; this process writes
        // the manifest that makes the checkpoint complete, tells the nodes,
        // then prunes.
        let started = now_ms();
        let dirs: Vec<String> = nodes.iter().map(|n| transport.node_path(n, &ck)).collect();
        let bucket = checkpoint::open(url).await?;
        let synced = checkpoint::sync(
            &bucket,
            started as u64,
            &nodes,
            &dirs,
            Arc::clone(&transport),
        )
        .await?;
        let stamp = started.to_string();
        tokio::task::spawn_blocking(move || {
            for (n, d) in nodes.iter().zip(&dirs) {
                let _ = transport.write_file(n, &format!("{d}/.gangway-synced"), stamp.as_bytes());
            }
        })
        .await?;
        if synced.new {
            checkpoint::prune(&bucket, mt.keep)
                .await
                .map_err(|error| SyncError::Prune { at: started, error })?;
        }
        return Ok(Synced {
            at: started,
            skipped: Vec::new(),
        });
    }
    tokio::task::spawn_blocking(move || sync_now(&storage, &ck, &nodes, transport.as_ref())).await?
}

pub(super) fn sync_now(
    storage: &Path,
    ck: &str,
    nodes: &[NodeRow],
    transport: &dyn Transport,
) -> Result<Synced, SyncError> {
    let started = now_ms();
    let name = storage
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parent = storage.parent().unwrap_or(Path::new("."));
    let tmp = parent.join(format!("{name}.partial"));
    let old = parent.join(format!("{name}.old"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let mut skipped = Vec::new();
    for n in nodes {
        // The path is the node's: only the transport can tell whether it
        // exists there (over SSH it is not on this machine).
        let path = transport.node_path(n, ck);
        for s in transport.download(n, &path, &tmp)? {
            skipped.push(format!("rank {} ({}): {s}", n.rank, n.label()));
        }
    }
    let _ = std::fs::remove_dir_all(&old);
    if storage.exists() {
        std::fs::rename(storage, &old)?;
    }
    std::fs::rename(&tmp, storage)?;
    let _ = std::fs::remove_dir_all(&old);
    for n in nodes {
        let path = format!("{}/.gangway-synced", transport.node_path(n, ck));
        let _ = transport.write_file(n, &path, started.to_string().as_bytes());
    }
    Ok(Synced {
        at: started,
        skipped,
    })
}
