//! Compiles the models this program calls, for the target Cargo builds for:
//! each becomes a static library and Rust bindings in `OUT_DIR`.

fn main() {
    // Two of the benchmark workloads, a small integer model whose division
    // can fail, and one with every kind of parameter the bindings map.
    dlc_build::Model::new("../w2_mlp.dl").build();
    dlc_build::Model::new("../w5_layernorm_gelu.dl").build();
    dlc_build::Model::new("models/ratio.dl").build();
    dlc_build::Model::new("models/kinds.dl").build();
}
