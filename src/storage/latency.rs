//! A store wrapper that adds per-request latency (and optionally a bandwidth cap) to any
//! object store and accounts for every request: counts by kind, bytes, peak concurrency, and
//! the sequential round trips on the critical path of whatever ran since the last reset.
//!
//! It makes an object store's latency visible on a local disk: benchmarks and tests wrap a
//! store with it (see [`Location::with_latency`](super::Location::with_latency)) and read
//! [`LatencyStore::counters`] after each query.

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Latency and bandwidth a [`LatencyStore`] adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyConfig {
    /// Added before every GET, HEAD and LIST. Default 10 ms.
    pub read: Duration,
    /// Added before every PUT, DELETE and COPY. Default 20 ms.
    pub write: Duration,
    /// When set, a GET also waits `bytes / bytes_per_second` after its latency.
    pub bytes_per_second: Option<u64>,
}

impl Default for LatencyConfig {
    fn default() -> Self {
        LatencyConfig {
            read: Duration::from_millis(10),
            write: Duration::from_millis(20),
            bytes_per_second: None,
        }
    }
}

/// Request accounting since the last [`LatencyStore::reset`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StoreCounters {
    /// GET requests (whole objects and ranges).
    pub gets: u64,
    /// HEAD requests.
    pub heads: u64,
    /// LIST requests (one per listing, however many pages).
    pub lists: u64,
    /// PUT requests, conditional ones included.
    pub puts: u64,
    /// DELETE requests (one per object).
    pub deletes: u64,
    /// Bytes returned by GETs.
    pub bytes_read: u64,
    /// Bytes sent by PUTs.
    pub bytes_written: u64,
    /// Most requests in flight at once.
    pub peak_concurrency: u64,
    /// The longest chain of requests each of which started after the previous one ended: the
    /// sequential round trips on the critical path.
    pub round_trips: u64,
}

#[derive(Debug, Default)]
struct Counters {
    gets: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// (start, end) of every finished request.
    spans: Mutex<Vec<(Instant, Instant)>>,
}

impl Counters {
    fn begin(&self) -> Instant {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Instant::now()
    }

    fn end(&self, start: Instant) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((start, Instant::now()));
    }
}

/// The longest chain of spans, each starting at or after the end of the one before.
fn longest_chain(spans: &[(Instant, Instant)]) -> u64 {
    let mut by_start: Vec<(Instant, Instant)> = spans.to_vec();
    by_start.sort_by_key(|s| s.0);
    // Depth of each span, and the spans ordered by end, consumed as starts pass their end.
    let mut depth = vec![0u64; by_start.len()];
    let mut by_end: Vec<usize> = (0..by_start.len()).collect();
    by_end.sort_by_key(|i| by_start[*i].1);
    let (mut next_end, mut best_ended) = (0, 0u64);
    for i in 0..by_start.len() {
        while next_end < by_end.len() && by_start[by_end[next_end]].1 <= by_start[i].0 {
            // A span that ended before span i started also started before it: its depth is known.
            best_ended = best_ended.max(depth[by_end[next_end]]);
            next_end += 1;
        }
        depth[i] = best_ended + 1;
    }
    depth.into_iter().max().unwrap_or(0)
}

/// An [`ObjectStore`] adding latency to and accounting for every request of an inner store.
#[derive(Debug)]
pub struct LatencyStore {
    inner: Arc<dyn ObjectStore>,
    config: LatencyConfig,
    counters: Arc<Counters>,
}

impl std::fmt::Display for LatencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LatencyStore(read {:?}, write {:?}, {})",
            self.config.read, self.config.write, self.inner
        )
    }
}

impl LatencyStore {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, config: LatencyConfig) -> Arc<Self> {
        Arc::new(LatencyStore {
            inner,
            config,
            counters: Arc::new(Counters::default()),
        })
    }

    /// The accounting since the last reset (requests still in flight are not counted in
    /// `round_trips`).
    pub fn counters(&self) -> StoreCounters {
        let c = &self.counters;
        let spans = c.spans.lock().unwrap_or_else(|e| e.into_inner()).clone();
        StoreCounters {
            gets: c.gets.load(Ordering::SeqCst),
            heads: c.heads.load(Ordering::SeqCst),
            lists: c.lists.load(Ordering::SeqCst),
            puts: c.puts.load(Ordering::SeqCst),
            deletes: c.deletes.load(Ordering::SeqCst),
            bytes_read: c.bytes_read.load(Ordering::SeqCst),
            bytes_written: c.bytes_written.load(Ordering::SeqCst),
            peak_concurrency: c.peak.load(Ordering::SeqCst) as u64,
            round_trips: longest_chain(&spans),
        }
    }

    /// Start counting afresh.
    pub fn reset(&self) {
        let c = &self.counters;
        for a in [
            &c.gets,
            &c.heads,
            &c.lists,
            &c.puts,
            &c.deletes,
            &c.bytes_read,
            &c.bytes_written,
        ] {
            a.store(0, Ordering::SeqCst);
        }
        c.peak
            .store(c.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
        c.spans.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The configured latencies.
    pub fn config(&self) -> LatencyConfig {
        self.config
    }

    async fn write_request<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let start = self.counters.begin();
        tokio::time::sleep(self.config.write).await;
        let r = f.await;
        self.counters.end(start);
        r
    }
}

