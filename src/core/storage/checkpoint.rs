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

use std::collections::BTreeSet;
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

/// What a sync left as the newest complete checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Synced {
    /// Its generation.
    pub(crate) generation: u64,
    /// Files in it (every rank's).
    pub(crate) files: usize,
    /// Whether this sync made it (false: nothing had changed since the
    /// newest one, which stays).
    pub(crate) new: bool,
}

/// What one rank's upload reported (its last line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RankReport {
    files: usize,
    unchanged: bool,
}

/// Uploads every node's checkpoint directory as generation `generation`
/// (each node with rclone, in parallel), then marks it complete. When no
/// node's files changed since the newest complete checkpoint, nothing is
/// written: that checkpoint is still whole and current. [`prune`] after
/// telling the run: the checkpoint is safe before the old ones go.
pub(crate) async fn sync(
    bucket: &Bucket,
    generation: u64,
    nodes: &[NodeRow],
    checkpoint_dirs: &[String],
    transport: Arc<dyn Transport>,
) -> Result<Synced, CheckpointError> {
    let done = complete(bucket).await?;
    let prev = done.last().copied();
    let own = super::OwnIdentity::of_nodes(nodes);
    let upload = Upload {
        creds: super::bucket_env(bucket.url(), REMOTE, &own).await?,
        base: bucket.url().rclone_path(REMOTE),
        generation,
        prev,
    };
    let reports = upload.run(nodes, checkpoint_dirs, transport).await?;
    let files: usize = reports.iter().map(|r| r.files).sum();
    if let Some(p) = prev {
        if reports.iter().all(|r| r.unchanged) {
            return Ok(Synced {
                generation: p,
                files,
                new: false,
            });
        }
        carry_unchanged_manifests(bucket, p, generation, &reports).await?;
    }
    every_manifest_there(bucket, generation, nodes.len()).await?;
    // Nodes with nothing in their checkpoint directories never replace a
    // checkpoint that has something (a run stopped before it wrote one).
    if files == 0 {
        if let Some(p) = prev {
            empty_may_replace(bucket, p).await?;
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
    Ok(Synced {
        generation,
        files,
        new: true,
    })
}

/// One generation's upload, the same for every node but the rank.
struct Upload {
    /// The bucket's credentials for rclone.
    creds: Vec<(String, String)>,
    /// The checkpoint's place as an rclone path.
    base: String,
    generation: u64,
    /// The newest complete generation, whose unchanged files are kept.
    prev: Option<u64>,
}

impl Upload {
    /// Runs the upload on every node at once; each rank's report, in order.
    async fn run(
        &self,
        nodes: &[NodeRow],
        checkpoint_dirs: &[String],
        transport: Arc<dyn Transport>,
    ) -> Result<Vec<RankReport>, CheckpointError> {
        let runs = nodes.iter().enumerate().map(|(rank, node)| {
            let cmd = self.command(rank, &checkpoint_dirs[rank]);
            run_on(Arc::clone(&transport), node.clone(), cmd, rank)
        });
        let mut reports = Vec::new();
        for r in futures::future::join_all(runs).await {
            reports.push(r?);
        }
        Ok(reports)
    }

    /// The upload script for rank `rank`, whose checkpoints are in `dir`.
    fn command(&self, rank: usize, dir: &str) -> NodeCommand {
        let mut env = self.creds.clone();
        env.extend(super::rclone_source_env());
        env.extend([
            ("GANGWAY_CHECKPOINT_DIR".to_string(), dir.to_string()),
            ("GW_CK_BASE".to_string(), self.base.clone()),
            ("GW_CK_GEN".to_string(), self.generation.to_string()),
            (
                "GW_CK_PREV".to_string(),
                self.prev.map(|p| p.to_string()).unwrap_or_default(),
            ),
            ("GW_CK_RANK".to_string(), rank.to_string()),
        ]);
        NodeCommand {
            script: format!(
                "{}{}{MANIFESTS}{UPLOAD}",
                super::RCLONE_PRELUDE,
                super::manifest::VALIDATE
            ),
            env,
            cwd: "~".into(),
            task_view: false,
        }
    }
}

/// A rank whose files did not change wrote no manifest: its manifest of
/// `prev` becomes its manifest of `generation` too (metadata, not bytes).
async fn carry_unchanged_manifests(
    bucket: &Bucket,
    prev: u64,
    generation: u64,
    reports: &[RankReport],
) -> Result<(), StoreError> {
    for (rank, r) in reports.iter().enumerate() {
        if r.unchanged {
            let m = bucket
                .get(&format!("manifests/{prev}/rank-{rank}.tsv"))
                .await?
                .unwrap_or_default();
            bucket
                .put(&format!("manifests/{generation}/rank-{rank}.tsv"), m)
                .await?;
        }
    }
    Ok(())
}

/// Fails unless each of the `ranks` ranks has its manifest of
/// `generation`: the generation may only be marked complete then.
async fn every_manifest_there(
    bucket: &Bucket,
    generation: u64,
    ranks: usize,
) -> Result<(), CheckpointError> {
    let listed: BTreeSet<String> = bucket
        .list(&format!("manifests/{generation}/"))
        .await?
        .into_iter()
        .map(|o| o.key)
        .collect();
    let missing: Vec<usize> = (0..ranks)
        .filter(|r| !listed.contains(&format!("manifests/{generation}/rank-{r}.tsv")))
        .collect();
    if !missing.is_empty() {
        return Err(CheckpointError::Incomplete {
            generation,
            missing,
        });
    }
    Ok(())
}

/// Fails when complete generation `prev` holds files, which an empty
/// generation must not replace.
async fn empty_may_replace(bucket: &Bucket, prev: u64) -> Result<(), CheckpointError> {
    let had = bucket
        .get(&format!("manifests/{prev}.json"))
        .await?
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["files"].as_u64())
        .unwrap_or(0);
    if had > 0 {
        return Err(CheckpointError::Empty { kept: prev });
    }
    Ok(())
}

/// The keys a rank manifest's lines point at: only lines a restore would
/// take ([`super::manifest`]'s rules); the others name nothing to keep.
fn keys_in(text: &[u8]) -> impl Iterator<Item = String> + '_ {
    std::str::from_utf8(text)
        .unwrap_or_default()
        .split('\n')
        .filter_map(|l| super::manifest::parse_line(l, u64::MAX).ok())
        .map(|l| l.key.to_string())
}

