//! A store wrapper that delays every request and records when each started and ended, to count
//! the sequential round trips on a critical path.

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct DelayedStore {
    inner: Arc<dyn ObjectStore>,
    delay: Duration,
    log: Arc<Mutex<Vec<(Instant, Instant, String)>>>,
}

impl std::fmt::Display for DelayedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DelayedStore({})", self.inner)
    }
}

impl DelayedStore {
    pub fn new(inner: Arc<dyn ObjectStore>, delay: Duration) -> Arc<Self> {
        Arc::new(DelayedStore {
            inner,
            delay,
            log: Arc::new(Mutex::new(Vec::new())),
        })
    }

    pub fn reset(&self) {
        self.log.lock().unwrap().clear();
    }

    pub fn requests(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// The longest chain of requests each of which started after the previous one ended.
    pub fn sequential_round_trips(&self) -> usize {
        let mut reqs = self.log.lock().unwrap().clone();
        reqs.sort_by_key(|r| r.0);
        let mut depth = vec![1usize; reqs.len()];
        for i in 0..reqs.len() {
            for j in 0..i {
                if reqs[j].1 <= reqs[i].0 {
                    depth[i] = depth[i].max(depth[j] + 1);
                }
            }
        }
        depth.into_iter().max().unwrap_or(0)
    }

    async fn timed<T>(&self, what: String, f: impl std::future::Future<Output = T>) -> T {
        let start = Instant::now();
        tokio::time::sleep(self.delay).await;
        let r = f.await;
        self.log.lock().unwrap().push((start, Instant::now(), what));
        r
    }
}

#[async_trait]
impl ObjectStore for DelayedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.timed(
            format!("PUT {location}"),
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.timed(
            format!("GET {location}"),
            self.inner.get_opts(location, options),
        )
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
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
        let delay = self.delay;
        let log = self.log.clone();
        futures::stream::once(async move {
            let start = Instant::now();
            tokio::time::sleep(delay).await;
            let items: Vec<_> = inner
                .list_with_offset(prefix.as_ref(), &offset)
                .collect()
                .await;
            log.lock()
                .unwrap()
                .push((start, Instant::now(), format!("LIST {prefix:?}")));
            futures::stream::iter(items)
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.timed(
            format!("LIST/ {prefix:?}"),
            self.inner.list_with_delimiter(prefix),
        )
        .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
