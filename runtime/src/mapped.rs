//! Files mapped into memory, read in place (an ONNX model's initializers).

use std::path::Path;

/// The contents of the file at `path`, mapped read-only: slices of it are
/// views of the file's pages, which the page cache shares with every other
/// reader, not copies in fresh memory (a warm `dlc run` of a 117 MB model
/// maps it and copies each weight once, into the buffer compiled code
/// reads).
pub fn map_file(path: &Path) -> std::io::Result<bytes::Bytes> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(std::io::ErrorKind::IsADirectory.into());
    }
    if meta.len() == 0 {
        // An empty file has no pages to map.
        return Ok(bytes::Bytes::new());
    }
    // SAFETY: the mapping is private and read-only, and is only ever read
    // as bytes. Another process truncating or rewriting the file while it
    // is mapped would change (or take away) what it reads, as for any
    // program that maps its inputs; dlc's own files are replaced by
    // renaming a new file into place, which leaves a mapping of the old
    // one intact.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(bytes::Bytes::from_owner(map))
}