/// Keeps the newest `keep` complete generations: deletes older
/// manifests, unfinished generations older than the newest complete one,
/// and every file object no kept manifest refers to. Newer unfinished
/// generations (an upload under way) are left alone. Lists only the
/// manifests, the top level and the generations it removes: a prune that
/// removes nothing makes three listing requests.
pub(crate) async fn prune(bucket: &Bucket, keep: u32) -> Result<(), StoreError> {
    prune_to(bucket, keep, &complete(bucket).await?).await
}

async fn prune_to(bucket: &Bucket, keep: u32, done: &[u64]) -> Result<(), StoreError> {
    let Some(&newest) = done.last() else {
        return Ok(());
    };
    let kept: Vec<u64> = done.iter().rev().take(keep as usize).copied().collect();
    let number = |dir: &str, prefix: &str| -> Option<u64> {
        dir.trim_end_matches('/').strip_prefix(prefix)?.parse().ok()
    };
    // Generations with files, and with manifests (complete or not).
    let with_files: Vec<u64> = bucket
        .list_dirs("")
        .await?
        .iter()
        .filter_map(|d| number(d, "gen-"))
        .collect();
    let with_manifests: Vec<u64> = bucket
        .list_dirs("manifests/")
        .await?
        .iter()
        .filter_map(|d| number(d, "manifests/"))
        .collect();
    let doomed = |g: &u64| *g < newest && !kept.contains(g);
    let doomed_files: BTreeSet<u64> = with_files.iter().copied().filter(doomed).collect();
    let doomed_manifests: BTreeSet<u64> = with_manifests
        .iter()
        .chain(done)
        .copied()
        .filter(doomed)
        .collect();
    if doomed_files.is_empty() && doomed_manifests.is_empty() {
        return Ok(());
    }
    // What the kept checkpoints still point at, in older generations too.
    let mut referenced = BTreeSet::new();
    if !doomed_files.is_empty() {
        for g in &kept {
            for m in bucket.list(&format!("manifests/{g}/")).await? {
                referenced.extend(keys_in(&bucket.get(&m.key).await?.unwrap_or_default()));
            }
        }
    }
    // Manifests first: a generation is never complete without its files.
    let mut marks = Vec::new();
    let mut ranks = Vec::new();
    for g in &doomed_manifests {
        marks.push(format!("manifests/{g}.json"));
        ranks.extend(
            bucket
                .list(&format!("manifests/{g}/"))
                .await?
                .into_iter()
                .map(|o| o.key),
        );
    }
    bucket.delete(&marks).await?;
    bucket.delete(&ranks).await?;
    for g in &doomed_files {
        let unreferenced: Vec<String> = bucket
            .list(&format!("gen-{g}/"))
            .await?
            .into_iter()
            .map(|o| o.key)
            .filter(|k| !referenced.contains(k))
            .collect();
        bucket.delete(&unreferenced).await?;
    }
    Ok(())
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
) -> Result<RankReport, CheckpointError> {
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
        // "gangway-checkpoint files=N unchanged=0|1", the script's last word.
        let line = output
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("gangway-checkpoint "))
            .ok_or_else(|| fail(format!("no report from the upload: {}", output.trim())))?;
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse::<usize>().ok())
        };
        Ok(RankReport {
            files: field("files=").unwrap_or(0),
            unchanged: field("unchanged=") == Some(1),
        })
    } else {
        let tail: Vec<&str> = output.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(fail(format!(
            "checkpoint upload failed ({status}): {}",
            tail.join(" | ")
        )))
    }
}