#[async_trait]
impl ObjectStore for LatencyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.counters.puts.fetch_add(1, Ordering::SeqCst);
        self.counters
            .bytes_written
            .fetch_add(payload.content_length() as u64, Ordering::SeqCst);
        self.write_request(self.inner.put_opts(location, payload, opts))
            .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.counters.puts.fetch_add(1, Ordering::SeqCst);
        self.write_request(self.inner.put_multipart_opts(location, opts))
            .await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let head = options.head;
        if head {
            self.counters.heads.fetch_add(1, Ordering::SeqCst);
        } else {
            self.counters.gets.fetch_add(1, Ordering::SeqCst);
        }
        let start = self.counters.begin();
        tokio::time::sleep(self.config.read).await;
        let result = async {
            let r = self.inner.get_opts(location, options).await?;
            if head {
                return Ok(r);
            }
            // Read the body here, so its transfer (and the bandwidth cap) is inside the span.
            let (meta, range, attributes) = (r.meta.clone(), r.range.clone(), r.attributes.clone());
            let body: Bytes = r.bytes().await?;
            self.counters
                .bytes_read
                .fetch_add(body.len() as u64, Ordering::SeqCst);
            if let Some(bps) = self.config.bytes_per_second.filter(|b| *b > 0) {
                tokio::time::sleep(Duration::from_secs_f64(body.len() as f64 / bps as f64)).await;
            }
            Ok(GetResult {
                payload: GetResultPayload::Stream(
                    futures::stream::once(async { Ok(body) }).boxed(),
                ),
                meta,
                range,
                attributes,
            })
        }
        .await;
        self.counters.end(start);
        result
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let inner = self.inner.clone();
        let counters = self.counters.clone();
        let delay = self.config.write;
        locations
            .then(move |p| {
                let inner = inner.clone();
                let counters = counters.clone();
                async move {
                    let p = p?;
                    counters.deletes.fetch_add(1, Ordering::SeqCst);
                    let start = counters.begin();
                    tokio::time::sleep(delay).await;
                    let one = futures::stream::once(async move { Ok(p) }).boxed();
                    let r = inner.delete_stream(one).next().await;
                    counters.end(start);
                    r.unwrap_or_else(|| {
                        Err(object_store::Error::Generic {
                            store: "LatencyStore",
                            source: "the inner store returned nothing for a delete".into(),
                        })
                    })
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_with_offset(prefix, &Path::from(""))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        let offset = offset.clone();
        let delay = self.config.read;
        let counters = self.counters.clone();
        futures::stream::once(async move {
            counters.lists.fetch_add(1, Ordering::SeqCst);
            let start = counters.begin();
            tokio::time::sleep(delay).await;
            let items: Vec<_> = inner
                .list_with_offset(prefix.as_ref(), &offset)
                .collect()
                .await;
            counters.end(start);
            futures::stream::iter(items)
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.counters.lists.fetch_add(1, Ordering::SeqCst);
        let start = self.counters.begin();
        tokio::time::sleep(self.config.read).await;
        let r = self.inner.list_with_delimiter(prefix).await;
        self.counters.end(start);
        r
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.write_request(self.inner.copy_opts(from, to, options))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    #[test]
    fn the_longest_chain_counts_sequential_requests_only() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Two parallel requests, then one after both, then two parallel again: 3 round trips.
        let spans = vec![
            (at(0), at(10)),
            (at(0), at(12)),
            (at(12), at(20)),
            (at(20), at(30)),
            (at(21), at(29)),
        ];
        assert_eq!(longest_chain(&spans), 3);
        assert_eq!(longest_chain(&[]), 0);
        // Sixty-four concurrent requests are one round trip.
        assert_eq!(longest_chain(&vec![(at(0), at(10)); 64]), 1);
    }

    #[tokio::test]
    async fn requests_are_delayed_and_counted() {
        let store = LatencyStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            LatencyConfig {
                read: Duration::from_millis(5),
                write: Duration::from_millis(5),
                bytes_per_second: None,
            },
        );
        let p = Path::from("a");
        store
            .put(&p, Bytes::from_static(b"hello").into())
            .await
            .unwrap();
        let t = Instant::now();
        let (a, b) = tokio::join!(store.get(&p), store.get(&p));
        assert!(t.elapsed() >= Duration::from_millis(5));
        assert_eq!(a.unwrap().bytes().await.unwrap(), "hello");
        assert_eq!(b.unwrap().bytes().await.unwrap(), "hello");
        let c = store.counters();
        assert_eq!(
            (c.puts, c.gets, c.bytes_read, c.bytes_written),
            (1, 2, 10, 5)
        );
        assert_eq!(c.round_trips, 2, "the PUT, then both GETs at once");
        assert_eq!(c.peak_concurrency, 2);
        store.reset();
        assert_eq!(store.counters(), StoreCounters::default());
    }
}
