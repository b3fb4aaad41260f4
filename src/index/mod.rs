//! Search indexes over sources: full-text ([`text`]) and vector ([`vector`]).

pub mod text;
pub mod vector;
