//! The round-trip and fencing scenarios against an S3-compatible server. They run when
//! `LSMSEARCH_TEST_S3` names a bucket (`s3://bucket`) and the standard AWS variables point at
//! the server; `.ci/s3-server.sh` starts one locally. Without it they say so and pass.

mod common;

use common::s3_location;
use common::scenarios::{fencing_scenario, round_trip_scenario};
use lsmsearch::Location;

fn location(test: &str) -> Option<Location> {
    match s3_location(test) {
        Some(l) => Some(Location::parse(&l).unwrap()),
        None => {
            assert!(
                std::env::var("LSMSEARCH_REQUIRE_S3").is_err(),
                "LSMSEARCH_REQUIRE_S3 is set but LSMSEARCH_TEST_S3 is not: start .ci/s3-server.sh"
            );
            eprintln!("LSMSEARCH_TEST_S3 is not set: skipping the S3 run of {test}");
            None
        }
    }
}

#[tokio::test]
async fn s3_round_trip() {
    if let Some(loc) = location("round-trip") {
        round_trip_scenario(loc).await;
    }
}

#[tokio::test]
async fn s3_fencing() {
    if let Some(loc) = location("fencing") {
        fencing_scenario(loc).await;
    }
}
