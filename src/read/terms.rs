//! What full-text searches look up of each query term in each generation: its document
//! frequency, and where its postings and positions lie in the generation's cold part. A
//! generation never changes, so neither do these.
//!
//! They are kept per term, with one entry per generation side by side, so a search of t terms
//! over g generations finds them with t lookups in one table and g entries read in order,
//! rather than t × g lookups in g tables. Each of those missed the processor's caches (two
//! or three loads from memory a lookup): over 18 generations of 5,500 rows they took 0.5 ms
//! of CPU a warm full-text query, a tenth of it.

use super::source::SourceKey;
use super::Source;
use crate::text::{missing, ColdPiece, TermAt, TextIndex};
use crate::Result;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tantivy::Term;

/// Entries (a term in a generation) the table keeps, across terms, before it starts over:
/// each about 150 bytes with its ranges, so about 10 MB.
const MAX_ENTRIES: usize = 1 << 16;

/// A handle's table of what its searches looked up of terms in generations.
#[derive(Debug, Default)]
pub(crate) struct TermTable {
    rows: Mutex<HashMap<Term, Arc<Mutex<Row>>, xxhash_rust::xxh3::Xxh3Builder>>,
    /// Rows and entries made since the table last started over.
    entries: AtomicUsize,
    /// The latest opening of each generation searches met ([`TextIndex::opening`]).
    latest: Mutex<HashMap<SourceKey, u64>>,
    /// The openings the last search read, checked first.
    last: Mutex<LastOpenings>,
}

/// The generations of a search with the openings it read, and those of them read at an
/// earlier opening than the latest met.
#[derive(Debug, Default)]
struct LastOpenings {
    read: Vec<(SourceKey, u64)>,
    older: Vec<SourceKey>,
}

/// One term's entries, in the order searches first met their generations (a snapshot's
/// order, which the next snapshots mostly keep).
#[derive(Debug, Default)]
struct Row(Vec<Entry>);

#[derive(Debug)]
struct Entry {
    key: SourceKey,
    /// The opening of the generation's index `at` was found in ([`TextIndex::opening`]): a
    /// generation opened again has other files, so its entry is found again.
    opening: u64,
    at: TermAt,
    /// The count of entries that had left the postings cache when the term's pieces were
    /// last all found kept, without positions and with them (see [`missing`]).
    kept_at: [Option<u64>; 2],
}

/// A generation's entry for a term, as [`Row::entry`] finds it.
enum Found {
    /// Kept, at this index of the row.
    Kept(usize),
    /// Looked up for an earlier opening than the one kept, and not kept.
    Once(TermAt),
}

/// What a search of one term reads of one source.
#[derive(Default)]
pub(crate) struct Looked {
    /// Documents of the source's index containing the term (dead rows counted).
    pub(crate) doc_freq: u64,
    /// What its search reads of the source's cold part and the postings cache does not hold.
    pub(crate) pieces: Vec<ColdPiece>,
}

impl Row {
    /// The entry of the generation `key`, looked for at `hint` first.
    fn find(&self, key: SourceKey, hint: usize) -> Option<usize> {
        match self.0.get(hint) {
            Some(e) if e.key == key => Some(hint),
            _ => self.0.iter().position(|e| e.key == key),
        }
    }

    /// The index of the entry of generation `source` (whose text index is `ti`) for `term`,
    /// looked for at `hint` first; looked up in `ti` and made when missing or found for an
    /// earlier opening of the generation (`entries` counts the entries made), or looked up
    /// and not kept when found for a later one.
    fn entry(
        &mut self,
        source: &Source,
        ti: &TextIndex,
        term: &Term,
        hint: usize,
        entries: &AtomicUsize,
    ) -> Result<Found> {
        let key = SourceKey::of(source);
        let opening = ti.opening();
        let found = self.find(key, hint);
        match found.map(|i| (i, self.0[i].opening)) {
            Some((i, o)) if o == opening => return Ok(Found::Kept(i)),
            // A search of an earlier opening (a point in time taken before the generation was
            // opened again): its answer is not kept, which would hold that opening's files.
            Some((_, o)) if o > opening => return Ok(Found::Once(ti.term(term)?)),
            _ => {}
        }
        let e = Entry {
            key,
            opening,
            at: ti.term(term)?,
            kept_at: [None; 2],
        };
        Ok(Found::Kept(match found {
            Some(i) => {
                self.0[i] = e;
                i
            }
            None => {
                entries.fetch_add(1, Ordering::Relaxed);
                self.0.push(e);
                self.0.len() - 1
            }
        }))
    }
}

