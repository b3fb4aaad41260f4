//! `latency.png`: p50 latency against generation count, one line per query kind and mode.

use super::Report;
use plotters::prelude::*;
use std::path::Path;

/// Fonts tried, in order (Debian's `fonts-dejavu-core` provides the first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn register_font() -> Result<(), String> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = FONTS
                .iter()
                .find_map(|p| std::fs::read(p).ok())
                .ok_or_else(|| {
                    format!(
                        "no font found (tried {}; apt-get install fonts-dejavu-core)",
                        FONTS.join(", ")
                    )
                })?;
            plotters::style::register_font(
                "sans-serif",
                FontStyle::Normal,
                Box::leak(bytes.into_boxed_slice()),
            )
            .map_err(|_| "the font could not be parsed".to_string())
        })
        .clone()
}

/// Draw the report's p50 latencies against G into `path` (PNG, log-scaled G axis).
pub(super) fn latency(report: &Report, path: &Path) -> Result<(), String> {
    register_font()?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let max_g = report.runs.iter().map(|r| r.generations).max().unwrap_or(1) as f64;
    // Ticks at the measured generation counts only.
    let ticks: Vec<f64> = report
        .runs
        .iter()
        .map(|r| r.generations)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|g| g as f64)
        .collect();
    let panels = [
        ("cold", "cold: new handle + query"),
        ("warm", "warm: loaded handle"),
    ];
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, 2));
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
    ];
    for ((mode, title), area) in panels.iter().zip(areas.iter()) {
        let runs: Vec<&super::Run> = report.runs.iter().filter(|r| r.mode == *mode).collect();
        let max_ms = runs.iter().map(|r| r.p50_ms).fold(0.0f64, f64::max) * 1.15 + 0.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{title}, {} docs, {} ms per GET",
                    report.docs, report.get_latency_ms
                ),
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (1f64..max_g.max(2.0))
                    .log_scale()
                    .with_key_points(ticks.clone()),
                0f64..max_ms,
            )
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("generations")
            .x_label_formatter(&|g| format!("{g:.0}"))
            .y_desc("p50 latency (ms)")
            .draw()
            .map_err(|e| err(&e))?;
        for (query, color) in ["fts", "vector", "filtered"].iter().zip(colors) {
            let mut pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.query == *query)
                .map(|r| (r.generations as f64, r.p50_ms))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if pts.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(*query)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
