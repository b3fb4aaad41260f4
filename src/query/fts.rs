//! Full-text search: parse once, compute global BM25 statistics over the snapshot's live rows,
//! run one tantivy search per arm with its live rows and filter applied inside the collector,
//! merge the arms' top k in DataFusion.

use super::annotate::{AnnotationInputs, Annotations};
use super::exec::{
    ranked, ranked_schema, sort_ordering, ArmExec, ArmRows, ArmSpec, ArmWork, RankedPlan, Spread,
};
use super::{Conjunction, SearchOptions, SCORE_COLUMN};
use crate::key::Key;
use crate::read::pool::{QueryPool, Stop};
use crate::read::{
    compile_filter, filter_rows, past_view, DeadRowCache, LiveRows, Looked, ReadCaches, Snapshot,
    Source,
};
use crate::schema::IndexSchema;
use crate::text::{ColdPiece, DocRows, TailQuery, TextIndex, TextSchema};
use crate::{Error, Result};
use arrow::array::{ArrayRef, Float32Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::ExecutionPlan;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tantivy::query::{Bm25StatisticsProvider, EnableScoring, Query, QueryParser, Weight};
use tantivy::{DocId, DocSet, Term};

/// BM25 statistics of the snapshot's live rows, for the query's terms.
#[derive(Debug, Default)]
pub(crate) struct GlobalStats {
    pub docs: u64,
    pub tokens: HashMap<tantivy::schema::Field, u64>,
    pub doc_freq: HashMap<Term, u64>,
}

impl GlobalStats {
    /// The statistics over the live rows of every source: each source's live rows and share
    /// (its tokens per field of `ts`, and its document frequency of each of `terms`), summed.
    fn sum<'a>(
        ts: &TextSchema,
        terms: &[Term],
        shares: impl Iterator<Item = (usize, &'a SourceStats)>,
    ) -> GlobalStats {
        let mut stats = GlobalStats::default();
        let mut tokens = vec![0u64; ts.fields().len()];
        let mut doc_freq = vec![0u64; terms.len()];
        for (live_rows, s) in shares {
            stats.docs += live_rows as u64;
            for (sum, n) in tokens.iter_mut().zip(&s.tokens) {
                *sum += n;
            }
            for (sum, n) in doc_freq.iter_mut().zip(&s.doc_freq) {
                *sum += n;
            }
        }
        stats.tokens = ts.fields().iter().copied().zip(tokens).collect();
        stats.doc_freq = terms.iter().cloned().zip(doc_freq).collect();
        stats
    }
}

impl GlobalStats {
    /// These statistics, given to score a point in time whose own are `local`, when they
    /// can be a sum that includes `local` (a shard's share of a sharded index's statistics);
    /// otherwise an `Invalid` error saying what does not add up (they were computed for
    /// another query, or over other rows).
    fn covering(&self, local: &GlobalStats, ts: &TextSchema) -> Result<GlobalStats> {
        let wrong = |what: String| {
            Err(Error::invalid(format!(
                "full-text statistics given to a search count {what}: they are not a sum of \
                 shares including this point in time's (computed for another query or index?)"
            )))
        };
        if self.docs < local.docs {
            return wrong(format!(
                "{} live rows, fewer than this point in time's {}",
                self.docs, local.docs
            ));
        }
        for (field, n) in &local.tokens {
            let given = self.tokens.get(field).copied().unwrap_or(0);
            if given < *n {
                return wrong(format!(
                    "{given} tokens in column '{}', fewer than this point in time's {n}",
                    ts.schema().get_field_name(*field)
                ));
            }
        }
        for (term, n) in &local.doc_freq {
            let given = self.doc_freq.get(term).copied().unwrap_or(0);
            if given < *n {
                return wrong(format!(
                    "{given} rows holding the term {term:?}, fewer than this point in time's {n}"
                ));
            }
        }
        if let Some((term, n)) = self.doc_freq.iter().find(|(_, n)| **n > self.docs) {
            return wrong(format!(
                "{n} rows holding the term {term:?}, more than their {} live rows",
                self.docs
            ));
        }
        Ok(GlobalStats {
            docs: self.docs,
            tokens: self.tokens.clone(),
            doc_freq: self.doc_freq.clone(),
        })
    }

    /// The public form of these statistics: columns by name.
    fn to_public(&self, ts: &TextSchema) -> FtsStatistics {
        let mut doc_freq: Vec<(Term, u64)> =
            self.doc_freq.iter().map(|(t, n)| (t.clone(), *n)).collect();
        doc_freq.sort();
        FtsStatistics {
            docs: self.docs,
            tokens: self
                .tokens
                .iter()
                .map(|(f, n)| (ts.schema().get_field_name(*f).to_string(), *n))
                .collect(),
            doc_freq,
        }
    }

    /// Statistics from their public form, checked against the text schema `ts`.
    pub(crate) fn from_public(s: &FtsStatistics, ts: &TextSchema) -> Result<GlobalStats> {
        let mut tokens = HashMap::new();
        for (name, n) in &s.tokens {
            let field = ts
                .schema()
                .get_field(name)
                .ok()
                .filter(|f| ts.fields().contains(f))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "full-text statistics name column '{name}', which is not a text column"
                    ))
                })?;
            tokens.insert(field, *n);
        }
        let mut doc_freq = HashMap::new();
        for (term, n) in &s.doc_freq {
            if !ts.fields().contains(&term.field()) {
                return Err(Error::invalid(format!(
                    "full-text statistics hold the term {term:?} of a field that is not a text column"
                )));
            }
            let sum: &mut u64 = doc_freq.entry(term.clone()).or_default();
            *sum = sum.saturating_add(*n);
        }
        Ok(GlobalStats {
            docs: s.docs,
            tokens,
            doc_freq,
        })
    }
}

/// The BM25 statistics of a full-text query over the live rows of a point in time: its
/// live rows, the tokens of each text column, and the rows holding each of the query's
/// terms. A sharded index's shards each compute their share
/// ([`crate::PointInTime::fts_statistics`]); the sum ([`FtsStatistics::add`]) scores every
/// shard's rows as one index over all of them would
/// ([`crate::PointInTime::search_fts_with_statistics`]). Serializable (serde), so shares
/// can travel between processes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FtsStatistics {
    docs: u64,
    tokens: BTreeMap<String, u64>,
    doc_freq: Vec<(Term, u64)>,
}

