//! `lsmsearch._lsmsearch`: the native half of the Python package.
//!
//! The Python half (`lsmsearch/__init__.py`) shapes the API (query builders, input
//! conversion, pandas and polars); this module holds the handles and runs every call on a
//! private tokio runtime with the GIL released. On the main thread, a call that reads (a
//! search, scan, SQL statement, point in time, refresh, read-only open) or compacts runs
//! Python's signal handlers while it waits past its first 50 ms (Ctrl-C stops it; a compaction
//! publishes its merge whole or not at all); a write (`add`, `delete`, `flush`, `close`, opening a
//! writer) completes first.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use lsmsearch::{
    Conjunction, Durability, Error, ErrorKind, Fusion, Highlight, HybridSearchOptions, Index,
    IndexSchema, Key, KeyType, Location, PointInTime, ReadOnlyIndex, ScanOptions, SearchOptions,
    Settings, VectorSearchOptions, WriteOptions,
};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3_arrow::input::AnyRecordBatch;
use pyo3_arrow::{PySchema, PyTable};

/// The extension's allocator: jemalloc, as the command line's (see its `main.rs`).
#[cfg(unix)]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The runtime of this process and the process that started it, created on first use.
static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

fn runtime(py: Python<'_>) -> PyResult<Arc<tokio::runtime::Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME
        .lock()
        .map_err(|_| PyRuntimeError::new_err("lsmsearch: the runtime lock is poisoned"))?;
    match slot.as_ref() {
        Some((owner, rt)) if *owner == pid => return Ok(rt.clone()),
        // A child of fork() has none of its parent's threads, and the locks they held (the
        // allocator's, parking_lot's table of parked threads, the runtime's own) stay held
        // or name threads that do not exist: a new runtime could crash or hang on them.
        Some((owner, _)) => {
            return Err(py_error(
                py,
                "ForkError",
                format!(
                    "lsmsearch was used in process {owner} before it forked this process \
                     ({pid}), and its threads do not survive fork(): start child processes with \
                     the spawn or forkserver method (multiprocessing.set_start_method(\"spawn\")), \
                     or use lsmsearch in the parent only after forking"
                ),
            ))
        }
        None => {}
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lsmsearch")
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("lsmsearch: cannot start a runtime: {e}")))?;
    let rt = Arc::new(rt);
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}

/// How often a waiting call looks for a pending signal (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Whether this is Python's main thread, the only one signal handlers run on. Asking runs
/// Python code, which may run a pending signal handler: its exception is the caller's.
fn on_main_thread(py: Python<'_>) -> PyResult<bool> {
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?.getattr("ident")?;
    let me = threading.call_method0("get_ident")?;
    main.eq(me)
}

/// Run `fut` to completion with the GIL released, so other Python threads run meanwhile.
///
/// The calling thread polls the call's future itself, as a task would cost the query a
/// thread of the runtime's pool (the work is elsewhere: planning on blocking threads, the
/// arms on the query pool, batches between them on the runtime's threads). No poll blocks
/// for long, so the slice's timer fires on time. On the main
/// thread, the only one signal handlers run on, it does so for one slice of SIGNAL_CHECK;
/// a call still running then becomes a task of the runtime before any handler runs, and the
/// thread waits in slices, running Python's signal handlers between them, outside the
/// runtime: a handler may call the index (the task goes on meanwhile), and one that raises
/// (Ctrl-C raises `KeyboardInterrupt`) aborts the task, which stops the work. Other threads
/// never see signals, so they poll to the end.
fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = lsmsearch::Result<T>> + Send + 'static,
{
    if !on_main_thread(py)? {
        return write(py, fut);
    }
    let rt = runtime(py)?;
    let mut fut = Box::pin(fut);
    let first = py.detach(|| {
        polled(|| {
            block_on(&rt, async {
                tokio::time::timeout(SIGNAL_CHECK, &mut fut).await
            })
        })
    });
    match first {
        Ok(Ok(done)) => return finished(py, Ok(done)),
        Err(panic) => return finished(py, Err(panic)),
        Ok(Err(_)) => {}
    }
    let mut task = rt.spawn(fut);
    loop {
        if let Err(signal) = py.check_signals() {
            task.abort();
            return Err(signal);
        }
        let step = py.detach(|| {
            polled(|| {
                block_on(&rt, async {
                    tokio::time::timeout(SIGNAL_CHECK, &mut task).await
                })
            })
        });
        match step {
            Ok(Ok(Ok(done))) => return finished(py, Ok(done)),
            // The task panicked: the same error as a panic in the first slice.
            Ok(Ok(Err(e))) => {
                let message = match e.try_into_panic() {
                    Ok(panic) => panic_message(panic),
                    Err(e) => format!("an lsmsearch task failed: {e}"),
                };
                return finished(py, Err(message));
            }
            Ok(Err(_)) => {}
            Err(message) => {
                task.abort();
                return finished(py, Err(message));
            }
        }
    }
}

