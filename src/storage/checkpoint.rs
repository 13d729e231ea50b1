//! Checkpoints in a bucket, moved by the nodes.
//!
//! Layout under `checkpoint.storage` (`s3://b/run1`):
//!
//! ```text
//! gen-<G>/rank-<R>/<path>        files rank R uploaded in generation G
//! manifests/<G>/rank-<R>.tsv     rank R's manifest of G: every file of
//!                                its checkpoint with size, mtime, the key
//!                                that holds its bytes and their MD5
//! manifests/<G>.json             G is complete: written last, by gangway,
//!                                once every rank's manifest is there
//! ```
//!
//! A generation only uploads what changed since the newest complete one
//! (same size and mtime: the old key is kept), so objects are never
//! overwritten: a killed upload leaves the previous checkpoint whole, and
//! its generation, having no `manifests/<G>.json`, is never restored.
//! gangway itself reads and writes manifests and lists keys (to prune):
//! no checkpoint byte passes through it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gangway_provider::{NodeCommand, NodeRow, Transport};
use gangway_store::{Bucket, BucketUrl, StoreError};

/// The rclone remote the checkpoint scripts use.
pub(crate) const REMOTE: &str = "gwck";

/// What went wrong with a bucket checkpoint.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("rank {rank}: {what}")]
    Node { rank: usize, what: String },
    #[error("generation {generation} lacks the manifests of ranks {missing:?}")]
    Incomplete {
        generation: u64,
        missing: Vec<usize>,
    },
    #[error("every node's checkpoint directory is empty; checkpoint {kept} stays the newest")]
    Empty { kept: u64 },
}

/// The bucket of `url`, opened with the user's credentials.
pub(crate) async fn open(url: &str) -> Result<Bucket, CheckpointError> {
    Ok(super::user_bucket(&super::bad_url(url)?).await?)
}

/// The complete generations, oldest first.
pub(crate) async fn complete(bucket: &Bucket) -> Result<Vec<u64>, StoreError> {
    let mut gens: Vec<u64> = bucket
        .list("manifests/")
        .await?
        .into_iter()
        .filter_map(|o| {
            o.key
                .strip_prefix("manifests/")?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect();
    gens.sort_unstable();
    Ok(gens)
}

/// Uploads every node's checkpoint directory as generation `generation`
/// (each node with rclone, in parallel), then marks it complete and prunes
/// to the newest `keep`. Returns the number of files in the checkpoint.
pub(crate) async fn sync(
    bucket: &Bucket,
    generation: u64,
    keep: u32,
    nodes: &[NodeRow],
    checkpoint_dirs: &[String],
    transport: Arc<dyn Transport>,
) -> Result<usize, CheckpointError> {
    let prev = complete(bucket).await?.last().copied();
    let creds = super::node_env(bucket.url(), REMOTE).await?;
    let base = bucket.url().rclone_path(REMOTE);
    let mut runs = Vec::new();
    for (rank, node) in nodes.iter().enumerate() {
        let mut env = creds.clone();
        env.extend([
            (
                "GANGWAY_CHECKPOINT_DIR".to_string(),
                checkpoint_dirs[rank].clone(),
            ),
            ("GW_CK_BASE".to_string(), base.clone()),
            ("GW_CK_GEN".to_string(), generation.to_string()),
            (
                "GW_CK_PREV".to_string(),
                prev.map(|p| p.to_string()).unwrap_or_default(),
            ),
            ("GW_CK_RANK".to_string(), rank.to_string()),
        ]);
        let cmd = NodeCommand {
            script: format!("{}{UPLOAD}", super::RCLONE_PRELUDE),
            env,
            cwd: "~".into(),
        };
        runs.push(run_on(Arc::clone(&transport), node.clone(), cmd, rank));
    }
    for r in futures::future::join_all(runs).await {
        r?;
    }
    // Complete only when every rank's manifest is there.
    let listed: BTreeSet<String> = bucket
        .list(&format!("manifests/{generation}/"))
        .await?
        .into_iter()
        .map(|o| o.key)
        .collect();
    let missing: Vec<usize> = (0..nodes.len())
        .filter(|r| !listed.contains(&format!("manifests/{generation}/rank-{r}.tsv")))
        .collect();
    if !missing.is_empty() {
        return Err(CheckpointError::Incomplete {
            generation,
            missing,
        });
    }
    let mut files = 0;
    for r in 0..nodes.len() {
        files += manifest(bucket, generation, r).await?.len();
    }
    // Nodes with nothing in their checkpoint directories never replace a
    // checkpoint that has something (a run stopped before it wrote one).
    if files == 0 {
        if let Some(p) = prev {
            let had = bucket
                .get(&format!("manifests/{p}.json"))
                .await?
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["files"].as_u64())
                .unwrap_or(0);
            if had > 0 {
                return Err(CheckpointError::Empty { kept: p });
            }
        }
    }
    let top = serde_json::json!({
        "generation": generation,
        "ranks": nodes.len(),
        "files": files,
    });
    bucket
        .put(
            &format!("manifests/{generation}.json"),
            top.to_string().into_bytes(),
        )
        .await?;
    prune(bucket, keep).await?;
    Ok(files)
}

/// One rank's manifest of `generation`: path → key.
async fn manifest(
    bucket: &Bucket,
    generation: u64,
    rank: usize,
) -> Result<BTreeMap<String, String>, StoreError> {
    let text = bucket
        .get(&format!("manifests/{generation}/rank-{rank}.tsv"))
        .await?
        .unwrap_or_default();
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() >= 4).then(|| (f[0].to_string(), f[3].to_string()))
        })
        .collect())
}

