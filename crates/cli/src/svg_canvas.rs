//! SVG output for `layout-rs`: a [`RenderBackend`] that writes what the
//! layout draws as SVG elements, with a title band above it.
//!
//! Use: pass a [`Canvas`] to `VisualGraph::do_it`, then
//! [`Canvas::finish`] with the title. `layout-rs` has an SVG writer of its
//! own, but it sizes the image from text lengths along the wrong axis (tall
//! empty space below a graph with long labels), sets text in Times and emits
//! an empty `<textPath>` per edge; this one keeps a true bounding box of
//! everything drawn, so the image fits the graph.
//!
//! The surprising part: text widths are estimated (0.6 em per character,
//! as no font is measured), so the box sizes `layout-rs` chose stay
//! generous and the title band centres its text over the estimate.

use layout::core::color::Color;
use layout::core::format::{ClipHandle, RenderBackend};
use layout::core::geometry::Point;
use layout::core::style::StyleAttr;
use std::fmt::Write;

/// Height of the title band above the graph, in pixels.
const TITLE_BAND: f64 = 36.0;
/// Title font size, in pixels.
const TITLE_FONT: f64 = 16.0;
/// Blank margin around everything, in pixels.
const MARGIN: f64 = 12.0;
/// Estimated width of a character, in ems.
const CHAR_EM: f64 = 0.6;

/// Collects SVG elements and the box they cover.
#[derive(Debug)]
pub struct Canvas {
    body: String,
    defs: String,
    clips: usize,
    lo: Point,
    hi: Point,
}

impl Default for Canvas {
    fn default() -> Self {
        Canvas {
            body: String::new(),
            defs: String::new(),
            clips: 0,
            lo: Point::new(f64::INFINITY, f64::INFINITY),
            hi: Point::new(f64::NEG_INFINITY, f64::NEG_INFINITY),
        }
    }
}

/// `text` with the characters XML gives a meaning escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

/// `#rrggbb` and an opacity from `layout-rs`'s RGBA color.
fn paint(c: Color) -> (String, f64) {
    let web = c.to_web_color(); // #rrggbbaa
    let alpha = u8::from_str_radix(web.get(7..9).unwrap_or("ff"), 16).unwrap_or(255);
    (web[..7].to_string(), f64::from(alpha) / 255.0)
}

fn fill_attr(c: Option<Color>) -> String {
    match c {
        Some(c) => {
            let (rgb, a) = paint(c);
            format!("fill=\"{rgb}\" fill-opacity=\"{a:.3}\"")
        }
        None => "fill=\"none\"".into(),
    }
}

fn stroke_attr(look: &StyleAttr) -> String {
    let (rgb, a) = paint(look.line_color);
    format!(
        "stroke=\"{rgb}\" stroke-opacity=\"{a:.3}\" stroke-width=\"{}\"",
        look.line_width
    )
}

impl Canvas {
    /// Grows the covered box to hold `p`.
    fn cover(&mut self, p: Point) {
        self.lo = Point::new(self.lo.x.min(p.x), self.lo.y.min(p.y));
        self.hi = Point::new(self.hi.x.max(p.x), self.hi.y.max(p.y));
    }

    /// The SVG document: `title` centred in a band above what was drawn.
    pub fn finish(mut self, title: &str) -> String {
        if self.lo.x > self.hi.x {
            self.cover(Point::zero());
        }
        let title_width = title.chars().count() as f64 * CHAR_EM * TITLE_FONT;
        let mid = (self.lo.x + self.hi.x) / 2.0;
        let left = self.lo.x.min(mid - title_width / 2.0) - MARGIN;
        let right = self.hi.x.max(mid + title_width / 2.0) + MARGIN;
        let top = self.lo.y - TITLE_BAND - MARGIN;
        let bottom = self.hi.y + MARGIN;
        let (w, h) = (right - left, bottom - top);
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" \
             viewBox=\"{left:.1} {top:.1} {w:.1} {h:.1}\" font-family=\"sans-serif\">\n\
             <defs>\n<marker id=\"arrow\" markerWidth=\"10\" markerHeight=\"8\" refX=\"10\" \
             refY=\"4\" orient=\"auto\" markerUnits=\"userSpaceOnUse\">\
             <polygon points=\"0 0, 10 4, 0 8\" fill=\"#333333\"/></marker>\n{}</defs>\n\
             <rect x=\"{left:.1}\" y=\"{top:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"#ffffff\"/>\n\
             <text x=\"{mid:.1}\" y=\"{:.1}\" font-size=\"{TITLE_FONT}\" font-weight=\"bold\" \
             text-anchor=\"middle\">{}</text>\n{}</svg>\n",
            self.defs,
            self.lo.y - TITLE_BAND / 2.0,
            escape(title),
            self.body
        )
    }
}

impl RenderBackend for Canvas {
    fn draw_rect(
        &mut self,
        xy: Point,
        size: Point,
        look: &StyleAttr,
        _properties: Option<String>,
        clip: Option<ClipHandle>,
    ) {
        self.cover(xy);
        self.cover(xy.add(size));
        let clip = clip.map_or_else(String::new, |c| format!(" clip-path=\"url(#clip{c})\""));
        let _ = writeln!(
            self.body,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"{}\" {} {}{clip}/>",
            xy.x,
            xy.y,
            size.x,
            size.y,
            look.rounded,
            fill_attr(look.fill_color),
            stroke_attr(look)
        );
    }

