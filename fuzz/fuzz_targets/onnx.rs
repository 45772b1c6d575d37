//! Fuzzes the ONNX importer: any bytes, read as a serialized model, must give
//! a dlc program or an error, never a panic, a hang or a crash; and what the
//! importer writes must be a program the front end accepts (an importer that
//! writes a program dlc rejects has a bug).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let options = dlc_onnx::Options::default();
    if let Ok(imported) = dlc_onnx::import(data, &options) {
        if let Err(e) = dlc_lang::compile_source(&imported.source) {
            let head: String = imported.source.chars().take(2000).collect();
            panic!("the importer wrote a program dlc rejects: {e:?}\n{head}");
        }
    }
});
