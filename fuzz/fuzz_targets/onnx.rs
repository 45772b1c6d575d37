//! Fuzzes the ONNX importer: any bytes, read as a serialized model, must give
//! a dlc program or an error, never a panic, a hang or a crash, and the front
//! end must take whatever the importer writes without crashing. With
//! `DLC_FUZZ_STRICT=1` every program the importer writes must also check
//! (an importer that writes a program dlc rejects has a validation gap: the
//! user gets a diagnostic in the imported program instead of one naming the
//! node); `make test`'s short run does not ask for that, so that a gap found
//! by chance there does not block unrelated work.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let options = dlc_onnx::Options::default();
    if let Ok(imported) = dlc_onnx::import(data, &options) {
        let checked = dlc_lang::compile_source(&imported.source);
        if let Err(e) = checked
            && std::env::var_os("DLC_FUZZ_STRICT").is_some()
        {
            let head: String = imported.source.chars().take(2000).collect();
            panic!("the importer wrote a program dlc rejects: {e:?}\n{head}");
        }
    }
});