    fn draw_line(
        &mut self,
        start: Point,
        stop: Point,
        look: &StyleAttr,
        _properties: Option<String>,
    ) {
        self.cover(start);
        self.cover(stop);
        let _ = writeln!(
            self.body,
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" {}/>",
            start.x,
            start.y,
            stop.x,
            stop.y,
            stroke_attr(look)
        );
    }

    fn draw_circle(
        &mut self,
        xy: Point,
        size: Point,
        look: &StyleAttr,
        _properties: Option<String>,
    ) {
        let r = size.scale(0.5);
        self.cover(xy.sub(r));
        self.cover(xy.add(r));
        let _ = writeln!(
            self.body,
            "<ellipse cx=\"{:.1}\" cy=\"{:.1}\" rx=\"{:.1}\" ry=\"{:.1}\" {} {}/>",
            xy.x,
            xy.y,
            r.x,
            r.y,
            fill_attr(look.fill_color),
            stroke_attr(look)
        );
    }

    /// Lines of `text` centred on `xy`.
    fn draw_text(&mut self, xy: Point, text: &str, look: &StyleAttr) {
        let size = look.font_size as f64;
        let lines: Vec<&str> = text.lines().collect();
        let widest = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        let half = Point::new(
            widest as f64 * CHAR_EM * size / 2.0,
            lines.len() as f64 * size * 1.2 / 2.0,
        );
        self.cover(xy.sub(half));
        self.cover(xy.add(half));
        // Baselines 1.2 em apart, the block centred; 0.35 em puts a line's
        // middle on its nominal position.
        let first = xy.y - (lines.len() as f64 - 1.0) * 0.6 * size + 0.35 * size;
        let _ = write!(
            self.body,
            "<text x=\"{:.1}\" y=\"{first:.1}\" font-size=\"{size}\" text-anchor=\"middle\" fill=\"#1a1a1a\">",
            xy.x
        );
        for (i, line) in lines.iter().enumerate() {
            let dy = if i == 0 { 0.0 } else { 1.2 };
            let _ = write!(
                self.body,
                "<tspan x=\"{:.1}\" dy=\"{dy}em\">{}</tspan>",
                xy.x,
                escape(line)
            );
        }
        self.body.push_str("</text>\n");
    }

    /// A cubic Bézier path through `path`: the first pair is the start and
    /// its control point, each later pair a control point and an end point
    /// (`layout-rs`'s convention).
    fn draw_arrow(
        &mut self,
        path: &[(Point, Point)],
        dashed: bool,
        head: (bool, bool),
        look: &StyleAttr,
        _properties: Option<String>,
        text: &str,
    ) {
        if path.len() < 2 {
            return;
        }
        for &(a, b) in path {
            self.cover(a);
            self.cover(b);
        }
        let mut d = format!(
            "M {:.1} {:.1} C {:.1} {:.1}, {:.1} {:.1}, {:.1} {:.1}",
            path[0].0.x,
            path[0].0.y,
            path[0].1.x,
            path[0].1.y,
            path[1].0.x,
            path[1].0.y,
            path[1].1.x,
            path[1].1.y
        );
        for (c, p) in &path[2..] {
            let _ = write!(d, " S {:.1} {:.1}, {:.1} {:.1}", c.x, c.y, p.x, p.y);
        }
        let dash = if dashed {
            " stroke-dasharray=\"5,5\""
        } else {
            ""
        };
        let start = if head.0 {
            " marker-start=\"url(#arrow)\""
        } else {
            ""
        };
        let end = if head.1 {
            " marker-end=\"url(#arrow)\""
        } else {
            ""
        };
        let _ = writeln!(
            self.body,
            "<path d=\"{d}\" fill=\"none\" {}{dash}{start}{end}/>",
            stroke_attr(look)
        );
        if !text.is_empty() {
            let mid = path[path.len() / 2].1;
            self.draw_text(mid, text, look);
        }
    }

    fn create_clip(&mut self, xy: Point, size: Point, rounded_px: usize) -> ClipHandle {
        let handle = self.clips;
        self.clips += 1;
        let _ = writeln!(
            self.defs,
            "<clipPath id=\"clip{handle}\"><rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" \
             height=\"{:.1}\" rx=\"{rounded_px}\"/></clipPath>",
            xy.x, xy.y, size.x, size.y
        );
        handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_covers_what_was_drawn_and_the_title() {
        let mut c = Canvas::default();
        let look = StyleAttr::simple();
        c.draw_rect(
            Point::new(10.0, 20.0),
            Point::new(100.0, 30.0),
            &look,
            None,
            None,
        );
        c.draw_text(Point::new(60.0, 35.0), "a<b\nc&d", &look);
        let svg = c.finish("T \"1\"");
        assert!(svg.contains("width=\"124\""), "{svg}");
        assert!(
            svg.contains("<tspan x=\"60.0\" dy=\"0em\">a&lt;b</tspan>"),
            "{svg}"
        );
        assert!(svg.contains("c&amp;d"), "{svg}");
        assert!(svg.contains(">T &quot;1&quot;</text>"), "{svg}");
        assert!(
            svg.contains("fill=\"#ffffff\" fill-opacity=\"1.000\""),
            "{svg}"
        );
    }
}
