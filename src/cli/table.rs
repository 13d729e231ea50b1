//! Plain aligned tables for humans.

use std::io::Write;

/// Prints `rows` under `headers`, columns padded to their widest cell.
pub(crate) fn print(headers: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let line = |out: &mut std::io::BufWriter<std::io::StdoutLock>,
                cells: Vec<&str>|
     -> std::io::Result<()> {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        writeln!(out, "{}", s.trim_end())
    };
    line(&mut out, headers.to_vec())?;
    for r in rows {
        line(&mut out, r.iter().map(String::as_str).collect())?;
    }
    out.flush()
}
