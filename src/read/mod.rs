//! The read path: snapshots of sources and the live rows they hold.
//!
//! A *source* is the active memtable, a frozen memtable or a generation. Sources are ordered
//! newest first; the first source holding a key decides it (its newest version, or a tombstone
//! that hides every older version).

use crate::generation::Generation;
use crate::key::Key;
use crate::memtable::deleted_flags;
use crate::{Error, Result};
use arrow::array::{RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use datafusion::prelude::SessionContext;
use std::collections::HashSet;
use std::sync::Arc;

/// What a query reads: fixed when it starts.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// Newest rows of each memtable, newest memtable first.
    pub memtables: Vec<RecordBatch>,
    /// Generations, newest first.
    pub generations: Vec<Arc<Generation>>,
}

impl Snapshot {
    /// Every live row (newest version per key, tombstones dropped), projected to `user_schema`.
    pub fn live_rows(&self, user_schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
        let mut seen: HashSet<Key> = HashSet::new();
        let sources = self
            .memtables
            .iter()
            .chain(self.generations.iter().map(|g| g.rows()));
        let mut out = Vec::new();
        for rows in sources {
            let deleted = deleted_flags(rows);
            let keys = rows.column(0);
            let mut keep = Vec::new();
            for r in 0..rows.num_rows() {
                let Some(k) = Key::from_array(keys.as_ref(), r) else {
                    continue;
                };
                if seen.insert(k) && !deleted.value(r) {
                    keep.push(r as u32);
                }
            }
            if keep.is_empty() {
                continue;
            }
            let idx = UInt32Array::from(keep);
            let columns = (0..user_schema.fields().len())
                .map(|c| arrow::compute::take(rows.column(c), &idx, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            out.push(RecordBatch::try_new(user_schema.clone(), columns)?);
        }
        Ok(out)
    }
}

/// Keep the rows matching a SQL predicate over the index's columns (parsed by DataFusion).
pub(crate) async fn filter_rows(
    batches: Vec<RecordBatch>,
    schema: &SchemaRef,
    filter: &str,
) -> Result<Vec<RecordBatch>> {
    let invalid =
        |e: datafusion::error::DataFusionError| Error::invalid(format!("filter '{filter}': {e}"));
    let ctx = SessionContext::new();
    let table = datafusion::datasource::MemTable::try_new(schema.clone(), vec![batches])?;
    let df = ctx.read_table(Arc::new(table))?;
    let expr = df.parse_sql_expr(filter).map_err(invalid)?;
    let df = df.filter(expr).map_err(invalid)?;
    df.collect().await.map_err(invalid)
}
