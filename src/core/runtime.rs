//! The async runtime that synchronous entry points run their I/O on.

/// A runtime on the calling thread: gangway's concurrency is I/O (many
/// SSH connections and API calls at once), not CPU.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// This gangway (`exe`) running `args` for `$GANGWAY_HOME` `home`, detached:
/// no stdin, stdout or stderr of ours (a caller may set its own), and in a
/// process group of its own, so that Ctrl-C in the terminal that started it
/// reaches only the caller. Drivers, controllers, supervisors and autostop
/// watchers are started this way.
pub(crate) fn detached(
    exe: &std::path::Path,
    home: &std::path::Path,
    args: &[&str],
) -> std::process::Command {
    use std::process::Stdio;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .env("GANGWAY_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd
}
