//! Compiles the models this program calls, for the target Cargo builds for:
//! each becomes a static library and Rust bindings in `OUT_DIR`.

fn main() {
    // Two of the benchmark workloads, and a small integer model whose
    // division can fail.
    dlc_build::Model::new("../w2_mlp.dl").build();
    dlc_build::Model::new("../w5_layernorm_gelu.dl").build();
    dlc_build::Model::new("models/ratio.dl").build();
}
