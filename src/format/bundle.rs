//! The generation bundle container: named sections, each with its CRC32, a JSON directory
//! (the sections and the generation's [`GenerationMeta`]) and a fixed-size footer with the
//! format version and two more CRC32s. Layout: `docs/format.md`, "Generation bundle".
//!
//! [`BundleWriter`] lays sections out and closes the object; [`Bundle::open`] checks the
//! footer, the version, the body CRC and the directory, and [`Bundle::section`] checks each
//! section's CRC as it hands it out. What the sections mean is the generation layer's business.

use super::{GenerationMeta, ObjectKind};
use crate::{Error, Result};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt::Display;

const MAGIC: &[u8; 4] = match ObjectKind::Generation.magic() {
    Some(m) => m,
    None => panic!("generations have a magic number"),
};
const FOOTER_LEN: usize = 32;

/// Named sections, as an index hands them to a [`BundleWriter`].
pub(crate) type Sections = Vec<(String, Vec<u8>)>;

#[derive(Debug, Serialize, Deserialize)]
struct Section {
    name: String,
    offset: u64,
    len: u64,
    crc32: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Directory {
    sections: Vec<Section>,
    stats: GenerationMeta,
}

/// Builds one bundle object.
#[derive(Debug)]
pub(crate) struct BundleWriter {
    out: Vec<u8>,
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
            sections: Vec::new(),
            version,
        }
    }

    /// Append a section.
    pub(crate) fn add(&mut self, name: &str, bytes: &[u8]) {
        self.sections.push(Section {
            name: name.to_string(),
            offset: self.out.len() as u64,
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        });
        self.out.extend_from_slice(bytes);
    }

    /// Write the directory and the footer; `meta.bytes` is set to the object's size first, as
    /// the directory records it.
    pub(crate) fn finish(self, meta: &mut GenerationMeta) -> Result<Vec<u8>> {
        let BundleWriter {
            mut out,
            mut sections,
            version,
        } = self;
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
        let body_crc = crc32fast::hash(&out);
        let mut footer = Vec::with_capacity(FOOTER_LEN);
        footer.extend_from_slice(&dir_offset.to_le_bytes());
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

/// A checked bundle: its version, its directory and its sections.
#[derive(Debug)]
pub(crate) struct Bundle {
    bytes: Bytes,
    dir: Directory,
    dir_offset: usize,
    version: u32,
    object: String,
}

impl Bundle {
    /// Check the footer, version, body CRC and directory of a whole bundle. Any defect is an
    /// error of kind `Data` naming `object`.
    pub(crate) fn open(bytes: Bytes, object: &dyn Display) -> Result<Bundle> {
        let bad = |m: String| Error::data(object, format!("generation {m}"));
        if bytes.len() < FOOTER_LEN + 4 || &bytes[0..4] != MAGIC {
            return Err(bad(format!(
                "is truncated or not a generation ({} bytes)",
                bytes.len()
            )));
        }
        let footer = &bytes[bytes.len() - FOOTER_LEN..];
        let field = |at: usize, n: usize| -> u64 {
            footer[at..at + n]
                .iter()
                .rev()
                .fold(0u64, |v, b| (v << 8) | u64::from(*b))
        };
        if crc32fast::hash(&footer[..28]) != field(28, 4) as u32 || &footer[24..28] != MAGIC {
            return Err(bad("footer is corrupt (CRC or magic mismatch)".into()));
        }
        let (dir_offset, dir_len) = (field(0, 8), field(8, 8));
        let version = ObjectKind::Generation.check_version(field(16, 4), object)?;
        let body_crc = field(20, 4) as u32;
        let body_len = (bytes.len() - FOOTER_LEN) as u64;
        if dir_offset.checked_add(dir_len) != Some(body_len) {
            return Err(bad("footer points outside the object".into()));
        }
        let (dir_offset, dir_end) = (dir_offset as usize, body_len as usize);
        if crc32fast::hash(&bytes[..dir_end]) != body_crc {
            return Err(bad("fails its CRC32 check".into()));
        }
        let dir: Directory = serde_json::from_slice(&bytes[dir_offset..dir_end])
            .map_err(|e| bad(format!("directory is not valid: {e}")))?;
        Ok(Bundle {
            bytes,
            dir,
            dir_offset,
            version,
            object: object.to_string(),
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
        self.dir.sections.iter().map(|s| s.name.as_str())
    }

    /// The bytes of section `name`, CRC-checked; a missing or damaged section is a `Data`
    /// error naming the object.
    pub(crate) fn section(&self, name: &str) -> Result<Bytes> {
        let s = self
            .dir
            .sections
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| self.error(format!("has no '{name}' section")))?;
        let (o, l) = (s.offset as usize, s.len as usize);
        if o.checked_add(l).is_none_or(|e| e > self.dir_offset) {
            return Err(self.error(format!("section '{name}' lies outside the object")));
        }
        let b = self.bytes.slice(o..o + l);
        if crc32fast::hash(&b) != s.crc32 {
            return Err(self.error(format!("section '{name}' fails its CRC32 check")));
        }
        Ok(b)
    }

    /// A `Data` error about this bundle.
    pub(crate) fn error(&self, detail: impl Display) -> Error {
        Error::data(&self.object, format!("generation {detail}"))
    }

    /// The whole object's size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
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