/// Run the write `fut` to completion on the calling thread (a thread of its own when the
/// calling thread already drives a runtime) with the GIL released. A write
/// is not interrupted: a signal that arrives meanwhile (Ctrl-C) is handled once it returns,
/// so no write is left half done.
fn write<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = lsmsearch::Result<T>> + Send + 'static,
{
    let rt = runtime(py)?;
    let done = py.detach(|| polled(|| block_on(&rt, fut)));
    finished(py, done)
}

/// `poll()`'s value, or the message of its panic: a panic in the library must reach Python
/// as an exception, not unwind through the interpreter.
fn polled<T>(poll: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(poll)).map_err(panic_message)
}

/// The message of the `InternalError` a panic becomes.
fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string());
    format!("an lsmsearch call panicked: {what}")
}

/// The result of a finished call: its value, its error as an exception, or an
/// `InternalError` when it panicked.
fn finished<T>(py: Python<'_>, done: Result<lsmsearch::Result<T>, String>) -> PyResult<T> {
    match done {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_py(py, e)),
        Err(message) => Err(py_error(py, "InternalError", message)),
    }
}

/// Run `fut` on `rt` to completion. A call made on a thread that already drives a runtime
/// blocks on a thread of its own: blocking the runtime's own thread would panic.
fn block_on<T: Send, F: Future<Output = T> + Send>(rt: &tokio::runtime::Runtime, fut: F) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return rt.block_on(fut);
    }
    std::thread::scope(|s| {
        s.spawn(|| rt.block_on(fut))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The Python exception of an error: the class of `lsmsearch.errors` named after its kind,
/// with its message.
fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let class = match e.kind() {
        ErrorKind::Invalid => "InvalidError",
        ErrorKind::Fenced => "FencedError",
        ErrorKind::Data => "DataError",
        ErrorKind::Unavailable => "UnavailableError",
        ErrorKind::Closed => "ClosedError",
        ErrorKind::Timeout => "TimeoutError",
        ErrorKind::Internal => "InternalError",
        _ => "LsmsearchError",
    };
    py_error(py, class, e.to_string())
}

/// An exception of the class `class` of `lsmsearch.errors` with `message`.
fn py_error(py: Python<'_>, class: &str, message: String) -> PyErr {
    let raise = || -> PyResult<PyErr> {
        let cls = py.import("lsmsearch.errors")?.getattr(class)?;
        Ok(PyErr::from_value(cls.call1((message.clone(),))?))
    };
    raise().unwrap_or_else(|_| PyRuntimeError::new_err(message))
}

/// An `InvalidError` with `message`.
fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    to_py(py, Error::invalid(message.into()))
}

impl Drop for Handle {
    /// In a child of `fork()`, the handle's tasks, locks and runtime are the parent's: the
    /// handle is leaked rather than dropped, which would touch them.
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            if let Some(source) = self.source.take() {
                std::mem::forget(source);
            }
        }
    }
}

/// What a handle reads from.
#[derive(Clone)]
enum Source {
    Writer(Arc<Index>),
    Reader(Arc<ReadOnlyIndex>),
    Snapshot(Arc<PointInTime>),
}

