//! A binary copy of each parsed catalog file, kept under
//! `$GANGWAY_HOME/cache/catalog/`, so that a large `--catalog` directory is
//! parsed once, not on every command.
//!
//! An entry is keyed on the CSV file's size, modification time and a hash
//! of its content (read on every load: a file rewritten within one mtime
//! tick, or copied with its mtime kept, still misses), and on
//! [`FORMAT`], which changes whenever the parser or this layout does. Any
//! mismatch, and any entry that cannot be decoded, reparses the file and
//! rewrites the entry. Writing is best effort: a home that cannot be
//! written costs the parse, never the command.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{Date, Estimated, Interner, Name, Offering};

/// Bump when the parsers or this layout change what an entry means.
const FORMAT: u32 = 2;
const MAGIC: &[u8; 8] = b"GWCATBIN";
const NONE: u32 = u32::MAX;

/// What one catalog file parses to.
#[derive(Debug, PartialEq)]
pub(crate) struct Parsed {
    /// Offerings.
    pub(crate) rows: Vec<Offering>,
    /// `# taken:` date, if the file has one.
    pub(crate) taken: Option<Date>,
    /// Rows that could not be used, as `file:line: reason`.
    pub(crate) warnings: Vec<String>,
}

/// Size, mtime and content hash of a catalog file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    size: u64,
    mtime_ns: u128,
    hash: u64,
}

impl Key {
    /// Stats and hashes `path` (streamed: the file is not held in memory).
    pub(crate) fn of(path: &Path) -> std::io::Result<Key> {
        let mut f = std::fs::File::open(path)?;
        let meta = f.metadata()?;
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let mut h = Hasher::default();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.write(&buf[..n]);
        }
        Ok(Key {
            size: meta.len(),
            mtime_ns,
            hash: h.finish(),
        })
    }
}

/// A fast non-cryptographic 64-bit hash of a byte stream (four lanes of
/// multiply-rotate over 8-byte words; a change to any byte changes its
/// lane). Change detection only: nothing here defends against an attacker
/// who can already write the catalog file.
#[derive(Debug)]
struct Hasher {
    lanes: [u64; 4],
    tail: Vec<u8>,
    len: u64,
}

const K: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
];

impl Default for Hasher {
    fn default() -> Hasher {
        Hasher {
            lanes: K,
            tail: Vec::new(),
            len: 0,
        }
    }
}

impl Hasher {
    fn mix(lane: u64, w: u64, k: u64) -> u64 {
        (lane ^ w).wrapping_mul(k).rotate_left(29)
    }

    fn blocks(&mut self, data: &[u8]) {
        for block in data.chunks_exact(32) {
            for (i, w) in block.chunks_exact(8).enumerate() {
                let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
                self.lanes[i] = Hasher::mix(self.lanes[i], w, K[i]);
            }
        }
    }

    fn write(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.tail.is_empty() {
            let take = (32 - self.tail.len()).min(data.len());
            self.tail.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.tail.len() == 32 {
                let t = std::mem::take(&mut self.tail);
                self.blocks(&t);
            }
        }
        let whole = data.len() / 32 * 32;
        self.blocks(&data[..whole]);
        self.tail.extend_from_slice(&data[whole..]);
    }

    fn finish(mut self) -> u64 {
        let mut last = std::mem::take(&mut self.tail);
        last.resize(32, 0);
        self.blocks(&last);
        let mut h = self.len.wrapping_mul(K[0]);
        for (i, l) in self.lanes.iter().enumerate() {
            h = Hasher::mix(h, *l, K[(i + 1) % 4]);
        }
        h ^ (h >> 31)
    }
}

/// Where the entry for the file shown as `shown` (the path its warnings
/// name) lives under `dir`: named by a hash of that path.
pub(crate) fn entry_path(dir: &Path, shown: &str) -> PathBuf {
    let mut h = Hasher::default();
    h.write(shown.as_bytes());
    dir.join(format!("{:016x}.bin", h.finish()))
}

/// A cache entry whose header matched the file's key; [`Entry::decode_into`]
/// streams its rows (the entry is never held whole in memory).
pub(crate) struct Entry {
    r: Reader,
    rows: usize,
}

