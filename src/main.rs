//! The `gangway` binary: parse, run, map errors to exit codes.

use clap::Parser;
use gangway::cli::{self, Cli};
use gangway::ExitCode;

fn main() -> std::process::ExitCode {
    // A closed stdout (e.g. `gangway show-gpus | head`) is not an error.
    reset_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => ExitCode::BadInput as u8,
            };
            let _ = e.print();
            return std::process::ExitCode::from(code);
        }
    };
    init_tracing(cli.verbose);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cli::run(cli)));
    let code = match result {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let message = e.to_string();
            eprintln!("gangway: error: {message}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                // A cause the message already quotes is not news.
                let cause = s.to_string();
                if !message.contains(&cause) {
                    eprintln!("  Caused by: {cause}");
                }
                src = s.source();
            }
            for line in e.details() {
                eprintln!("  {line}");
            }
            e.exit_code()
        }
        Err(_) => {
            eprintln!("gangway: internal error (a bug): please report it with the command you ran");
            ExitCode::Internal
        }
    };
    std::process::ExitCode::from(code as u8)
}

fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        // The AWS SDK warns about every credential source it tries; gangway
        // reports what finally failed itself, with a hint.
        0 => "warn,aws_config=error,aws_smithy_runtime=error,aws_runtime=error",
        1 => "gangway=info",
        2 => "gangway=debug",
        _ => "trace",
    };
    let filter = if verbose == 0 {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
    } else {
        EnvFilter::new(default)
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

#[cfg(unix)]
fn reset_sigpipe() {
    // SAFETY: restoring the default disposition of SIGPIPE before any
    // threads start; Rust sets it to ignore, which turns `| head` into errors.
    unsafe {
        libc_signal();
    }
}

#[cfg(unix)]
unsafe fn libc_signal() {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGPIPE: i32 = 13;
    const SIG_DFL: usize = 0;
    signal(SIGPIPE, SIG_DFL);
}

#[cfg(not(unix))]
fn reset_sigpipe() {}
