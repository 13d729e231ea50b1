//! A checkpoint's rank manifests, read as hostile input.
//!
//! Whoever can write the checkpoint's bucket can write its manifests, and
//! a restore copies what a manifest names. So a line names only a file of
//! this checkpoint, in the shape gangway writes, or the restore fails
//! naming the line before anything is copied:
//!
//! ```text
//! PATH \t SIZE \t MTIME \t gen-G/rank-R/PATH \t MD5
//! ```
//!
//! - `PATH`: relative, no empty, `.` or `..` segment, no control
//!   character, and not one of gangway's own files (`.gangway-*`);
//! - `SIZE` decimal bytes, `MTIME` decimal seconds with an optional
//!   fraction (what `find -printf %T@` prints);
//! - the key is the path under the generation and rank that hold its
//!   bytes, in the checkpoint's own prefix (the key is relative to it), in
//!   a generation no newer than the one restored;
//! - `MD5` is 32 lowercase hex digits.
//!
//! The nodes check the same rules in [`VALIDATE`] (awk: they read the
//! manifests themselves, and check them where they use them); a test runs
//! both over the same lines.

/// One line of a rank manifest, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    /// The file's path in the checkpoint directory.
    pub path: &'a str,
    /// Its size in bytes.
    pub size: u64,
    /// The key, under the checkpoint's prefix, that holds its bytes.
    pub key: &'a str,
    /// The generation of that key.
    pub generation: u64,
    /// The MD5 of the bytes, hex.
    pub md5: &'a str,
}

/// Why a manifest line was refused (the text names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct Refused {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong, naming the field.
    pub why: String,
}

/// Checks every line of a rank manifest of generation `generation`.
pub fn parse(text: &str, generation: u64) -> Result<Vec<Line<'_>>, Refused> {
    // Split on `\n` only: a `\r` stays in its line (and breaks it), as the
    // nodes' awk reads it.
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    body.split('\n')
        .enumerate()
        .map(|(i, l)| parse_line(l, generation).map_err(|why| Refused { line: i + 1, why }))
        .collect()
}

/// Checks one line; the error says what is wrong with which field.
pub fn parse_line(line: &str, generation: u64) -> Result<Line<'_>, String> {
    let fields: Vec<&str> = line.split('\t').collect();
    let [path, size, mtime, key, md5] = fields[..] else {
        return Err(format!(
            "expected 5 tab-separated fields, found {}",
            fields.len()
        ));
    };
    check_path(path)?;
    let size: u64 = number(size)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("size is not a number: {}", shown(size)))?;
    let (whole, frac) = mtime.split_once('.').unwrap_or((mtime, "0"));
    if digits(whole).is_none() || digits(frac).is_none() {
        return Err(format!("mtime is not a number: {}", shown(mtime)));
    }
    let (g, rest) = key
        .strip_prefix("gen-")
        .and_then(|k| k.split_once('/'))
        .ok_or_else(|| format!("key outside gen-N/rank-R/: {}", shown(key)))?;
    let (r, held) = rest
        .strip_prefix("rank-")
        .and_then(|k| k.split_once('/'))
        .ok_or_else(|| format!("key outside gen-N/rank-R/: {}", shown(key)))?;
    let key_gen: u64 = number(g)
        .filter(|g| *g == "0" || !g.starts_with('0'))
        .and_then(|g| g.parse().ok())
        .ok_or_else(|| format!("key outside gen-N/rank-R/: {}", shown(key)))?;
    if digits(r).is_none() {
        return Err(format!("key outside gen-N/rank-R/: {}", shown(key)));
    }
    if held != path {
        return Err(format!(
            "key {} does not hold path {}",
            shown(key),
            shown(path)
        ));
    }
    if key_gen > generation {
        return Err(format!(
            "key {} is in a generation newer than {generation}",
            shown(key)
        ));
    }
    if md5.len() != 32 || !md5.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(format!("MD5 is not 32 hex digits: {}", shown(md5)));
    }
    Ok(Line {
        path,
        size,
        key,
        generation: key_gen,
        md5,
    })
}

fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(format!("a control character in the path {}", shown(path)));
    }
    if path.starts_with('/') {
        return Err(format!("an absolute path: {}", shown(path)));
    }
    let segments: Vec<&str> = path.split('/').collect();
    for s in &segments {
        match *s {
            "" => return Err(format!("an empty segment in the path {}", shown(path))),
            "." | ".." => return Err(format!("a . or .. segment in the path {}", shown(path))),
            _ => {}
        }
    }
    if segments.last().is_some_and(|s| s.starts_with(".gangway-")) {
        return Err(format!("one of gangway's own files: {}", shown(path)));
    }
    Ok(())
}

/// `s` when it is one or more ASCII digits (no sign, no space).
fn digits(s: &str) -> Option<&str> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then_some(s)
}

/// `s` when it is 1 to 19 ASCII digits (a u64, on both sides).
fn number(s: &str) -> Option<&str> {
    digits(s).filter(|s| s.len() <= 19)
}

/// A field as an error shows it: at most 120 characters, escaped.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(120).flat_map(char::escape_debug).collect();
    if s.chars().count() > 120 {
        out.push('…');
    }
    out
}

/// The node side of [`parse`]: `gw_ck_valid GEN FILE NAME` checks every
/// line of the rank manifest `FILE` of generation `GEN` by the same rules
/// and, at the first that breaks one, says `NAME line N: why` on stderr
/// and fails. POSIX awk (mawk, busybox): no interval expressions.
pub(crate) const VALIDATE: &str = r#"
gw_ck_valid() {
  LC_ALL=C awk -F'\t' -v gen="$1" -v name="$3" '
    function bad(why) {
      printf "%s line %d: %s\n", name, NR, why > "/dev/stderr"
      failed = 1
      exit 1
    }
    {
      if (NF != 5) bad("expected 5 tab-separated fields, found " NF)
      p = $1
      if (p == "") bad("empty path")
      if (p ~ /[[:cntrl:]]/) bad("a control character in the path")
      if (substr(p, 1, 1) == "/") bad("an absolute path: " p)
      n = split(p, seg, "/")
      for (i = 1; i <= n; i++) {
        if (seg[i] == "") bad("an empty segment in the path " p)
        if (seg[i] == "." || seg[i] == "..") bad("a . or .. segment in the path " p)
      }
      if (substr(seg[n], 1, 9) == ".gangway-") bad("one of gangway'"'"'s own files: " p)
      if ($2 !~ /^[0-9]+$/ || length($2) > 19) bad("size is not a number: " $2)
      if ($3 !~ /^[0-9]+(\.[0-9]+)?$/) bad("mtime is not a number: " $3)
      if (!match($4, /^gen-[0-9]+\/rank-[0-9]+\//)) bad("key outside gen-N/rank-R/: " $4)
      held = substr($4, RLENGTH + 1)
      g = substr($4, 5, index($4, "/") - 5)
      if (length(g) > 19 || (length(g) > 1 && substr(g, 1, 1) == "0")) bad("key outside gen-N/rank-R/: " $4)
      if (held != p) bad("key " $4 " does not hold path " p)
      if (length(g) > length(gen) || (length(g) == length(gen) && g > gen)) bad("key " $4 " is in a generation newer than " gen)
      if (length($5) != 32 || $5 ~ /[^0-9a-f]/) bad("MD5 is not 32 hex digits: " $5)
    }
    END { exit failed }' "$2"
}
"#;

#[cfg(test)]
mod tests;
