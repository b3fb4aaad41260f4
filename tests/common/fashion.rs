//! Fashion-MNIST vectors from the Debian package `dataset-fashion-mnist`.

const DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The first `n` images of `file` (e.g. `train-images-idx3-ubyte.gz`) as 784-d f32 vectors, or
/// `None` when the package is not installed (an error when `LSMSEARCH_REQUIRE_FASHION` is set).
pub fn load(file: &str, n: usize) -> Option<Vec<Vec<f32>>> {
    let path = format!("{DIR}/{file}");
    if !std::path::Path::new(&path).exists() {
        assert!(
            std::env::var("LSMSEARCH_REQUIRE_FASHION").is_err(),
            "{path} is missing: apt-get install dataset-fashion-mnist"
        );
        eprintln!("{path} is missing: skipping (apt-get install dataset-fashion-mnist)");
        return None;
    }
    let out = std::process::Command::new("gzip")
        .args(["-dc", &path])
        .output()
        .expect("gzip");
    assert!(out.status.success());
    let b = out.stdout;
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap()) as usize;
    assert_eq!(be(0), 0x0803, "not an IDX image file");
    let (count, rows, cols) = (be(4), be(8), be(12));
    let dim = rows * cols;
    Some(
        (0..count.min(n))
            .map(|i| {
                b[16 + i * dim..16 + (i + 1) * dim]
                    .iter()
                    .map(|x| *x as f32)
                    .collect()
            })
            .collect(),
    )
}
