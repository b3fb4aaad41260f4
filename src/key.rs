//! Primary keys and their stable 64-bit hashes.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type, UInt64Type};
use serde::{Deserialize, Serialize};
use std::fmt;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the primary-key hash. Part of the generation format: changing it changes every
/// stored key set, so it is fixed forever.
pub const PK_HASH_SEED: u64 = 0x6c73_6d73_6561_7263; // "lsmsearc"

/// The type of an index's primary-key column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum KeyType {
    /// Arrow `Utf8`.
    #[default]
    Utf8,
    /// Arrow `Int64`.
    Int64,
    /// Arrow `UInt64`.
    Uint64,
}

impl KeyType {
    /// The Arrow type of the key column.
    pub fn data_type(self) -> DataType {
        match self {
            KeyType::Utf8 => DataType::Utf8,
            KeyType::Int64 => DataType::Int64,
            KeyType::Uint64 => DataType::UInt64,
        }
    }
}

/// One primary-key value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A string key.
    Str(String),
    /// A signed integer key.
    I64(i64),
    /// An unsigned integer key.
    U64(u64),
}

impl Key {
    /// The stable, seeded xxh3 hash stored in generations' key sets.
    pub fn hash64(&self) -> u64 {
        self.hash_with_seed(PK_HASH_SEED)
    }

    /// The xxh3 hash of the key's bytes (a string's UTF-8, an integer's 8 little-endian
    /// bytes) with `seed`: [`Key::hash64`] with [`PK_HASH_SEED`], a sharded index's routing
    /// with its own seed.
    pub fn hash_with_seed(&self, seed: u64) -> u64 {
        match self {
            Key::Str(s) => xxh3_64_with_seed(s.as_bytes(), seed),
            Key::I64(v) => xxh3_64_with_seed(&v.to_le_bytes(), seed),
            Key::U64(v) => xxh3_64_with_seed(&v.to_le_bytes(), seed),
        }
    }

    /// [`Key::hash64`] of the key at `row` of a key column (Utf8, Int64 or UInt64), without
    /// making the key (no allocation for a string). `None` if it is null.
    pub fn hash_at(array: &dyn Array, row: usize) -> Option<u64> {
        Key::hash_at_with_seed(array, row, PK_HASH_SEED)
    }

    /// [`Key::hash_with_seed`] of the key at `row` of a key column, as [`Key::hash_at`].
    pub fn hash_at_with_seed(array: &dyn Array, row: usize, seed: u64) -> Option<u64> {
        if array.is_null(row) {
            return None;
        }
        match array.data_type() {
            DataType::Utf8 => Some(xxh3_64_with_seed(
                array.as_string::<i32>().value(row).as_bytes(),
                seed,
            )),
            DataType::Int64 => Some(xxh3_64_with_seed(
                &array.as_primitive::<Int64Type>().value(row).to_le_bytes(),
                seed,
            )),
            DataType::UInt64 => Some(xxh3_64_with_seed(
                &array.as_primitive::<UInt64Type>().value(row).to_le_bytes(),
                seed,
            )),
            _ => None,
        }
    }

    /// Read the key at `row` of a key column (Utf8, Int64 or UInt64). `None` if it is null.
    pub fn from_array(array: &dyn Array, row: usize) -> Option<Key> {
        if array.is_null(row) {
            return None;
        }
        match array.data_type() {
            DataType::Utf8 => Some(Key::Str(array.as_string::<i32>().value(row).to_string())),
            DataType::Int64 => Some(Key::I64(array.as_primitive::<Int64Type>().value(row))),
            DataType::UInt64 => Some(Key::U64(array.as_primitive::<UInt64Type>().value(row))),
            _ => None,
        }
    }

