//! The committer: group commit, sequence numbers, WAL writes, memtable application, freezing.

use crate::format::wal::{decode, decode_header, encode, WalEntry, WalKind};
use crate::memtable::Memtable;
use crate::memtable::{catch_up, read_memtable, write_memtable};
use crate::settings::{Durability, WriteOptions};
use crate::writer::Writer;
use crate::{Error, Result};
use arrow::array::ArrayRef;
use arrow::array::RecordBatch;
use object_store::{PutMode, PutOptions, PutPayload};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// What a write call returns once it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WriteReceipt {
    /// Sequence number of the last row written by the call.
    pub last_seq: u64,
    /// Rows written (appended rows or tombstones).
    pub rows: usize,
}

pub(crate) enum WriteRows {
    Append(RecordBatch),
    Delete(ArrayRef),
}

impl WriteRows {
    fn len(&self) -> usize {
        match self {
            WriteRows::Append(b) => b.num_rows(),
            WriteRows::Delete(k) => k.len(),
        }
    }
}

pub(crate) enum Request {
    Write {
        rows: WriteRows,
        options: WriteOptions,
        ack: oneshot::Sender<Result<WriteReceipt>>,
    },
    /// Freeze the active memtable; answers the id of the newest memtable to wait for.
    Freeze {
        ack: oneshot::Sender<Result<Option<u64>>>,
    },
    /// Write buffered rows and stop; answers whether they reached the WAL.
    Close { ack: oneshot::Sender<Result<()>> },
}

pub(crate) struct Committer {
    inner: Arc<Writer>,
    rx: mpsc::Receiver<Request>,
    next_seq: u64,
    next_wal_id: u64,
    next_memtable_id: u64,
    /// Buffered writes applied to the memtable but not yet in a WAL object.
    pending: Vec<RecordBatch>,
    /// A WAL id whose PUT failed with an error that does not say whether it landed.
    ambiguous: Option<u64>,
    pending_since: Option<Instant>,
    /// A size-triggered freeze gave up waiting for room after a failed flush: until the queue
    /// of frozen memtables has room again, the active memtable keeps taking rows instead of
    /// every group waiting for the next failure.
    gave_up: bool,
    /// Delays group commits while the indexers are behind.
    pacer: super::pace::Pacer,
    /// Rows applied to memtables by this committer.
    applied: u64,
}

struct Prepared {
    stored: RecordBatch,
    durability: Durability,
    ack: oneshot::Sender<Result<WriteReceipt>>,
}

impl Committer {
    pub(crate) fn new(
        inner: Arc<Writer>,
        rx: mpsc::Receiver<Request>,
        next_seq: u64,
        next_wal_id: u64,
    ) -> Self {
        Committer {
            inner,
            rx,
            next_seq,
            next_wal_id,
            next_memtable_id: 2,
            pending: Vec::new(),
            ambiguous: None,
            pending_since: None,
            gave_up: false,
            pacer: Default::default(),
            applied: 0,
        }
    }

