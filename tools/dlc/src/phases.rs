//! What a long compile is doing, on a terminal: a spinner on standard error
//! naming the file and the phase (importing, checking, optimizing,
//! compiling), cleared before results print. Nothing at all when standard
//! error is not a terminal (pipes, CI, tests), so output stays as it was.

use std::io::IsTerminal;
use std::time::Duration;

/// The spinner of one command, if standard error is a terminal.
pub struct Phases {
    bar: Option<indicatif::ProgressBar>,
    file: String,
}

impl Phases {
    /// A spinner for work on `file`, shown only on a terminal.
    pub fn new(file: &str) -> Phases {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Phases {
            bar,
            file: file.to_string(),
        }
    }

    /// The first phase: reading the file, or importing an ONNX model.
    pub fn reading(&self) {
        self.set(if dlc_driver::is_onnx(&self.file) {
            "importing"
        } else {
            "reading"
        });
    }

    /// The phase now under way.
    pub fn set(&self, phase: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!("{}: {phase}", self.file));
        }
    }

    /// Clears the spinner (before results or timed calls).
    pub fn done(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        self.done();
    }
}
