//! The generation bundle container: named sections, each with its CRC32, a JSON directory
//! (the sections and the generation's [`GenerationMeta`]) and a fixed-size footer with the
//! format version and two more CRC32s. Layout: `docs/format.md`, "Generation bundle".
//!
//! From version 3 a bundle has two parts. The *cold* part opens the object: the magic and the
//! sections a query reads by byte range (rows, vectors), in blocks of [`BLOCK_BYTES`] (the
//! last one shorter), each with its CRC32 listed in the hot part, so that any range can be
//! checked block by block on arrival. The *hot* part ends it: the sections every query
//! needs, the directory and the footer, fetched in one ranged read from the offset the footer
//! (and the manifest's [`GenerationMeta::hot_offset`]) gives. Versions 1 and 2 have one part:
//! every section is hot.
//!
//! [`BundleWriter`] lays sections out and closes the object; [`Bundle::open`] checks a whole
//! object and [`Bundle::open_hot`] its hot part alone: the footer, the version, the hot part's
//! CRC and the directory. [`Bundle::section`] checks each section's CRC as it hands it out.
//! What the sections mean is the generation layer's business.

use super::{GenerationMeta, ObjectKind};
use crate::{Error, Result};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt::Display;
use std::ops::Range;

const MAGIC: &[u8; 4] = match ObjectKind::Generation.magic() {
    Some(m) => m,
    None => panic!("generations have a magic number"),
};
const FOOTER_LEN: usize = 32;

/// Bytes per checked block of a version-3 bundle's cold part (its last block is shorter), and
/// of the block cache: a row returned costs the block holding its page (pages are at most
/// 8 KiB), and the CRC list is 0.025% of the cold part.
pub(crate) const BLOCK_BYTES: u64 = 16 << 10;

/// The first version with a hot and a cold part.
const SPLIT_VERSION: u32 = 3;

/// The hot section listing the cold part's block CRC32s (u32 little-endian each).
const BLOCKS_SECTION: &str = "blocks";

/// Named sections, as an index hands them to a [`BundleWriter`].
pub(crate) type Sections = Vec<(String, Vec<u8>)>;

#[derive(Debug, Serialize, Deserialize)]
struct Section {
    name: String,
    offset: u64,
    len: u64,
    crc32: u32,
    /// In the cold part (version 3): read by range, checked by its blocks' CRCs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    cold: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct Directory {
    sections: Vec<Section>,
    stats: GenerationMeta,
}

/// Builds one bundle object.
#[derive(Debug)]
pub(crate) struct BundleWriter {
    /// The magic and, from version 3, the cold sections.
    out: Vec<u8>,
    /// Version 3: the hot sections, placed after the cold part when the bundle closes.
    hot: Vec<u8>,
    sections: Vec<Section>,
    version: u32,
}

impl BundleWriter {
    /// A bundle of the version this build writes.
    pub(crate) fn new() -> Self {
        Self::with_version(ObjectKind::Generation.written())
    }

    /// A bundle that says it has format `version` (fixtures of older versions).
    pub(crate) fn with_version(version: u32) -> Self {
        BundleWriter {
            out: MAGIC.to_vec(),
            hot: Vec::new(),
            sections: Vec::new(),
            version,
        }
    }

    /// The format version it writes.
    pub(crate) fn version(&self) -> u32 {
        self.version
    }

    /// Append a hot section: one every query needs, fetched when the generation is opened.
    pub(crate) fn add(&mut self, name: &str, bytes: &[u8]) {
        self.add_section(name, bytes, false);
    }

    /// Append a cold section (version 3; a hot one before): read by range when a query needs
    /// part of it.
    pub(crate) fn add_cold(&mut self, name: &str, bytes: &[u8]) {
        self.add_section(name, bytes, true);
    }

