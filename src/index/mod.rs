//! Search indexes over sources: full-text ([`text`]).

pub mod text;
