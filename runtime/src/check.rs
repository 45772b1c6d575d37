//! How `--check` compares results with the reference interpreter's:
//! each result's largest difference relative to its largest reference
//! magnitude, within a tolerance of its element type, NaN and infinity in
//! the same places. Here, so that `dlc` and `dlc-rt` (which has no
//! compiler) hold one rule.

use dlc_core::TensorType;

use crate::call::RuntimeError;
use crate::tensor::HostTensor;

/// How closely `--check` requires a result of element type `d` to match the
/// reference interpreter, relative to the result's largest finite reference
/// magnitude: `1e-4` for f32 (room for reassociated sums and the 4-ulp
/// vector `exp`/`tanh`), `1e-10` for f64 (reassociated sums; its functions
/// are the C library's), four units in the last place of the narrow type
/// for f16 (`2^-8`) and bf16 (`2^-5`), and exact equality for integers and
/// booleans.
pub fn check_tolerance(d: dlc_core::DType) -> f64 {
    use dlc_core::DType;
    match d {
        DType::F32 => 1e-4,
        DType::F16 => 4.0 * f64::powi(2.0, -10),
        DType::BF16 => 4.0 * f64::powi(2.0, -7),
        DType::F64 => 1e-10,
        _ => 0.0,
    }
}

/// The tolerance of an f32 result computed with TF32 products (`--tf32`:
/// operands rounded to 10 mantissa bits, as f16's): f16's.
pub const TF32_TOLERANCE: f64 = 4.0 * 1.0 / 1024.0;

/// How one result compares with the reference interpreter's.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultCheck {
    /// Which result (`out0` is 0).
    pub index: usize,
    /// Its type.
    pub ty: TensorType,
    /// The largest difference over the finite elements, relative to the
    /// largest finite reference magnitude (absolute when that is 0).
    pub relative_error: f64,
    /// What [`ResultCheck::relative_error`] may be.
    pub tolerance: f64,
    /// The first element where one side is NaN or infinite and the other is
    /// not (or infinities of different signs): flat index, got, reference.
    pub nonfinite_mismatch: Option<(usize, f64, f64)>,
    /// How many elements are NaN in both.
    pub nan_in_both: usize,
}

impl ResultCheck {
    /// Whether the result matches within its tolerance, with NaN and
    /// infinity in the same places.
    pub fn passed(&self) -> bool {
        self.nonfinite_mismatch.is_none() && self.relative_error <= self.tolerance
    }

    /// Whether every element is NaN on both sides, so nothing was compared.
    pub fn all_nan(&self) -> bool {
        self.ty
            .num_elements()
            .is_some_and(|n| n > 0 && self.nan_in_both == n)
    }
}

impl ResultCheck {
    /// The comparison in words, the result called `label` (`out0`, or a
    /// name such as `grad_w`).
    pub fn describe(&self, label: &str) -> String {
        if let Some((at, got, want)) = self.nonfinite_mismatch {
            return format!(
                "{label} ({}): element {at} is {got} but the reference is {want}",
                self.ty
            );
        }
        if self.all_nan() {
            return format!(
                "{label} ({}): every element is NaN in both results, so nothing was compared",
                self.ty
            );
        }
        let mut text = format!(
            "{label} ({}): largest relative error {:.3e} (tolerance {:.1e})",
            self.ty, self.relative_error, self.tolerance
        );
        if self.nan_in_both > 0 {
            text.push_str(&format!(
                "; {} element(s) are NaN in both",
                self.nan_in_both
            ));
        }
        text
    }
}

impl std::fmt::Display for ResultCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(&format!("out{}", self.index)))
    }
}

/// Compares results with the reference interpreter's, each with its
/// tolerance (the compiler's `check_tolerances`); an error when their types differ.
pub fn check_results(
    got: &[HostTensor],
    reference: &[HostTensor],
    tolerances: &[f64],
) -> Result<Vec<ResultCheck>, RuntimeError> {
    check_results_with_floors(got, reference, tolerances, &[])
}

/// A gradient is compared relative to at least this fraction of the largest
/// reference magnitude among the gradients of the same value: a gradient
/// that is zero in real arithmetic (a bias before a normalization, say) is
/// rounding noise on both sides, and its own largest magnitude is no scale.
/// That noise is a few units of f32's last place of the terms summed, which
/// are of the largest gradients' size (3e-7 of it for a bias before a
/// batch normalization of 576 elements per channel); f32's tolerance of a
/// hundredth of the largest is 1e-6 of it.
pub const GRADIENT_SCALE_FLOOR: f64 = 1e-2;

/// The scale floors of [`check_results_with_floors`] for results of which
/// those from `first` on are gradients of one value: each gradient's is
/// [`GRADIENT_SCALE_FLOOR`] times the largest finite reference magnitude
/// among them; the results before `first` have none.
pub fn gradient_floors(reference: &[HostTensor], first: usize) -> Vec<f64> {
    let top = reference
        .iter()
        .skip(first)
        .flat_map(|t| t.data.iter())
        .filter(|x| x.is_finite())
        .fold(0f64, |a, x| a.max(x.abs()));
    (0..reference.len())
        .map(|i| {
            if i < first {
                0.0
            } else {
                GRADIENT_SCALE_FLOOR * top
            }
        })
        .collect()
}

/// [`check_results`], each result's scale (its largest finite reference
/// magnitude) raised to at least `floors[i]` where given.
pub fn check_results_with_floors(
    got: &[HostTensor],
    reference: &[HostTensor],
    tolerances: &[f64],
    floors: &[f64],
) -> Result<Vec<ResultCheck>, RuntimeError> {
    if got.len() != reference.len() {
        return Err(RuntimeError::Arguments(format!(
            "{} result(s) but the reference has {}",
            got.len(),
            reference.len()
        )));
    }
    got.iter()
        .zip(reference)
        .enumerate()
        .map(|(index, (g, r))| {
            if g.ty != r.ty {
                return Err(RuntimeError::Arguments(format!(
                    "result {index} is {} but the reference is {}",
                    g.ty, r.ty
                )));
            }
            let scale = r
                .data
                .iter()
                .filter(|x| x.is_finite())
                .fold(0f64, |a, x| a.max(x.abs()))
                .max(floors.get(index).copied().unwrap_or(0.0));
            let (mut diff, mut nonfinite_mismatch, mut nan_in_both) = (0f64, None, 0);
            for (at, (&x, &y)) in g.data.iter().zip(&r.data).enumerate() {
                if x.is_finite() && y.is_finite() {
                    diff = diff.max((x - y).abs());
                } else if x.is_nan() && y.is_nan() {
                    nan_in_both += 1;
                } else if x != y && nonfinite_mismatch.is_none() {
                    nonfinite_mismatch = Some((at, x, y));
                }
            }
            Ok(ResultCheck {
                index,
                ty: r.ty.clone(),
                relative_error: if scale > 0.0 { diff / scale } else { diff },
                tolerance: tolerances.get(index).copied().unwrap_or(0.0),
                nonfinite_mismatch,
                nan_in_both,
            })
        })
        .collect()
}