/// Every rank's manifest of checkpoint `$1` under `GW_CK_BASE`, one after
/// another into the file `$2`, with one rclone (a start per rank would
/// cost seconds on a large gang); fails when rclone or reading one does,
/// and (exit 2, `gw_ck_why` naming the manifest and line) when a line breaks
/// the rules of [`super::manifest`], before anything it names is copied.
/// Only `rank-<R>.tsv` files are read. Part of [`UPLOAD`]'s and
/// [`RESTORE`]'s scripts.
pub(crate) const MANIFESTS: &str = r#"
gw_ck_manifests() {
  gw_d="$(mktemp -d)" || return 1
  rclone copy "$GW_CK_BASE/manifests/$1/" "$gw_d" --transfers 16 || { rm -rf "$gw_d"; return 1; }
  : > "$2"
  for gw_m in "$gw_d"/rank-*.tsv; do
    [ -e "$gw_m" ] || continue
    case "${gw_m##*/}" in rank-*[!0-9]*.tsv) continue ;; esac
    gw_ck_why="$(gw_ck_valid "$1" "$gw_m" "manifests/$1/${gw_m##*/}" 2>&1)" || { rm -rf "$gw_d"; return 2; }
    cat "$gw_m" >> "$2" || { rm -rf "$gw_d"; return 1; }
  done
  rm -rf "$gw_d"
}
"#;

/// Uploads this node's checkpoint as generation `GW_CK_GEN`: only files
/// that changed since generation `GW_CK_PREV` (by size and mtime), each
/// checked by rclone against the store's own hash of it and hashed here
/// meanwhile for the manifest; fails when a file moved during the upload;
/// writes the rank's manifest last.
const UPLOAD: &str = r#"
gw_fail() { echo "gangway: checkpoint: $*" >&2; exit 3; }
ck="$(gw_path "$GANGWAY_CHECKPOINT_DIR")"; base="$GW_CK_BASE"; gen="$GW_CK_GEN"; r="$GW_CK_RANK"; prev="${GW_CK_PREV:-}"
tmp="$(mktemp -d)" || gw_fail "no temporary directory"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$ck" || gw_fail "cannot make $ck"
gw_need_rclone
# gangway's own files (.gangway-*) are not part of the checkpoint.
(cd "$ck" && find . -type f ! -name '.gangway-*' -printf '%P\t%s\t%T@\n') | LC_ALL=C sort > "$tmp/now"
: > "$tmp/prev"
# The previous checkpoint as this node knows it (the manifest it wrote or
# restored last), else every rank's manifest of it from the bucket: a file
# restored from another rank's upload keeps that upload's key.
if [ -n "$prev" ]; then
  if [ -f "$ck/.gangway-manifest-$prev" ]; then cp "$ck/.gangway-manifest-$prev" "$tmp/prev"
  else
    gw_ck_manifests "$prev" "$tmp/prev" 2>/dev/null || : > "$tmp/prev"
  fi
fi
# Unchanged files (same path, size and mtime) keep the key (and hash)
# that already holds their bytes.
awk -F'\t' -v kept="$tmp/kept" -v up="$tmp/up" '
  FILENAME == ARGV[1] { line[$1 "\t" $2 "\t" $3] = $0; next }
  (($1 "\t" $2 "\t" $3) in line) { print line[$1 "\t" $2 "\t" $3] > kept; next }
  { print $1 > up }' "$tmp/prev" "$tmp/now"
