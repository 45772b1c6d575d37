//! Generates the ONNX protobuf messages from the vendored `proto/onnx.proto`
//! with prost. protox compiles the schema in Rust, so building needs no
//! `protoc`.

fn main() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let descriptors = match protox::compile(["proto/onnx.proto"], ["proto"]) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot compile proto/onnx.proto: {e}");
            std::process::exit(1);
        }
    };
    // A tensor's raw bytes are slices of the model's buffer, not copies
    // (`import_owned`).
    if let Err(e) = prost_build::Config::new()
        .bytes([".onnx.TensorProto.raw_data"])
        .compile_fds(descriptors)
    {
        eprintln!("cannot generate the ONNX messages: {e}");
        std::process::exit(1);
    }
}