impl FtsStatistics {
    /// Live rows counted.
    pub fn docs(&self) -> u64 {
        self.docs
    }

    /// Tokens counted in text column `column`.
    pub fn tokens(&self, column: &str) -> u64 {
        self.tokens.get(column).copied().unwrap_or(0)
    }

    /// About how many bytes these statistics take in memory.
    pub(crate) fn size(&self) -> usize {
        let tokens: usize = self.tokens.keys().map(|c| c.len() + 48).sum();
        let terms: usize = self
            .doc_freq
            .iter()
            .map(|(t, _)| t.serialized_value_bytes().len() + 48)
            .sum();
        std::mem::size_of::<FtsStatistics>() + tokens + terms
    }

    /// The sum of `shares` (of the same query over disjoint rows).
    pub(crate) fn sum(shares: &[FtsStatistics]) -> FtsStatistics {
        let mut sum = FtsStatistics::default();
        shares.iter().for_each(|s| sum.add(s));
        sum
    }

    /// Add `other`'s counts to these (shares of the same query over disjoint rows).
    pub fn add(&mut self, other: &FtsStatistics) {
        self.docs = self.docs.saturating_add(other.docs);
        for (column, n) in &other.tokens {
            let sum = self.tokens.entry(column.clone()).or_default();
            *sum = sum.saturating_add(*n);
        }
        let mut terms: BTreeMap<Term, u64> = BTreeMap::new();
        for (term, n) in self
            .doc_freq
            .drain(..)
            .chain(other.doc_freq.iter().cloned())
        {
            let sum = terms.entry(term).or_default();
            *sum = sum.saturating_add(n);
        }
        self.doc_freq = terms.into_iter().collect();
    }
}

/// The statistics of `query` over `snapshot`'s live rows (the first phase of a sharded
/// index's full-text search): what [`prepare`] computes before it scores, without reading
/// postings or filter columns.
pub(crate) fn statistics(
    text: Option<&Arc<TextSchema>>,
    snapshot: Snapshot,
    query: &str,
    opts: &SearchOptions,
) -> Result<FtsStatistics> {
    let ts =
        text.ok_or_else(|| Error::invalid("full-text search on an index without text columns"))?;
    let query = parse_query(ts, query, opts.conjunction)?;
    let live = snapshot.live();
    let (needs, terms) = query_terms(query.as_ref());
    let per_source = snapshot.pool.install(|| {
        shares(
            ts,
            &snapshot.caches,
            &snapshot.sources,
            &live,
            &terms,
            &needs,
        )
    })?;
    let stats = GlobalStats::sum(ts, &terms, per_source.iter().map(|(_, n, s, _)| (*n, s)));
    Ok(stats.to_public(ts))
}

/// Check a full-text score floor (`min_score`): finite and at least 0.
pub(crate) fn check_min_score(min_score: Option<f32>) -> Result<()> {
    match min_score.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        Some(t) => Err(Error::invalid(format!(
            "min_score is {t}: it must be a finite number at least 0"
        ))),
        None => Ok(()),
    }
}

/// The query's terms, sorted and unique, each with whether its search reads positions (a
/// phrase's, anywhere in the query); and the terms alone.
fn query_terms(query: &dyn Query) -> (Vec<(Term, bool)>, Vec<Term>) {
    let mut all: Vec<(Term, bool)> = Vec::new();
    query.query_terms(&mut |t, positions| all.push((t.clone(), positions)));
    all.sort();
    let mut needs: Vec<(Term, bool)> = Vec::with_capacity(all.len());
    for (t, positions) in all {
        match needs.last_mut() {
            Some((last, p)) if *last == t => *p |= positions,
            _ => needs.push((t, positions)),
        }
    }
    let terms: Vec<Term> = needs.iter().map(|(t, _)| t.clone()).collect();
    (needs, terms)
}

impl Bm25StatisticsProvider for GlobalStats {
    fn total_num_tokens(&self, field: tantivy::schema::Field) -> tantivy::Result<u64> {
        Ok(self.tokens.get(&field).copied().unwrap_or(0))
    }

    fn total_num_docs(&self) -> tantivy::Result<u64> {
        Ok(self.docs)
    }

    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        Ok(self.doc_freq.get(term).copied().unwrap_or(0))
    }
}

/// The field names a parsed query mentions.
fn fields_named(ast: &tantivy::query_grammar::UserInputAst, out: &mut Vec<String>) {
    use tantivy::query_grammar::{UserInputAst, UserInputLeaf};
    match ast {
        UserInputAst::Clause(clauses) => clauses.iter().for_each(|(_, a)| fields_named(a, out)),
        UserInputAst::Boost(a, _) => fields_named(a, out),
        UserInputAst::Leaf(leaf) => match leaf.as_ref() {
            UserInputLeaf::Literal(l) => out.extend(l.field_name.clone()),
            UserInputLeaf::Range { field, .. }
            | UserInputLeaf::Set { field, .. }
            | UserInputLeaf::Regex { field, .. } => out.extend(field.clone()),
            UserInputLeaf::Exists { field } => out.push(field.clone()),
            UserInputLeaf::All => {}
        },
    }
}