    /// Append a section, cold or hot.
    pub(crate) fn add_section(&mut self, name: &str, bytes: &[u8], cold: bool) {
        let cold = cold && self.version >= SPLIT_VERSION;
        let (part, offset) = if cold || self.version < SPLIT_VERSION {
            (&mut self.out, 0)
        } else {
            // Offsets of hot sections are made absolute when the cold part's size is known.
            (&mut self.hot, u64::MAX)
        };
        let at = part.len() as u64;
        part.extend_from_slice(bytes);
        self.sections.push(Section {
            name: name.to_string(),
            offset: if offset == u64::MAX { at } else { at + offset },
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
            cold,
        });
    }

    /// Write the directory and the footer; `meta.bytes` is set to the object's size first, as
    /// the directory records it, and from version 3 `meta.hot_offset` to where the hot part
    /// starts.
    pub(crate) fn finish(self, meta: &mut GenerationMeta) -> Result<Vec<u8>> {
        let BundleWriter {
            mut out,
            hot,
            mut sections,
            version,
        } = self;
        let split = version >= SPLIT_VERSION;
        let hot_offset = if split {
            // List the cold part's block CRCs (its last block is shorter, unless the cold
            // part holds only the magic), then place the hot sections after it.
            let hot_offset = out.len() as u64;
            let crcs: Vec<u8> = if sections.iter().any(|s| s.cold) {
                out.chunks(BLOCK_BYTES as usize)
                    .flat_map(|b| crc32fast::hash(b).to_le_bytes())
                    .collect()
            } else {
                Vec::new()
            };
            for s in sections.iter_mut().filter(|s| !s.cold) {
                s.offset += hot_offset;
            }
            out.extend_from_slice(&hot);
            let at = out.len() as u64;
            out.extend_from_slice(&crcs);
            sections.push(Section {
                name: BLOCKS_SECTION.into(),
                offset: at,
                len: crcs.len() as u64,
                crc32: crc32fast::hash(&crcs),
                cold: false,
            });
            meta.hot_offset = Some(hot_offset);
            hot_offset
        } else {
            meta.hot_offset = None;
            0
        };
        let dir_offset = out.len() as u64;
        // The object size is known once the directory is serialized; its own digits may change
        // the size, so iterate to a fixed point (at most a couple of rounds).
        let mut dir_json;
        let mut total = out.len() as u64 + FOOTER_LEN as u64;
        loop {
            meta.bytes = total;
            let dir = Directory {
                sections,
                stats: meta.clone(),
            };
            dir_json = serde_json::to_vec(&dir)
                .map_err(|e| Error::internal(format!("generation directory: {e}")))?;
            sections = dir.sections;
            let t = dir_offset + dir_json.len() as u64 + FOOTER_LEN as u64;
            if t == total {
                break;
            }
            total = t;
        }
        out.extend_from_slice(&dir_json);
        // Version 3: the footer's first field is where the hot part starts (the directory ends
        // where the footer begins), and its CRC covers the hot part.
        let first = if split { hot_offset } else { dir_offset };
        let body_crc = crc32fast::hash(&out[hot_offset as usize..]);
        let mut footer = Vec::with_capacity(FOOTER_LEN);
        footer.extend_from_slice(&first.to_le_bytes());
        footer.extend_from_slice(&(dir_json.len() as u64).to_le_bytes());
        footer.extend_from_slice(&version.to_le_bytes());
        footer.extend_from_slice(&body_crc.to_le_bytes());
        footer.extend_from_slice(MAGIC);
        let fcrc = crc32fast::hash(&footer);
        footer.extend_from_slice(&fcrc.to_le_bytes());
        out.extend_from_slice(&footer);
        debug_assert_eq!(out.len() as u64, meta.bytes);
        Ok(out)
    }
}

