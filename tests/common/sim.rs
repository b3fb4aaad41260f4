//! A simulated object store for the deterministic simulation (`tests/dst.rs`): every request
//! of one process goes through its own `SimStore` over the shared store, which decides from a
//! seeded generator whether the request is delayed, fails before it happens, or happens and
//! reports an error anyway (an ambiguous outcome), or, for a manifest PUT, reports an error and
//! lands later; and which can kill the process at its N-th next request (every later request
//! fails: nothing it sends lands any more).

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Ranged GETs (reads of part of an object: hot parts, row pages) the store failed, over
/// every store of the process: what shows that faults reach them.
pub static RANGED_GETS_FAILED: AtomicU64 = AtomicU64::new(0);

/// Of them, reads of a generation's hot part (a range that ends where the object ends).
pub static HOT_PART_GETS_FAILED: AtomicU64 = AtomicU64::new(0);

/// How often things go wrong.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// A request fails before it reaches the store.
    pub fail: f64,
    /// A PUT lands, then the caller is told it failed.
    pub ambiguous: f64,
    /// Upper bound of the latency added to a request, in microseconds.
    pub latency_us: u64,
    /// A manifest PUT fails before it reaches the store (on top of `fail`): flushes and
    /// compactions lose their publication more often than other requests fail.
    pub manifest_fail: f64,
    /// A manifest PUT reports an error at once and lands up to 20 ms later (a request the
    /// client gave up on that the store still carries out).
    pub manifest_late: f64,
}

impl Faults {
    pub const NONE: Faults = Faults {
        fail: 0.0,
        ambiguous: 0.0,
        latency_us: 0,
        manifest_fail: 0.0,
        manifest_late: 0.0,
    };
}

#[derive(Debug)]
pub struct SimStore {
    inner: Arc<dyn ObjectStore>,
    rng: Mutex<StdRng>,
    faults: Mutex<Faults>,
    dead: AtomicBool,
    /// Requests left before the process dies (negative: never).
    dies_in: AtomicI64,
    requests: AtomicU64,
}

impl std::fmt::Display for SimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimStore")
    }
}

fn injected(what: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "SimStore",
        source: what.into(),
    }
}

impl SimStore {
    pub fn new(inner: Arc<dyn ObjectStore>, seed: u64, faults: Faults) -> Arc<SimStore> {
        Arc::new(SimStore {
            inner,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            faults: Mutex::new(faults),
            dead: AtomicBool::new(false),
            dies_in: AtomicI64::new(-1),
            requests: AtomicU64::new(0),
        })
    }

    pub fn faults(&self) -> Faults {
        *self.faults.lock().unwrap()
    }

    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().unwrap() = faults;
    }

    /// The process dies at its `n`-th next request (that request fails too).
    pub fn die_in(&self, n: i64) {
        self.dies_in.store(n, Ordering::SeqCst);
    }

    /// The process dies now: no later request lands.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Decide the fate of one request: `Err` if it must fail before reaching the store,
    /// otherwise the latency to add and whether it must report an error after it lands.
    fn decide(&self, op: &str, location: &str) -> object_store::Result<(u64, bool)> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if self.dead.load(Ordering::SeqCst) {
            return Err(injected(format!("{op} {location}: the process is dead")));
        }
        if self.dies_in.load(Ordering::SeqCst) >= 0
            && self.dies_in.fetch_sub(1, Ordering::SeqCst) == 0
        {
            self.dead.store(true, Ordering::SeqCst);
            return Err(injected(format!("{op} {location}: the process died")));
        }
        let faults = *self.faults.lock().unwrap();
        let mut rng = self.rng.lock().unwrap();
        let latency = if faults.latency_us > 0 {
            rng.random_range(0..faults.latency_us)
        } else {
            0
        };
        if rng.random_bool(faults.fail) {
            return Err(injected(format!("injected failure of {op} {location}")));
        }
        Ok((latency, rng.random_bool(faults.ambiguous)))
    }

    async fn fate(&self, op: &str, location: &str) -> object_store::Result<bool> {
        let (latency, ambiguous) = self.decide(op, location)?;
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        Ok(ambiguous)
    }

    fn failing_list(
        &self,
        prefix: Option<&Path>,
    ) -> Option<BoxStream<'static, object_store::Result<ObjectMeta>>> {
        match self.decide("list", &format!("{prefix:?}")) {
            Ok(_) => None,
            Err(e) => Some(futures::stream::once(async { Err(e) }).boxed()),
        }
    }
}

#[async_trait]
impl ObjectStore for SimStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let ambiguous = self.fate("put", location.as_ref()).await?;
        if location.as_ref().contains("/manifest/") {
            let (fail, late, delay) = {
                let faults = *self.faults.lock().unwrap();
                let mut rng = self.rng.lock().unwrap();
                (
                    rng.random_bool(faults.manifest_fail),
                    rng.random_bool(faults.manifest_late),
                    rng.random_range(1..20_000u64),
                )
            };
            if late {
                let (inner, path) = (self.inner.clone(), location.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_micros(delay)).await;
                    let _ = inner.put_opts(&path, payload, opts).await;
                });
                return Err(injected(format!("put {location}: timed out (lands later)")));
            }
            if fail {
                return Err(injected(format!("injected failure of put {location}")));
            }
        }
        let r = self.inner.put_opts(location, payload, opts).await?;
        if ambiguous || self.dead.load(Ordering::SeqCst) {
            return Err(injected(format!("put {location} landed, then an error")));
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.fate("put_multipart", location.as_ref()).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let fate = self.fate("get", location.as_ref()).await;
        if fate.is_err() && options.range.is_some() {
            RANGED_GETS_FAILED.fetch_add(1, Ordering::Relaxed);
            if let Some(object_store::GetRange::Bounded(r)) = &options.range {
                let size = self.inner.head(location).await.map(|m| m.size);
                if size.is_ok_and(|n| n == r.end && r.start > 0) {
                    HOT_PART_GETS_FAILED.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        fate?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // The stream is one request; then each delete lands or fails on its own.
        let start = self.decide("delete", "");
        let inner = self.inner.clone();
        let fail = self.faults.lock().unwrap().fail;
        let seed: u64 = self.rng.lock().unwrap().random();
        let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
        let dead = start.is_err();
        locations
            .then(move |p| {
                let inner = inner.clone();
                let rng = rng.clone();
                async move {
                    let p = p?;
                    if dead || rng.lock().unwrap().random_bool(fail) {
                        return Err(injected(format!("injected failure of delete {p}")));
                    }
                    let one = futures::stream::once(async { Ok(p) }).boxed();
                    let mut out = inner.delete_stream(one);
                    out.next()
                        .await
                        .unwrap_or_else(|| Err(injected("no result".into())))
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.failing_list(prefix)
            .unwrap_or_else(|| self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.failing_list(prefix)
            .unwrap_or_else(|| self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.fate("list", &format!("{prefix:?}")).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.fate("copy", from.as_ref()).await?;
        self.inner.copy_opts(from, to, options).await
    }
}
