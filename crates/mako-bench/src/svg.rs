//! A hand-written SVG bar chart of a bench run (one bar per phase), or of the
//! target/reference ratio per phase when comparing.

use std::fmt::Write as _;

use crate::bench::{BenchReport, PhaseKind};

const WIDTH_PX: f64 = 820.0;
const LABEL_PX: f64 = 190.0;
const BAR_AREA_PX: f64 = 480.0;
const ROW_PX: f64 = 24.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the report as an SVG document.
pub fn render(report: &BenchReport) -> String {
    let mut rows: Vec<(String, f64, String, &'static str)> = Vec::new();
    let title;
    let mut scale_max = 0.0f64;
    let mut reference_line = None;
    if let Some(reference) = &report.reference {
        title = format!(
            "mako bench: {} / {} (ratio per phase)",
            report.target.dir.display(),
            reference.dir.display()
        );
        for ratio in &report.ratios {
            let value = ratio.ratio.unwrap_or(0.0);
            let colour = if value >= 1.0 { "#2e7d32" } else { "#c62828" };
            rows.push((ratio.phase.clone(), value, format!("{value:.2}x"), colour));
            scale_max = scale_max.max(value);
        }
        scale_max = scale_max.max(2.0);
        reference_line = Some(1.0);
    } else {
        title = format!("mako bench: {}", report.target.dir.display());
        // Bandwidth and metadata have different units; each bar is scaled against the
        // largest phase of its own kind so both kinds fill the width.
        let max_of = |kind: PhaseKind| {
            report
                .target
                .phases
                .iter()
                .filter(|p| p.kind == kind)
                .map(|p| p.value)
                .fold(0.0, f64::max)
        };
        let (bandwidth_max, metadata_max) =
            (max_of(PhaseKind::Bandwidth), max_of(PhaseKind::Metadata));
        for phase in &report.target.phases {
            let (max, colour) = match phase.kind {
                PhaseKind::Bandwidth => (bandwidth_max, "#1565c0"),
                PhaseKind::Metadata => (metadata_max, "#6a1b9a"),
            };
            let fraction = if max > 0.0 { phase.value / max } else { 0.0 };
            rows.push((
                phase.name.clone(),
                fraction,
                format!("{:.3} {}", phase.value, phase.unit),
                colour,
            ));
        }
        scale_max = 1.0;
    }
    let height = 60.0 + ROW_PX * rows.len() as f64 + 20.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="10" y="24" font-size="15" font-weight="bold">{}</text>"#,
        escape(&title)
    );
    let _ = writeln!(
        svg,
        r#"<text x="10" y="44">score: total {:.3}, bandwidth {:.3} GiB/s, metadata {:.3} kIOPS</text>"#,
        report.target.score.total,
        report.target.score.bandwidth_gib_s,
        report.target.score.metadata_kiops
    );
    for (index, (name, value, label, colour)) in rows.iter().enumerate() {
        let y = 60.0 + ROW_PX * index as f64;
        let width = if scale_max > 0.0 {
            BAR_AREA_PX * value / scale_max
        } else {
            0.0
        };
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{:.1}">{}</text>"#,
            y + 15.0,
            escape(name)
        );
        let _ = writeln!(
            svg,
            r#"<rect x="{LABEL_PX}" y="{y:.1}" width="{width:.1}" height="{:.1}" fill="{colour}"/>"#,
            ROW_PX - 6.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            LABEL_PX + width + 6.0,
            y + 15.0,
            escape(label)
        );
    }
    if let Some(line) = reference_line {
        let x = LABEL_PX + BAR_AREA_PX * line / scale_max;
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="52" x2="{x:.1}" y2="{:.1}" stroke="#333" stroke-dasharray="4 3"/>"##,
            height - 20.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">1.0 = same as reference</text>"#,
            x + 4.0,
            height - 6.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
