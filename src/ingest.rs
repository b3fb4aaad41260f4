//! Reading rows to append from files: JSON lines, Parquet and Arrow IPC (what `lsmsearch
//! ingest` reads). Input files are untrusted: a malformed one is an error of kind `Invalid`
//! naming the file, never a panic or an allocation beyond what its size justifies (Arrow IPC
//! goes through [`crate::IpcReader`]; a panic inside a third-party decoder is caught and
//! reported as an error).

use crate::{Error, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest batch size [`read_rows`] accepts (readers size buffers by it).
pub const MAX_BATCH_SIZE: usize = 1 << 20;

/// Batches of rows read from a file, at most `batch_size` rows each.
pub type RowReader = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// Open `file` by its extension (`.jsonl`/`.json`/`.ndjson`, `.parquet`,
/// `.arrow`/`.arrows`/`.ipc`/`.feather`) as batches for an index whose user schema is
/// `schema`. JSON vectors are read as lists and every JSON column as nullable, so that
/// validation at append names a wrong dimension or a missing key.
pub fn read_rows(file: &Path, schema: &SchemaRef, batch_size: usize) -> Result<RowReader> {
    if batch_size == 0 || batch_size > MAX_BATCH_SIZE {
        return Err(Error::invalid(format!(
            "the batch size must be between 1 and {MAX_BATCH_SIZE}, not {batch_size}"
        )));
    }
    let name = file.to_path_buf();
    let open = || {
        std::fs::File::open(file)
            .map_err(|e| Error::invalid(format!("cannot open '{}': {e}", file.display())))
    };
    let ext = file
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let bad = |e: &dyn std::fmt::Display| unreadable(file, e);
    let reader: RowReader = match ext.as_str() {
        "jsonl" | "json" | "ndjson" => {
            let fields: Vec<Field> = schema
                .fields()
                .iter()
                .map(|f| {
                    let t = match f.data_type() {
                        DataType::FixedSizeList(inner, _) => DataType::List(inner.clone()),
                        t => t.clone(),
                    };
                    Field::new(f.name(), t, true)
                })
                .collect();
            let r = arrow::json::ReaderBuilder::new(Arc::new(Schema::new(fields)))
                .with_batch_size(batch_size)
                .with_strict_mode(true)
                .build(BufReader::new(open()?))
                .map_err(|e| bad(&e))?;
            let n = name.clone();
            guarded(name, r.map(move |b| b.map_err(|e| unreadable(&n, e))))
        }
        "parquet" => {
            let file = open()?;
            let r = caught(&name, || {
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .map_err(|e| bad(&e))?
                    .with_batch_size(batch_size)
                    .build()
                    .map_err(|e| bad(&e))
            })?;
            let n = name.clone();
            guarded(name, r.map(move |b| b.map_err(|e| unreadable(&n, e))))
        }
        "arrow" | "arrows" | "ipc" | "feather" => {
            let r = crate::IpcReader::open(file)?.flat_map(move |b| rebatch(b, batch_size));
            guarded(name, r)
        }
        _ => {
            return Err(Error::invalid(format!(
                "'{}': unknown file type (use .jsonl, .parquet or .arrow)",
                file.display()
            )))
        }
    };
    Ok(reader)
}

fn unreadable(file: &Path, e: impl std::fmt::Display) -> Error {
    Error::invalid(format!("cannot read '{}': {e}", file.display()))
}

/// `b` in slices of at most `size` rows, made one at a time (a batch announcing a huge number
/// of zero-width rows costs nothing until its slices are read).
fn rebatch(
    b: Result<RecordBatch>,
    size: usize,
) -> Box<dyn Iterator<Item = Result<RecordBatch>> + Send> {
    match b {
        Ok(b) => {
            let n = b.num_rows();
            Box::new(
                (0..n)
                    .step_by(size)
                    .map(move |off| Ok(b.slice(off, size.min(n - off)))),
            )
        }
        Err(e) => Box::new(std::iter::once(Err(e))),
    }
}

/// Run `f`, turning a panic into an `Invalid` error naming `file`.
fn caught<T>(file: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::invalid(format!(
            "cannot read '{}': the decoder failed on malformed data",
            file.display()
        )))
    })
}

/// Batches of `inner`; the first error ends the iteration, and a panic of the decoder becomes
/// an error naming `file`.
fn guarded(
    file: PathBuf,
    inner: impl Iterator<Item = Result<RecordBatch>> + Send + 'static,
) -> RowReader {
    let mut inner = Some(inner);
    Box::new(std::iter::from_fn(move || {
        let it = inner.as_mut()?;
        let next = caught(&file, || it.next().transpose()).transpose();
        match next {
            Some(Ok(b)) => Some(Ok(b)),
            Some(Err(e)) => {
                inner = None;
                Some(Err(e))
            }
            None => {
                inner = None;
                None
            }
        }
    }))
}
