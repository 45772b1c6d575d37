//! Work limits of the lowered interpreters: a function's estimated work,
//! summed over its top-level ops, is checked before anything runs, and a
//! refusal names the costliest op.

/// A function whose estimated work is above the limit it was to run under.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{op} (top-level op {index} of @{function}) would take about {work:.2e} operations \
     ({total:.2e} for the whole function), more than the interpreter's limit of {limit:.2e}; \
     --max-work raises the limit"
)]
pub struct WorkExceeded {
    /// The function.
    pub function: String,
    /// The costliest top-level op's name.
    pub op: String,
    /// Its position in the function body.
    pub index: usize,
    /// Its estimated work.
    pub work: f64,
    /// The whole function's.
    pub total: f64,
    /// The limit.
    pub limit: f64,
}

/// Checks `function`'s work, given each top-level op's name and estimate,
/// against `limit`.
pub fn check_work(
    function: &str,
    per_op: &[(String, f64)],
    limit: f64,
) -> Result<(), WorkExceeded> {
    let total: f64 = per_op.iter().map(|(_, w)| w).sum();
    if total <= limit {
        return Ok(());
    }
    let (index, (op, work)) = per_op
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.1.total_cmp(&b.1.1))
        .map_or((0, (String::new(), total)), |(i, (op, w))| {
            (i, (op.clone(), *w))
        });
    Err(WorkExceeded {
        function: function.to_string(),
        op,
        index,
        work,
        total,
        limit,
    })
}
