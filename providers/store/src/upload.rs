//! A local directory into a bucket, from the machine gangway runs on: a
//! task's local `source` for a bucket it creates, a managed job's workdir.
//! Only what changed is sent (as `aws s3 sync` decides: a different size,
//! or a local file newer than the object); large files go in parts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutPayload};
use tokio::io::AsyncReadExt;

use crate::{Bucket, StoreError};

/// Files above this go in parts of this size.
const PART: usize = 16 << 20;
/// Files sent at once.
const AT_ONCE: usize = 8;

/// What [`Bucket::upload_dir`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uploaded {
    /// Files sent.
    pub sent: usize,
    /// Files already there, unchanged.
    pub kept: usize,
    /// Bytes sent.
    pub bytes: u64,
}

/// Every regular file below `root`: its path relative to `root` with `/`
/// separators, size and modification time (ms). Symbolic links are
/// followed, as a copy would.
fn walk(root: &Path) -> std::io::Result<Vec<(String, PathBuf, u64, i64)>> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let meta = std::fs::metadata(&path)?;
            if meta.is_dir() {
                dirs.push(path);
            } else if meta.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                let mtime = meta
                    .modified()?
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                out.push((rel, path, meta.len(), mtime));
            }
        }
    }
    out.sort();
    Ok(out)
}

impl Bucket {
    /// Copies the directory `local` (or one file) below `under` in the
    /// bucket, sending only files that are missing there, differ in size,
    /// or are newer here than there. Nothing there is deleted.
    pub async fn upload_dir(&self, local: &Path, under: &str) -> Result<Uploaded, StoreError> {
        let io = |e: std::io::Error| StoreError::Store {
            url: self.url.clone(),
            reason: format!("reading {}: {e}", local.display()),
        };
        let files = if local.is_file() {
            let meta = std::fs::metadata(local).map_err(io)?;
            let name = local
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mtime = meta
                .modified()
                .map_err(io)?
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            vec![(name, local.to_path_buf(), meta.len(), mtime)]
        } else {
            walk(local).map_err(io)?
        };
        let under = under.trim_matches('/');
        let key = |rel: &str| {
            if under.is_empty() {
                rel.to_string()
            } else {
                format!("{under}/{rel}")
            }
        };
        let there: HashMap<String, (u64, i64)> = match self.list(under).await {
            Ok(objects) => objects
                .into_iter()
                .map(|o| (o.key, (o.size, o.modified_ms)))
                .collect(),
            Err(e) => return Err(e),
        };
        let mut done = Uploaded::default();
        let mut todo = Vec::new();
        for (rel, path, size, mtime) in files {
            let k = key(&rel);
            match there.get(&k) {
                // Stores keep whole seconds (S3's Last-Modified): compared
                // at that grain, a file written in the second it was
                // uploaded counts as unchanged unless its size changed.
                Some(&(s, m)) if s == size && m.div_euclid(1000) >= mtime.div_euclid(1000) => {
                    done.kept += 1
                }
                _ => todo.push((k, path, size)),
            }
        }
        done.sent = todo.len();
        done.bytes = todo.iter().map(|t| t.2).sum();
        futures::stream::iter(todo)
            .map(|(k, path, size)| async move { self.put_file(&k, &path, size).await })
            .buffer_unordered(AT_ONCE)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(done)
    }

    /// One file at `key`: whole when small, in parts when large.
    async fn put_file(&self, key: &str, path: &Path, size: u64) -> Result<(), StoreError> {
        let io = |e: std::io::Error| StoreError::Store {
            url: self.url.clone(),
            reason: format!("reading {}: {e}", path.display()),
        };
        if size <= PART as u64 || cfg!(not(any(feature = "s3", feature = "gcs"))) {
            let bytes = tokio::fs::read(path).await.map_err(io)?;
            return self
                .store
                .put(&self.path(key), PutPayload::from(bytes))
                .await
                .map(|_| ())
                .map_err(|e| self.fail(e));
        }
        #[cfg(any(feature = "s3", feature = "gcs"))]
        {
            let upload = self
                .store
                .put_multipart(&self.path(key))
                .await
                .map_err(|e| self.fail(e))?;
            let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, PART);
            let mut f = tokio::fs::File::open(path).await.map_err(io)?;
            let mut buf = vec![0u8; PART];
            loop {
                let n = f.read(&mut buf).await.map_err(io)?;
                if n == 0 {
                    break;
                }
                w.wait_for_capacity(4).await.map_err(|e| self.fail(e))?;
                w.write(&buf[..n]);
            }
            w.finish().await.map(|_| ()).map_err(|e| self.fail(e))
        }
        #[cfg(not(any(feature = "s3", feature = "gcs")))]
        Err(StoreError::Store {
            url: self.url.clone(),
            reason: "this gangway was built without any store".into(),
        })
    }
}