/// Run `$body` with `$s` bound to the source's handle, whatever its type.
macro_rules! on_source {
    ($src:expr, $s:ident => $body:expr) => {
        match $src {
            Source::Writer($s) => $body,
            Source::Reader($s) => $body,
            Source::Snapshot($s) => $body,
        }
    };
}

/// An index handle: the writer, a read-only handle or a point in time of either.
#[pyclass(frozen, module = "lsmsearch._lsmsearch")]
struct Handle {
    /// None once dropped in a process that did not open it (see `Drop`).
    source: Option<Source>,
    schema: IndexSchema,
    /// The process that opened the handle: a child of `fork()` must open its own.
    pid: u32,
}

fn parse_settings(py: Python<'_>, settings: Option<&str>) -> PyResult<Settings> {
    match settings {
        None => Ok(Settings::default()),
        Some(json) => serde_json::from_str(json).map_err(|e| invalid(py, format!("settings: {e}"))),
    }
}

/// What creating or opening an index at `uri` starts from, once this process may run
/// lsmsearch at all (a forked child is refused before anything else).
fn opening(py: Python<'_>, uri: &str, settings: Option<&str>) -> PyResult<(Location, Settings)> {
    runtime(py)?;
    let settings = parse_settings(py, settings)?;
    let loc = Location::parse(uri).map_err(|e| to_py(py, e))?;
    Ok((loc, settings))
}

/// Create an index at `uri` with `schema` (its JSON form) and `settings` (JSON).
#[pyfunction]
#[pyo3(signature = (uri, schema, settings=None))]
fn create(py: Python<'_>, uri: &str, schema: &str, settings: Option<&str>) -> PyResult<Handle> {
    let (loc, settings) = opening(py, uri, settings)?;
    let schema = IndexSchema::from_json(schema).map_err(|e| to_py(py, e))?;
    let index = write(py, Index::create(loc, schema.clone(), settings))?;
    Ok(Handle::new(Source::Writer(Arc::new(index)), schema))
}

/// Open the index at `uri` as its writer.
#[pyfunction]
#[pyo3(signature = (uri, settings=None))]
fn open(py: Python<'_>, uri: &str, settings: Option<&str>) -> PyResult<Handle> {
    let (loc, settings) = opening(py, uri, settings)?;
    // Opening claims the index (fencing the previous writer) and replays its WAL: a write.
    let index = write(py, Index::open(loc, settings))?;
    let schema = index.schema().clone();
    Ok(Handle::new(Source::Writer(Arc::new(index)), schema))
}

/// Open the index at `uri` read-only.
#[pyfunction]
#[pyo3(signature = (uri, settings=None))]
fn open_read_only(py: Python<'_>, uri: &str, settings: Option<&str>) -> PyResult<Handle> {
    let (loc, settings) = opening(py, uri, settings)?;
    let index = wait(py, Index::open_read_only(loc, settings))?;
    let schema = index.schema().clone();
    Ok(Handle::new(Source::Reader(Arc::new(index)), schema))
}

/// The options of one search, as the Python builder passes them.
struct Query {
    text: Option<String>,
    vector: Option<Vec<f32>>,
    k: usize,
    offset: usize,
    filter: Option<String>,
    columns: Option<Vec<String>>,
    conjunction: Conjunction,
    min_score: Option<f32>,
    max_distance: Option<f32>,
    highlight: Option<Highlight>,
    explain: bool,
    exact: bool,
    ef: Option<usize>,
    fusion: Fusion,
    candidates: Option<usize>,
    timeout: Option<Duration>,
}

impl Query {
    fn fts(&self) -> SearchOptions {
        SearchOptions {
            k: self.k,
            offset: self.offset,
            filter: self.filter.clone(),
            conjunction: self.conjunction,
            min_score: self.min_score,
            columns: self.columns.clone(),
            timeout: self.timeout,
            highlight: self.highlight.clone(),
            explain: self.explain,
        }
    }

    fn vector(&self) -> VectorSearchOptions {
        VectorSearchOptions {
            k: self.k,
            offset: self.offset,
            filter: self.filter.clone(),
            ef: self.ef,
            exact: self.exact,
            max_distance: self.max_distance,
            columns: self.columns.clone(),
            timeout: self.timeout,
        }
    }

