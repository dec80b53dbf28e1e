//! `kpack size --svg`: a squarified treemap of where the bytes go (root →
//! binary → host code and each target), as a standalone SVG a browser
//! shows (hovering a box shows its name and size).

use std::fmt::Write;

use kpack_engine::size::Root;
use kpack_format::bytes::format_size;

const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 800.0;
const HEADER: f64 = 24.0;

/// A box of the treemap: a name, its bytes, its parts.
struct Node {
    name: String,
    value: f64,
    /// Colour key: a target, `host`, or another category.
    key: String,
    children: Vec<Node>,
}

#[derive(Clone, Copy, Debug)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

/// The treemap of `roots` as an SVG document.
pub fn treemap(roots: &[Root]) -> String {
    let tree: Vec<Node> = roots
        .iter()
        .map(root_node)
        .filter(|n| n.value > 0.0)
        .collect();
    let total: f64 = tree.iter().map(|n| n.value).sum();
    let mut svg = String::new();
    let _ = writeln!(svg, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}" viewBox="0 0 {WIDTH} {h}" font-family="sans-serif" font-size="11">"#,
        h = HEIGHT + HEADER
    );
    let title = format!(
        "kpack size: {} in {} path(s)",
        format_size(total as u64),
        roots.len()
    );
    let _ = writeln!(svg, "<title>{}</title>", escape(&title));
    let _ = writeln!(
        svg,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{}" fill="#ffffff"/>"##,
        HEIGHT + HEADER
    );
    let _ = writeln!(
        svg,
        r#"<text x="6" y="16" font-size="14">{}</text>"#,
        escape(&title)
    );
    let area = Rect {
        x: 0.0,
        y: HEADER,
        w: WIDTH,
        h: HEIGHT,
    };
    draw(&mut svg, &tree, area, 0);
    svg.push_str("</svg>\n");
    svg
}

fn root_node(r: &Root) -> Node {
    let mut children: Vec<Node> = r
        .binaries
        .iter()
        .map(|b| {
            let mut parts = vec![Node {
                name: "host code".into(),
                value: b.host_bytes as f64,
                key: "host".into(),
                children: Vec::new(),
            }];
            parts.extend(b.targets.iter().map(|(t, v)| Node {
                name: t.clone(),
                value: v.stored as f64,
                key: t.clone(),
                children: Vec::new(),
            }));
            parts.retain(|p| p.value > 0.0);
            Node {
                name: b.name.clone(),
                value: parts.iter().map(|p| p.value).sum(),
                key: "binary".into(),
                children: parts,
            }
        })
        .collect();
    for (name, value, key) in [
        ("other files", r.other_bytes, "other"),
        ("headers, padding, TOCs", r.overhead_bytes, "overhead"),
    ] {
        children.push(Node {
            name: name.into(),
            value: value as f64,
            key: key.into(),
            children: Vec::new(),
        });
    }
    children.retain(|c| c.value > 0.0);
    Node {
        name: r.path.clone(),
        value: children.iter().map(|c| c.value).sum(),
        key: "root".into(),
        children,
    }
}

/// Lay `nodes` out in `area` and draw them (groups with a label strip,
/// leaves filled by their colour key).
fn draw(svg: &mut String, nodes: &[Node], area: Rect, depth: usize) {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| {
        nodes[b]
            .value
            .total_cmp(&nodes[a].value)
            .then(nodes[a].name.cmp(&nodes[b].name))
    });
    let values: Vec<f64> = order.iter().map(|&i| nodes[i].value).collect();
    for (k, r) in squarify(&values, area).into_iter().enumerate() {
        let n = &nodes[order[k]];
        let tip = format!("{}: {}", n.name, format_size(n.value as u64));
        if n.children.is_empty() {
            let _ = writeln!(
                svg,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" stroke="#ffffff" stroke-width="1"><title>{}</title></rect>"##,
                r.x,
                r.y,
                r.w,
                r.h,
                colour(&n.key),
                escape(&tip)
            );
            label(svg, r, &n.name, r.y + 13.0);
            continue;
        }
        let _ = writeln!(
            svg,
            r##"<g><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" stroke="#333333" stroke-width="{}"><title>{}</title></rect>"##,
            r.x,
            r.y,
            r.w,
            r.h,
            if depth == 0 { "#eeeeee" } else { "#dddddd" },
            if depth == 0 { 2 } else { 1 },
            escape(&tip)
        );
        label(svg, r, &n.name, r.y + 12.0);
        let strip = if r.h > 40.0 { 16.0 } else { 0.0 };
        let inner = Rect {
            x: r.x + 2.0,
            y: r.y + strip,
            w: (r.w - 4.0).max(0.0),
            h: (r.h - strip - 2.0).max(0.0),
        };
        draw(svg, &n.children, inner, depth + 1);
        svg.push_str("</g>\n");
    }
}

