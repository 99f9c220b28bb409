//! `--plot DIR`: SVG charts of a run, drawn with `plotters`: the latency
//! distributions of W1 and of W3's handoffs against their floors, and
//! throughput by workload.

use std::path::Path;

use plotters::prelude::*;

use super::*;

type PlotResult = Result<(), Box<dyn std::error::Error>>;

/// Writes every chart whose workloads ran into `dir`; returns the files.
pub(crate) fn plot(dir: &Path, reports: &[Report]) -> Result<Vec<String>, Error> {
    std::fs::create_dir_all(dir)?;
    let find = |prefix: &str| reports.iter().find(|r| r.workload.starts_with(prefix));
    let mut written = Vec::new();
    let mut chart = |file: &str, drawn: PlotResult| -> Result<(), Error> {
        drawn.map_err(|e| -> Error { format!("{file}: {e}").into() })?;
        written.push(dir.join(file).display().to_string());
        Ok(())
    };
    if let (Some(floor), Some(w1)) = (find("W0 floor"), find("W1 un")) {
        let file = "w1_latency.svg";
        chart(
            file,
            distribution(
                &dir.join(file),
                "W1: one acquire + release, latency",
                &[
                    (floor, "floor: SET NX PX + compare-and-delete"),
                    (w1, "lock-runtime"),
                ],
            ),
        )?;
    }
    if let (Some(rtt), Some(w3)) = (find("W0 round"), find("W3 16")) {
        let file = "w3_handoff.svg";
        chart(
            file,
            distribution(
                &dir.join(file),
                "W3: 16 tasks on one key, release-to-next-holder handoff",
                &[(rtt, "floor: one round trip (GET)"), (w3, "lock-runtime handoff")],
            ),
        )?;
    }
    if !reports.is_empty() {
        let file = "throughput.svg";
        chart(file, throughput(&dir.join(file), reports))?;
    }
    Ok(written)
}

/// The cumulative distribution of each report's latencies, in µs, up to
/// the 99.5th percentile of the slowest (the tail past it is one or two
/// scheduler hiccups that would squash the rest).
fn distribution(path: &Path, title: &str, series: &[(&Report, &str)]) -> PlotResult {
    let sorted: Vec<Vec<f64>> = series
        .iter()
        .map(|(r, _)| {
            let mut us: Vec<f64> = r.latencies.iter().map(|d| d.as_secs_f64() * 1e6).collect();
            us.sort_by(f64::total_cmp);
            us
        })
        .collect();
    let right = series
        .iter()
        .map(|(r, _)| r.percentile_us(0.995))
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..right, 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("latency (µs)")
        .y_desc("fraction of operations at or below")
        .draw()?;
    for (i, ((_, label), us)) in series.iter().zip(&sorted).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let n = us.len().max(1) as f64;
        // At most ~400 points a line: the file stays small, the curve the same.
        let step = (us.len() / 400).max(1);
        let points = us
            .iter()
            .enumerate()
            .filter(|&(k, &x)| x <= right && (k % step == 0 || k + 1 == us.len()))
            .map(|(k, &x)| (x, (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(format!(
                "{label} (p50 {:.0} µs, p99 {:.0} µs)",
                percentile_of(us, 0.5),
                percentile_of(us, 0.99)
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Operations per second of every workload, on a log scale (they span
/// four orders of magnitude), floors in grey.
fn throughput(path: &Path, reports: &[Report]) -> PlotResult {
    let rows: Vec<(&str, f64)> = reports
        .iter()
        .map(|r| (r.workload, r.per_second()))
        .filter(|(_, v)| v.is_finite() && *v > 0.0)
        .collect();
    let top = rows.iter().map(|(_, v)| *v).fold(10.0, f64::max) * 3.0;
    let height = 60 + 28 * rows.len() as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Throughput by workload (operations per second)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(330)
        .build_cartesian_2d((1f64..top).log_scale(), (0..rows.len()).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows.len())
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => rows.get(*i).map_or(String::new(), |(name, _)| (*name).to_owned()),
            _ => String::new(),
        })
        .x_desc("ops/s (log scale)")
        .draw()?;
    chart.draw_series(rows.iter().enumerate().map(|(i, (name, v))| {
        let color = if name.contains("floor") || name.starts_with("W0") {
            RGBColor(160, 160, 160)
        } else {
            RGBColor(31, 119, 180)
        };
        let mut bar = Rectangle::new(
            [(1.0, SegmentValue::Exact(i)), (*v, SegmentValue::Exact(i + 1))],
            color.filled(),
        );
        bar.set_margin(4, 4, 0, 0);
        bar
    }))?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(workload: &'static str, micros: &[u64]) -> Report {
        Report {
            workload,
            ops: micros.len(),
            elapsed: Duration::from_millis(10),
            latencies: micros.iter().map(|&us| Duration::from_micros(us)).collect(),
            ..Report::default()
        }
    }

    #[test]
    fn every_chart_is_written_as_svg_with_its_series() {
        let dir = std::env::temp_dir().join(format!("lock-bench-plot-{}", std::process::id()));
        let reports = [
            report("W0 round trip (GET)", &[40, 50, 60]),
            report("W0 floor pair (SET NX PX + compare-and-delete)", &[90, 100, 110]),
            report("W1 uncontended acquire+release", &[95, 105, 130]),
            report("W3 16 tasks x 1 key, increments", &[120, 140, 300]),
        ];
        let written = plot(&dir, &reports).expect("plotted");
        assert_eq!(written.len(), 3, "{written:?}");
        for file in &written {
            let svg = std::fs::read_to_string(file).expect("written");
            assert!(svg.starts_with("<svg"), "{file}");
        }
        let w1 = std::fs::read_to_string(dir.join("w1_latency.svg")).expect("written");
        assert!(
            w1.contains("lock-runtime (p50 105 µs"),
            "the legend names each series"
        );
        let throughput = std::fs::read_to_string(dir.join("throughput.svg")).expect("written");
        assert!(throughput.contains("W3 16 tasks x 1 key, increments"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