    fn hybrid(&self) -> HybridSearchOptions {
        HybridSearchOptions {
            k: self.k,
            offset: self.offset,
            filter: self.filter.clone(),
            columns: self.columns.clone(),
            fusion: self.fusion,
            candidates: self.candidates,
            conjunction: self.conjunction,
            ef: self.ef,
            exact: self.exact,
            timeout: self.timeout,
        }
    }

    /// What a search of only one part cannot honour: an error naming the option.
    fn check_parts(&self, py: Python<'_>) -> PyResult<()> {
        let text_only = [
            (self.min_score.is_some(), "min_score"),
            (self.highlight.is_some(), "highlight"),
            (self.explain, "explain"),
        ];
        let vector_only = [(self.max_distance.is_some(), "max_distance")];
        let hybrid_only = [(self.candidates.is_some(), "candidates")];
        let refused = match (&self.text, &self.vector) {
            (Some(_), Some(_)) => [&text_only[..], &vector_only[..]].concat(),
            (Some(_), None) => [&vector_only[..], &hybrid_only[..]].concat(),
            (None, Some(_)) => [&text_only[..], &hybrid_only[..]].concat(),
            (None, None) => {
                return Err(invalid(
                    py,
                    "a search needs a text query, a vector, or both",
                ))
            }
        };
        match refused.iter().find(|(set, _)| *set) {
            Some((_, name)) => Err(invalid(
                py,
                format!("{name} does not apply to this kind of search"),
            )),
            None => Ok(()),
        }
    }
}

fn conjunction(py: Python<'_>, s: &str) -> PyResult<Conjunction> {
    match s {
        "or" | "OR" => Ok(Conjunction::Or),
        "and" | "AND" => Ok(Conjunction::And),
        _ => Err(invalid(
            py,
            format!("conjunction is {s:?}: it is \"or\" or \"and\""),
        )),
    }
}

fn fusion(py: Python<'_>, s: &str, rrf_k: f32, weights: Option<(f32, f32)>) -> PyResult<Fusion> {
    match (s, weights) {
        ("rrf", None) => Ok(Fusion::Rrf { k: rrf_k }),
        ("rrf", Some(_)) => Err(invalid(
            py,
            "weights apply to the weighted fusion: pass fusion=\"weighted\"",
        )),
        ("weighted", w) => {
            let (text, vector) = w.unwrap_or((0.5, 0.5));
            Ok(Fusion::Weighted { text, vector })
        }
        _ => Err(invalid(
            py,
            format!("fusion is {s:?}: it is \"rrf\" or \"weighted\""),
        )),
    }
}

fn timeout(py: Python<'_>, seconds: Option<f64>) -> PyResult<Option<Duration>> {
    seconds
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                invalid(
                    py,
                    format!("timeout is {s} s: it is a finite number of seconds at least 0"),
                )
            })
        })
        .transpose()
}

/// One key for a delete: an int or a str, as the primary key's type wants it.
#[derive(FromPyObject)]
enum KeyArg {
    Int(i128),
    Str(String),
}

fn key(py: Python<'_>, kind: KeyType, k: KeyArg) -> PyResult<Key> {
    let wrong = |what: &str| {
        invalid(
            py,
            format!("a key to delete is {what}, but the primary key is {kind:?}"),
        )
    };
    match (kind, k) {
        (KeyType::Utf8, KeyArg::Str(s)) => Ok(Key::Str(s)),
        (KeyType::Int64, KeyArg::Int(i)) => i64::try_from(i)
            .map(Key::I64)
            .map_err(|_| wrong("beyond int64")),
        (KeyType::Uint64, KeyArg::Int(i)) => u64::try_from(i)
            .map(Key::U64)
            .map_err(|_| wrong("beyond uint64")),
        (_, KeyArg::Str(_)) => Err(wrong("a str")),
        (_, KeyArg::Int(_)) => Err(wrong("an int")),
    }
}

fn durability(py: Python<'_>, s: &str) -> PyResult<WriteOptions> {
    let d: Durability = s.parse().map_err(|e| to_py(py, e))?;
    Ok(WriteOptions::with_durability(d))
}