/// A label inside `r` if it fits.
fn label(svg: &mut String, r: Rect, text: &str, y: f64) {
    let room = ((r.w - 6.0) / 6.5).floor() as usize;
    if r.h < 14.0 || room < 4 {
        return;
    }
    let shown: String = if text.chars().count() > room {
        let tail: String = text
            .chars()
            .rev()
            .take(room - 1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    } else {
        text.to_string()
    };
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
        r.x + 3.0,
        y,
        escape(&shown)
    );
}

/// Squarified treemap (Bruls, Huizing, van Wijk): `values` (sorted, largest
/// first) as rectangles filling `area`, in the same order.
fn squarify(values: &[f64], area: Rect) -> Vec<Rect> {
    let total: f64 = values.iter().sum();
    let mut out = Vec::with_capacity(values.len());
    if total <= 0.0 || area.w <= 0.0 || area.h <= 0.0 {
        return values
            .iter()
            .map(|_| Rect {
                w: 0.0,
                h: 0.0,
                ..area
            })
            .collect();
    }
    let scale = area.w * area.h / total;
    let scaled: Vec<f64> = values.iter().map(|v| v * scale).collect();
    let mut rest = area;
    let mut start = 0;
    while start < scaled.len() {
        let side = rest.w.min(rest.h);
        let mut end = start + 1;
        while end < scaled.len()
            && worst(&scaled[start..=end], side) <= worst(&scaled[start..end], side)
        {
            end += 1;
        }
        rest = lay_row(&scaled[start..end], rest, &mut out);
        start = end;
    }
    out
}

/// The worst aspect ratio of a row of `areas` along a side of length `side`.
fn worst(areas: &[f64], side: f64) -> f64 {
    let sum: f64 = areas.iter().sum();
    let (max, min) = areas
        .iter()
        .fold((0.0f64, f64::MAX), |(a, b), &v| (a.max(v), b.min(v)));
    let s2 = sum * sum;
    let w2 = side * side;
    (w2 * max / s2).max(s2 / (w2 * min.max(f64::MIN_POSITIVE)))
}

/// Lay one row along the shorter side of `r`; the rest of `r`.
fn lay_row(areas: &[f64], r: Rect, out: &mut Vec<Rect>) -> Rect {
    let sum: f64 = areas.iter().sum();
    if r.w >= r.h {
        let w = if r.h > 0.0 { sum / r.h } else { 0.0 };
        let mut y = r.y;
        for a in areas {
            let h = if w > 0.0 { a / w } else { 0.0 };
            out.push(Rect { x: r.x, y, w, h });
            y += h;
        }
        Rect {
            x: r.x + w,
            w: (r.w - w).max(0.0),
            ..r
        }
    } else {
        let h = if r.w > 0.0 { sum / r.w } else { 0.0 };
        let mut x = r.x;
        for a in areas {
            let w = if h > 0.0 { a / h } else { 0.0 };
            out.push(Rect { x, y: r.y, w, h });
            x += w;
        }
        Rect {
            y: r.y + h,
            h: (r.h - h).max(0.0),
            ..r
        }
    }
}

/// A stable colour per key: grey for host code, hues for targets.
fn colour(key: &str) -> String {
    match key {
        "host" => "#9e9e9e".into(),
        "other" => "#c8b89a".into(),
        "overhead" => "#e0e0e0".into(),
        _ => {
            let h = key.bytes().fold(2166136261u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(16777619)
            });
            format!("hsl({}, 65%, 55%)", h % 360)
        }
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squarify_fills_the_area_in_proportion() {
        let area = Rect {
            x: 0.0,
            y: 0.0,
            w: 600.0,
            h: 400.0,
        };
        let values = [6.0, 6.0, 4.0, 3.0, 2.0, 2.0, 1.0];
        let rects = squarify(&values, area);
        assert_eq!(rects.len(), values.len());
        let total: f64 = values.iter().sum();
        for (v, r) in values.iter().zip(&rects) {
            let want = v / total * 240_000.0;
            assert!(
                (r.w * r.h - want).abs() < 1e-6 * want.max(1.0),
                "{r:?} {want}"
            );
            assert!(r.x >= -1e-9 && r.y >= -1e-9);
            assert!(r.x + r.w <= 600.0 + 1e-6 && r.y + r.h <= 400.0 + 1e-6);
        }
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
        assert_eq!(escape("x\u{1}y"), "x?y");
    }
}
