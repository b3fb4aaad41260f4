//! Every object name of an index, formatted and parsed in one place.
//!
//! ```text
//! <root>/LATEST                                  hint: the newest manifest version (plain text)
//! <root>/manifest/{version:020}.manifest         immutable manifest versions
//! <root>/wal/{id:020}.wal                        one group commit (or an epoch fence) per object
//! <root>/generations/{id:020}-{epoch:010}.gen    one bundle per flushed generation
//! <root>/probe/{token}                           while a writer opens: the conditional-create check
//! ```
//!
//! Numbers are zero-padded to a fixed width so that a lexicographic LIST returns them in order.

use object_store::path::Path;

/// Names of the objects under one index root.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    root: Path,
}

impl Paths {
    /// Names under `root` (which may be empty).
    pub(crate) fn new(root: Path) -> Self {
        Paths { root }
    }

    fn child(&self, rel: &str) -> Path {
        if self.root.as_ref().is_empty() {
            Path::from(rel)
        } else {
            Path::from(format!("{}/{rel}", self.root))
        }
    }

    /// The latest-manifest hint.
    pub(crate) fn latest_hint(&self) -> Path {
        self.child("LATEST")
    }

    /// The manifest folder.
    pub(crate) fn manifest_dir(&self) -> Path {
        self.child("manifest")
    }

    /// Manifest `version`.
    pub(crate) fn manifest(&self, version: u64) -> Path {
        self.child(&format!("manifest/{version:020}.manifest"))
    }

    /// The WAL folder.
    pub(crate) fn wal_dir(&self) -> Path {
        self.child("wal")
    }

    /// WAL object `id`.
    pub(crate) fn wal(&self, id: u64) -> Path {
        self.child(&format!("wal/{id:020}.wal"))
    }

    /// A short-lived object a writer creates when it opens, to check that the store honours
    /// conditional creates.
    pub(crate) fn probe(&self, token: &str) -> Path {
        self.child(&format!("probe/{token}"))
    }

    /// The generations folder.
    pub(crate) fn generations_dir(&self) -> Path {
        self.child("generations")
    }

    /// The probes folder.
    pub(crate) fn probe_dir(&self) -> Path {
        self.child("probe")
    }

    /// Generation `id` written by the writer of `epoch`.
    pub(crate) fn generation(&self, id: u64, epoch: u64) -> Path {
        self.child(&format!("generations/{id:020}-{epoch:010}.gen"))
    }
}

fn parse_number(name: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The version of a manifest object, from its path.
pub(crate) fn parse_manifest(path: &Path) -> Option<u64> {
    parse_number(path.filename()?, ".manifest")
}

/// The id of a WAL object, from its path.
pub(crate) fn parse_wal(path: &Path) -> Option<u64> {
    parse_number(path.filename()?, ".wal")
}

/// The (id, epoch) of a generation object, from its path.
pub(crate) fn parse_generation(path: &Path) -> Option<(u64, u64)> {
    let stem = path.filename()?.strip_suffix(".gen")?;
    let (id, epoch) = stem.split_once('-')?;
    if id.len() != 20 || epoch.len() != 10 {
        return None;
    }
    if !id.bytes().chain(epoch.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((id.parse().ok()?, epoch.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn names_round_trip(v in any::<u64>(), e in 0u64..10_000_000_000, root in "[a-z]{0,3}(/[a-z]{1,3}){0,2}") {
            let p = Paths::new(Path::from(root.as_str()));
            prop_assert_eq!(parse_manifest(&p.manifest(v)), Some(v));
            prop_assert_eq!(parse_wal(&p.wal(v)), Some(v));
            prop_assert_eq!(parse_generation(&p.generation(v, e)), Some((v, e)));
            prop_assert_eq!(parse_wal(&p.manifest(v)), None);
        }

        #[test]
        fn names_sort_like_numbers(a in any::<u64>(), b in any::<u64>()) {
            let p = Paths::new(Path::from("idx"));
            prop_assert_eq!(p.wal(a).as_ref().cmp(p.wal(b).as_ref()), a.cmp(&b));
            prop_assert_eq!(p.manifest(a).as_ref().cmp(p.manifest(b).as_ref()), a.cmp(&b));
        }
    }
}