    /// Build a key column of `key_type` from keys. Fails with `Invalid` on a key of another type.
    pub fn to_array(keys: &[Key], key_type: KeyType) -> crate::error::Result<ArrayRef> {
        use arrow::array::{Int64Array, StringArray, UInt64Array};
        use std::sync::Arc;
        let wrong = |k: &Key| {
            crate::error::Error::invalid(format!(
                "key {k} does not match the primary-key type {key_type:?}"
            ))
        };
        Ok(match key_type {
            KeyType::Utf8 => Arc::new(
                keys.iter()
                    .map(|k| match k {
                        Key::Str(s) => Ok(Some(s.as_str())),
                        other => Err(wrong(other)),
                    })
                    .collect::<crate::error::Result<StringArray>>()?,
            ),
            KeyType::Int64 => Arc::new(
                keys.iter()
                    .map(|k| match k {
                        Key::I64(v) => Ok(Some(*v)),
                        other => Err(wrong(other)),
                    })
                    .collect::<crate::error::Result<Int64Array>>()?,
            ),
            KeyType::Uint64 => Arc::new(
                keys.iter()
                    .map(|k| match k {
                        Key::U64(v) => Ok(Some(*v)),
                        other => Err(wrong(other)),
                    })
                    .collect::<crate::error::Result<UInt64Array>>()?,
            ),
        })
    }

    /// Parse a key from text (as typed on a command line) for a key column of `key_type`.
    pub fn parse(s: &str, key_type: KeyType) -> crate::error::Result<Key> {
        match key_type {
            KeyType::Utf8 => Ok(Key::Str(s.to_string())),
            KeyType::Int64 => s.parse().map(Key::I64).map_err(|_| {
                crate::error::Error::invalid(format!("key '{s}' is not a valid int64 primary key"))
            }),
            KeyType::Uint64 => s.parse().map(Key::U64).map_err(|_| {
                crate::error::Error::invalid(format!("key '{s}' is not a valid uint64 primary key"))
            }),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Str(s) => write!(f, "{s:?}"),
            Key::I64(v) => write!(f, "{v}"),
            Key::U64(v) => write!(f, "{v}"),
        }
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::Str(s.to_string())
    }
}
impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::Str(s)
    }
}
impl From<i64> for Key {
    fn from(v: i64) -> Self {
        Key::I64(v)
    }
}
impl From<u64> for Key {
    fn from(v: u64) -> Self {
        Key::U64(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_across_releases() {
        // These values are persisted in every generation; they must never change.
        assert_eq!(
            Key::Str("a".into()).hash64(),
            xxh3_64_with_seed(b"a", PK_HASH_SEED)
        );
        assert_eq!(Key::I64(7).hash64(), Key::U64(7).hash64());
        assert_ne!(Key::Str("a".into()).hash64(), Key::Str("b".into()).hash64());
    }

    #[test]
    fn key_columns_round_trip() {
        let keys = vec![Key::I64(3), Key::I64(-1)];
        let arr = Key::to_array(&keys, KeyType::Int64).unwrap();
        assert_eq!(Key::from_array(&arr, 1), Some(Key::I64(-1)));
        assert!(Key::to_array(&keys, KeyType::Utf8).is_err());
        assert!(Key::parse("x", KeyType::Uint64).is_err());
    }

    #[test]
    fn a_key_hashed_in_its_column_hashes_as_the_key() {
        use arrow::array::{Int64Array, StringArray, UInt64Array};
        let strs = StringArray::from(vec![Some("k1"), None, Some("")]);
        let ints = Int64Array::from(vec![Some(-5), None]);
        let uints = UInt64Array::from(vec![Some(u64::MAX)]);
        for (array, rows) in [
            (&strs as &dyn Array, 3),
            (&ints as &dyn Array, 2),
            (&uints as &dyn Array, 1),
        ] {
            for r in 0..rows {
                assert_eq!(
                    Key::hash_at(array, r),
                    Key::from_array(array, r).map(|k| k.hash64()),
                    "row {r} of a {:?} column",
                    array.data_type()
                );
            }
        }
        assert_eq!(Key::hash_at(&strs, 1), None);
    }
}
