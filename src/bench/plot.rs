//! `latency.png`: p50 latency against generation count, one line per query kind and mode.

use super::generations::Report;
use plotters::prelude::*;
use std::path::Path;

/// Fonts tried, in order (Debian's `fonts-dejavu-core` provides the first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Line colours, in order.
const PALETTE: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
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
    let colors = PALETTE;
    for ((mode, title), area) in panels.iter().zip(areas.iter()) {
        let runs: Vec<&super::generations::Run> =
            report.runs.iter().filter(|r| r.mode == *mode).collect();
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

/// `stream.png`: three panels against time: acknowledged rows/s; append and query p99
/// latency (log scale); generations, memtable and unindexed rows.
pub(super) fn stream(report: &super::stream::StreamReport, path: &Path) -> Result<(), String> {
    register_font()?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let rows = &report.intervals;
    let t_max = rows.last().map_or(1.0, |r| r.t).max(1.0);
    let root = BitMapBackend::new(path, (1500, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, 3));
    let colors = PALETTE;
    type Series = (String, Vec<(f64, f64)>);
    let draw = |area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
                title: &str,
                y_desc: &str,
                log: bool,
                series: Vec<Series>|
     -> Result<(), String> {
        let y_max = series
            .iter()
            .flat_map(|s| s.1.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            * 1.15
            + 1.0;
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(65);
        macro_rules! body {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc("seconds")
                    .y_desc(y_desc)
                    .draw()
                    .map_err(|e| err(&e))?;
                for ((name, pts), color) in series.into_iter().zip(colors) {
                    chart
                        .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                        .map_err(|e| err(&e))?
                        .label(name)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                        });
                }
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperLeft)
                    .draw()
                    .map_err(|e| err(&e))?;
            }};
        }
        if log {
            body!(builder
                .build_cartesian_2d(0f64..t_max, (0.1f64..y_max).log_scale())
                .map_err(|e| err(&e))?);
        } else {
            body!(builder
                .build_cartesian_2d(0f64..t_max, 0f64..y_max)
                .map_err(|e| err(&e))?);
        }
        Ok(())
    };
    draw(
        &areas[0],
        "acknowledged rows/s",
        "rows/s",
        false,
        vec![(
            "rows/s".into(),
            rows.iter().map(|r| (r.t, r.rows_per_s)).collect(),
        )],
    )?;
    let mut latency = vec![(
        "append".to_string(),
        rows.iter()
            .map(|r| (r.t, r.append.p99_ms.max(0.1)))
            .collect(),
    )];
    for kind in ["fts", "vector", "filtered"] {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| r.queries.get(kind).map(|l| (r.t, l.p99_ms.max(0.1))))
            .collect();
        if !pts.is_empty() {
            latency.push((kind.to_string(), pts));
        }
    }
    draw(&areas[1], "p99 latency", "ms", true, latency)?;
    draw(
        &areas[2],
        "index shape",
        "count",
        false,
        vec![
            (
                "generations x1000".into(),
                rows.iter()
                    .map(|r| (r.t, r.generations as f64 * 1000.0))
                    .collect(),
            ),
            (
                "memtable rows".into(),
                rows.iter().map(|r| (r.t, r.memtable_rows as f64)).collect(),
            ),
            (
                "unindexed rows".into(),
                rows.iter()
                    .map(|r| (r.t, r.unindexed_rows as f64))
                    .collect(),
            ),
        ],
    )?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
