//! A store wrapper that fails or holds back requests on cue (fault injection).

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

#[derive(Debug, Clone)]
pub enum Action {
    /// Fail the request with an I/O-like error.
    Fail,
    /// Hold the request until the semaphore gets a permit.
    Hold(Arc<Semaphore>),
    /// Hold the first matching request until the semaphore gets a permit; later ones pass.
    HoldOnce(Arc<Semaphore>),
    /// Let the first matching request through, then report an error anyway (an ambiguous
    /// outcome: a timeout after the write landed); later ones pass.
    SucceedThenFailOnce,
    /// Treat a conditional create as a plain overwrite, as S3-compatible stores that ignore
    /// `If-None-Match` do.
    IgnoreCreate,
    /// Let the first matching PUT land, then hold its answer until the semaphore gets a
    /// permit (a caller that gives up meanwhile leaves a PUT that landed); later ones pass.
    LandThenHoldOnce(Arc<Semaphore>),
    /// As `LandThenHoldOnce`, then report an error (a timeout after the write landed).
    LandThenHoldThenFailOnce(Arc<Semaphore>),
}

#[derive(Debug, Clone)]
struct Rule {
    op: &'static str,
    path_contains: String,
    action: Action,
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    rules: Arc<Mutex<Vec<Rule>>>,
    puts: Mutex<Vec<String>>,
    landed: Mutex<Vec<String>>,
    /// Seconds subtracted from the `last_modified` of objects whose path contains the string
    /// (every matching entry adds up): a store whose clock runs behind this machine's.
    skews: Mutex<Vec<(String, u64)>>,
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            rules: Arc::new(Mutex::new(Vec::new())),
            puts: Mutex::new(Vec::new()),
            landed: Mutex::new(Vec::new()),
            skews: Mutex::new(Vec::new()),
        })
    }

    /// Apply `action` to every `op` ("put", "get" or "delete") on a path containing
    /// `path_contains`.
    pub fn on(&self, op: &'static str, path_contains: &str, action: Action) {
        self.rules.lock().unwrap().push(Rule {
            op,
            path_contains: path_contains.to_string(),
            action,
        });
    }

    /// How many PUTs reached a path containing `path_contains`.
    pub fn puts(&self, path_contains: &str) -> usize {
        self.puts
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.contains(path_contains))
            .count()
    }

    /// How many PUTs to a path containing `path_contains` landed (wrote the object), whatever
    /// the caller was told.
    pub fn landed(&self, path_contains: &str) -> usize {
        self.landed
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.contains(path_contains))
            .count()
    }

    /// Report objects whose path contains `path_contains` as modified `secs` seconds earlier
    /// than they were (LIST and HEAD/GET metadata), on top of any other skew that matches.
    pub fn skew(&self, path_contains: &str, secs: u64) {
        self.skews
            .lock()
            .unwrap()
            .push((path_contains.to_string(), secs));
    }

    fn skewed(skews: &[(String, u64)], mut meta: ObjectMeta) -> ObjectMeta {
        let secs: u64 = skews
            .iter()
            .filter(|(p, _)| meta.location.as_ref().contains(p.as_str()))
            .map(|(_, s)| s)
            .sum();
        meta.last_modified -= std::time::Duration::from_secs(secs);
        meta
    }

    pub fn clear(&self) {
        self.rules.lock().unwrap().clear();
    }

    async fn check(&self, op: &str, location: &Path) -> object_store::Result<()> {
        check_rules(&self.rules, op, location).await
    }
}

