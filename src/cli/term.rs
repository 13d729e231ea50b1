//! What nodes print, made safe for the user's terminal.
//!
//! A node's output is the job's, and a job can print anything: escape
//! sequences that retitle the window, write the clipboard (OSC 52), move
//! the cursor over gangway's own lines, or hit a terminal's bugs. On a
//! terminal every control character but newline and tab is shown in caret
//! notation (`^[` for ESC, `^M` for a carriage return not ending a line,
//! `^?` for DEL) and the C1 controls as `\u{9b}`; the bytes themselves
//! never reach it. Piped or redirected output, and the log files, keep the
//! bytes as the node wrote them.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};

/// `bytes` with every control character but `\n` and `\t` (and a `\r`
/// before `\n`) made visible, or borrowed unchanged when there is none.
pub(crate) fn visible(bytes: &[u8]) -> Cow<'_, [u8]> {
    let c1 =
        |i: usize| bytes[i] == 0xc2 && bytes.get(i + 1).is_some_and(|b| (0x80..=0x9f).contains(b));
    let clean = bytes.iter().enumerate().all(|(i, &b)| {
        !(b < 0x20 && b != b'\n' && b != b'\t' && !(b == b'\r' && bytes.get(i + 1) == Some(&b'\n'))
            || b == 0x7f
            || c1(i))
    });
    if clean {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\n' | b'\t' => out.push(b),
            b'\r' if bytes.get(i + 1) == Some(&b'\n') => {}
            0x7f => out.extend_from_slice(b"^?"),
            0..=0x1f => out.extend_from_slice(&[b'^', b + 0x40]),
            0xc2 if c1(i) => {
                out.extend_from_slice(format!("\\u{{{:x}}}", bytes[i + 1]).as_bytes());
                i += 1;
            }
            _ => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

/// Standard output for node output: made [`visible`] when it is a
/// terminal, as it is otherwise.
pub(crate) struct NodeOutput {
    tty: bool,
    out: std::io::StdoutLock<'static>,
}

impl NodeOutput {
    /// This process's standard output.
    pub(crate) fn stdout() -> NodeOutput {
        let out = std::io::stdout();
        NodeOutput {
            tty: out.is_terminal(),
            out: out.lock(),
        }
    }
}

impl Write for NodeOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.tty {
            self.out.write_all(&visible(buf))?;
        } else {
            self.out.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_sent() {
        // A window title, a clipboard write (OSC 52), a cursor move up.
        let hostile = b"step 3\x1b]0;pwned\x07 \x1b]52;c;ZWNobyBoaQ==\x07\x1b[1A\n";
        assert_eq!(
            &*visible(hostile),
            &b"step 3^[]0;pwned^G ^[]52;c;ZWNobyBoaQ==^G^[[1A\n"[..]
        );
        assert_eq!(&*visible(b"a\rb\r\n\x7f"), &b"a^Mb\n^?"[..]);
        assert_eq!(&*visible("x\u{9b}31m".as_bytes()), &b"x\\u{9b}31m"[..]);
    }

    #[test]
    fn ordinary_output_is_untouched_and_not_copied() {
        let text = "loss 0.25\tépoque 3 ✓\r\n".as_bytes();
        assert!(matches!(visible(text), Cow::Borrowed(_)));
    }
}