touch "$tmp/kept" "$tmp/up"
files=$(wc -l < "$tmp/now")
if [ -n "$prev" ] && [ ! -s "$tmp/up" ] && cmp -s "$tmp/kept" "$tmp/prev"; then
  # Nothing changed, nothing went: the previous checkpoint is this one.
  cp "$tmp/prev" "$ck/.gangway-manifest-$prev" 2>/dev/null
  echo "gangway-checkpoint files=$files unchanged=1"
  exit 0
fi
dest="$base/gen-$gen/rank-$r"
: > "$tmp/new"
if [ -s "$tmp/up" ]; then
  command -v md5sum >/dev/null 2>&1 || gw_fail "md5sum is not installed on this node (coreutils or busybox has it)"
  # Each file's MD5 for the manifest, hashed here while rclone uploads it:
  # rclone checks every upload against the hash the store reports, so no
  # listing of what landed is needed (on 10,000 small files that listing
  # took as long as a tenth of the upload). One md5sum at a time: parallel
  # ones would interleave their lines.
  (cd "$ck" && awk '{ printf "./%s%c", $0, 0 }' "$tmp/up" | xargs -0 -r -n 1000 md5sum) > "$tmp/md5" 2> "$tmp/md5err" &
  hashing=$!
  # The generation's prefix is new: nothing there to compare with, so no
  # per-file lookup (--no-check-dest) before each upload.
  rclone copy "$ck" "$dest" --files-from-raw "$tmp/up" --no-traverse --no-check-dest --transfers 16 --checkers 16 \
    || { kill "$hashing" 2>/dev/null; gw_fail "rclone copy to $dest failed"; }
  wait "$hashing" || gw_fail "cannot hash the checkpoint's files: $(head -n 3 "$tmp/md5err" | tr '\n' ' ')"
  # What went up and what was hashed must be what was listed before: a
  # file whose size or mtime moved meanwhile was being written.
  (cd "$ck" && find . -type f ! -name '.gangway-*' -printf '%P\t%s\t%T@\n') | LC_ALL=C sort > "$tmp/after"
  awk -F'\t' -v key="gen-$gen/rank-$r" -v bad="$tmp/bad" -v md5="$tmp/md5" '
    BEGIN {
      # md5sum answers in the order it was asked, one line per file ("\\"
      # first where it escaped the name): the nth hash is the nth path.
      while ((getline p < ARGV[1]) > 0) {
        if ((getline l < md5) <= 0) break
        if (substr(l, 1, 1) == "\\") l = substr(l, 2)
        h[p] = substr(l, 1, 32)
      }
      close(ARGV[1])
    }
    FILENAME == ARGV[1] { want[$1] = 1; next }
    FILENAME == ARGV[2] { after[$1] = $0; next }
    ($1 in want) {
      if (after[$1] != $0 || !($1 in h)) { print $1 > bad; next }
      print $1 "\t" $2 "\t" $3 "\t" key "/" $1 "\t" h[$1]
    }' "$tmp/up" "$tmp/after" "$tmp/now" > "$tmp/new"
  [ -s "$tmp/bad" ] && gw_fail "changed while it was uploaded (written to during the sync?): $(head -n 3 "$tmp/bad" | tr '\n' ' ')"
fi
LC_ALL=C sort "$tmp/kept" "$tmp/new" > "$tmp/manifest"
rclone rcat "$base/manifests/$gen/rank-$r.tsv" < "$tmp/manifest" || gw_fail "cannot write the manifest"
rm -f "$ck"/.gangway-manifest-*
cp "$tmp/manifest" "$ck/.gangway-manifest-$gen" 2>/dev/null
echo "checkpoint rank $r: $(wc -l < "$tmp/manifest") files, $(wc -l < "$tmp/up") uploaded"
echo "gangway-checkpoint files=$files unchanged=0"
"#;

