"""HTML rendering: jinja2 templates, plotly.js inlined once so the file works offline."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import jinja2
from plotly.offline import get_plotlyjs

from reports.confidence_rows import INTERVAL_COLUMNS, VALIDITY_COLUMNS
from reports.markdown import INTERVALS_NOTE, SUMMARY_COLUMNS
from reports.mix_rows import MIX_COLUMNS, MIX_NOTE, MODALITY_COLUMNS, MODALITY_NOTE, TURN_KIND_COLUMNS, TURN_KIND_NOTE
from reports.prediction import PREDICTION_COLUMNS
from reports.quality_rows import ACCURACY_COLUMNS
from reports.repeat_runs import REPEAT_COLUMNS, REPEATS_NOTE
from reports.replicas import REPLICA_COLUMNS
from reports.telemetry_rows import TELEMETRY_COLUMNS, TELEMETRY_NOTE

TEMPLATES = Path(__file__).parent / "templates"
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def figure_divs(figures) -> list[tuple[str, str]]:
    """(heading, <div> + drawing <script>) per figure; the drawing code needs plotly.js on the page."""
    return [
        (heading, fig.to_html(full_html=False, include_plotlyjs=False, config=PLOT_CONFIG)) for heading, fig in figures
    ]


def render(template: str, figures, **context) -> str:
    return (
        environment()
        .get_template(template)
        .render(
            plotly_js=get_plotlyjs(),
            plots=figure_divs(figures),
            generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **context,
        )
    )


def render_report_html(content) -> str:
    return render(
        "report.html.j2",
        content.figures,
        title=content.title,
        c=content,
        summary_columns=SUMMARY_COLUMNS,
        prediction_columns=PREDICTION_COLUMNS,
        replica_columns=REPLICA_COLUMNS,
        interval_columns=INTERVAL_COLUMNS,
        intervals_note=INTERVALS_NOTE,
        validity_columns=VALIDITY_COLUMNS,
        accuracy_columns=ACCURACY_COLUMNS,
        telemetry_columns=TELEMETRY_COLUMNS,
        mix_columns=MIX_COLUMNS,
        mix_note=MIX_NOTE,
        turn_kind_columns=TURN_KIND_COLUMNS,
        turn_kind_note=TURN_KIND_NOTE,
        modality_columns=MODALITY_COLUMNS,
        modality_note=MODALITY_NOTE,
        telemetry_note=TELEMETRY_NOTE,
        repeat_columns=REPEAT_COLUMNS,
        repeats_note=REPEATS_NOTE,
    )
