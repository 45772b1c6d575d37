//! Graph-dialect transforms and the registry that names them.

mod autocast;
mod canonicalize;
mod dce;
mod inline;
pub(crate) mod remat;
pub mod saturate;
mod split;

pub use autocast::autocast;
pub use canonicalize::{Canonicalize, FOLD_LIMIT};
pub use dce::{Dce, remove_dead_nodes};
pub use inline::{Inline, inline_into};
pub(crate) use remat::scalar_token;
pub use remat::{Remat, rematerialize};
pub use split::{Stage, split_by_results};

use dlc_core::PassRegistry;

use crate::Module;

/// The pipeline `dlc compile` and `dlc run` apply by default. Saturation
/// runs first on the functions without calls, so that a helper called many
/// times (W7's 32 steps) is saturated once; after inlining it runs again on
/// what is new (the callers' own ops, and merges across the inlined
/// bodies), leaving the settled bodies to the multi-pattern rules. What to
/// keep and what to compute again (`graph.remat`) is chosen last, on what
/// will be compiled.
pub const DEFAULT_PIPELINE: &str = "graph.canonicalize,graph.saturate,graph.inline,graph.canonicalize,graph.saturate,graph.canonicalize,graph.remat,graph.dce";

/// Every graph pass, by name.
pub fn registry() -> PassRegistry<Module> {
    registry_for(dlc_core::TargetDesc::host())
}

/// The graph passes, those that price what is compiled (`graph.saturate`)
/// doing so for `target` unless told another (`target=NAME`).
pub fn registry_for(target: &dlc_core::TargetDesc) -> PassRegistry<Module> {
    let mut r = PassRegistry::default();
    let remat_target = target.clone();
    let target = target.clone();
    r.register(
        "graph.canonicalize",
        "constant folding and algebraic identities (transpose of transpose, x*1, x+0, reshape of reshape, ...)",
        |o| {
            o.expect_only(&["max-iterations"])?;
            Ok(Box::new(Canonicalize { max_iterations: o.get("max-iterations", 16)? }))
        },
    );
    r.register(
        "graph.saturate",
        "equality saturation (egg): rewrites by the rule tables, extracts the cheapest equivalent graph under the calibrated cost model, pricing the kernels compiled for `target` (host, x86-64-avx512, x86-64-avx2, aarch64-linux-gnu, sm_80, sm_90; default host)",
        move |o| Ok(Box::new(saturate::from_options(o, &target)?)),
    );
    r.register(
        "graph.remat",
        "rematerialization: each element-wise value read by several kernels is computed again for its later readers (from what it reads, after barriers) where the calibrated cost model prices that no slower and the fusion plan's peak of live buffers lower, or faster and no higher, for `target` (default host); last in the pipeline, after saturation",
        move |o| {
            o.expect_only(&["target"])?;
            let target = match o.get("target", String::new())?.as_str() {
                "" => remat_target.clone(),
                name => dlc_core::TargetDesc::named(name).map_err(|message| {
                    dlc_core::PassError::BadOption {
                        pass: "graph.remat".into(),
                        message,
                    }
                })?,
            };
            Ok(Box::new(Remat { target }))
        },
    );
    r.register(
        "graph.dce",
        "removes ops whose results are never used",
        |o| {
            o.expect_only(&[])?;
            Ok(Box::new(Dce))
        },
    );
    r.register(
        "graph.grad",
        "reverse-mode differentiation: adds NAME (default ENTRY_grad) returning ENTRY's results and the gradient of its first, a float scalar, with respect to the parameters `wrt` (names joined by `+`; default: ENTRY's weights, or every float parameter); options entry=ENTRY,wrt=a+b,name=NAME, autocast=bf16|f16 (products in that type, f32 elsewhere: mixed precision), scaled=true (the reverse sweep seeded by a last parameter __loss_scale: loss scaling)",
        |o| Ok(Box::new(crate::autodiff::Grad::from_options(o)?)),
    );
    r.register(
        "graph.inline",
        "inlines every call and removes private functions left uncalled",
        |o| {
            o.expect_only(&[])?;
            Ok(Box::new(Inline))
        },
    );
    r
}
