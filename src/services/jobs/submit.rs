//! Submitting a managed job: the task read, checked and staged once
//! (buckets made, local files uploaded to jobs.bucket, secrets taken out of
//! the kept copy), then registered with an id for a controller.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{signal_number, ManagedTask};
use crate::core::gang::JobSpec;
use crate::core::spec::{Overrides, Task};
use crate::core::state::Store;
use crate::services::launch::{job_spec, secrets_of};
use crate::Error;

/// What `jobs launch` asks for.
pub(crate) struct Launch<'a> {
    /// The task, overrides applied.
    pub task: &'a Task,
    /// Its file.
    pub task_file: &'a Path,
    /// The overrides, kept for recoveries.
    pub overrides: Overrides,
    /// `--name`.
    pub name: Option<String>,
    /// `--catalog`, for the controller's plans.
    pub catalog: Option<&'a Path>,
}

/// `checkpoint.storage`: a local directory (default: the job's own), or a
/// bucket, checked now (it exists, these credentials may list it), before
/// anything is provisioned.
fn checkpoint_storage(
    task: &crate::core::spec::Task,
    file: &Path,
    default: PathBuf,
    own: &crate::core::storage::OwnIdentity,
) -> Result<(PathBuf, Option<String>), Error> {
    let Some(ck) = task.checkpoint.as_ref() else {
        return Ok((default, None));
    };
    match ck.storage.clone() {
        None => Ok((default, None)),
        Some(s) if s.contains("://") => {
            let url = crate::core::storage::check_checkpoint_bucket(&s, file, ck.storage_at, own)?;
            Ok((default, Some(url)))
        }
        Some(s) => {
            let p = PathBuf::from(&s);
            Ok((std::path::absolute(&p).unwrap_or(p), None))
        }
    }
}

/// A managed job ready for a controller: everything but its id, as the
/// laptop sends it to a hosted controller (over the SSH connection's
/// stdin: secrets included, never on a command line).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Submission {
    /// `--name`, or the task's.
    pub(crate) name: Option<String>,
    /// The task file with literal secret values taken out.
    pub(crate) task_text: String,
    /// The job; `task_file`, and `storage` where `own_storage`, are placed
    /// by the side that registers it.
    pub(crate) task: ManagedTask,
    /// Whether the checkpoints go to the job's own directory.
    pub(crate) own_storage: bool,
    /// The task's secrets, for its recoveries.
    pub(crate) secrets: Vec<(String, String)>,
    /// Buckets made for the job (URL, persistent): the job's end deletes
    /// the others.
    pub(crate) buckets: Vec<(String, bool)>,
}

/// What ends the tar stream of a job's local files: a stream cut short
/// (the laptop's gangway killed, its connection lost) lacks it, even where
/// the cut falls between two files, and is refused.
const FILES_END: &[u8] = b"gangway: end of the job's files\n";

/// Whether `spec` has local files (a workdir, local file mounts), and how
/// many bytes in how many files: what [`write_local_files`] sends.
pub(crate) fn local_files_size(spec: &JobSpec) -> Option<(u64, u64)> {
    fn walk(p: &Path, total: &mut (u64, u64)) {
        let Ok(m) = std::fs::symlink_metadata(p) else {
            return;
        };
        if m.is_dir() {
            for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                walk(&e.path(), total);
            }
        } else {
            total.0 += m.len();
            total.1 += 1;
        }
    }
    if spec.workdir.is_none() && spec.file_mounts.is_empty() {
        return None;
    }
    let mut total = (0, 0);
    for p in spec
        .workdir
        .iter()
        .chain(spec.file_mounts.iter().map(|(_, p)| p))
    {
        walk(p, &mut total);
    }
    Some(total)
}

/// Writes the workdir and local file mounts of `spec` to `w` as one tar
/// stream (`workdir/...`, `mounts/<i>...`; links as links) and its end
/// mark, as it reads them: for a controller host that has no jobs.bucket
/// to fetch them from ([`receive_files`] unpacks it there as it arrives).
pub(crate) fn write_local_files(spec: &JobSpec, w: &mut dyn Write) -> std::io::Result<()> {
    let mut b = tar::Builder::new(&mut *w);
    b.follow_symlinks(false);
    let mut add = |name: &str, path: &Path| -> std::io::Result<()> {
        let what =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        if path.is_dir() {
            b.append_dir_all(name, path).map_err(what)
        } else {
            b.append_path_with_name(path, name).map_err(what)
        }
    };
    if let Some(wd) = &spec.workdir {
        add("workdir", wd)?;
    }
    for (i, (_, src)) in spec.file_mounts.iter().enumerate() {
        add(&format!("mounts/{i}"), src)?;
    }
    b.finish()?;
    drop(b);
    w.write_all(FILES_END)?;
    w.flush()
}

