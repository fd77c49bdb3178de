"""`thinkrl report RUN_DIR [--out DIR]`

Draws a run from its directory (metrics.jsonl, config.yaml, generations/)
as one self-contained HTML page, report.html, plus a PNG per panel: reward,
validation, response length, policy update, time per stage, throughput, and
sample generations. Works on a finished, a running or a crashed run.
"""

from __future__ import annotations

from thinkrl.commands.common import command_parser


def add_parser(sub) -> None:
    parser = command_parser(sub, "report", help="draw a run's metrics as an HTML page", doc=__doc__)
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="the run directory (trainer.default_local_dir)")
    parser.add_argument("--out", metavar="DIR",
                        help="where to write report.html and the PNGs (default: RUN_DIR/report)")


def run(args) -> int:
    from thinkrl.report import render_report

    report = render_report(args.run_dir, args.out)
    for panel in report.panels:
        if panel.figure is None:
            print(f"skipped {panel.title}: {panel.note}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"report: {report.html} ({len(report.images)} figures)")
    return 0
