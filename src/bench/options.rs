//! What every benchmark's options use: defaults read from their flags, and durations.

use std::time::Duration;

/// Options with the defaults their flags declare: each default is written once, on its flag.
pub(crate) fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true));
    let parsed = command
        .try_get_matches_from(std::iter::empty::<String>())
        .and_then(|m| T::from_arg_matches(&m));
    match parsed {
        Ok(options) => options,
        // Every flag has a default that parses (`tests::every_default_parses`).
        Err(e) => panic!("the benchmark's option defaults do not parse: {e}"),
    }
}

/// A duration given in (fractional) milliseconds.
pub(crate) fn millis(v: &str) -> std::result::Result<Duration, String> {
    let ms: f64 = v.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(ms / 1e3).map_err(|_| "a number of milliseconds".to_string())
}

/// A duration given in (fractional) seconds.
pub(crate) fn seconds(v: &str) -> std::result::Result<Duration, String> {
    let s: f64 = v.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(s).map_err(|_| "a number of seconds".to_string())
}