/// Check block `index` of a cold part of `cold_len` bytes whose blocks have the CRC32s `crcs`:
/// `bytes` starts at byte `index * BLOCK_BYTES` of the object, and only its bytes in the cold
/// part count (the last block of the cold part is shorter than a block of a cache, which may
/// run on into the hot part). An error says what is wrong.
pub(crate) fn check_block(
    crcs: &[u32],
    cold_len: u64,
    index: u64,
    bytes: &[u8],
) -> std::result::Result<(), String> {
    let Some(crc) = crcs.get(index as usize) else {
        return Err(format!("has no block {index} in its cold part"));
    };
    let want = cold_len
        .saturating_sub(index.saturating_mul(BLOCK_BYTES))
        .min(BLOCK_BYTES) as usize;
    if bytes.len() < want || crc32fast::hash(&bytes[..want]) != *crc {
        return Err(format!("block {index} fails its CRC32 check"));
    }
    Ok(())
}

/// A checked bundle: its version, its directory and its sections. It holds the whole object,
/// or (version 3, [`Bundle::open_hot`]) only its hot part.
#[derive(Debug)]
pub(crate) struct Bundle {
    /// Bytes `[base, len)` of the object.
    bytes: Bytes,
    base: u64,
    len: u64,
    dir: Directory,
    dir_offset: u64,
    hot_offset: u64,
    version: u32,
    /// Version 3: the CRC32 of each block of the cold part.
    block_crcs: Vec<u32>,
    object: String,
}

/// What the footer of a bundle says.
struct Footer {
    version: u32,
    hot_offset: u64,
    dir_offset: u64,
    body_crc: u32,
}

impl Bundle {
    /// Check the footer, version, CRCs and directory of a whole bundle. Any defect is an
    /// error of kind `Data` naming `object`.
    pub(crate) fn open(bytes: Bytes, object: &dyn Display) -> Result<Bundle> {
        if bytes.len() < 4 || &bytes[0..4] != MAGIC {
            return Err(Error::data(
                object,
                format!(
                    "generation is truncated or not a generation ({} bytes)",
                    bytes.len()
                ),
            ));
        }
        let b = Self::open_part(bytes, 0, object)?;
        // A whole object's cold part is checked here, block by block.
        let cold = if b.block_crcs.is_empty() {
            0
        } else {
            b.hot_offset() as usize
        };
        for (i, chunk) in b.bytes[..cold].chunks(BLOCK_BYTES as usize).enumerate() {
            if b.check_block(i as u64, chunk).is_err() {
                return Err(b.error(format!("block {i} fails its CRC32 check")));
            }
        }
        Ok(b)
    }

    /// Check the hot part of a version-3 bundle of `len` bytes: `hot` holds bytes
    /// `[len - hot.len(), len)`, from the hot offset the manifest recorded. Cold sections are
    /// then read by range ([`Bundle::cold_range`]) and checked by [`Bundle::check_block`].
    pub(crate) fn open_hot(hot: Bytes, len: u64, object: &dyn Display) -> Result<Bundle> {
        let base = len.checked_sub(hot.len() as u64).ok_or_else(|| {
            Error::internal(format!("{object}: a hot part longer than its object"))
        })?;
        let b = Self::open_part(hot, base, object)?;
        if b.version < SPLIT_VERSION || b.hot_offset() != base {
            return Err(b.error(format!(
                "hot part does not start at byte {base} (version {}, hot offset {})",
                b.version,
                b.hot_offset()
            )));
        }
        Ok(b)
    }