    pub(crate) async fn run(mut self) {
        loop {
            let deadline = self
                .pending_since
                .map(|t| t + self.inner.reader.settings.wal_buffer_interval());
            let req = tokio::select! {
                r = self.rx.recv() => r,
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    match self.write_pending().await {
                        Ok(()) => {}
                        // A newer writer owns the index: these rows can never be written.
                        Err(e) if self.inner.fenced.load(Ordering::SeqCst) => {
                            tracing::error!("{} buffered rows are lost: {e}", self.pending_rows());
                            self.pending.clear();
                            self.pending_since = None;
                        }
                        Err(e) => {
                            tracing::warn!("background WAL write failed (will retry): {e}");
                            // Retry after another interval.
                            self.pending_since = Some(Instant::now());
                        }
                    }
                    continue;
                }
            };
            let Some(first) = req else {
                // Every handle is gone: make buffered writes durable, then stop.
                if let Err(e) = self.write_pending().await {
                    tracing::warn!("buffered writes lost at shutdown: {e}");
                }
                return;
            };
            let mut rows = request_rows(&first);
            let mut group = vec![first];
            while rows < self.inner.reader.settings.max_commit_rows {
                match self.rx.try_recv() {
                    Ok(r) => {
                        rows += request_rows(&r);
                        group.push(r);
                    }
                    Err(_) => break,
                }
            }
            if self.process(group).await {
                return;
            }
        }
    }

    /// Handle one group; true when the committer must stop.
    async fn process(&mut self, group: Vec<Request>) -> bool {
        let mut writes = Vec::new();
        let mut freezes = Vec::new();
        let mut close = None;
        for r in group {
            match r {
                Request::Write { rows, options, ack } => writes.push((rows, options, ack)),
                Request::Freeze { ack } => freezes.push(ack),
                Request::Close { ack } => close = Some(ack),
            }
        }
        if !writes.is_empty() {
            let rows: usize = writes.iter().map(|w| w.0.len()).sum();
            let delay = self.pacer.delay(
                std::time::Instant::now(),
                self.applied,
                super::pace::debt_rows(&self.inner),
                self.inner.reader.settings.max_unindexed_rows,
                rows,
            );
            let us = delay.as_micros() as u64;
            self.inner.log.append_delay_us.store(us, Ordering::Relaxed);
            self.inner
                .log
                .append_delay_total_us
                .fetch_add(us, Ordering::Relaxed);
            if !delay.is_zero() {
                // Acknowledged Buffered rows do not wait in memory longer than their bound
                // because of the pause: they are written first (a failure leaves them pending,
                // retried by the committer's loop).
                if !self.pending.is_empty() {
                    if let Err(e) = self.write_pending().await {
                        tracing::warn!("WAL write of buffered rows failed (will retry): {e}");
                    }
                }
                tokio::time::sleep(delay).await;
            }
            self.commit(writes).await;
        }
        let full = {
            let st = self.inner.read_state();
            let m = read_memtable(&st.active);
            m.rows() >= self.inner.reader.settings.memtable_max_rows
                || m.bytes() >= self.inner.reader.settings.memtable_max_bytes
        };
        if self.gave_up
            && self.inner.read_state().frozen.len()
                < self.inner.reader.settings.max_frozen_memtables
        {
            self.gave_up = false;
        }
        if (full && !self.gave_up) || !freezes.is_empty() {
            let r = self.freeze().await;
            self.gave_up = r.is_err();
            if let Err(e) = &r {
                tracing::warn!("freeze failed: {e}");
            }
            for ack in freezes {
                let _ = ack.send(r.clone());
            }
        }
        if let Some(ack) = close {
            let r = self.write_pending().await;
            if let Err(e) = &r {
                tracing::warn!("buffered writes not written at close: {e}");
            }
            let _ = ack.send(r.map_err(|e| e.context("buffered rows were not written to the WAL")));
            return true;
        }
        false
    }

    async fn commit(
        &mut self,
        writes: Vec<(
            WriteRows,
            crate::settings::WriteOptions,
            oneshot::Sender<Result<WriteReceipt>>,
        )>,
    ) {
        if self.inner.fenced.load(Ordering::SeqCst) {
            for (_, _, ack) in writes {
                let _ = ack.send(Err(self.inner.fenced_error()));
            }
            return;
        }
        let mut prepared = Vec::with_capacity(writes.len());
        for (rows, options, ack) in writes {
            let first = self.next_seq;
            let stored = match &rows {
                WriteRows::Append(b) => self.inner.reader.schema.to_stored(b, first),
                WriteRows::Delete(k) => self.inner.reader.schema.tombstones(k, first),
            };
            match stored {
                Ok(stored) => {
                    self.next_seq += rows.len() as u64;
                    prepared.push(Prepared {
                        stored,
                        durability: options.durability,
                        ack,
                    });
                }
                Err(e) => {
                    let _ = ack.send(Err(e));
                }
            }
        }
        let any_durable = prepared.iter().any(|p| p.durability == Durability::Durable);
        // Buffered rows are acknowledged from memory only up to the bound; past it the group
        // writes its WAL object now (backpressure while the WAL is slow or down).
        let bound = self.inner.reader.settings.wal_buffer_max_rows;
        let mut buffered_rows = self.pending_rows();
        let incoming: usize = prepared
            .iter()
            .filter(|p| p.durability == Durability::Buffered)
            .map(|p| p.stored.num_rows())
            .sum();
        if !any_durable && buffered_rows + incoming <= bound {
            for p in prepared {
                let receipt = self.apply(&p.stored);
                self.pending.push(p.stored);
                self.pending_since.get_or_insert_with(Instant::now);
                let _ = p.ack.send(receipt);
            }
            return;
        }
        let mut batches = self.pending.clone();
        batches.extend(prepared.iter().map(|p| p.stored.clone()));
        match self.write_wal(&batches).await {
            Ok(id) => {
                self.pending.clear();
                self.pending_since = None;
                let active = self.inner.read_state().active.clone();
                for p in prepared {
                    let receipt = self.apply(&p.stored);
                    let _ = p.ack.send(receipt);
                }
                write_memtable(&active).add_wal_id(id);
            }
            Err(e) => {
                let fenced = self.inner.fenced.load(Ordering::SeqCst);
                for p in prepared {
                    let fits = buffered_rows + p.stored.num_rows() <= bound;
                    if p.durability == Durability::Buffered && fits && !fenced {
                        buffered_rows += p.stored.num_rows();
                        let receipt = self.apply(&p.stored);
                        self.pending.push(p.stored);
                        self.pending_since.get_or_insert_with(Instant::now);
                        let _ = p.ack.send(receipt);
                    } else {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    fn pending_rows(&self) -> usize {
        self.pending.iter().map(RecordBatch::num_rows).sum()
    }

    /// Apply stored rows to the active memtable (they are visible when this returns).
    fn apply(&mut self, stored: &RecordBatch) -> Result<WriteReceipt> {
        let active = self.inner.read_state().active.clone();
        write_memtable(&active).apply(stored.clone())?;
        self.applied += stored.num_rows() as u64;
        catch_up(&active);
        self.inner.read_ahead.notify_one();
        let n = stored.num_rows();
        let last_seq = self.next_seq - 1;
        self.inner
            .log
            .last_seq
            .fetch_max(last_seq, Ordering::SeqCst);
        Ok(WriteReceipt {
            last_seq: seq_of_last(stored).unwrap_or(last_seq),
            rows: n,
        })
    }

    /// Write buffered rows to the WAL.
    async fn write_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            self.pending_since = None;
            return Ok(());
        }
        let batches = std::mem::take(&mut self.pending);
        match self.write_wal(&batches).await {
            Ok(id) => {
                self.pending_since = None;
                let active = self.inner.read_state().active.clone();
                write_memtable(&active).add_wal_id(id);
                Ok(())
            }
            Err(e) => {
                self.pending = batches;
                Err(e)
            }
        }
    }

    /// Write one WAL object holding `batches`; returns its id.
    async fn write_wal(&mut self, batches: &[RecordBatch]) -> Result<u64> {
        let schema = self.inner.reader.stored_schema.clone();
        let rows = arrow::compute::concat_batches(&schema, batches)?;
        let (first_seq, last_seq) = seq_range(&rows);
        let entry = WalEntry {
            kind: WalKind::Rows,
            epoch: self.inner.epoch,
            first_seq,
            last_seq,
            rows: Some(rows),
        };
        let bytes = bytes::Bytes::from(encode(&entry, &schema)?);
        loop {
            let id = self.next_wal_id;
            let p = self.inner.paths.wal(id);
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            match self
                .inner
                .loc
                .store
                .put_opts(&p, PutPayload::from(bytes.clone()), opts)
                .await
            {
                Ok(_) => {
                    if self.ambiguous == Some(id) {
                        // Our earlier PUT at this id may have landed: a newer writer then
                        // replayed it, fenced at the next id, and its flush freed this one.
                        // Rows written here would lie below its replay point, never read.
                        // Until the check succeeds the id stays suspect: if it fails, this
                        // object may be collected and the next PUT land here again.
                        self.check_not_superseded(id).await?;
                        self.ambiguous = None;
                    }
                    self.next_wal_id = id + 1;
                    self.inner.log.next_wal_id.store(id + 1, Ordering::SeqCst);
                    return Ok(id);
                }
                Err(object_store::Error::AlreadyExists { .. }) => {
                    // Either a newer writer's fence (or rows), or our own earlier attempt whose
                    // PUT succeeded although we saw an error.
                    let existing = match crate::storage::read_object(
                        self.inner.loc.store.as_ref(),
                        &p,
                    )
                    .await
                    {
                        Ok(b) => b,
                        // Gone already: only a newer writer's flush deletes WAL objects.
                        Err(e) if e.is_not_found() => {
                            self.inner.mark_fenced();
                            return Err(self.inner.fenced_error());
                        }
                        Err(e) => return Err(e),
                    };
                    let header = decode_header(&existing, &p);
                    match header {
                        Ok(h) if h.epoch == self.inner.epoch && h.kind == WalKind::Rows => {
                            let orphan = decode(existing, &schema, &p)?;
                            if let Some(r) = orphan.rows {
                                let active = self.inner.read_state().active.clone();
                                let mut m = write_memtable(&active);
                                m.apply(r)?;
                                m.add_wal_id(id);
                            }
                            self.next_wal_id = id + 1;
                        }
                        _ => {
                            self.inner.mark_fenced();
                            return Err(self.inner.fenced_error());
                        }
                    }
                }
                Err(e) => {
                    self.ambiguous = Some(id);
                    return Err(Error::store(&p, e));
                }
            }
        }
    }

    /// After a PUT at `id` succeeded where an earlier one had an ambiguous outcome: if a newer
    /// writer's object sits at `id + 1`, this writer is fenced (and acknowledges nothing).
    async fn check_not_superseded(&self, id: u64) -> Result<()> {
        let p = self.inner.paths.wal(id + 1);
        match crate::storage::read_object(self.inner.loc.store.as_ref(), &p).await {
            Ok(b) => match decode_header(&b, &p) {
                Ok(h) if h.epoch <= self.inner.epoch => Ok(()),
                _ => {
                    self.inner.mark_fenced();
                    Err(self.inner.fenced_error())
                }
            },
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Freeze the active memtable (after writing buffered rows) and wake the flusher. Returns the
    /// id of the newest frozen memtable, which `flush()` waits for.
    async fn freeze(&mut self) -> Result<Option<u64>> {
        if self.inner.fenced.load(Ordering::SeqCst) {
            return Err(self.inner.fenced_error());
        }
        self.write_pending().await?;
        let empty = read_memtable(&self.inner.read_state().active).is_empty();
        if empty {
            let st = self.inner.read_state();
            return Ok(st.frozen.back().map(|m| read_memtable(m).id()));
        }
        // Backpressure: wait while too many frozen memtables await their flush, but not past a
        // failed flush attempt: while the store refuses flushes, the active memtable keeps
        // taking rows (their WAL writes are the durability) and each freeze retries the wait.
        let failures_before = self.inner.flushes.status.borrow().failures;
        loop {
            let notified = self.inner.flushes.backpressure.notified();
            if self.inner.read_state().frozen.len()
                < self.inner.reader.settings.max_frozen_memtables
            {
                break;
            }
            if self.inner.fenced.load(Ordering::SeqCst) {
                return Err(self.inner.fenced_error());
            }
            if self.inner.closed.load(Ordering::SeqCst) {
                return Err(Error::closed());
            }
            {
                let status = self.inner.flushes.status.borrow();
                if status.failures > failures_before {
                    let e = status
                        .error
                        .clone()
                        .unwrap_or_else(|| Error::internal("flush failed"));
                    return Err(e.context("no room for another frozen memtable"));
                }
            }
            notified.await;
        }
        let id = self.next_memtable_id;
        self.next_memtable_id += 1;
        let fresh = Arc::new(RwLock::new(Memtable::new(
            id,
            self.inner.reader.stored_schema.clone(),
            self.inner.reader.text_schema.as_ref(),
            self.inner.mem_graph_spec(),
        )?));
        let frozen_id = {
            let mut st = self.inner.write_state();
            let old = std::mem::replace(&mut st.active, fresh);
            let fid = read_memtable(&old).id();
            st.frozen.push_back(old);
            fid
        };
        self.inner.flushes.wake.notify_one();
        Ok(Some(frozen_id))
    }
}

fn request_rows(r: &Request) -> usize {
    match r {
        Request::Write { rows, .. } => rows.len(),
        _ => 0,
    }
}

fn seq_range(rows: &RecordBatch) -> (u64, u64) {
    use arrow::array::AsArray;
    let s = rows
        .column_by_name(crate::schema::SEQ_COLUMN)
        .map(|c| c.as_primitive::<arrow::datatypes::UInt64Type>().clone());
    match s {
        Some(s) if !s.is_empty() => (
            s.iter().flatten().min().unwrap_or(0),
            s.iter().flatten().max().unwrap_or(0),
        ),
        _ => (0, 0),
    }
}

fn seq_of_last(rows: &RecordBatch) -> Option<u64> {
    let (_, last) = seq_range(rows);
    (rows.num_rows() > 0).then_some(last)
}