/// On a controller host: unpacks what [`write_local_files`] wrote, read
/// from `packed` as it arrives, into a directory of its own under `home`
/// and points `sub`'s workdir and file mounts there, for every run of the
/// job; the job's end deletes it. A stream without its end mark is
/// refused, and what it brought is deleted.
pub(crate) fn receive_files(
    sub: &mut Submission,
    packed: impl std::io::Read,
    home: &Path,
) -> std::io::Result<()> {
    let tag = format!("{}-{}", crate::core::state::now_ms(), std::process::id());
    let dir = home.join("jobs-files").join(tag);
    std::fs::create_dir_all(&dir)?;
    let received = unpack_files(packed, &dir);
    if let Err(e) = received {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    let spec = &mut sub.task.spec;
    if spec.workdir.is_some() {
        spec.workdir = Some(dir.join("workdir"));
    }
    for (i, (_, src)) in spec.file_mounts.iter_mut().enumerate() {
        *src = dir.join("mounts").join(i.to_string());
    }
    sub.task.files_dir = Some(dir);
    Ok(())
}

/// Unpacks the stream [`write_local_files`] wrote into `dir` (made
/// private to its owner): an error when it lacks its end mark.
fn unpack_files(mut packed: impl std::io::Read, dir: &Path) -> std::io::Result<()> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    // tar refuses members that would land outside `dir`.
    tar::Archive::new(&mut packed).unpack(dir)?;
    // The archive's last zero block, then the end mark.
    let mut rest = Vec::new();
    (&mut packed).take(64 * 1024).read_to_end(&mut rest)?;
    let start = rest.iter().position(|b| *b != 0).unwrap_or(rest.len());
    if &rest[start..] != FILES_END {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the stream of files ended early (the laptop's gangway stopped or its connection was lost)",
        ));
    }
    Ok(())
}

/// Reads, checks and stages a task for `jobs launch`: buckets it makes are
/// recorded in `store` under `pending` until the job is registered.
pub(crate) fn prepare(
    a: &Launch<'_>,
    store: &Store,
    pending: &str,
    hosted: Option<&str>,
) -> Result<Submission, Error> {
    let task = a.task;
    let task_file = a.task_file;
    let mut spec = job_spec(task, task_file, true, false)?;
    // Nodes with an identity of their own need no credentials from here:
    // those are checked (and made) at each run's storage step instead.
    let own = {
        let home = crate::core::config::gangway_home()?;
        let config = crate::core::config::launch_config(task, &home)?;
        crate::core::storage::OwnIdentity::configured(
            config.as_ref(),
            &crate::core::registry::Providers::new(&home),
        )
    };
    crate::core::storage::preflight_now(task, task_file, &spec.bucket_mounts, &own)?;
    // With jobs.bucket, the workdir and local file mounts go to the store
    // once, now: recoveries fetch them from there, not from this machine.
    let local_files = spec.workdir.is_some() || !spec.file_mounts.is_empty();
    let job_files = match crate::core::config::jobs_bucket(task, store.home())? {
        Some(b) if local_files => {
            let tag = format!("{}-{}", crate::core::state::now_ms(), std::process::id());
            Some(crate::core::runtime::runtime()?.block_on(
                crate::core::storage::stage_job_files(
                    &b,
                    spec.take_local_files(),
                    &mut spec.bucket_mounts,
                    &tag,
                ),
            )?)
        }
        _ => None,
    };
    let secrets = secrets_of(task);
    // The copy recoveries plan from, with literal secret values taken out
    // (they are in secrets.json, owner-only, until the job ends).
    let text = std::fs::read_to_string(task_file)?;
    let redacted = crate::core::spec::redact_secrets(&text, &task_file.display().to_string())
        .map_err(|e| Error::usage(e.to_string(), None))?;
    // Buckets the task names and lacks are made now, once: recoveries
    // reuse them. Held under a placeholder owner until the job has an id.
    if let Err(e) =
        crate::core::storage::make_buckets_now(task, task_file, &spec.bucket_mounts, store, pending)
    {
        crate::core::storage::remove_buckets_now(store, pending);
        return Err(e);
    }
    let ck = task.checkpoint.clone().unwrap_or_default();
    let (storage, storage_url) = checkpoint_storage(task, task_file, PathBuf::new(), &own)?;
    let own_storage = storage.as_os_str().is_empty();
    if own_storage && storage_url.is_none() && task.checkpoint.is_some() {
        if let Some(host) = hosted {
            eprintln!(
                "gangway: the checkpoints are kept on the controller host {host}; \
                 checkpoint.storage: s3://... or gs://... keeps them in a bucket the nodes write themselves"
            );
        }
    }
    let recovery = task.resources.job_recovery.clone();
    let buckets = store
        .buckets_of(pending)?
        .into_iter()
        .map(|b| (b.url, b.persistent))
        .collect();
    Ok(Submission {
        name: a.name.clone().or_else(|| task.name.clone()),
        task_text: redacted,
        own_storage,
        secrets,
        buckets,
        task: ManagedTask {
            task_file: PathBuf::new(),
            task_path: task_file.display().to_string(),
            overrides: a.overrides.clone(),
            // Absolute: the controller runs elsewhere in the file system.
            catalog_dir: a
                .catalog
                .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_path_buf())),
            spec,
            storage,
            storage_url,
            job_files,
            files_dir: None,
            keep: ck.keep,
            sync_interval_s: ck.sync_interval_s as f64,
            signal: signal_number(&ck.signal),
            grace_s: ck.grace_s as f64,
            strategy: recovery
                .as_ref()
                .and_then(|r| r.strategy.clone())
                .unwrap_or_else(|| super::controller::replace::REPLACE_LOST_NODES.into()),
            max_restarts_on_errors: recovery.as_ref().map_or(0, |r| r.max_restarts_on_errors),
            recover_on_exit_codes: recovery
                .as_ref()
                .map(|r| r.recover_on_exit_codes.clone())
                .unwrap_or_default(),
            deadline_s: task.deadline_s.map(|d| d as f64),
            work_s: task.deadline_work_s.map(|w| w as f64),
            policy: task.deadline_policy.clone(),
        },
    })
}

