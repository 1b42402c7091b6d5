"""Gantt chart of one simulated iteration: ops and messages per stage, then the sync."""

from __future__ import annotations

from pathlib import Path

from spantrain._figures import glyphs_may_be_missing, plain_text
from spantrain.env.reference import Trace

__all__ = ["COLORS", "MAX_ROWS", "draw_timeline", "rows_to_draw"]

COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452", "BW": "#2A9D8F", "act": "#8C8C8C",
          "grad": "#B07AA1", "sync": "#C44E52", "optimizer": "#8172B3"}
"""Colour of each op, message direction and phase."""
MAX_LABEL_ID = 24
"""Characters of a device id a row label shows: a spec sets ids no length limit, and a 5,000-character
id made a label wider than the figure (rows cut off, matplotlib warning on stderr)."""

MAX_ROWS = 64
"""Stage rows a timeline draws at most: a 4,096-stage plan made a 1540 x 189,413 px image."""


def rows_to_draw(stages_per_pipeline: list[int], max_rows: int = MAX_ROWS) -> list[tuple[int, int]]:
    """(pipeline, stage) rows in order: all of them, or past `max_rows` the first and last halves."""
    rows = [(p, s) for p, n in enumerate(stages_per_pipeline) for s in range(n)]
    if len(rows) <= max_rows:
        return rows
    head = (max_rows + 1) // 2
    return rows[:head] + rows[len(rows) - (max_rows - head):]


@plain_text
def draw_timeline(tr: Trace, path: str | Path, title: str = "", max_rows: int = MAX_ROWS) -> None:
    """Write a PNG: one row per stage (ops on top, outgoing messages as a thin bar below),
    pipelines separated by gaps, and below them one row per sync collective. Past `max_rows`
    stages, only the first and last `max_rows / 2` are drawn, a gap where the rest were."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # as a Path, the file `check_figure_path` checked: given 't.png/' as a string, matplotlib saw
    # no suffix and wrote 't.png/.png', failing after the work ("No such file or directory")
    path = Path(path)
    total = sum(len(p) for p in tr.ops)
    drawn_rows = rows_to_draw([len(p) for p in tr.ops], max_rows)
    rows = len(drawn_rows)
    cut = total - rows
    # a gap per pipeline drawn, and one more where rows were left out
    gaps = len({p for p, _ in drawn_rows}) + (1 if cut else 0)
    n_sync = len(tr.collectives)
    height = 1.2 + 0.42 * (rows + gaps) + (0.35 * min(n_sync, 24) + 0.8 if n_sync else 0)
    ratios = [rows + gaps] + ([max(min(n_sync, 24), 2)] if n_sync else [])
    fig, axes = plt.subplots(len(ratios), 1, figsize=(14, height), sharex=True,
                             gridspec_kw={"height_ratios": ratios}, squeeze=False)
    ax = axes[0][0]
    labels, ticks = [], []
    y = 0.0
    span = max([op.end for p in tr.ops for ops in p for op in ops]
               + [c.end for c in tr.collectives] + [0.0]) + tr.optimizer_s
    kinds = set()
    for row, (p, s) in enumerate(drawn_rows):
        if row and p != drawn_rows[row - 1][0]:
            y += 0.6
        if cut and row == (rows + 1) // 2:  # where the left-out rows were
            ax.text(0.5, y + 0.2, f"... {cut:,} stages not drawn ...", transform=ax.get_yaxis_transform(),
                    ha="center", va="center", fontsize=9, color="0.3")
            y += 1.0
        ops = tr.ops[p][s]
        kinds |= {op.kind for op in ops}
        bars = {}
        for op in ops:
            bars.setdefault(op.kind, []).append((op.start, op.end - op.start))
        for kind, spans in bars.items():
            ax.broken_barh(spans, (y, 0.62), facecolors=COLORS[kind], edgecolor="white", linewidth=0.3)
        sends = [(t.start, t.busy_until - t.start, t.kind) for t in tr.transfers[p]
                 if (t.kind == "act" and t.stage == s) or (t.kind == "grad" and t.stage == s)]
        for kind in ("act", "grad"):
            spans = [(a, d) for a, d, k in sends if k == kind]
            if spans:
                ax.broken_barh(spans, (y + 0.66 + (0.12 if kind == "grad" else 0.0), 0.11),
                               facecolors=COLORS[kind], linewidth=0)
        dev = tr.devices[p][s]
        # the step follows the device's own gradient sync (it was drawn at the schedule's end,
        # before collectives that ran on), except under overlapped local SGD, which averages after it
        synced = [c.end for c in tr.collectives if dev in c.devices] if tr.optimizer_after_sync else []
        end = max([ops[-1].end, *synced])
        ax.broken_barh([(end, tr.optimizer_s)], (y, 0.62), facecolors=COLORS["optimizer"], linewidth=0)
        a, z = tr.layers[p][s]
        label_id = dev if len(dev) <= MAX_LABEL_ID else dev[:MAX_LABEL_ID - 1] + "…"
        labels.append(f"p{p} s{s} {label_id} [{a},{z})")
        ticks.append(y + 0.45)
        y += 1.0
    y += 0.6
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(y - 0.4, -0.3)
    ax.set_xlim(0, span * 1.01)
    ax.grid(axis="x", alpha=0.3)
    title = title or "simulated iteration"
    if cut:
        title += f"\n{rows} of {total:,} stages drawn (the first {(rows + 1) // 2} and the last {rows // 2})"
    ax.set_title(title, fontsize=11)
    # only what the chart shows: a GPipe plan's legend listed B, W and sync it never drew
    drawn = kinds | {t.kind for p, s in drawn_rows for t in tr.transfers[p] if t.stage == s}
    drawn |= {"optimizer"} | ({"sync"} if n_sync else set())
    handles = [Patch(color=COLORS[k], label=lab) for k, lab in
               (("F", "forward F"), ("B", "input grad B"), ("W", "weight grad W"), ("BW", "fused backward"),
                ("act", "activation send"), ("grad", "gradient send"), ("optimizer", "optimizer step"),
                ("sync", "sync collective")) if k in drawn]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    if n_sync:
        sx = axes[1][0]
        shown = tr.collectives[:24]
        for i, c in enumerate(shown):
            sx.broken_barh([(c.start, c.end - c.start)], (i, 0.7), facecolors=COLORS["sync"])
            sx.plot([c.ready], [i + 0.35], marker="|", color="black", markersize=8)
        sx.set_yticks([i + 0.35 for i in range(len(shown))],
                      [f"layers [{c.layers[0]},{c.layers[1]}) {c.nbytes / 1e6:.0f} MB" for c in shown], fontsize=8)
        sx.set_ylim(len(shown), -0.3)
        sx.grid(axis="x", alpha=0.3)
        sx.set_title("data-parallel sync (| = gradients ready)" +
                     (f", first 24 of {n_sync}" if n_sync > 24 else ""), fontsize=9)
    axes[-1][0].set_xlabel("seconds")
    with glyphs_may_be_missing():
        fig.tight_layout(rect=(0, 0.6 / height, 1, 1))
        fig.savefig(path, dpi=110)
    plt.close(fig)
