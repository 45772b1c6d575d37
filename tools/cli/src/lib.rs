//! What `dlc` and `dlc-opt` share, and what the compiler's library
//! (`dlc-driver`) must not do itself: write to the terminal and end the
//! process. The library returns values and errors; the binaries print them
//! through this crate.
#![deny(missing_docs)]

use std::io::Write;

use dlc_core::PassReport;

/// Writes to standard output; when the reader has gone away (`dlc ... |
/// head`), exits quietly instead of panicking as `print!` does.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush())
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

/// Writes bytes (an object file) to standard output, quietly exiting when
/// the reader has gone away; other failures are returned.
pub fn write_stdout_bytes(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => other,
    }
}

/// `print!` through [`write_stdout`].
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::write_stdout(format_args!($($t)*)) };
}

/// `println!` through [`write_stdout`].
#[macro_export]
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($t)*))) };
}

/// Writes each pass's counters as `--stats` prints them
/// (`   value pass - counter`), to standard error.
pub fn print_stats(reports: &[PassReport]) {
    let mut err = std::io::stderr().lock();
    for r in reports {
        for (what, n) in &r.stats {
            let _ = writeln!(err, "{:>8} {} - {what}", n, r.name);
        }
    }
}