/// What the first of `rules` matching `op` on `location` does to the request.
async fn check_rules(
    rules: &Mutex<Vec<Rule>>,
    op: &str,
    location: &Path,
) -> object_store::Result<()> {
    let action = {
        let mut rules = rules.lock().unwrap();
        let at = rules
            .iter()
            .position(|r| r.op == op && location.as_ref().contains(&r.path_contains));
        match at.map(|i| (i, rules[i].action.clone())) {
            Some((
                i,
                a @ (Action::HoldOnce(_)
                | Action::SucceedThenFailOnce
                | Action::LandThenHoldOnce(_)
                | Action::LandThenHoldThenFailOnce(_)),
            )) => {
                rules.remove(i);
                Some(a)
            }
            other => other.map(|(_, a)| a),
        }
    };
    match action {
        None
        | Some(Action::IgnoreCreate)
        | Some(Action::LandThenHoldOnce(_))
        | Some(Action::LandThenHoldThenFailOnce(_)) => Ok(()),
        Some(Action::Fail) => Err(object_store::Error::Generic {
            store: "FaultyStore",
            source: format!("injected failure of {op} {location}").into(),
        }),
        Some(Action::Hold(s)) | Some(Action::HoldOnce(s)) => {
            s.acquire().await.unwrap().forget();
            Ok(())
        }
        Some(Action::SucceedThenFailOnce) => Err(object_store::Error::NotImplemented {
            operation: "SucceedThenFailOnce".into(),
            implementer: "FaultyStore".into(),
        }),
    }
}

impl FaultyStore {
    async fn put_inner(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
        ignores_create: bool,
    ) -> object_store::Result<PutResult> {
        if ignores_create {
            return self.inner.put_opts(location, payload, opts).await;
        }
        let land_then_hold = {
            let mut rules = self.rules.lock().unwrap();
            let at = rules.iter().position(|r| {
                r.op == "put"
                    && matches!(
                        r.action,
                        Action::LandThenHoldOnce(_) | Action::LandThenHoldThenFailOnce(_)
                    )
                    && location.as_ref().contains(&r.path_contains)
            });
            at.map(|i| rules.remove(i).action)
        };
        match land_then_hold {
            Some(Action::LandThenHoldOnce(s)) => {
                let r = self.inner.put_opts(location, payload, opts).await;
                s.acquire().await.unwrap().forget();
                return r;
            }
            Some(Action::LandThenHoldThenFailOnce(s)) => {
                self.inner.put_opts(location, payload, opts).await?;
                s.acquire().await.unwrap().forget();
                return Err(object_store::Error::Generic {
                    store: "FaultyStore",
                    source: format!("injected error after the put of {location} landed").into(),
                });
            }
            _ => {}
        }
        let check = self.check("put", location).await;
        if let Err(object_store::Error::NotImplemented { .. }) = check {
            // Succeed, then report a failure.
            self.inner.put_opts(location, payload, opts).await?;
            return Err(object_store::Error::Generic {
                store: "FaultyStore",
                source: format!("injected error after the put of {location} landed").into(),
            });
        }
        check?;
        self.inner.put_opts(location, payload, opts).await
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.puts.lock().unwrap().push(location.to_string());
        let mut opts = opts;
        let ignores_create = self.rules.lock().unwrap().iter().any(|r| {
            r.op == "put"
                && matches!(r.action, Action::IgnoreCreate)
                && location.as_ref().contains(&r.path_contains)
        });
        if ignores_create {
            opts.mode = object_store::PutMode::Overwrite;
        }
        let r = self
            .put_inner(location, payload, opts, ignores_create)
            .await;
        if r.is_ok()
            || matches!(&r, Err(object_store::Error::Generic { source, .. }) if source.to_string().contains("landed"))
        {
            self.landed.lock().unwrap().push(location.to_string());
        }
        r
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
        self.check("get", location).await?;
        let mut r = self.inner.get_opts(location, options).await?;
        r.meta = Self::skewed(&self.skews.lock().unwrap(), r.meta);
        Ok(r)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        use futures::StreamExt;
        let rules = self.rules.clone();
        let checked = locations
            .then(move |p| {
                let rules = rules.clone();
                async move {
                    let p = p?;
                    check_rules(&rules, "delete", &p).await?;
                    Ok(p)
                }
            })
            .boxed();
        self.inner.delete_stream(checked)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        use futures::StreamExt;
        let skews = self.skews.lock().unwrap().clone();
        self.inner
            .list(prefix)
            .map(move |m| m.map(|m| Self::skewed(&skews, m)))
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
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