/// Gives a prepared job an id in `store`: its directory, the redacted task,
/// its secrets (owner-only) and its buckets (those under `pending` in this
/// store, or the submission's list).
pub(crate) fn register(
    store: &Store,
    sub: Submission,
    pending: Option<&str>,
) -> Result<i64, Error> {
    let placeholder = "{}";
    let job = store.add_managed(sub.name.as_deref(), placeholder)?;
    let owner = format!("job:{}", job.id);
    match pending {
        Some(p) => store.move_buckets(p, &owner)?,
        None => {
            for (url, persistent) in &sub.buckets {
                // Made by the submitting side for this job: its own.
                let _ = store.add_bucket(url, &owner, *persistent)?;
            }
        }
    }
    let dir = store.managed_dir(job.id);
    std::fs::create_dir_all(&dir)?;
    let task_file = dir.join("task.yaml");
    std::fs::write(&task_file, &sub.task_text)?;
    if !sub.secrets.is_empty() {
        // Kept only so a recovery can hand them to the new nodes; owner-only,
        // removed when the job ends.
        let mut f = std::fs::File::options()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(dir.join("secrets.json"))?;
        f.write_all(
            serde_json::to_string(&sub.secrets)
                .map_err(std::io::Error::from)?
                .as_bytes(),
        )?;
    }
    let mut mt = sub.task;
    mt.task_file = task_file;
    if sub.own_storage {
        mt.storage = dir.join("checkpoint");
    }
    let text = serde_json::to_string(&mt).map_err(std::io::Error::from)?;
    store.set_managed_task(job.id, &text)?;
    Ok(job.id)
}

/// A placeholder owner for the buckets of a job not yet registered.
pub(crate) fn pending_owner() -> String {
    format!(
        "job:pending-{}-{}",
        std::process::id(),
        crate::core::state::now_ms()
    )
}

/// Whether a controller has work: live jobs, or ended ones whose cluster
/// is still there (it was killed before the teardown, or the teardown
/// failed and is retried).
/// The same query the controller watches.
pub(crate) fn needs_controller(store: &Store) -> Result<bool, Error> {
    Ok(!store.managed_watch()?.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec with a workdir of `files` and one file mount.
    fn spec_with(dir: &Path) -> JobSpec {
        let wd = dir.join("wd");
        std::fs::create_dir_all(wd.join("sub")).unwrap();
        std::fs::write(wd.join("a.py"), "print(1)\n").unwrap();
        std::fs::write(wd.join("sub/b.bin"), vec![9u8; 3000]).unwrap();
        std::fs::write(dir.join("one.txt"), "one\n").unwrap();
        JobSpec {
            workdir: Some(wd),
            file_mounts: vec![("~/one.txt".into(), dir.join("one.txt"))],
            ..JobSpec::default()
        }
    }

    #[test]
    fn the_files_arrive_whole_or_not_at_all() {
        let t = tempfile::tempdir().unwrap();
        let spec = spec_with(t.path());
        assert_eq!(local_files_size(&spec), Some((9 + 3000 + 4, 3)));
        let mut stream = Vec::new();
        write_local_files(&spec, &mut stream).unwrap();

        let whole = t.path().join("whole");
        std::fs::create_dir(&whole).unwrap();
        unpack_files(stream.as_slice(), &whole).unwrap();
        assert_eq!(
            std::fs::read(whole.join("workdir/sub/b.bin")).unwrap(),
            vec![9u8; 3000]
        );
        assert_eq!(
            std::fs::read_to_string(whole.join("mounts/0")).unwrap(),
            "one\n"
        );

        // Cut anywhere, even between two files or in the end mark: refused.
        let cuts = [
            stream.len() - 1,
            stream.len() - FILES_END.len(),
            512 * 3,
            100,
        ];
        for cut in cuts {
            let part = t.path().join(format!("cut-{cut}"));
            std::fs::create_dir(&part).unwrap();
            assert!(
                unpack_files(&stream[..cut], &part).is_err(),
                "a stream cut at {cut} of {} was taken",
                stream.len()
            );
        }
    }
}