/// Keeps the newest `keep` complete generations: deletes older manifests,
/// unfinished generations older than the newest complete one, and every
/// file object no kept manifest refers to. Newer unfinished generations
/// (an upload under way) are left alone.
pub(crate) async fn prune(bucket: &Bucket, keep: u32) -> Result<(), StoreError> {
    let done = complete(bucket).await?;
    let Some(&newest) = done.last() else {
        return Ok(());
    };
    let kept: Vec<u64> = done.iter().rev().take(keep as usize).copied().collect();
    let mut referenced = BTreeSet::new();
    for g in &kept {
        let ranks: Vec<String> = bucket
            .list(&format!("manifests/{g}/"))
            .await?
            .into_iter()
            .map(|o| o.key)
            .collect();
        for key in ranks {
            let text = bucket.get(&key).await?.unwrap_or_default();
            for l in String::from_utf8_lossy(&text).lines() {
                if let Some(k) = l.split('\t').nth(3) {
                    referenced.insert(k.to_string());
                }
            }
        }
    }
    let generation_of = |key: &str| -> Option<u64> {
        let rest = key
            .strip_prefix("gen-")
            .or_else(|| key.strip_prefix("manifests/"))?;
        let g: String = rest.chars().take_while(char::is_ascii_digit).collect();
        g.parse().ok()
    };
    let mut doomed = Vec::new();
    for o in bucket.list("").await? {
        let Some(g) = generation_of(&o.key) else {
            continue;
        };
        if g > newest || kept.contains(&g) && o.key.starts_with("manifests/") {
            continue;
        }
        if o.key.starts_with("gen-") && referenced.contains(&o.key) {
            continue;
        }
        doomed.push(o.key);
    }
    // Manifests first: a generation is never complete without its files.
    doomed.sort_by_key(|k| (!k.ends_with(".json"), !k.starts_with("manifests/")));
    bucket.delete(&doomed).await
}

/// The environment that restores generation `generation` into a node's
/// checkpoint directory in its storage step (`GANGWAY_CHECKPOINT_DIR` is
/// already there).
pub(crate) fn restore_env(url: &BucketUrl, generation: u64) -> Vec<(String, String)> {
    vec![
        ("GW_CK_BASE".to_string(), url.rclone_path(REMOTE)),
        ("GW_CK_RESTORE".to_string(), generation.to_string()),
    ]
}

/// Runs `cmd` on `node` and waits; the output's tail says why it failed.
async fn run_on(
    transport: Arc<dyn Transport>,
    node: NodeRow,
    cmd: NodeCommand,
    rank: usize,
) -> Result<(), CheckpointError> {
    let fail = |what: String| CheckpointError::Node { rank, what };
    let (reader, writer) = std::io::pipe().map_err(|e| fail(e.to_string()))?;
    let child = transport
        .spawn(&node, &cmd, writer)
        .map_err(|e| fail(e.to_string()))?;
    let output = tokio::task::spawn_blocking(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { reader }, &mut s);
        s
    });
    let status = child.wait().await.map_err(|e| fail(e.to_string()))?;
    let output = output.await.unwrap_or_default();
    if status.success() {
        Ok(())
    } else {
        let tail: Vec<&str> = output.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(fail(format!(
            "checkpoint upload failed ({status}): {}",
            tail.join(" | ")
        )))
    }
}