/// `batches` as a `pyarrow.Table` of `schema`.
fn table(
    py: Python<'_>,
    batches: Vec<RecordBatch>,
    schema: arrow_schema::SchemaRef,
) -> PyResult<Py<PyAny>> {
    let table = PyTable::try_new(batches, schema)?;
    Ok(table.into_pyarrow(py)?.unbind())
}

/// The schema of `batches`, or `fallback` when there are none.
fn schema_of(
    batches: &[RecordBatch],
    fallback: impl FnOnce() -> arrow_schema::SchemaRef,
) -> arrow_schema::SchemaRef {
    batches.first().map(|b| b.schema()).unwrap_or_else(fallback)
}

impl Handle {
    fn new(source: Source, schema: IndexSchema) -> Handle {
        Handle {
            source: Some(source),
            schema,
            pid: std::process::id(),
        }
    }

    /// The source, if this process opened the handle.
    fn source(&self, py: Python<'_>) -> PyResult<Source> {
        if self.pid != std::process::id() {
            return Err(py_error(
                py,
                "ClosedError",
                format!(
                    "this handle was opened by process {} and does not survive fork(): open the index again in process {}",
                    self.pid,
                    std::process::id()
                ),
            ));
        }
        self.source
            .clone()
            .ok_or_else(|| py_error(py, "ClosedError", "the handle is gone".to_string()))
    }

    fn writer(&self, py: Python<'_>, what: &str) -> PyResult<Arc<Index>> {
        match self.source(py)? {
            Source::Writer(w) => Ok(w),
            _ => Err(invalid(
                py,
                format!("{what} needs the writer: this handle is read-only"),
            )),
        }
    }

    fn run_search(&self, py: Python<'_>, q: Query) -> PyResult<Py<PyAny>> {
        q.check_parts(py)?;
        let src = self.source(py)?;
        let batches = wait(py, async move {
            match (&q.text, &q.vector) {
                (Some(t), Some(v)) => {
                    let o = q.hybrid();
                    on_source!(&src, s => s.search_hybrid(t, v, &o).await)
                }
                (Some(t), None) => {
                    let o = q.fts();
                    let rows = on_source!(&src, s => s.search_fts(t, &o).await)?;
                    match rows.is_empty() {
                        false => Ok(rows),
                        // No row: an empty batch carries the schema the search returns.
                        true => {
                            let plan = on_source!(&src, s => s.plan_fts(t, &o).await)?;
                            Ok(vec![RecordBatch::new_empty(plan.schema())])
                        }
                    }
                }
                (None, Some(v)) => {
                    let o = q.vector();
                    let rows = on_source!(&src, s => s.search_vector(v, &o).await)?;
                    match rows.is_empty() {
                        false => Ok(rows),
                        true => {
                            let plan = on_source!(&src, s => s.plan_vector(v, &o).await)?;
                            Ok(vec![RecordBatch::new_empty(plan.schema())])
                        }
                    }
                }
                (None, None) => Err(Error::invalid(
                    "a search needs a text query, a vector, or both".to_string(),
                )),
            }
        })?;
        let schema = schema_of(&batches, || self.schema.arrow_schema());
        table(py, batches, schema)
    }
}

#[pymethods]
impl Handle {
    /// The schema in its JSON form.
    fn schema_json(&self, py: Python<'_>) -> PyResult<String> {
        serde_json::to_string(&self.schema).map_err(|e| invalid(py, e.to_string()))
    }

    /// The Arrow schema of the rows the index holds, as a `pyarrow.Schema`.
    fn arrow_schema(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(PySchema::new(self.schema.arrow_schema())
            .into_pyarrow(py)?
            .unbind())
    }