impl Entry {
    /// How many offerings the entry holds (to size a vector once).
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Appends the entry's offerings to `out`, returning the file's taken
    /// date and warnings; `None` (with `out` as it was) if the entry is
    /// malformed.
    pub(crate) fn decode_into(
        mut self,
        out: &mut Vec<Offering>,
    ) -> Option<(Option<Date>, Vec<String>)> {
        let before = out.len();
        let got = decode(&mut self.r, out);
        if got.is_none() {
            out.truncate(before);
        }
        got
    }
}

/// The entry at `entry` if it holds the parse of a file with key `key`.
pub(crate) fn read(entry: &Path, key: &Key) -> Option<Entry> {
    let f = std::fs::File::open(entry).ok()?;
    let left = f.metadata().ok()?.len();
    let mut r = Reader {
        b: std::io::BufReader::with_capacity(64 * 1024, f),
        left,
    };
    let rows = header(&mut r, key)?;
    Some(Entry { r, rows })
}

/// Checks magic, format and key; returns the row count.
fn header(r: &mut Reader, key: &Key) -> Option<usize> {
    if r.array::<8>()? != *MAGIC || r.u32()? != FORMAT {
        return None;
    }
    let stored = Key {
        size: r.u64()?,
        mtime_ns: r.u128()?,
        hash: r.u64()?,
    };
    (stored == *key).then_some(())?;
    Some(r.u64()? as usize)
}

/// Saves `parsed` for a file with key `key` (write to a temporary file,
/// then rename: a reader never sees half an entry).
pub(crate) fn write(entry: &Path, key: &Key, parsed: &Parsed) -> std::io::Result<()> {
    if let Some(dir) = entry.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = entry.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, encode(key, parsed))?;
    std::fs::rename(&tmp, entry).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Numbers each distinct name once, in first-seen order.
#[derive(Default)]
struct Table<'a> {
    names: Vec<&'a str>,
    ids: std::collections::HashMap<&'a str, u32>,
}

impl<'a> Table<'a> {
    fn id(&mut self, s: &'a str) -> u32 {
        let next = self.names.len() as u32;
        let id = *self.ids.entry(s).or_insert(next);
        if id == next {
            self.names.push(s);
        }
        id
    }
}

fn encode(key: &Key, p: &Parsed) -> Vec<u8> {
    let mut table = Table::default();
    let rows: Vec<[u32; 5]> = p
        .rows
        .iter()
        .map(|o| {
            [
                table.id(&o.cloud),
                table.id(&o.instance_type),
                o.accelerator.as_deref().map_or(NONE, |a| table.id(a)),
                table.id(&o.region),
                table.id(&o.zone),
            ]
        })
        .collect();
    let names = table.names;
    let mut out = Vec::with_capacity(64 + p.rows.len() * 56);
    out.extend_from_slice(MAGIC);
    put32(&mut out, FORMAT);
    put64(&mut out, key.size);
    out.extend_from_slice(&key.mtime_ns.to_le_bytes());
    put64(&mut out, key.hash);
    put64(&mut out, p.rows.len() as u64);
    match p.taken {
        Some(d) => {
            put32(&mut out, 1);
            put32(&mut out, d.y as u32);
            put32(&mut out, d.m);
            put32(&mut out, d.d);
        }
        None => put32(&mut out, 0),
    }
    put32(&mut out, p.warnings.len() as u32);
    for w in &p.warnings {
        put_str(&mut out, w);
    }
    put32(&mut out, names.len() as u32);
    for n in &names {
        put_str(&mut out, n);
    }
    put32(&mut out, p.rows.len() as u32);
    for (o, ids) in p.rows.iter().zip(&rows) {
        for i in ids {
            put32(&mut out, *i);
        }
        put32(&mut out, o.accelerator_count.to_bits());
        put32(
            &mut out,
            o.accelerator_memory_gib.unwrap_or(f32::NAN).to_bits(),
        );
        put32(&mut out, o.vcpus.to_bits());
        put32(&mut out, o.memory_gib.to_bits());
        put64(&mut out, o.price.unwrap_or(f64::NAN).to_bits());
        put64(&mut out, o.spot_price.unwrap_or(f64::NAN).to_bits());
        out.push(
            u8::from(o.placement)
                | (u8::from(o.efa) << 1)
                | (u8::from(o.estimated.price) << 2)
                | (u8::from(o.estimated.spot) << 3),
        );
    }
    out
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

/// Reads over an entry, counting what is left: any short or malformed
/// entry is `None`, never a panic.
struct Reader {
    b: std::io::BufReader<std::fs::File>,
    left: u64,
}

impl Reader {
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut a = [0u8; N];
        self.b.read_exact(&mut a).ok()?;
        self.left = self.left.checked_sub(N as u64)?;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }
    fn u128(&mut self) -> Option<u128> {
        Some(u128::from_le_bytes(self.array()?))
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u32()? as u64;
        self.left = self.left.checked_sub(n)?;
        let mut v = vec![0u8; n as usize];
        self.b.read_exact(&mut v).ok()?;
        String::from_utf8(v).ok()
    }
}

