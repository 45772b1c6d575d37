//! `dlc-opt`: reads dlc source or graph IR, runs named passes, prints the
//! result. The pass-level tests are written against it.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use dlc_driver::{DriverError, PassOptions, load_ir, read_input, registry, run_pipeline};

#[derive(Parser)]
#[command(
    name = "dlc-opt",
    version,
    about = "Run dlc passes over source or IR and print the result"
)]
struct Args {
    /// Input: a `.dl` source file, a graph or loop IR file, or `-` for standard input.
    #[arg(required_unless_present = "list_passes")]
    input: Option<String>,
    /// Pipeline to run, as `a,b{key=value},c`.
    #[arg(long, default_value = "")]
    passes: String,
    /// Print the IR after every pass (to standard error).
    #[arg(long)]
    print_after_all: bool,
    /// Print the result in MLIR's generic operation syntax.
    #[arg(long)]
    mlir_generic: bool,
    /// Print each pass's statistics (to standard error).
    #[arg(long)]
    stats: bool,
    /// Print each pass's wall time (to standard error).
    #[arg(short = 'T', long = "timing")]
    timing: bool,
    /// Write the result here instead of standard output.
    #[arg(short, long)]
    output: Option<String>,
    /// List the registered passes and exit.
    #[arg(long)]
    list_passes: bool,
}

fn run(args: Args) -> Result<(), DriverError> {
    // A `DLC_CPU` that cannot stand for this machine is reported before
    // any pass reads `native`.
    dlc_core::TargetDesc::check_cpu_env().map_err(DriverError::Usage)?;
    if args.list_passes {
        for (name, description) in registry().describe() {
            dlc_cli::outln!("{name:<22} {description}");
        }
        return Ok(());
    }
    let input = args.input.as_deref().unwrap_or("-");
    let src = read_input(input)?;
    let mut module = load_ir(&src)?;
    let mut stderr = std::io::stderr();
    let options = PassOptions {
        print_after_all: if args.print_after_all {
            Some(&mut stderr as &mut dyn Write)
        } else {
            None
        },
        target: None,
    };
    let reports = run_pipeline(&mut module, &args.passes, options)?;
    if args.stats {
        dlc_cli::print_stats(&reports);
    }
    let mut err = std::io::stderr().lock();
    if args.timing {
        let total: f64 = reports.iter().map(|r| r.elapsed.as_secs_f64()).sum();
        let _ = writeln!(err, "===-- pass timing --===");
        for r in &reports {
            let _ = writeln!(
                err,
                "{:>10.3} ms  {}",
                r.elapsed.as_secs_f64() * 1e3,
                r.name
            );
        }
        let _ = writeln!(err, "{:>10.3} ms  total", total * 1e3);
    }
    let text = if args.mlir_generic {
        module.print_mlir_generic()
    } else {
        module.print()
    };
    match &args.output {
        Some(path) if path != "-" => std::fs::write(path, text).map_err(|source| DriverError::Io {
            path: path.clone(),
            source,
        }),
        _ => {
            dlc_cli::out!("{text}");
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{e}");
            if !e.to_string().ends_with('\n') {
                eprintln!();
            }
            ExitCode::FAILURE
        }
    }
}
