//! Search indexes over sources: full-text ([`text`]) and vector ([`vector`]).

pub mod distance;
pub mod graph;
pub mod text;
pub mod vector;
