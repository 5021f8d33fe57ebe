//! `bench --sweep --plot FILE`: the sweep's prefill and decode speed against
//! context length, as an SVG line chart.
//!
//! [`plot_svg`] draws both series with `plotters`' SVG backend (built without
//! its font-rendering features: text goes out as SVG `<text>` elements and
//! the viewer picks the font, so no system font library is linked). Both
//! axes are logarithmic: context lengths double from point to point, and
//! prefill is often a hundred times faster than decode, so one linear axis
//! would flatten the decode line against zero.
//!
//! The surprising part: without a font library plotters only estimates text
//! widths, so the label areas are sized generously.

use crate::sweep::SweepReport;
use anyhow::{anyhow, bail, Result};
use plotters::prelude::*;

/// Pixel size of the chart.
pub const SIZE: (u32, u32) = (900, 560);

/// `(lo, hi)` of `values` widened by `factor` each way, for a log axis.
fn log_range(values: impl Iterator<Item = f64>, factor: f64) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    (lo / factor, hi * factor)
}

/// 1, 2 and 5 times the powers of ten in `lo..=hi`: ticks for a log axis
/// (plotters' own repeat a value where two decades meet).
fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * decade;
            if (lo..=hi).contains(&t) {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// The chart of `r` as SVG text.
pub fn plot_svg(r: &SweepReport) -> Result<String> {
    if r.points.is_empty() {
        bail!("the sweep measured no points; nothing to plot");
    }
    let bad = r.points.iter().find(|p| {
        !(p.prefill_tok_s.is_finite()
            && p.prefill_tok_s > 0.0
            && p.decode_tok_s.is_finite()
            && p.decode_tok_s > 0.0)
    });
    if let Some(p) = bad {
        bail!(
            "the speed measured at context {} is not a positive number (prefill {} tok/s, \
             decode {} tok/s); the timer may be too coarse for so small a model: raise --repeats",
            p.context,
            p.prefill_tok_s,
            p.decode_tok_s
        );
    }
    let (x_lo, x_hi) = log_range(r.points.iter().map(|p| p.context as f64), 1.25);
    let (y_lo, y_hi) = log_range(
        r.points
            .iter()
            .flat_map(|p| [p.prefill_tok_s, p.decode_tok_s]),
        1.6,
    );
    // Ticks at the measured lengths, which a log axis's own (powers of ten)
    // would mostly miss.
    let contexts: Vec<f64> = r.points.iter().map(|p| p.context as f64).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing the chart: {e}");
        root.fill(&WHITE).map_err(err)?;
        let title = format!("{}: speed against context — {}", r.model, r.device);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (x_lo..x_hi).log_scale().with_key_points(contexts),
                (y_lo..y_hi)
                    .log_scale()
                    .with_key_points(nice_ticks(y_lo, y_hi)),
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("context length (tokens, log scale)")
            .y_desc("tokens per second (log scale)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(TRANSPARENT)
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(err)?;
        let series = [
            (
                "prefill (a prompt of that length)".to_string(),
                RGBColor(0x1f, 0x77, 0xb4),
                r.points
                    .iter()
                    .map(|p| (p.context as f64, p.prefill_tok_s))
                    .collect::<Vec<_>>(),
            ),
            (
                format!("decode ({} tokens from that depth)", r.new_tokens),
                RGBColor(0xd6, 0x27, 0x28),
                r.points
                    .iter()
                    .map(|p| (p.context as f64, p.decode_tok_s))
                    .collect::<Vec<_>>(),
            ),
        ];
        for (name, color, data) in series {
            chart
                .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(data.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::MiddleRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::SweepPoint;

    fn report(points: Vec<SweepPoint>) -> SweepReport {
        SweepReport {
            device: "Test GPU (Vulkan)".into(),
            model: "tiny".into(),
            variant: "portable".into(),
            precision: "f32".into(),
            new_tokens: 8,
            points,
        }
    }

    fn point(context: usize, prefill: f64, decode: f64) -> SweepPoint {
        SweepPoint {
            context,
            prefill_tok_s: prefill,
            decode_depth: context,
            decode_tok_s: decode,
        }
    }

    #[test]
    fn the_chart_has_title_axes_and_legend() {
        let svg = plot_svg(&report(vec![
            point(128, 30000.0, 800.0),
            point(256, 28000.0, 780.0),
            point(512, 25000.0, 700.0),
        ]))
        .unwrap();
        for text in [
            "tiny: speed against context",
            "Test GPU (Vulkan)",
            "context length (tokens, log scale)",
            "tokens per second (log scale)",
            "prefill (a prompt of that length)",
            "decode (8 tokens from that depth)",
        ] {
            assert!(svg.contains(text), "`{text}` missing from the chart");
        }
        assert!(svg.matches("<circle").count() >= 6, "a marker per point");
    }

    #[test]
    fn log_ticks_are_one_two_five_per_decade() {
        assert_eq!(
            nice_ticks(60.0, 4100.0),
            [100.0, 200.0, 500.0, 1000.0, 2000.0]
        );
        assert_eq!(nice_ticks(1.5, 1.9), Vec::<f64>::new());
        assert_eq!(nice_ticks(0.5, 2.0), [0.5, 1.0, 2.0]);
    }

    #[test]
    fn one_point_still_plots_and_bad_speeds_are_errors() {
        assert!(plot_svg(&report(vec![point(16, 100.0, 100.0)])).is_ok());
        let e = plot_svg(&report(vec![point(16, f64::INFINITY, 1.0)])).unwrap_err();
        assert!(e.to_string().contains("context 16"), "{e}");
        let e = plot_svg(&report(vec![])).unwrap_err();
        assert!(e.to_string().contains("no points"), "{e}");
    }
}
