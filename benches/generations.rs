//! The generations benchmark (see `lsmsearch::bench`), also reachable as
//! `lsmsearch bench generations`:
//!
//! ```text
//! cargo bench --bench generations
//! LSMSEARCH_BENCH_DOCS=20000 LSMSEARCH_BENCH_GENS=1,2,5 cargo bench --bench generations
//! ```

use lsmsearch::bench::{run, Options};

fn main() {
    let env = |name: &str| std::env::var(name).ok();
    let mut o = Options {
        out: concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-generations").into(),
        data: None,
        ..Options::default()
    };
    if let Some(d) = env("LSMSEARCH_BENCH_DOCS").and_then(|v| v.parse().ok()) {
        o.docs = d;
    }
    if let Some(g) = env("LSMSEARCH_BENCH_GENS") {
        o.gens = g.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(run(&o)).expect("the generations benchmark");
}