/// Row size in an entry: five name ids, four f32, two f64, flags.
const ROW: usize = 5 * 4 + 4 * 4 + 2 * 8 + 1;

fn decode(r: &mut Reader, rows: &mut Vec<Offering>) -> Option<(Option<Date>, Vec<String>)> {
    let taken = match r.u32()? {
        0 => None,
        _ => Some(Date {
            y: r.u32()? as i32,
            m: r.u32()?,
            d: r.u32()?,
        }),
    };
    let n = r.u32()? as usize;
    let mut warnings = Vec::with_capacity(n.min(r.left as usize / 4));
    for _ in 0..n {
        warnings.push(r.str()?);
    }
    let n = r.u32()? as usize;
    let mut interner = Interner::default();
    let mut names: Vec<Name> = Vec::with_capacity(n.min(r.left as usize / 4));
    for _ in 0..n {
        names.push(interner.get(&r.str()?));
    }
    let n = r.u32()? as usize;
    if r.left != n.checked_mul(ROW)? as u64 {
        return None;
    }
    let name = |i: u32| names.get(i as usize).cloned();
    let f32_opt = |v: u32| Some(f32::from_bits(v)).filter(|v| !v.is_nan());
    let f64_opt = |v: u64| Some(f64::from_bits(v)).filter(|v| !v.is_nan());
    rows.reserve(n);
    for _ in 0..n {
        let row = r.array::<ROW>()?;
        let w32 = |i: usize| u32::from_le_bytes([row[i], row[i + 1], row[i + 2], row[i + 3]]);
        let w64 = |i: usize| u64::from(w32(i)) | (u64::from(w32(i + 4)) << 32);
        let cloud = name(w32(0))?;
        let instance_type = name(w32(4))?;
        let accelerator = match w32(8) {
            NONE => None,
            i => Some(name(i)?),
        };
        let region = name(w32(12))?;
        let zone = name(w32(16))?;
        let accelerator_count = f32::from_bits(w32(20));
        let accelerator_memory_gib = f32_opt(w32(24));
        let vcpus = f32::from_bits(w32(28));
        let memory_gib = f32::from_bits(w32(32));
        let price = f64_opt(w64(36));
        let spot_price = f64_opt(w64(44));
        let flags = row[52];
        rows.push(Offering {
            cloud,
            instance_type,
            accelerator,
            accelerator_count,
            accelerator_memory_gib,
            vcpus,
            memory_gib,
            region,
            zone,
            price,
            spot_price,
            placement: flags & 1 != 0,
            efa: flags & 2 != 0,
            estimated: Estimated {
                price: flags & 4 != 0,
                spot: flags & 8 != 0,
            },
        });
    }
    Some((taken, warnings))
}

#[cfg(test)]
mod tests {
    use super::super::Catalog;
    use super::*;