    /// Check bytes `[base, len)` of an object: the footer, the version, the CRC of what the
    /// footer's CRC covers, the directory.
    fn open_part(bytes: Bytes, base: u64, object: &dyn Display) -> Result<Bundle> {
        let bad = |m: String| Error::data(object, format!("generation {m}"));
        let len = base + bytes.len() as u64;
        if bytes.len() < FOOTER_LEN {
            return Err(bad(format!(
                "is truncated or not a generation ({len} bytes)"
            )));
        }
        let f = Self::footer(&bytes[bytes.len() - FOOTER_LEN..], len, object)?;
        if f.hot_offset < base {
            return Err(bad(format!(
                "hot part starts at byte {}, before the {} bytes read from byte {base}",
                f.hot_offset,
                bytes.len()
            )));
        }
        let local = |at: u64| (at - base) as usize;
        let body_end = local(len - FOOTER_LEN as u64);
        if crc32fast::hash(&bytes[local(f.hot_offset)..body_end]) != f.body_crc {
            return Err(bad("fails its CRC32 check".into()));
        }
        let dir: Directory = serde_json::from_slice(&bytes[local(f.dir_offset)..body_end])
            .map_err(|e| bad(format!("directory is not valid: {e}")))?;
        let mut b = Bundle {
            bytes,
            base,
            len,
            dir,
            dir_offset: f.dir_offset,
            hot_offset: f.hot_offset,
            version: f.version,
            block_crcs: Vec::new(),
            object: object.to_string(),
        };
        if b.version >= SPLIT_VERSION {
            let crcs = b.section(BLOCKS_SECTION)?;
            let blocks = b.hot_offset().div_ceil(BLOCK_BYTES);
            let has_cold = b.dir.sections.iter().any(|s| s.cold);
            if crcs.len() % 4 != 0 || (has_cold && crcs.len() as u64 != blocks * 4) {
                return Err(b.error(format!(
                    "lists {} bytes of block CRCs for a cold part of {} bytes",
                    crcs.len(),
                    b.hot_offset()
                )));
            }
            b.block_crcs = crcs
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            if b.dir.stats.hot_offset != Some(b.hot_offset()) {
                return Err(b.error("directory and footer disagree on the hot part".to_string()));
            }
            for s in &b.dir.sections {
                let end = s.offset.checked_add(s.len);
                let inside = if s.cold {
                    s.offset >= 4 && end.is_some_and(|e| e <= b.hot_offset())
                } else {
                    s.offset >= b.hot_offset() && end.is_some_and(|e| e <= b.dir_offset)
                };
                if !inside {
                    return Err(b.error(format!("section '{}' lies outside its part", s.name)));
                }
            }
        }
        Ok(b)
    }

    /// Read and check a footer (the last 32 bytes of an object of `len` bytes).
    fn footer(footer: &[u8], len: u64, object: &dyn Display) -> Result<Footer> {
        let bad = |m: &str| Error::data(object, format!("generation {m}"));
        let field = |at: usize, n: usize| -> u64 {
            footer[at..at + n]
                .iter()
                .rev()
                .fold(0u64, |v, b| (v << 8) | u64::from(*b))
        };
        if crc32fast::hash(&footer[..28]) != field(28, 4) as u32 || &footer[24..28] != MAGIC {
            return Err(bad("footer is corrupt (CRC or magic mismatch)"));
        }
        let version = ObjectKind::Generation.check_version(field(16, 4), object)?;
        let (first, dir_len) = (field(0, 8), field(8, 8));
        let body_len = len - FOOTER_LEN as u64;
        let dir_offset = body_len
            .checked_sub(dir_len)
            .ok_or_else(|| bad("footer points outside the object"))?;
        let hot_offset = if version >= SPLIT_VERSION {
            first
        } else if first == dir_offset {
            0
        } else {
            return Err(bad("footer points outside the object"));
        };
        if hot_offset > dir_offset || (version >= SPLIT_VERSION && hot_offset < 4) {
            return Err(bad("footer points outside the object"));
        }
        Ok(Footer {
            version,
            hot_offset,
            dir_offset,
            body_crc: field(20, 4) as u32,
        })
    }

    /// The format version the bundle was written with.
    pub(crate) fn version(&self) -> u32 {
        self.version
    }

    /// The generation's record, as the directory holds it.
    pub(crate) fn stats(&self) -> &GenerationMeta {
        &self.dir.stats
    }

    /// Names of the sections, in the order they were written.
    pub(crate) fn section_names(&self) -> impl Iterator<Item = &str> {
        self.dir
            .sections
            .iter()
            .map(|s| s.name.as_str())
            .filter(|n| *n != BLOCKS_SECTION)
    }