    /// "writer", "read_only" or "snapshot".
    #[getter]
    fn kind(&self) -> &'static str {
        match self.source {
            Some(Source::Writer(_)) => "writer",
            Some(Source::Reader(_)) => "read_only",
            _ => "snapshot",
        }
    }

    /// Append the rows of `data` (any Arrow record batch or stream) in one write: all of
    /// them or none. Several batches are concatenated (a copy). Returns `(last_seq, rows)`.
    #[pyo3(signature = (data, durability="durable"))]
    fn add(
        &self,
        py: Python<'_>,
        data: AnyRecordBatch,
        durability: &str,
    ) -> PyResult<(u64, usize)> {
        let writer = self.writer(py, "add")?;
        let options = self::durability(py, durability)?;
        let reader = data.into_reader()?;
        let schema = reader.schema();
        let mut batches: Vec<RecordBatch> = reader
            .filter(|b| b.as_ref().map_or(true, |b| b.num_rows() > 0))
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(py, format!("reading the rows to add: {e}")))?;
        // One append, one WAL object: every row of the input or none. The library checks it
        // (schema, dimension, NaN, null keys) before anything is written.
        write(py, async move {
            let batch = match batches.len() {
                0 => return Ok((0, 0)),
                1 => batches
                    .pop()
                    .ok_or_else(|| Error::invalid("no rows".to_string()))?,
                _ => arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| {
                    Error::invalid(format!("the batches to add do not concatenate: {e}"))
                })?,
            };
            let r = writer.append_with(&batch, options).await?;
            Ok((r.last_seq, r.rows))
        })
    }

    /// Delete the rows with these keys. Returns `(last_seq, rows)`.
    #[pyo3(signature = (keys, durability="durable"))]
    fn delete(
        &self,
        py: Python<'_>,
        keys: Vec<KeyArg>,
        durability: &str,
    ) -> PyResult<(u64, usize)> {
        let writer = self.writer(py, "delete")?;
        let options = self::durability(py, durability)?;
        let kind = self.schema.primary_key_type;
        let keys: Vec<Key> = keys
            .into_iter()
            .map(|k| key(py, kind, k))
            .collect::<PyResult<_>>()?;
        write(py, async move {
            let r = writer.delete_with(&keys, options).await?;
            Ok((r.last_seq, r.rows))
        })
    }

    /// A search: full text (`text`), vector (`vector`) or hybrid (both). Returns a
    /// `pyarrow.Table`.
    #[pyo3(signature = (text=None, vector=None, *, k=10, offset=0, filter=None, columns=None,
        conjunction="or", min_score=None, max_distance=None, highlight=None, explain=false,
        exact=false, ef=None, fusion="rrf", rrf_k=60.0, weights=None, candidates=None,
        timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        py: Python<'_>,
        text: Option<String>,
        vector: Option<Vec<f32>>,
        k: usize,
        offset: usize,
        filter: Option<String>,
        columns: Option<Vec<String>>,
        conjunction: &str,
        min_score: Option<f32>,
        max_distance: Option<f32>,
        highlight: Option<(Option<Vec<String>>, usize, String, String)>,
        explain: bool,
        exact: bool,
        ef: Option<usize>,
        fusion: &str,
        rrf_k: f32,
        weights: Option<(f32, f32)>,
        candidates: Option<usize>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let q = Query {
            conjunction: self::conjunction(py, conjunction)?,
            fusion: self::fusion(py, fusion, rrf_k, weights)?,
            timeout: self::timeout(py, timeout)?,
            highlight: highlight.map(|(columns, max_chars, pre_tag, post_tag)| Highlight {
                columns,
                max_chars,
                pre_tag,
                post_tag,
            }),
            text,
            vector,
            k,
            offset,
            filter,
            columns,
            min_score,
            max_distance,
            explain,
            exact,
            ef,
            candidates,
        };
        self.run_search(py, q)
    }

    /// The exact number of live rows matching the full-text query `text` (and `filter`,
    /// `min_score`).
    #[pyo3(signature = (text, *, filter=None, conjunction="or", min_score=None, timeout=None))]
    fn count(
        &self,
        py: Python<'_>,
        text: String,
        filter: Option<String>,
        conjunction: &str,
        min_score: Option<f32>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let o = SearchOptions {
            filter,
            conjunction: self::conjunction(py, conjunction)?,
            min_score,
            timeout: self::timeout(py, timeout)?,
            ..SearchOptions::default()
        };
        let src = self.source(py)?;
        wait(py, async move {
            on_source!(&src, s => s.count_fts(&text, &o).await)
        })
    }

    /// Every live row passing `filter` (SQL over the columns), as a `pyarrow.Table`.
    #[pyo3(signature = (filter=None))]
    fn scan(&self, py: Python<'_>, filter: Option<String>) -> PyResult<Py<PyAny>> {
        let src = self.source(py)?;
        let batches = wait(py, async move {
            on_source!(&src, s => s.scan(ScanOptions { filter }).await)
        })?;
        let schema = schema_of(&batches, || self.schema.arrow_schema());
        table(py, batches, schema)
    }

    /// Run SQL with this handle registered as table `table` (and the `fts`, `knn` and
    /// `hybrid` table functions). Returns a `pyarrow.Table`.
    #[pyo3(signature = (statement, table="docs"))]
    fn sql(&self, py: Python<'_>, statement: String, table: &str) -> PyResult<Py<PyAny>> {
        let src = self.source(py)?;
        let name = table.to_string();
        let (batches, schema) = wait(py, async move {
            let ctx = datafusion_context();
            match src {
                Source::Writer(s) => lsmsearch::sql::register(&ctx, &name, s)?,
                Source::Reader(s) => lsmsearch::sql::register(&ctx, &name, s)?,
                Source::Snapshot(_) => {
                    return Err(Error::invalid(
                        "SQL runs on an index handle, not on a point in time".to_string(),
                    ))
                }
            }
            lsmsearch::sql::query_with_schema(&ctx, &statement).await
        })?;
        self::table(py, batches, schema)
    }

    /// A point in time of what this handle sees: searches of it see the same rows whatever
    /// is written after (consecutive pages agree).
    fn point_in_time(&self, py: Python<'_>) -> PyResult<Handle> {
        let src = self.source(py)?;
        let pit = wait(py, async move {
            match src {
                Source::Snapshot(p) => Ok((*p).clone()),
                Source::Writer(s) => s.point_in_time().await,
                Source::Reader(s) => s.point_in_time().await,
            }
        })?;
        Ok(Handle::new(
            Source::Snapshot(Arc::new(pit)),
            self.schema.clone(),
        ))
    }

    /// Freeze the memtable and write it as a generation.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let w = self.writer(py, "flush")?;
        write(py, async move { w.flush().await })
    }

    /// Merge generations now. Returns the report as JSON, or None when nothing was merged.
    fn compact(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let w = self.writer(py, "compact")?;
        let report = wait(py, async move { w.compact().await })?;
        report
            .map(|r| serde_json::to_string(&r).map_err(|e| invalid(py, e.to_string())))
            .transpose()
    }

    /// The handle's figures as JSON.
    fn stats(&self, py: Python<'_>) -> PyResult<String> {
        let stats = match self.source(py)? {
            Source::Writer(w) => w.stats(),
            Source::Reader(r) => r.stats(),
            Source::Snapshot(_) => {
                return Err(invalid(py, "a point in time has no figures of its own"))
            }
        };
        serde_json::to_string(&stats).map_err(|e| invalid(py, e.to_string()))
    }

    /// See what the writer made durable since the handle opened (read-only handles).
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        match self.source(py)? {
            Source::Reader(r) => wait(py, async move { r.refresh().await }),
            _ => Err(invalid(py, "refresh is for read-only handles")),
        }
    }

    /// Close the handle: the writer flushes what is buffered first. In a child of `fork()`
    /// it does nothing: the handle is the parent's.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.pid != std::process::id() {
            return Ok(());
        }
        match self.source(py)? {
            Source::Writer(w) => write(py, async move { w.close().await }),
            Source::Reader(r) => write(py, async move { r.close().await }),
            Source::Snapshot(_) => Ok(()),
        }
    }
}

fn datafusion_context() -> datafusion::prelude::SessionContext {
    datafusion::prelude::SessionContext::new()
}

/// The native module.
#[pymodule]
fn _lsmsearch(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Handle>()?;
    m.add_function(wrap_pyfunction!(create, m)?)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(open_read_only, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