    const GCP: &str = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice
a2-highgpu-1g,12.0,85.0,,,,us-central1,us-central1-a,0.7,0.35
n1-standard-8,8.0,30.0,,,,us-central1,us-central1-a,0.38,
,,,A100,1,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 40960}}]},us-central1,us-central1-a,2.9,1.4
,,,V100,1,,us-central1,us-central1-a,2.48,0.74
bad,8.0,30.0,,,,us-central1,us-central1-a,,
";

    fn entries(cache: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(cache)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn a_cached_load_equals_a_parse_and_changes_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let cat = dir.path().join("cat");
        std::fs::create_dir_all(cat.join("gcp")).unwrap();
        let file = cat.join("gcp/vms.csv");
        std::fs::write(&file, GCP).unwrap();
        let parsed = Catalog::load_dir(&cat).unwrap();
        assert_eq!(parsed.warnings.len(), 1, "{:?}", parsed.warnings);
        let first = Catalog::load_dir_cached(&cat, Some(&cache)).unwrap();
        assert_eq!(entries(&cache).len(), 1, "one entry per file");
        let entry = entries(&cache)[0].clone();
        let written = std::fs::metadata(&entry).unwrap().modified().unwrap();
        let second = Catalog::load_dir_cached(&cat, Some(&cache)).unwrap();
        for c in [&first, &second] {
            assert_eq!(c.offerings(), parsed.offerings());
            assert_eq!(c.warnings, parsed.warnings);
            assert_eq!(c.sources[0].rows, parsed.sources[0].rows);
        }
        // The second load read the entry rather than rewriting it.
        assert_eq!(
            std::fs::metadata(&entry).unwrap().modified().unwrap(),
            written
        );
        // Same size, same mtime, other content: the hash sees it.
        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        let changed = GCP.replace("2.48,0.74", "2.47,0.75");
        assert_eq!(changed.len(), GCP.len());
        std::fs::write(&file, &changed).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let third = Catalog::load_dir_cached(&cat, Some(&cache)).unwrap();
        let v100 = |c: &Catalog| {
            c.with_accelerator("V100")
                .map(|o| o.price)
                .collect::<Vec<_>>()
        };
        assert_eq!(v100(&third), vec![Some(0.38 + 2.47)]);
        assert_eq!(v100(&Catalog::load_dir(&cat).unwrap()), v100(&third));
    }

    #[test]
    fn a_damaged_entry_is_reparsed_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let cat = dir.path().join("cat");
        std::fs::create_dir_all(cat.join("gcp")).unwrap();
        std::fs::write(cat.join("gcp/vms.csv"), GCP).unwrap();
        let want = Catalog::load_dir(&cat).unwrap();
        Catalog::load_dir_cached(&cat, Some(&cache)).unwrap();
        let entry = entries(&cache)[0].clone();
        let whole = std::fs::read(&entry).unwrap();
        // Cut short, a name id out of range, and garbage: each reparses.
        let mut bad_id = whole.clone();
        let row_at = whole.len() - ROW;
        bad_id[row_at..row_at + 4].copy_from_slice(&999u32.to_le_bytes());
        for damaged in [whole[..whole.len() - 3].to_vec(), bad_id, b"junk".to_vec()] {
            std::fs::write(&entry, &damaged).unwrap();
            let got = Catalog::load_dir_cached(&cat, Some(&cache)).unwrap();
            assert_eq!(got.offerings(), want.offerings());
            assert_eq!(got.warnings, want.warnings);
            // ... and the entry is whole again.
            assert_eq!(std::fs::read(&entry).unwrap(), whole);
        }
    }

    #[test]
    fn the_hash_depends_on_every_byte_and_on_how_data_is_split() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let hash = |parts: &[&[u8]]| {
            let mut h = Hasher::default();
            for p in parts {
                h.write(p);
            }
            h.finish()
        };
        let whole = hash(&[&data]);
        assert_eq!(whole, hash(&[&data[..5], &data[5..37], &data[37..]]));
        for i in [0, 31, 32, 500, 999] {
            let mut d = data.clone();
            d[i] ^= 1;
            assert_ne!(hash(&[&d]), whole, "byte {i}");
        }
        assert_ne!(hash(&[&data[..999]]), whole);
    }
}
