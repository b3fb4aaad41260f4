//! `stream.png`.

use super::report::StreamReport;

/// `stream.png`: three panels against time: acknowledged rows/s; append and query p99
/// latency (log scale); generations, memtable and unindexed rows.
pub(super) fn plot_stream(report: &StreamReport, path: &std::path::Path) -> Result<(), String> {
    use plotters::prelude::*;
    crate::bench::plot::register_font()?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let rows = &report.intervals;
    let t_max = rows.last().map_or(1.0, |r| r.t).max(1.0);
    let root = BitMapBackend::new(path, (1500, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, 3));
    let colors = crate::bench::plot::PALETTE;
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