/// Restores generation `GW_CK_RESTORE` into `GANGWAY_CHECKPOINT_DIR`: the
/// union of every rank's files, the newest copy of a path winning (as the
/// directory sync does), each fetched from the generation that holds its
/// bytes.
pub(crate) const RESTORE: &str = r#"
if [ -n "${GW_CK_RESTORE:-}" ]; then
  ck="$(gw_path "$GANGWAY_CHECKPOINT_DIR")"; base="$GW_CK_BASE"; gen="$GW_CK_RESTORE"
  gw_need_rclone
  t0="$(date +%s%3N)"
  tmp="$(mktemp -d)" || gw_fail "no temporary directory"
  mkdir -p "$ck" || gw_fail "cannot make $ck"
  gw_ck_manifests "$gen" "$tmp/all"
  case $? in
    0) ;;
    2) gw_fail "checkpoint: $gw_ck_why; nothing of checkpoint $gen was restored" ;;
    *) gw_fail "cannot read the manifests of checkpoint $gen" ;;
  esac
  # The newest copy of each path (its size and MD5 into want), grouped by
  # the generation and rank that hold its bytes.
  awk -F'\t' -v dir="$tmp" '
    !($1 in t) || $3 + 0 > t[$1] + 0 { t[$1] = $3; key[$1] = $4; size[$1] = $2; md5[$1] = $5 }
    END {
      for (p in key) {
        split(key[p], k, "/"); print p > (dir "/list." k[1] "%" k[2])
        print p "\t" size[p] "\t" md5[p] > (dir "/want")
      }
    }' "$tmp/all"
  for list in "$tmp"/list.*; do
    [ -e "$list" ] || continue
    src="$(basename "$list" | sed 's/^list\.//; s/%/\//g')"
    # A few files: one lookup each (--no-traverse). More: one listing of
    # the prefix, which costs a request per thousand objects, where a
    # lookup each made a 4-node restore of 10,000 files take twice as long
    # as rclone copying the whole prefix (bench/checkpoint.py).
    if [ "$(wc -l < "$list")" -le 32 ]; then walk=--no-traverse; else walk=--fast-list; fi
    rclone copy "$base/$src" "$ck" --files-from-raw "$list" "$walk" --transfers 16 --checkers 16 \
      || gw_fail "cannot restore $src of checkpoint $gen"
  done
  # Every file as its manifest line says: there, of its size, and of its
  # MD5 (hashed here, on every core: rclone checked each download against
  # the store's hash, this checks the store's object against the manifest).
  if [ -s "$tmp/want" ]; then
    command -v md5sum >/dev/null 2>&1 || gw_fail "md5sum is not installed on this node (coreutils or busybox has it)"
    (cd "$ck" && awk -F'\t' '{ printf "./%s%c", $1, 0 }' "$tmp/want" \
      | xargs -0 -r -n 64 -P "$(nproc 2>/dev/null || echo 2)" md5sum) > "$tmp/got" 2> "$tmp/goterr" \
      || gw_fail "checkpoint $gen: a restored file is missing or unreadable: $(head -n 3 "$tmp/goterr" | tr '\n' ' ')"
    (cd "$ck" && awk -F'\t' '{ printf "./%s%c", $1, 0 }' "$tmp/want" | xargs -0 -r stat -c '%s' --) > "$tmp/sizes" \
      || gw_fail "checkpoint $gen: cannot read the restored files' sizes"
    awk -F'\t' -v got="$tmp/got" -v sizes="$tmp/sizes" '
      BEGIN {
        while ((getline l < got) > 0) {
          # md5sum escapes a name with a backslash or newline and marks the
          # line with a leading backslash.
          esc = substr(l, 1, 1) == "\\"
          if (esc) l = substr(l, 2)
          p = substr(l, 37)
          if (esc) { gsub(/\\n/, "\n", p); gsub(/\\\\/, "\\", p) }
          h[p] = substr(l, 1, 32)
        }
      }
      {
        if ((getline s < sizes) <= 0) s = "?"
        if (s != $2) { print "checkpoint: " $1 " is " s " bytes, its manifest says " $2 > "/dev/stderr"; bad = 1; exit }
        if (h[$1] != $3) { print "checkpoint: " $1 " has MD5 " h[$1] ", its manifest says " $3 > "/dev/stderr"; bad = 1; exit }
      }
      END { exit bad }' "$tmp/want" || gw_fail "checkpoint $gen does not match its manifest (above): not restored"
  fi
  # What was restored, for the next sync to compare with.
  rm -f "$ck"/.gangway-manifest-*
  LC_ALL=C sort "$tmp/all" > "$ck/.gangway-manifest-$gen"
  rm -rf "$tmp"
  ms=$(( $(date +%s%3N) - t0 ))
  echo "restored checkpoint $gen into $ck in $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
fi
"#;

#[cfg(test)]
mod tests;