/// Uploads this node's checkpoint as generation `GW_CK_GEN`: only files
/// that changed since generation `GW_CK_PREV` (by size and mtime), then
/// checks every one arrived whole, then writes the rank's manifest last.
const UPLOAD: &str = r#"
gw_fail() { echo "gangway: checkpoint: $*" >&2; exit 3; }
ck="$GANGWAY_CHECKPOINT_DIR"; base="$GW_CK_BASE"; gen="$GW_CK_GEN"; r="$GW_CK_RANK"; prev="${GW_CK_PREV:-}"
tmp="$(mktemp -d)" || gw_fail "no temporary directory"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$ck" || gw_fail "cannot make $ck"
(cd "$ck" && find . -type f ! -name .gangway-synced -printf '%P\t%s\t%T@\n') | LC_ALL=C sort > "$tmp/now"
: > "$tmp/prev"
if [ -n "$prev" ]; then rclone cat "$base/manifests/$prev/rank-$r.tsv" > "$tmp/prev" 2>/dev/null || : > "$tmp/prev"; fi
# Unchanged files keep the key (and hash) that already holds their bytes.
awk -F'\t' -v kept="$tmp/kept" -v up="$tmp/up" '
  FILENAME == ARGV[1] { was[$1] = $2 "\t" $3; line[$1] = $0; next }
  ($1 in was) && was[$1] == $2 "\t" $3 { print line[$1] > kept; next }
  { print $1 > up }' "$tmp/prev" "$tmp/now"
touch "$tmp/kept" "$tmp/up"
dest="$base/gen-$gen/rank-$r"
: > "$tmp/new"
if [ -s "$tmp/up" ]; then
  rclone copy "$ck" "$dest" --files-from-raw "$tmp/up" --no-traverse --transfers 16 --checkers 16 \
    || gw_fail "rclone copy to $dest failed"
  rclone lsf -R --files-only --format psh --separator "	" --hash MD5 "$dest" | LC_ALL=C sort > "$tmp/got" \
    || gw_fail "cannot list $dest"
  awk -F'\t' -v key="gen-$gen/rank-$r" -v bad="$tmp/bad" '
    FILENAME == ARGV[1] { size[$1] = $2; md5[$1] = $3; next }
    FILENAME == ARGV[2] { want[$1] = 1; next }
    ($1 in want) {
      if (!($1 in size) || size[$1] != $2) { print $1 > bad; next }
      print $1 "\t" $2 "\t" $3 "\t" key "/" $1 "\t" md5[$1]
    }' "$tmp/got" "$tmp/up" "$tmp/now" > "$tmp/new"
  [ -s "$tmp/bad" ] && gw_fail "not uploaded whole (changed while copying?): $(head -n 3 "$tmp/bad" | tr '\n' ' ')"
fi
LC_ALL=C sort "$tmp/kept" "$tmp/new" > "$tmp/manifest"
rclone rcat "$base/manifests/$gen/rank-$r.tsv" < "$tmp/manifest" || gw_fail "cannot write the manifest"
echo "checkpoint rank $r: $(wc -l < "$tmp/manifest") files, $(wc -l < "$tmp/up") uploaded"
"#;

/// Restores generation `GW_CK_RESTORE` into `GANGWAY_CHECKPOINT_DIR`: the
/// union of every rank's files, the newest copy of a path winning (as the
/// directory sync does), each fetched from the generation that holds its
/// bytes.
pub(crate) const RESTORE: &str = r#"
if [ -n "${GW_CK_RESTORE:-}" ]; then
  ck="$GANGWAY_CHECKPOINT_DIR"; base="$GW_CK_BASE"; gen="$GW_CK_RESTORE"
  tmp="$(mktemp -d)" || gw_fail "no temporary directory"
  mkdir -p "$ck" || gw_fail "cannot make $ck"
  rclone lsf --files-only "$base/manifests/$gen/" > "$tmp/ranks" \
    || gw_fail "cannot list the manifests of checkpoint $gen"
  : > "$tmp/all"
  while read -r m; do
    rclone cat "$base/manifests/$gen/$m" >> "$tmp/all" || gw_fail "cannot read $m of checkpoint $gen"
  done < "$tmp/ranks"
  # The newest copy of each path, grouped by the generation and rank that
  # hold its bytes.
  awk -F'\t' -v dir="$tmp" '
    !($1 in t) || $3 + 0 > t[$1] + 0 { t[$1] = $3; key[$1] = $4 }
    END { for (p in key) { split(key[p], k, "/"); print p > (dir "/list." k[1] "%" k[2]) } }' "$tmp/all"
  for list in "$tmp"/list.*; do
    [ -e "$list" ] || continue
    src="$(basename "$list" | sed 's/^list\.//; s/%/\//g')"
    rclone copy "$base/$src" "$ck" --files-from-raw "$list" --no-traverse --transfers 16 \
      || gw_fail "cannot restore $src of checkpoint $gen"
  done
  rm -rf "$tmp"
  echo "restored checkpoint $gen into $ck"
fi
"#;
