//! The chart (`--svg`): two panels over the traffic's time, one line per
//! limiter in each, in the same colour.
//!
//! * Above, requests per second: what the traffic offered (a wide grey
//!   line, behind) and what each limiter admitted (by the instant it
//!   granted).
//! * Below, the longest wait of the requests granted in each span of time,
//!   in milliseconds (meters never wait: their line lies on 0).
//!
//! At most [`POINTS`] points a line: the replay's buckets are merged to fit.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::engine::{Bucket, Replay};
use super::summary::coarsen;
use super::traffic::show_span;

/// The most points one line gets.
pub(crate) const POINTS: usize = 1200;

const SIZE: (u32, u32) = (1200, 820);

/// The offered traffic's line: light, so that the limiters' show on it.
const OFFERED: RGBColor = RGBColor(190, 190, 190);

/// The chart as an SVG document.
///
/// # Errors
///
/// plotters' drawing error, as text.
pub(crate) fn svg(title: &str, replay: &Replay) -> Result<String, String> {
    let mut out = String::new();
    {
        // The backend writes `out` when it is dropped.
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        draw(&root, title, replay)?;
    }
    Ok(out)
}

/// The time axis: its unit and how many seconds one of it is.
fn unit(seconds: f64) -> (&'static str, f64) {
    if seconds <= 120.0 {
        ("s", 1.0)
    } else if seconds <= 2.0 * 3600.0 {
        ("min", 60.0)
    } else {
        ("h", 3600.0)
    }
}

fn colour(index: usize) -> RGBColor {
    // Distinct on white, and for the common kinds of colour blindness.
    const COLOURS: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(120, 94, 240),
        RGBColor(150, 150, 150),
    ];
    COLOURS[index % COLOURS.len()]
}

#[expect(clippy::cast_precision_loss, reason = "chart coordinates")]
#[expect(
    clippy::too_many_lines,
    reason = "the two panels in the order they are drawn; apart, they would share a dozen values"
)]
fn draw<DB>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    replay: &Replay,
) -> Result<(), String>
where
    DB: DrawingBackend,
{
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(fail)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(fail)?;
    let (upper, lower) = root.split_vertically(SIZE.1 * 11 / 20);

    let Some(first) = replay.tallies.first() else {
        return Ok(());
    };
    let longest = replay
        .tallies
        .iter()
        .map(|t| t.buckets.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let by = longest.div_ceil(POINTS).max(1);
    let span = first.bucket_width().as_secs_f64() * by as f64;
    let series: Vec<Vec<Bucket>> = replay
        .tallies
        .iter()
        .map(|t| coarsen(&t.buckets, by))
        .collect();
    let total = span * series.iter().map(Vec::len).max().unwrap_or(1) as f64;
    let (unit_name, unit_secs) = unit(total);
    // Room above the data for the legend (a line per series, upper right).
    let legend = 20.0 * (replay.tallies.len() as f64 + 1.0) + 24.0;
    let headroom = 1.0 / (1.0 - (legend / f64::from(SIZE.1 * 11 / 20 - 100)).min(0.6));
    // Lines drawn first are wider, so that two limiters that admit the same
    // show as a line inside a wider one rather than one hiding the other.
    let count = replay.tallies.len();
    let width = |i: usize| u32::try_from(2 + (count - 1 - i).min(4)).unwrap_or(2);
    let x_max = total / unit_secs;
    // A point at the middle of its span, and the line closed at both ends.
    let x = |i: usize| (i as f64 + 0.5) * span / unit_secs;
    // Per second of the span a point covers (the last may cover fewer
    // buckets).
    let bucket = first.bucket_width().as_secs_f64();
    let rate = |i: usize, count: u64| count as f64 / (bucket * by.min(longest - i * by) as f64);

    let offered: Vec<(f64, f64)> = series[0]
        .iter()
        .enumerate()
        .map(|(i, b)| (x(i), rate(i, b.offered)))
        .collect();
    let y_max = series
        .iter()
        .flat_map(|s| {
            s.iter()
                .enumerate()
                .map(|(i, b)| rate(i, b.offered.max(b.admitted)))
        })
        .fold(1.0, f64::max)
        * headroom;
    let per = show_span(std::time::Duration::from_secs_f64(span));
    let mut rates = ChartBuilder::on(&upper)
        .caption(
            format!("requests per second, offered and admitted (mean over {per})"),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(fail)?;
    rates
        .configure_mesh()
        .x_desc(format!("time since the start ({unit_name})"))
        .y_desc("requests per second")
        .draw()
        .map_err(fail)?;
    rates
        .draw_series(LineSeries::new(offered, OFFERED.stroke_width(6)))
        .map_err(fail)?
        .label("offered")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], OFFERED.stroke_width(6)));
    let lines = |name: &str, value: &dyn Fn(usize, &Bucket) -> f64| {
        replay
            .tallies
            .iter()
            .zip(&series)
            .enumerate()
            .map(|(i, (tally, buckets))| {
                let points = (buckets.iter().enumerate())
                    .map(|(j, b)| (x(j), value(j, b)))
                    .collect();
                let style = colour(i).stroke_width(width(i));
                (format!("{name}: {}", tally.spec.label), points, style)
            })
            .collect::<Vec<_>>()
    };
    draw_lines(&mut rates, lines("admitted", &|j, b| rate(j, b.admitted))).map_err(fail)?;

    let wait_ms = |b: &Bucket| b.max_wait as f64 / 1e6;
    let w_max = series
        .iter()
        .flat_map(|s| s.iter().map(wait_ms))
        .fold(0.0, f64::max);
    let w_top = if w_max > 0.0 { w_max * headroom } else { 1.0 };
    let mut waits = ChartBuilder::on(&lower)
        .caption(
            if w_max > 0.0 {
                format!("longest wait of the requests granted in each {per}")
            } else {
                "longest wait: no request waited".to_owned()
            },
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..w_top)
        .map_err(fail)?;
    waits
        .configure_mesh()
        .x_desc(format!("time since the start ({unit_name})"))
        .y_desc("wait (ms)")
        .draw()
        .map_err(fail)?;
    draw_lines(&mut waits, lines("wait", &|_, b| wait_ms(b))).map_err(fail)?;
    root.present().map_err(fail)?;
    Ok(())
}

/// One limiter's line in a panel: its legend label, its points, its style.
type Line = (String, Vec<(f64, f64)>, ShapeStyle);

/// Draws each `(label, points, style)` as a line of a panel, then the
/// panel's legend (upper right, in the headroom left for it).
fn draw_lines<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    lines: Vec<Line>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (label, points, style) in lines {
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
}