impl TermTable {
    /// For each of `terms` (each with whether its search reads positions), what its search
    /// reads of each of `sources` (whose text indexes are `indexes`): `[term][source]`.
    /// Generations' answers are kept; memtables', which change, are computed. Runs across
    /// terms concurrently (on the query pool this is called in).
    pub(crate) fn look_up(
        &self,
        sources: &[Source],
        indexes: &[TextIndex],
        terms: &[(Term, bool)],
    ) -> Result<Vec<Vec<Looked>>> {
        use rayon::prelude::*;
        let older = self.note_openings(sources, indexes);
        let rows = self.rows(terms.iter().map(|(t, _)| t));
        terms
            .par_iter()
            .zip(rows)
            .map(|((term, positions), row)| {
                let p = usize::from(*positions);
                // Under the row's lock, only each generation's entry, found or made (a lookup
                // in its held term dictionaries), copied out: concurrent searches of the term
                // wait for no more.
                let found = {
                    let mut row = row.lock().unwrap_or_else(|e| e.into_inner());
                    let mut hint = 0;
                    sources
                        .iter()
                        .zip(indexes)
                        .map(|(source, ti)| {
                            if matches!(source, Source::Memtable(_)) {
                                return Ok(None);
                            }
                            let key = SourceKey::of(source);
                            if older.contains(&key) {
                                // Not kept: it would hold an earlier opening's files.
                                return Ok(Some((usize::MAX, ti.term(term)?, None)));
                            }
                            match row.entry(source, ti, term, hint, &self.entries)? {
                                Found::Kept(i) => {
                                    hint = i + 1;
                                    let e = &row.0[i];
                                    Ok(Some((i, e.at.clone(), e.kept_at[p])))
                                }
                                // No entry to write back to.
                                Found::Once(at) => Ok(Some((usize::MAX, at, None))),
                            }
                        })
                        .collect::<Result<Vec<_>>>()?
                };
                let mut kept = Vec::new();
                let looked = sources
                    .iter()
                    .zip(indexes)
                    .zip(found)
                    .map(|((source, ti), found)| match found {
                        None => Ok(Looked {
                            doc_freq: ti.doc_freq(term)?,
                            pieces: Vec::new(),
                        }),
                        Some((i, at, mut kept_at)) => {
                            let ranges: &[_] = match positions {
                                true => &[&at.postings, &at.positions],
                                false => &[&at.postings],
                            };
                            let was = kept_at;
                            let pieces = missing(ranges, &mut kept_at);
                            if kept_at != was {
                                kept.push((i, SourceKey::of(source), ti.opening(), kept_at));
                            }
                            Ok(Looked {
                                doc_freq: at.doc_freq,
                                pieces,
                            })
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                if !kept.is_empty() {
                    let mut row = row.lock().unwrap_or_else(|e| e.into_inner());
                    for (i, key, opening, kept_at) in kept {
                        // Unless another search replaced the entry meanwhile.
                        if let Some(e) = row.0.get_mut(i) {
                            if e.key == key && e.opening == opening {
                                e.kept_at[p] = kept_at;
                            }
                        }
                    }
                }
                Ok(looked)
            })
            .collect()
    }

    /// Note the openings `indexes` of generations `sources` hold; when one is newer than any
    /// met before (the generation was pushed out of the handle's cache and opened again),
    /// drop the entries of its earlier openings, whose ranges name files no search reads any
    /// more (and would keep them alive until the generations change).
    /// Returns the generations `sources` read at an earlier opening than the latest met (a
    /// point in time taken before they were opened again), whose entries are not kept.
    fn note_openings(&self, sources: &[Source], indexes: &[TextIndex]) -> Vec<SourceKey> {
        let now: Vec<(SourceKey, u64)> = sources
            .iter()
            .zip(indexes)
            .filter(|(s, _)| matches!(s, Source::Generation(_)))
            .map(|(s, ti)| (SourceKey::of(s), ti.opening()))
            .collect();
        {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.read == now {
                return last.older.clone();
            }
        }
        let mut newer: HashMap<SourceKey, u64> = HashMap::new();
        let mut older = Vec::new();
        {
            let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
            for (key, opening) in &now {
                let at = latest.entry(*key).or_insert(*opening);
                if *opening > *at {
                    *at = *opening;
                    newer.insert(*key, *opening);
                } else if *opening < *at {
                    older.push(*key);
                }
            }
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = LastOpenings {
            read: now,
            older: older.clone(),
        };
        if newer.is_empty() {
            return older;
        }
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        for row in rows.values() {
            let mut row = row.lock().unwrap_or_else(|e| e.into_inner());
            let before = row.0.len();
            row.0
                .retain(|e| newer.get(&e.key).is_none_or(|o| e.opening >= *o));
            self.entries
                .fetch_sub(before - row.0.len(), Ordering::Relaxed);
        }
        older
    }

    /// The rows of `terms`, made where missing; the table starts over first when it holds
    /// [`MAX_ENTRIES`] entries.
    fn rows<'a>(&self, terms: impl Iterator<Item = &'a Term>) -> Vec<Arc<Mutex<Row>>> {
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if self.entries.load(Ordering::Relaxed) >= MAX_ENTRIES {
            rows.clear();
            self.entries.store(0, Ordering::Relaxed);
        }
        terms
            .map(|t| match rows.get(t) {
                Some(r) => r.clone(),
                None => {
                    self.entries.fetch_add(1, Ordering::Relaxed);
                    rows.entry(t.clone()).or_default().clone()
                }
            })
            .collect()
    }

    /// Rows and entries held.
    pub(crate) fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed) as u64
    }

    /// Drop the entries of generations other than `gens` (sorted; their ranges name the
    /// generation's files).
    pub(crate) fn retain(&self, gens: &[SourceKey]) {
        let keep = |k: &SourceKey| gens.binary_search(k).is_ok();
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep(k));
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        for row in rows.values() {
            let mut row = row.lock().unwrap_or_else(|e| e.into_inner());
            let before = row.0.len();
            row.0.retain(|e| keep(&e.key));
            self.entries
                .fetch_sub(before - row.0.len(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::tests::text_generation;
    use crate::schema::IndexSchema;
    use crate::text::TextSchema;

    /// Each term's document frequency in each source, as the table answers.
    fn doc_freqs(table: &TermTable, sources: &[Source], terms: &[Term]) -> Vec<Vec<u64>> {
        let indexes: Vec<TextIndex> = sources
            .iter()
            .map(|s| s.text_index().unwrap().unwrap())
            .collect();
        let wanted: Vec<(Term, bool)> = terms.iter().map(|t| (t.clone(), false)).collect();
        table
            .look_up(sources, &indexes, &wanted)
            .unwrap()
            .into_iter()
            .map(|per| per.into_iter().map(|l| l.doc_freq).collect())
            .collect()
    }

    #[test]
    fn kept_answers_equal_the_indexes_and_go_with_their_generations() {
        let s = IndexSchema::from_json(r#"{"primary_key": "id", "text": ["t"]}"#).unwrap();
        let ts = TextSchema::new(&s).unwrap();
        let g1 = text_generation(&ts, 1, &["a", "b", "c"], "one two");
        let g2 = text_generation(&ts, 2, &["d", "e"], "two three");
        let sources = vec![Source::Generation(g2), Source::Generation(g1)];
        let field = ts.fields()[0];
        let term = |w: &str| Term::from_field_text(field, w);
        let terms = [term("one"), term("two"), term("three"), term("absent")];
        let table = TermTable::default();
        let want = vec![vec![0, 3], vec![2, 3], vec![2, 0], vec![0, 0]];
        assert_eq!(doc_freqs(&table, &sources, &terms), want);
        // Four rows of two entries each; asked again, the same answers from them.
        assert_eq!(table.entries.load(Ordering::Relaxed), 12);
        assert_eq!(doc_freqs(&table, &sources, &terms), want);
        assert_eq!(table.entries.load(Ordering::Relaxed), 12);

        // Generation 1 leaves the handle's sources: its entries go, once.
        let current: Vec<SourceKey> = sources[..1].iter().map(SourceKey::of).collect();
        table.retain(&current);
        assert_eq!(table.entries.load(Ordering::Relaxed), 8);
        table.retain(&current);
        assert_eq!(table.entries.load(Ordering::Relaxed), 8);
        assert_eq!(
            doc_freqs(&table, &sources[..1], &terms),
            vec![vec![0], vec![2], vec![2], vec![0]]
        );

        // Full, the table starts over at the next search.
        let many: Vec<Term> = (0..MAX_ENTRIES / 2)
            .map(|i| term(&format!("w{i}")))
            .collect();
        doc_freqs(&table, &sources[..1], &many);
        assert!(table.entries.load(Ordering::Relaxed) >= MAX_ENTRIES);
        assert_eq!(doc_freqs(&table, &sources, &terms), want);
        assert_eq!(table.entries.load(Ordering::Relaxed), 12);
    }
}