    /// Whether section `name` is in the cold part.
    pub(crate) fn is_cold(&self, name: &str) -> bool {
        self.dir.sections.iter().any(|s| s.name == name && s.cold)
    }

    fn find(&self, name: &str) -> Result<&Section> {
        self.dir
            .sections
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| self.error(format!("has no '{name}' section")))
    }

    /// The bytes of section `name`, CRC-checked; a missing or damaged section is a `Data`
    /// error naming the object. A cold section needs the whole object ([`Bundle::open`]).
    pub(crate) fn section(&self, name: &str) -> Result<Bytes> {
        let s = self.find(name)?;
        let (o, l) = (s.offset, s.len);
        if o < self.base || o.checked_add(l).is_none_or(|e| e > self.dir_offset) {
            return Err(self.error(format!(
                "section '{name}' lies outside the bytes read of the object"
            )));
        }
        let at = (o - self.base) as usize;
        let b = self.bytes.slice(at..at + l as usize);
        if crc32fast::hash(&b) != s.crc32 {
            return Err(self.error(format!("section '{name}' fails its CRC32 check")));
        }
        Ok(b)
    }

    /// The byte range of cold section `name` in the object.
    pub(crate) fn cold_range(&self, name: &str) -> Result<Range<u64>> {
        let s = self.find(name)?;
        if !s.cold {
            return Err(self.error(format!("section '{name}' is not in the cold part")));
        }
        Ok(s.offset..s.offset + s.len)
    }

    /// Check block `index` of the cold part: `bytes` starts at byte `index * BLOCK_BYTES`
    /// (see [`check_block`]).
    pub(crate) fn check_block(&self, index: u64, bytes: &[u8]) -> Result<()> {
        check_block(&self.block_crcs, self.hot_offset, index, bytes).map_err(|m| self.error(m))
    }

    /// The CRC32 of each block of the cold part (version 3; empty before).
    pub(crate) fn block_crcs(&self) -> &[u32] {
        &self.block_crcs
    }

    /// Where the hot part starts (0 before version 3: the whole object is hot).
    pub(crate) fn hot_offset(&self) -> u64 {
        self.hot_offset
    }

    /// A `Data` error about this bundle.
    pub(crate) fn error(&self, detail: impl Display) -> Error {
        Error::data(&self.object, format!("generation {detail}"))
    }

    /// The whole object's size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> GenerationMeta {
        GenerationMeta {
            id: 1,
            epoch: 2,
            rows: 3,
            tombstones: 0,
            bytes: 0,
            min_seq: 1,
            max_seq: 3,
            flushes: 1,
            hot_offset: None,
        }
    }

    #[test]
    fn sections_round_trip_and_every_flipped_byte_is_caught() {
        let mut w = BundleWriter::new();
        w.add("a", b"hello");
        w.add("b", &[7u8; 100]);
        let mut m = meta();
        let bytes = w.finish(&mut m).unwrap();
        assert_eq!(m.bytes as usize, bytes.len());
        let b = Bundle::open(bytes.clone().into(), &"g").unwrap();
        assert_eq!(b.version(), ObjectKind::Generation.written());
        assert_eq!(b.stats(), &m);
        assert_eq!(&b.section("a").unwrap()[..], b"hello");
        assert_eq!(b.section_names().collect::<Vec<_>>(), ["a", "b"]);
        assert!(b.section("c").is_err());
        for i in 0..bytes.len() {
            let mut c = bytes.clone();
            c[i] ^= 0x20;
            let r = Bundle::open(c.into(), &"g").and_then(|b| {
                b.section("a")?;
                b.section("b")
            });
            let e = r.expect_err("a flipped byte is caught");
            assert_eq!(e.kind(), crate::ErrorKind::Data, "flip at {i}");
        }
    }

    #[test]
    fn a_split_bundle_reads_its_hot_part_alone_and_checks_cold_blocks() {
        let cold: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = BundleWriter::new();
        w.add_cold("rows", &cold);
        w.add("keys", b"hot bytes");
        w.add_cold("vectors", b"after the rows");
        let mut m = meta();
        let bytes = w.finish(&mut m).unwrap();
        let hot = m.hot_offset.expect("version 3 records its hot part");
        assert_eq!(hot, 4 + cold.len() as u64 + 14, "the cold part, unpadded");
        // The whole object, and its hot part alone.
        let whole = Bundle::open(bytes.clone().into(), &"g").unwrap();
        assert_eq!(&whole.section("rows").unwrap()[..], &cold[..]);
        assert_eq!(whole.stats(), &m);
        let part = Bundle::open_hot(
            Bytes::copy_from_slice(&bytes[hot as usize..]),
            bytes.len() as u64,
            &"g",
        )
        .unwrap();
        assert_eq!(&part.section("keys").unwrap()[..], b"hot bytes");
        assert!(part.is_cold("rows") && !part.is_cold("keys"));
        assert!(
            part.section("rows").is_err(),
            "cold bytes are not in the hot part"
        );
        let r = part.cold_range("vectors").unwrap();
        assert_eq!(&bytes[r.start as usize..r.end as usize], b"after the rows");
        assert_eq!(part.block_crcs().len() as u64, hot.div_ceil(BLOCK_BYTES));
        for (i, block) in bytes.chunks(BLOCK_BYTES as usize).enumerate() {
            if i as u64 * BLOCK_BYTES >= hot {
                assert!(part.check_block(i as u64, block).is_err(), "a hot block");
                break;
            }
            // The last cold block is checked on its cold bytes only, whatever follows them.
            part.check_block(i as u64, block).unwrap();
            let mut bad = block.to_vec();
            bad[i * 7 % (hot as usize - i * BLOCK_BYTES as usize).min(block.len())] ^= 1;
            assert_eq!(
                part.check_block(i as u64, &bad).unwrap_err().kind(),
                crate::ErrorKind::Data
            );
        }
        // A hot part read from the wrong offset, or damaged, is refused.
        let e = Bundle::open_hot(
            Bytes::copy_from_slice(&bytes[hot as usize + 1..]),
            bytes.len() as u64,
            &"g",
        );
        assert_eq!(e.unwrap_err().kind(), crate::ErrorKind::Data);
        // Every flipped byte of the whole object is caught when it is opened or read (sampled
        // in the cold part, every byte of the hot part).
        let flips = (0..hot as usize)
            .step_by(997)
            .chain(hot as usize - 20..bytes.len());
        for i in flips {
            let mut c = bytes.clone();
            c[i] ^= 0x20;
            let r = Bundle::open(c.into(), &"g").and_then(|b| {
                b.section("keys")?;
                b.section("rows")?;
                b.section("vectors")
            });
            assert_eq!(r.unwrap_err().kind(), crate::ErrorKind::Data, "flip at {i}");
        }
    }

    #[test]
    fn older_versions_have_one_part() {
        let mut w = BundleWriter::with_version(2);
        w.add_cold("rows", b"not cold before version 3");
        let mut m = meta();
        let bytes = w.finish(&mut m).unwrap();
        assert_eq!(m.hot_offset, None);
        let b = Bundle::open(bytes.into(), &"g").unwrap();
        assert!(!b.is_cold("rows"));
        assert_eq!(
            &b.section("rows").unwrap()[..],
            b"not cold before version 3"
        );
        assert_eq!(b.hot_offset(), 0);
    }

    #[test]
    fn a_newer_version_is_named() {
        let mut w = BundleWriter::with_version(ObjectKind::Generation.written() + 1);
        w.add("a", b"x");
        let bytes = w.finish(&mut meta()).unwrap();
        let e = Bundle::open(bytes.into(), &"g.gen").unwrap_err();
        assert!(
            e.message().contains("g.gen") && e.message().contains("version"),
            "{e}"
        );
    }
}