/// Parse `query` with tantivy's query-parser syntax over every text column.
pub(crate) fn parse_query(
    ts: &TextSchema,
    query: &str,
    conjunction: Conjunction,
) -> Result<Box<dyn Query>> {
    if query.trim().is_empty() {
        return Err(Error::invalid("full-text query is empty"));
    }
    let index = ts.query_index();
    let mut parser = QueryParser::for_index(index, ts.fields().to_vec());
    if conjunction == Conjunction::And {
        parser.set_conjunction_by_default();
    }
    // Every field the query names (in terms, phrases, ranges, sets, `field:*`) must be a text
    // column: tantivy's parser reports unknown fields only for some of these forms.
    if let Ok(ast) = tantivy::query_grammar::parse_query(query) {
        let mut named = Vec::new();
        fields_named(&ast, &mut named);
        let text: Vec<&str> = ts
            .fields()
            .iter()
            .map(|f| ts.schema().get_field_name(*f))
            .collect();
        if let Some(f) = named.iter().find(|f| !text.contains(&f.as_str())) {
            return Err(Error::invalid(format!(
                "full-text query '{query}': unknown field '{f}' (text columns: {})",
                text.join(", ")
            )));
        }
    }
    let q = parser
        .parse_query(query)
        .map_err(|e| Error::invalid(format!("full-text query '{query}': {e}")))?;
    let mut bad = None;
    q.query_terms(&mut |t, _| {
        if ts.field_position(t.field()).is_none() {
            bad = Some(ts.schema().get_field_name(t.field()).to_string());
        }
    });
    if let Some(f) = bad {
        return Err(Error::invalid(format!(
            "full-text query '{query}': unknown field '{f}' (text columns: {})",
            ts.fields()
                .iter()
                .map(|f| ts.schema().get_field_name(*f))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(q)
}

/// Log a full-text plan that took 10 ms or more (`lsmsearch::slow`), with the time to its
/// live rows and to its statistics.
fn log_slow_plan(total: Duration, t_live: Duration, t_stats: Duration) {
    if total.as_millis() >= 10 {
        tracing::debug!(
            target: "lsmsearch::slow",
            "full-text plan took {:.1} ms: live rows {:.1}, statistics {:.1}, filters and arms {:.1}",
            total.as_secs_f64() * 1e3,
            t_live.as_secs_f64() * 1e3,
            (t_stats - t_live).as_secs_f64() * 1e3,
            (total - t_stats).as_secs_f64() * 1e3
        );
    }
}

/// The weight and tail query every arm shares (see [`scoring`]).
type SharedScoring = (Option<Arc<dyn Weight>>, Option<Arc<TailQuery>>, bool);

/// What every arm scores with: one weight (BM25 over the global statistics does not depend on
/// the arm; `None` without sources); when a memtable's index holds rows past its last commit
/// and the query allows it, the same query compiled for them (scored from their postings in
/// memory; otherwise from a tantivy segment of them); and whether a segment may be scored in
/// pieces ([`seeks`]).
fn scoring(
    query: &dyn Query,
    ts: &TextSchema,
    stats: &GlobalStats,
    indexes: &[TextIndex],
) -> Result<SharedScoring> {
    let weight: Option<Arc<dyn Weight>> = match indexes.first() {
        Some(first) => Some(Arc::from(query.weight(
            EnableScoring::enabled_from_statistics_provider(stats, first.searcher()),
        )?)),
        None => None,
    };
    let tail_query = if indexes.iter().any(TextIndex::has_tail) {
        TailQuery::compile(query, ts, stats)?.map(Arc::new)
    } else {
        None
    };
    Ok((weight, tail_query, seeks(query)))
}

/// Whether `query` is made of terms, phrases and their boolean combinations only, whose
/// scorers seek: a segment can be scored in pieces (see [`pieces`]). Other queries (ranges,
/// regular expressions, term sets, phrase prefixes) build their scorer by reading the whole
/// segment's matches, which each piece would do again.
fn seeks(query: &dyn Query) -> bool {
    use tantivy::query::{BooleanQuery, EmptyQuery, PhraseQuery, TermQuery};
    if query.downcast_ref::<TermQuery>().is_some()
        || query.downcast_ref::<PhraseQuery>().is_some()
        || query.downcast_ref::<EmptyQuery>().is_some()
    {
        return true;
    }
    query
        .downcast_ref::<BooleanQuery>()
        .is_some_and(|q| q.clauses().iter().all(|(_, sub)| seeks(sub.as_ref())))
}

/// Build the physical plan of a full-text search over a snapshot.
pub(crate) fn plan(
    schema: &IndexSchema,
    text: Option<&Arc<TextSchema>>,
    snapshot: Snapshot,
    query: &str,
    opts: &SearchOptions,
    global: Option<&GlobalStats>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let columns = super::returned_columns(schema, opts.columns.as_deref(), SCORE_COLUMN)?;
    let prepared = prepare(schema, text, snapshot, query, opts, global)?;
    let annotations = match text {
        Some(ts) => Annotations::new(
            AnnotationInputs {
                schema,
                text: ts,
                query: prepared.query.as_ref(),
                doc_freq: &prepared.stats.doc_freq,
                weight: prepared.scoring.0.clone(),
                indexes: prepared.parts.iter().map(|p| p.1.clone()).collect(),
            },
            &columns,
            opts.highlight.as_ref(),
            opts.explain,
            &super::output_schema(schema, SCORE_COLUMN, &columns),
        )?,
        None => None,
    };
    ranked_plan(schema, prepared, opts)?.take_annotated(
        schema,
        SCORE_COLUMN,
        true,
        columns,
        annotations,
    )
}

/// A full-text query made ready to run over a snapshot: parsed, its global statistics
/// computed, its postings and its filter's columns read, and each source's eligible rows
/// (live, passing the filter) known. Searches, counts, explanations and highlights start
/// here.
pub(crate) struct Prepared {
    /// The rows a search ranks: `offset + k`.
    window: usize,
    /// The parsed query.
    query: Arc<dyn Query>,
    /// BM25 statistics of the snapshot's live rows for the query's terms.
    stats: GlobalStats,
    scoring: SharedScoring,
    /// Per source: the source, its text index, its eligible rows and its live rows.
    parts: Vec<(Source, TextIndex, LiveRows, usize)>,
    pool: Arc<crate::read::pool::QueryPool>,
    caches: Arc<crate::read::ReadCaches>,
    sources: Vec<Source>,
}

/// Prepare `query` over `snapshot` (see [`Prepared`]), its options checked. Scores use
/// `global` when given (the statistics of the live rows of every shard of a sharded index,
/// see [`statistics`]), and otherwise those of the snapshot's live rows.
pub(crate) fn prepare(
    schema: &IndexSchema,
    text: Option<&Arc<TextSchema>>,
    snapshot: Snapshot,
    query: &str,
    opts: &SearchOptions,
    global: Option<&GlobalStats>,
) -> Result<Prepared> {
    let ts =
        text.ok_or_else(|| Error::invalid("full-text search on an index without text columns"))?;
    let window = super::result_window(opts.k, opts.offset)?;
    check_min_score(opts.min_score)?;
    let query: Arc<dyn Query> = Arc::from(parse_query(ts, query, opts.conjunction)?);
    let user = schema.arrow_schema();
    let filter = opts
        .filter
        .as_deref()
        .map(|f| compile_filter(&user, f))
        .transpose()?;

    let started = std::time::Instant::now();
    // Live rows, then each source's text index (a memtable's is caught up here), its live
    // rows and its share of the statistics, concurrently across sources on the query pool.
    let live = snapshot.live();
    let t_live = started.elapsed();
    let pool = snapshot.pool.clone();
    let caches = snapshot.caches.clone();
    let sources = snapshot.sources;
    let (needs, terms) = query_terms(query.as_ref());
    let per_source = pool.install(|| shares(ts, &caches, &sources, &live, &terms, &needs))?;
    let t_stats = started.elapsed();
    let stats = GlobalStats::sum(ts, &terms, per_source.iter().map(|(_, n, s, _)| (*n, s)));
    let stats = match global {
        Some(g) => g.covering(&stats, ts)?,
        None => stats,
    };
    let mut pieces_of = Vec::with_capacity(sources.len());
    let (indexes, live_rows): (Vec<TextIndex>, Vec<usize>) = per_source
        .into_iter()
        .map(|(ti, n, _, pieces)| {
            pieces_of.push(pieces);
            (ti, n)
        })
        .unzip();
    let scoring = scoring(query.as_ref(), ts, &stats, &indexes)?;

    // The query's postings and the filter's columns are read at once: one round, not two.
    let (warmed, filter_rows) = pool.install(|| {
        rayon::join(
            || warm_postings(&sources, pieces_of),
            || filter_rows(&pool, &caches.columns, &sources, filter.as_ref(), &user),
        )
    });
    warmed?;
    let filter_rows = filter_rows?;
    let parts = sources
        .iter()
        .cloned()
        .zip(indexes)
        .zip(live)
        .zip(live_rows)
        .zip(filter_rows)
        .map(|((((source, ti), live), live_rows), fm)| {
            let eligible = match fm {
                Some(fm) => live.and(&fm),
                None => live,
            };
            (source, ti, eligible, live_rows)
        })
        .collect();
    log_slow_plan(started.elapsed(), t_live, t_stats);
    Ok(Prepared {
        window,
        query,
        stats,
        scoring,
        parts,
        pool,
        caches,
        sources,
    })
}

/// The rows of a full-text search over a snapshot, ranked and merged, before their columns
/// are read ([`RankedPlan`]).
pub(crate) fn plan_ranked(
    schema: &IndexSchema,
    text: Option<&Arc<TextSchema>>,
    snapshot: Snapshot,
    query: &str,
    opts: &SearchOptions,
    global: Option<&GlobalStats>,
) -> Result<RankedPlan> {
    ranked_plan(
        schema,
        prepare(schema, text, snapshot, query, opts, global)?,
        opts,
    )
}

/// The rows of a prepared full-text search, ranked and merged ([`RankedPlan`]).
fn ranked_plan(
    schema: &IndexSchema,
    prepared: Prepared,
    opts: &SearchOptions,
) -> Result<RankedPlan> {
    let out_schema = super::output_schema(schema, SCORE_COLUMN, &[]);
    let ranked = ranked_schema(&out_schema);
    let ordering = sort_ordering(&ranked, true, SCORE_COLUMN)?;
    let Prepared {
        window,
        scoring,
        parts,
        pool,
        caches,
        sources,
        ..
    } = prepared;
    let mut arms: Vec<ArmSpec> = Vec::with_capacity(parts.len());
    for (src, (source, ti, eligible, live_rows)) in parts.into_iter().enumerate() {
        let candidates = eligible.count();
        let description = format!(
            "source={}, rows={}, live={live_rows}, candidates={candidates}, k={}",
            source.name(),
            source.rows(),
            window
        );
        let k = window.min(candidates);
        let work = arm_work(source, ti, &scoring, eligible, k, src, &ranked, &pool);
        arms.push(ArmSpec { description, work });
    }
    let leaf = Arc::new(ArmExec::new(
        "FtsArmExec",
        (ranked, ordering.clone()),
        arms,
        Spread::PerArm,
        pool,
    ));
    let merged = Arc::new(SortPreservingMergeExec::new(ordering, leaf).with_fetch(Some(window)));
    Ok(RankedPlan {
        merged: super::page(
            super::within(merged, SCORE_COLUMN, opts.min_score, true)?,
            opts.offset,
            opts.k,
        ),
        sources,
        caches,
    })
}

/// The exact number of live rows of `snapshot` matching `query` and `opts`' filter (and
/// scoring at least its `min_score`), counted over every source concurrently on the query
/// pool. `k`, `offset` and `columns` play no part. Stops between segments when `stop` says
/// the query went.
pub(crate) fn count(
    schema: &IndexSchema,
    text: Option<&Arc<TextSchema>>,
    snapshot: Snapshot,
    query: &str,
    opts: &SearchOptions,
    global: Option<&GlobalStats>,
    stop: &Stop,
) -> Result<u64> {
    use rayon::prelude::*;
    // A count ranks nothing: its k and offset play no part.
    let unpaged = SearchOptions {
        k: 1,
        offset: 0,
        ..opts.clone()
    };
    let prepared = prepare(schema, text, snapshot, query, &unpaged, global)?;
    let Some(weight) = prepared.scoring.0.as_deref() else {
        return Ok(0);
    };
    let tail = prepared.scoring.1.as_deref();
    let floor = opts.min_score.unwrap_or(f32::MIN);
    prepared.pool.install(|| {
        prepared
            .parts
            .par_iter()
            .map(|(_, ti, eligible, _)| {
                let mut n = 0u64;
                let scoring = Scoring {
                    weight,
                    tail,
                    stop,
                    pool: None,
                };
                each_match(ti, scoring, &mut |row, score| {
                    if score >= floor && eligible.admits(row) {
                        n += 1;
                    }
                })?;
                Ok(n)
            })
            .sum()
    })
}

/// A source's text index, its live rows, its share of the statistics and what its search
/// reads of its cold part.
type Share = (TextIndex, usize, SourceStats, Vec<ColdPiece>);

/// Each source's text index, live rows, share of the statistics of `terms` and what its
/// search of `needs` (the same terms, each with whether positions are read) will read of its cold
/// part: the terms looked up in every source concurrently across terms, then each source's
/// share concurrently across sources (on the query pool this runs in).
fn shares(
    ts: &TextSchema,
    caches: &ReadCaches,
    sources: &[Source],
    live: &[LiveRows],
    terms: &[Term],
    needs: &[(Term, bool)],
) -> Result<Vec<Share>> {
    use rayon::prelude::*;
    // A memtable's index catches up here, concurrently across sources.
    let indexes = sources
        .par_iter()
        .map(|s| {
            s.text_index()?
                .ok_or_else(|| Error::internal("a source without a text index"))
        })
        .collect::<Result<Vec<_>>>()?;
    let looked = caches.terms.look_up(sources, &indexes, needs)?;
    // Transposed: per source, each term's document frequency, and its pieces.
    let mut per_source: Vec<(Vec<u64>, Vec<ColdPiece>)> = (0..sources.len())
        .map(|_| (Vec::with_capacity(terms.len()), Vec::new()))
        .collect();
    for term in looked {
        for (s, Looked { doc_freq, pieces }) in per_source.iter_mut().zip(term) {
            s.0.push(doc_freq);
            s.1.extend(pieces);
        }
    }
    sources
        .par_iter()
        .zip(live.par_iter())
        .zip(indexes)
        .zip(per_source)
        .map(|(((source, live), ti), (doc_freq, pieces))| {
            let stats = source_stats(ts, &caches.dead, source, &ti, live, terms, doc_freq)?;
            Ok((ti, live.count(), stats, pieces))
        })
        .collect()
}

/// Fetch the postings (and positions, where the query needs them) of the query's terms that
/// each generation reads by range (`pieces`, per source), all in one concurrent round, so
/// that the arms' synchronous searches find them in memory. Terms the query does not list (a
/// phrase prefix's expansions) are read when its arm asks.
fn warm_postings(sources: &[Source], pieces: Vec<Vec<ColdPiece>>) -> Result<()> {
    let mut gens = Vec::new();
    let mut wanted = Vec::new();
    for (source, p) in sources.iter().zip(pieces) {
        if let (Source::Generation(g), false) = (source, p.is_empty()) {
            gens.push(g.clone());
            wanted.push(p);
        }
    }
    let reads = futures::future::try_join_all(gens.iter().zip(&wanted).map(|(g, p)| g.warm(p)));
    crate::generation::Generation::block_on_any(&gens, reads).map_or(Ok(()), |r| r.map(drop))
}

/// One source's share of the global statistics: tokens per text field and documents per
/// query term, over its live rows.
struct SourceStats {
    tokens: Vec<u64>,
    doc_freq: Vec<u64>,
}

/// The statistics of `source`'s live rows: its index's totals (`doc_freq` of each of
/// `terms`, every row counted) minus what its dead rows hold.
fn source_stats(
    ts: &TextSchema,
    dead_rows: &DeadRowCache,
    source: &Source,
    ti: &TextIndex,
    live: &LiveRows,
    terms: &[Term],
    doc_freq: Vec<u64>,
) -> Result<SourceStats> {
    let dead = dead_rows.for_source(source);
    let mut dead = dead.lock().unwrap_or_else(|e| e.into_inner());
    dead.update(ts, source, ti, live, Some(dead_rows))?;
    let (past_df, past_tokens) = past_view(ti, ts.fields().len(), live.len(), terms)?;
    let tokens = (0..ts.fields().len())
        .map(|pos| {
            ti.total_tokens(pos)
                .saturating_sub(dead.tokens(pos) + past_tokens[pos])
        })
        .collect();
    let doc_freq = terms
        .iter()
        .zip(past_df)
        .zip(doc_freq)
        .map(|((term, past), all)| all.saturating_sub(dead.doc_freq(term) + past))
        .collect();
    Ok(SourceStats { tokens, doc_freq })
}

/// A row competing for an arm's top k: ordered so that the greatest is the worst (lowest score,
/// then largest key), which is the order of the merged result reversed.
struct Ranked {
    score: f32,
    key: Option<Key>,
    row: usize,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then_with(|| self.key.cmp(&other.key))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Ranked {}

/// The best k rows by score, ties broken by key.
struct TopRows<'a> {
    heap: BinaryHeap<Ranked>,
    k: usize,
    source: &'a Source,
    /// The score a document must reach to enter: the k-th score once there are k.
    floor: f32,
}

impl TopRows<'_> {
    /// Offer `row` with `score`.
    fn push(&mut self, score: f32, row: usize) {
        if self.heap.len() == self.k && score < self.heap.peek().expect("k > 0").score {
            return;
        }
        let key = self.source.key_at(row);
        self.insert(Ranked { score, key, row });
    }

    /// Offer `candidate`.
    fn insert(&mut self, candidate: Ranked) {
        if self.heap.len() == self.k {
            let worst = self.heap.peek().expect("k > 0");
            if candidate < *worst {
                self.heap.pop();
                self.heap.push(candidate);
            }
        } else {
            self.heap.push(candidate);
        }
        if self.heap.len() == self.k {
            self.floor = self.heap.peek().expect("k > 0").score;
        }
    }
}

/// How an arm scores: the query's weight, and what scores a memtable's rows past its last
/// commit when the query allows it (see [`TailQuery`]); and what tells it the query went.
struct Scoring<'a> {
    weight: &'a dyn Weight,
    tail: Option<&'a TailQuery>,
    stop: &'a Stop,
    /// The pool a search arm runs on, when it may score a generation's segment in pieces
    /// there (the query's scorers seek: see [`seeks`] and [`pieces`]).
    pool: Option<&'a QueryPool>,
}

/// The work of one arm over `source` (number `src` of the snapshot): its best `k` eligible
/// rows (at most its candidates, which bounds its heap), none when nothing can match.
#[allow(clippy::too_many_arguments)]
fn arm_work(
    source: Source,
    ti: TextIndex,
    scoring: &SharedScoring,
    eligible: LiveRows,
    k: usize,
    src: usize,
    ranked: &SchemaRef,
    pool: &Arc<QueryPool>,
) -> ArmWork {
    let ranked = ranked.clone();
    let pool = pool.clone();
    match &scoring.0 {
        Some(weight) if k > 0 => {
            let weight = weight.clone();
            let tail_query = scoring.1.clone();
            let seeks = scoring.2;
            Arc::new(move |stop| {
                search_arm(
                    &source,
                    &ti,
                    Scoring {
                        weight: weight.as_ref(),
                        tail: tail_query.as_deref(),
                        stop,
                        pool: seeks.then_some(&pool),
                    },
                    &eligible,
                    k,
                    src,
                    &ranked,
                )
            })
        }
        _ => Arc::new(move |_| Ok(ArmRows::Done(RecordBatch::new_empty(ranked.clone())))),
    }
}

/// One arm: the query's shared weight over each segment of the arm's index (and `tail`, when
/// given, over a memtable's rows past its last commit), rows outside `eligible` skipped, the best
/// `k` by score then key. Every matching document is scored: block-max WAND
/// (`for_each_pruning`) was measured slower on long natural-language queries (twenty-odd terms
/// over two fields), and cannot prune on documents the filter rejects.
fn search_arm(
    source: &Source,
    ti: &TextIndex,
    scoring: Scoring<'_>,
    eligible: &LiveRows,
    k: usize,
    src: usize,
    ranked_schema: &SchemaRef,
) -> Result<ArmRows> {
    let new_top = || TopRows {
        heap: BinaryHeap::with_capacity(super::heap_capacity(k)),
        k,
        source,
        floor: f32::MIN,
    };
    // In pieces: a generation's segments, for a query whose scorers seek (the pool is given
    // only then), while the pool holds no other query's work (a thread waiting for a piece
    // runs whatever job is queued).
    let pieces = match (source, scoring.pool) {
        (Source::Generation(_), Some(pool))
            if pool.threads() > 1 && pool.piece_docs() > 0 && !pool.saturated() =>
        {
            pieces(ti, pool.piece_docs(), pool.threads())
        }
        _ => Vec::new(),
    };
    let top = if pieces.len() > 1 {
        // Each piece on a thread of the pool (the one this arm runs on first), into a top of
        // its own; the tops merged.
        use rayon::prelude::*;
        let tops = pieces
            .into_par_iter()
            .map(|(ord, docs)| {
                scoring.stop.check()?;
                let mut top = new_top();
                let mut offer = |row: usize, score: f32| {
                    if score >= top.floor && eligible.admits(row) {
                        top.push(score, row);
                    }
                };
                each_match_in(ti, scoring.weight, ord, docs, &mut offer)?;
                Ok(top)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut tops = tops.into_iter();
        let mut top = tops.next().unwrap_or_else(new_top);
        for other in tops {
            for r in other.heap.into_vec() {
                top.insert(r);
            }
        }
        top
    } else {
        let mut top = new_top();
        let mut offer = |row: usize, score: f32| {
            if score >= top.floor && eligible.admits(row) {
                top.push(score, row);
            }
        };
        each_match(ti, scoring, &mut offer)?;
        top
    };
    let rows: Vec<Ranked> = top.heap.into_sorted_vec();
    let ords: Vec<usize> = rows.iter().map(|r| r.row).collect();
    let scores: ArrayRef = Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.score)));
    Ok(ArmRows::Done(ranked(
        source,
        src,
        &ords,
        scores,
        ranked_schema,
    )?))
}

/// The pieces [`search_arm`] scores `ti`'s segments in, on the query pool's threads:
/// `(segment, documents)`, each segment cut into `max_doc / piece_docs` pieces of about equal
/// size (at least one, at most `threads`), as Lucene slices a segment for intra-query
/// concurrency ([`crate::Settings::query_piece_docs`]).
fn pieces(ti: &TextIndex, piece_docs: u32, threads: usize) -> Vec<(usize, Range<DocId>)> {
    let mut out = Vec::new();
    for (ord, seg) in ti.segment_readers().enumerate() {
        let max = u64::from(seg.max_doc());
        let n = (max / u64::from(piece_docs.max(1))).clamp(1, threads.max(1) as u64);
        for i in 0..n {
            let start = u32::try_from(max * i / n).unwrap_or(u32::MAX);
            let end = u32::try_from(max * (i + 1) / n).unwrap_or(u32::MAX);
            out.push((ord, start..end));
        }
    }
    out
}

/// Call `offer` with every row among documents `docs` of segment `ord` of `ti` (a generation's
/// index, no rows past a commit) that `weight` matches, and its score.
fn each_match_in<F: FnMut(usize, f32)>(
    ti: &TextIndex,
    weight: &dyn Weight,
    ord: usize,
    docs: Range<DocId>,
    offer: &mut F,
) -> Result<()> {
    let seg = ti
        .segment_readers()
        .nth(ord)
        .ok_or_else(|| Error::internal(format!("no segment {ord}")))?;
    let rows = ti.doc_rows(ord)?;
    if docs.start == 0 && docs.end >= seg.max_doc() {
        weight.for_each(seg, &mut |doc, score| {
            if let Some(row) = rows.get(doc) {
                offer(row, score);
            }
        })?;
        return Ok(());
    }
    let mut scorer = weight.scorer(seg, 1.0)?;
    let mut doc = scorer.doc();
    if doc < docs.start {
        doc = scorer.seek(docs.start);
    }
    while doc < docs.end {
        if let Some(row) = rows.get(doc) {
            offer(row, scorer.score());
        }
        doc = scorer.advance();
    }
    Ok(())
}

/// Call `offer` with every row of `ti` that `scoring` matches and its score: each segment of
/// the index, and its rows past the last commit (from their postings in memory when the query
/// compiles for them, otherwise from a tantivy segment of them). Stops between segments when
/// `stop` says the query went.
fn each_match<F: FnMut(usize, f32)>(
    ti: &TextIndex,
    scoring: Scoring<'_>,
    offer: &mut F,
) -> Result<()> {
    let Scoring {
        weight, tail, stop, ..
    } = scoring;
    let tail_readers = match tail {
        Some(tail) => {
            ti.score_tail(tail, &mut *offer);
            Vec::new()
        }
        None => ti.tail_readers()?,
    };
    let mut segments: Vec<(&tantivy::SegmentReader, DocRows)> = Vec::new();
    for (ord, seg) in ti.segment_readers().enumerate() {
        segments.push((seg, ti.doc_rows(ord)?));
    }
    for seg in &tail_readers {
        segments.push((seg, DocRows::of_segment(seg)?));
    }
    for (seg, rows) in segments {
        stop.check()?;
        weight.for_each(seg, &mut |doc, score| {
            if let Some(row) = rows.get(doc) {
                offer(row, score);
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::Conjunction;
    use crate::text::MemTextIndex;
    use arrow::array::{ArrayRef, StringArray};
    use tantivy::query::EnableScoring;

    /// Every match of `query` in `index`'s segments: row → score.
    fn scores(index: &TextIndex, weight: &dyn Weight) -> HashMap<usize, f32> {
        let mut out = HashMap::new();
        for (ord, seg) in index.segment_readers().enumerate() {
            let rows = index.doc_rows(ord).unwrap();
            weight
                .for_each(seg, &mut |doc, score| {
                    out.insert(rows.get(doc).unwrap(), score);
                })
                .unwrap();
        }
        out
    }

    /// Query `q`'s weight over `reference`'s statistics, its matches in `reference` and its
    /// compiled form for tail rows (over the same statistics).
    fn both_ways(
        ts: &TextSchema,
        reference: &TextIndex,
        q: &str,
        conjunction: Conjunction,
    ) -> (Box<dyn Weight>, HashMap<usize, f32>, Option<TailQuery>) {
        let query = parse_query(ts, q, conjunction).unwrap();
        let searcher = reference.searcher();
        let weight = query
            .weight(EnableScoring::enabled_from_searcher(searcher))
            .unwrap();
        let want = scores(reference, weight.as_ref());
        let compiled = TailQuery::compile(query.as_ref(), ts, searcher).unwrap();
        (weight, want, compiled)
    }

    /// Statistics from a worker are summed without overflowing, however large (a share
    /// listing a term twice, or counts near u64::MAX).
    #[test]
    fn huge_statistics_saturate_instead_of_overflowing() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let term = Term::from_field_text(ts.fields()[0], "fox");
        let mut share = FtsStatistics {
            docs: u64::MAX,
            tokens: [("t".to_string(), u64::MAX)].into_iter().collect(),
            doc_freq: vec![(term.clone(), u64::MAX), (term.clone(), u64::MAX)],
        };
        let global = GlobalStats::from_public(&share, &ts).unwrap();
        assert_eq!(global.doc_freq[&term], u64::MAX);
        let other = share.clone();
        share.add(&other);
        assert_eq!(share.docs(), u64::MAX);
        assert_eq!(share.tokens("t"), u64::MAX);
    }

    #[test]
    fn tail_rows_score_as_tantivy_scores_them() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t", "u"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let texts = [
            (Some("red fox jumps over the red hen"), Some("a fox story")),
            (Some("the quick brown fox"), None),
            (None, Some("red red red")),
            (
                Some("hen and fox and hen"),
                Some("farm animals: the hen, the fox"),
            ),
            (Some("brown hen"), Some("red fox")),
            (Some("fox red fox red"), Some("")),
            (Some("the the the"), Some("the end")),
        ];
        let keys: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..texts.len()).map(|i| format!("k{i}")),
        ));
        let t: ArrayRef = Arc::new(StringArray::from_iter(texts.iter().map(|x| x.0)));
        let u: ArrayRef = Arc::new(StringArray::from_iter(texts.iter().map(|x| x.1)));
        let user = RecordBatch::try_new(s.arrow_schema(), vec![keys, t, u]).unwrap();
        let tomb: ArrayRef = Arc::new(StringArray::from(vec!["k1"]));
        let batches = vec![
            s.to_stored(&user.slice(0, 3), 1).unwrap(),
            s.tombstones(&tomb, 4).unwrap(),
            s.to_stored(&user.slice(3, 4), 5).unwrap(),
        ];
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
        // The reference: one committed tantivy index of the same rows; the tail: the same rows
        // past a memtable index's (empty) commit, in two tail segments.
        let (reference, _) = TextIndex::build(&ts, &all).unwrap();
        let mem = Arc::new(MemTextIndex::new(ts.clone()).unwrap());
        mem.view(&batches[..1], 3).unwrap();
        let tail = mem.view(&batches, rows).unwrap();
        assert!(tail.has_tail() && tail.segment_readers().count() == 0);
        let searcher = reference.searcher();
        let direct = [
            "red",
            "red fox",
            "fox red hen",
            "\"red fox\"",
            "\"fox red fox\"",
            "\"the the\"",
            "+red -hen",
            "+fox +hen",
            "t:red u:fox",
            "u:\"red fox\"",
            "red OR (fox AND -brown)",
            "fox -red",
            "missing",
            "fox missing",
            "+fox +missing",
            "(red fox) AND (hen OR brown)",
        ];
        for (q, conjunction) in direct
            .iter()
            .flat_map(|q| [(*q, Conjunction::Or), (*q, Conjunction::And)])
        {
            let (weight, want, compiled) = both_ways(&ts, &reference, q, conjunction);
            let compiled = compiled.unwrap_or_else(|| panic!("{q}: not scored directly"));
            let mut got = HashMap::new();
            tail.score_tail(&compiled, &mut |row, score| {
                assert!(got.insert(row, score).is_none(), "{q}: row {row} twice");
            });
            assert_eq!(
                got.keys().collect::<std::collections::BTreeSet<_>>(),
                want.keys().collect::<std::collections::BTreeSet<_>>(),
                "{q} ({conjunction:?}): matching rows"
            );
            for (row, score) in &want {
                let g = got[row];
                assert!(
                    (g - score).abs() <= 1e-6 * score.abs().max(1.0),
                    "{q} ({conjunction:?}): row {row} scores {g}, tantivy {score}"
                );
            }
            // The same query read from a tantivy segment of the tail finds the same.
            let mut from_segment = HashMap::new();
            for seg in tail.tail_readers().unwrap() {
                let rows = DocRows::of_segment(&seg).unwrap();
                weight
                    .for_each(&seg, &mut |doc, score| {
                        from_segment.insert(rows.get(doc).unwrap(), score);
                    })
                    .unwrap();
            }
            assert_eq!(
                from_segment.len(),
                want.len(),
                "{q}: tantivy segment of the tail"
            );
        }
        // Clauses tail postings do not score: a tantivy segment of the tail serves them.
        for q in [
            "red^2",
            "\"red fo\"*",
            "t:[a TO c]",
            "*",
            "\"red fox\"~1",
            "fox^0.5 hen",
        ] {
            let query = parse_query(&ts, q, Conjunction::Or).unwrap();
            assert!(
                TailQuery::compile(query.as_ref(), &ts, searcher)
                    .unwrap()
                    .is_none(),
                "{q} compiled"
            );
        }
    }

    #[test]
    fn tokens_tantivy_leaves_out_are_not_counted() {
        // The whitespace analyzer keeps a token of any length; tantivy drops one over
        // MAX_TOKEN_LEN bytes from the postings and from the field's length alike.
        let s = IndexSchema::from_json(
            r#"{"primary_key": "id", "text": ["t"], "tokenizer": {"t": "whitespace"}}"#,
        )
        .unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let long = format!("fox {}", "a".repeat(tantivy::tokenizer::MAX_TOKEN_LEN + 1));
        let keys: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c"]));
        let t: ArrayRef = Arc::new(StringArray::from(vec![long.as_str(), "fox fox hen", "hen"]));
        let user = RecordBatch::try_new(s.arrow_schema(), vec![keys, t]).unwrap();
        let batches = vec![s.to_stored(&user, 1).unwrap()];
        let (reference, _) = TextIndex::build(&ts, &batches[0]).unwrap();
        let seg = &reference.searcher().segment_readers()[0];
        let norms = seg.get_fieldnorms_reader(ts.fields()[0]).unwrap();
        let rows = reference.doc_rows(0).unwrap();
        for doc in 0..seg.max_doc() {
            let row = rows.get(doc).unwrap();
            assert_eq!(
                reference.tokens(row, 0),
                norms.fieldnorm(doc),
                "row {row}: token count against tantivy's field length"
            );
        }
        let total = seg
            .inverted_index(ts.fields()[0])
            .unwrap()
            .total_num_tokens();
        assert_eq!(reference.total_tokens(0), total);
        // Tail rows score as tantivy scores them.
        let mem = Arc::new(MemTextIndex::new(ts.clone()).unwrap());
        let tail = mem.view(&batches, 3).unwrap();
        let (_, want, compiled) = both_ways(&ts, &reference, "fox", Conjunction::Or);
        let compiled = compiled.unwrap();
        let mut got = HashMap::new();
        tail.score_tail(&compiled, &mut |row, score| {
            got.insert(row, score);
        });
        assert_eq!(got, want);
    }

    /// A generation's segment scored in pieces of consecutive documents matches what one pass
    /// over it matches, with the same scores, however it is cut.
    #[test]
    fn a_segment_scored_in_pieces_matches_as_one_pass() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t", "u"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let words = ["red", "fox", "hen", "brown", "the", "quick", "farm", "blue"];
        let n = 700;
        // Each row a few words picked by a small generator: every word in many rows, and
        // rows matching none.
        let mut x: u64 = 7;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        let mut text = |len: usize| -> String {
            (0..len)
                .map(|_| words[next() % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        };
        let t: Vec<String> = (0..n).map(|i| text(i % 5)).collect();
        let u: Vec<String> = (0..n).map(|i| text(i % 3)).collect();
        let keys: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| format!("k{i}")),
        ));
        let t: ArrayRef = Arc::new(StringArray::from_iter_values(t));
        let u: ArrayRef = Arc::new(StringArray::from_iter_values(u));
        let user = RecordBatch::try_new(s.arrow_schema(), vec![keys, t, u]).unwrap();
        let (index, _) = TextIndex::build(&ts, &s.to_stored(&user, 1).unwrap()).unwrap();
        let max = index
            .segment_readers()
            .map(|seg| seg.max_doc())
            .sum::<u32>();
        assert_eq!(max as usize, n);
        for q in [
            "red",
            "red fox hen",
            "+fox +hen",
            "\"red fox\"",
            "fox -brown",
            "t:the u:blue",
        ] {
            let (weight, want, _) = both_ways(&ts, &index, q, Conjunction::Or);
            assert!(!want.is_empty(), "{q}: matches nothing");
            for (piece_docs, threads) in [(7, 2), (64, 3), (100, 8), (1000, 4), (1, 700)] {
                let cut = pieces(&index, piece_docs, threads);
                // The pieces cover each segment's documents once, in order.
                let mut at = HashMap::new();
                for (ord, docs) in &cut {
                    let from = at.insert(*ord, docs.end).unwrap_or(0);
                    assert_eq!(docs.start, from, "{q}: pieces {cut:?}");
                }
                let want_pieces = (max / piece_docs).clamp(1, threads as u32) as usize;
                assert_eq!(
                    cut.len(),
                    want_pieces,
                    "{piece_docs} docs, {threads} threads"
                );
                let mut got = HashMap::new();
                for (ord, docs) in cut {
                    each_match_in(&index, weight.as_ref(), ord, docs, &mut |row, score| {
                        assert!(got.insert(row, score).is_none(), "{q}: row {row} twice");
                    })
                    .unwrap();
                }
                assert_eq!(
                    got, want,
                    "{q}: pieces of {piece_docs} for {threads} threads"
                );
            }
        }
    }

    /// Terms, phrases and their boolean combinations are cut into pieces, whether or not a
    /// memtable holds rows past its commit; queries whose scorers read the whole segment are
    /// not.
    #[test]
    fn only_queries_whose_scorers_seek_are_cut() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t", "u"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let q = |text: &str| parse_query(&ts, text, Conjunction::Or).unwrap();
        for text in [
            "red",
            "red fox hen",
            "+fox -hen",
            "\"red fox\"",
            "t:red (u:fox OR hen)",
        ] {
            assert!(seeks(q(text).as_ref()), "{text}");
        }
        for text in ["t:[a TO m]", "\"red fo\"*", "red (t:[a TO c] fox)"] {
            assert!(!seeks(q(text).as_ref()), "{text}");
        }
    }
}
