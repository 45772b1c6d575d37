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

/// The mean time two threads take to pass a cache line to each other and
/// back (one writes a counter, the other waits for it and writes the next),
/// over up to `max_trips` round trips or about 20 ms, whichever ends first;
/// `None` where a second thread cannot be started. Where the cores share a
/// cache (one L3) it is some 50-70 ns on a Zen 4; across L3s or sockets
/// several hundred, and then whatever two threads share (an operand one
/// wrote and the other reads, a line both write) crosses at that cost: a
/// benchmark at two threads says which placement it ran in by it.
pub fn core_round_trip(max_trips: u32) -> Option<std::time::Duration> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    // On a line of its own.
    #[repr(align(64))]
    struct Line(AtomicU64);
    let line = Line(AtomicU64::new(0));
    let stop = Line(AtomicU64::new(u64::MAX));
    let budget = Duration::from_millis(20);
    let trips = std::thread::scope(|s| {
        let echo = std::thread::Builder::new()
            .spawn_scoped(s, || {
                // Answers odd values with the next even one until told the
                // last trip's number.
                let mut next = 1;
                loop {
                    while line.0.load(Ordering::Acquire) != next {
                        if stop.0.load(Ordering::Relaxed) < next {
                            return;
                        }
                        std::hint::spin_loop();
                    }
                    line.0.store(next + 1, Ordering::Release);
                    next += 2;
                }
            })
            .ok()?;
        let start = Instant::now();
        let mut trips = 0u32;
        while trips < max_trips && (!trips.is_multiple_of(16) || start.elapsed() < budget) {
            let sent = 2 * u64::from(trips) + 1;
            line.0.store(sent, Ordering::Release);
            while line.0.load(Ordering::Acquire) != sent + 1 {
                std::hint::spin_loop();
            }
            trips += 1;
        }
        let took = start.elapsed();
        stop.0.store(2 * u64::from(trips), Ordering::Relaxed);
        echo.join().ok()?;
        Some((trips > 0).then(|| took / trips))
    });
    trips.flatten()
}

#[cfg(test)]
mod tests {
    /// Two threads pass a line back and forth: a round trip takes some
    /// time, and the measurement ends (after the 2000 trips asked for, or
    /// about 20 ms, checked every 16 trips: a second even where the two
    /// threads share a busy core, and a trip waits out time slices).
    #[test]
    fn two_threads_pass_a_line_back_and_forth() {
        let t = super::core_round_trip(2000).expect("a second thread");
        assert!(
            t > std::time::Duration::ZERO && t < std::time::Duration::from_secs(1),
            "{t:?}"
        );
    }
}
