"""What a benchmark matrix's ``results.json`` becomes: a markdown table, PNG plots, an HTML page.

``tunecore bench`` writes ``results.md`` and the plots after its cells; ``tunecore report DIR``
renders ``DIR/report.html``, one self-contained file (plots embedded) that can be mailed or archived.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import statistics
from typing import Any

PLOTS_DIR = "plots"


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds with 4 significant digits; "-" for none."""
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


def _pair(cell: dict[str, Any]) -> str:
    return f"{cell['search']}+{cell['cost_model']}"


def _best_s(cell: dict[str, Any]) -> float | None:
    """The cell's best latency: the kernel's for an operator, the estimate (sum of weight × best) for a network."""
    best = cell["curve"]["best_s"]
    return best[-1] if best else None


def cell_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for cell in results["cells"].values():
        e2e = cell.get("e2e") or {}
        measured = "-" if "trials_total" not in cell else f"{cell['trials_total']} ({cell['errors_total']})"
        rows.append([
            cell["model"], cell["search"], cell["cost_model"], str(cell["seed"]),
            cell["status"] + (f": {cell['error']}" if cell.get("error") else ""), measured, ms(_best_s(cell)),
            "-" if cell.get("tuning_s") is None else f"{cell['tuning_s']:.0f}",
            f"{e2e['latency_ms']:.4g}" if "latency_ms" in e2e else e2e.get("error", "-"),
            f"{e2e['speedup']:.2f}" if e2e.get("speedup") is not None else "-",
        ])
    return rows


CELL_COLUMNS = ["model", "search", "cost model", "seed", "status", "measured (failed)", "best ms",
                "tuning s", "end-to-end ms", "speedup over untuned"]
MEDIAN_COLUMNS = ["model", "search + cost model", "seeds", "best ms (median)", "tuning s (median)",
                  "end-to-end ms (median)"]


def median_rows(results: dict[str, Any]) -> list[list[str]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cell in results["cells"].values():
        groups.setdefault((cell["model"], _pair(cell)), []).append(cell)

    def median(values: list[float | None], fmt: str) -> str:
        values = [v for v in values if v is not None]
        return fmt.format(statistics.median(values)) if values else "-"

    return [[model, pair, str(len(cells)),
             median([_best_s(c) and _best_s(c) * 1e3 for c in cells], "{:.4g}"),
             median([c.get("tuning_s") for c in cells], "{:.0f}"),
             median([(c.get("e2e") or {}).get("latency_ms") for c in cells], "{:.4g}")]
            for (model, pair), cells in groups.items()]


def _environment_line(results: dict[str, Any]) -> str:
    env = results["environment"]
    plugins = ", ".join(sorted({f"{p['distribution']} {p['version']}" for p in env.get("plugins", [])}))
    return (f"CPU {env['cpu']} ({env['cores']} cores); target `{json.dumps(env['target'])}`; "
            f"TVM {env['versions']['apache-tvm']}, "
            f"tunecore {env['versions']['tunecore']}; plugins: {plugins or 'none'}.")


def markdown(results: dict[str, Any]) -> str:
    def table(columns: list[str], rows: list[list[str]]) -> list[str]:
        return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                + ["| " + " | ".join(r.replace("|", "\\|") for r in row) + " |" for row in rows])

    untuned = "; ".join(f"{m} untuned: {v:.4g} ms" for m, v in results.get("untuned", {}).items())
    lines = [f"# tunecore bench: {results['trials']} trials per cell", "", _environment_line(results), "",
             "Best ms: the best kernel latency of an operator, or for a network the sum of weight × best "
             "over its tasks. Tuning s: the cell's tuning time. End-to-end: `tunecore compile` of the cell's store.",
             ""]
    if untuned:
        lines += [untuned + ".", ""]
    lines += ["## Median over seeds", ""] + table(MEDIAN_COLUMNS, median_rows(results))
    lines += ["", "## Cells", ""] + table(CELL_COLUMNS, cell_rows(results)) + [""]
    return "\n".join(lines)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[-60:]


def write_plots(results: dict[str, Any], out: str) -> list[str]:
    """Per model, best latency against trials and against tuning seconds, one line per cell; returns paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    os.makedirs(os.path.join(out, PLOTS_DIR), exist_ok=True)
    models: dict[str, list[dict[str, Any]]] = {}
    for cell in results["cells"].values():
        models.setdefault(cell["model"], []).append(cell)
    written = []
    for model, cells in models.items():
        pairs = sorted({_pair(c) for c in cells})
        colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(pairs)}
        for axis, label in (("trials", "measured trials"), ("seconds", "tuning time (s)")):
            fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
            for c in cells:
                curve = c["curve"]
                if not curve["best_s"]:
                    continue
                pair = _pair(c)
                xs = curve[axis] + ([max(curve[axis][-1], c.get("tuning_s") or 0)] if axis == "seconds" else [])
                ys = [b * 1e3 for b in curve["best_s"]] + ([curve["best_s"][-1] * 1e3] if axis == "seconds" else [])
                ax.step(xs, ys, where="post", color=colors[pair], linestyle=["-", "--", ":", "-."][c["seed"] % 4],
                        label=f"{pair} seed {c['seed']}")
            ax.set_yscale("log")  # first samples are often 10-100x slower than the best
            plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")  # 6, 20, not 6x10^0, 2x10^1
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
            ax.set_xlabel(label)
            ax.set_ylabel("best latency (ms)" + (", sum over tasks" if any(c.get("e2e") for c in cells) else ""))
            ax.set_title(f"{model}: best latency vs {label}")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
            path = os.path.join(PLOTS_DIR, f"best_vs_{axis}-{_slug(model)}.png")
            fig.tight_layout()
            fig.savefig(os.path.join(out, path))
            plt.close(fig)
            written.append(path)
    return written


def write_markdown_and_plots(results: dict[str, Any], out: str) -> list[str]:
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(results))
    return write_plots(results, out)


def write_html(results: dict[str, Any], out: str) -> str:
    """``OUT/report.html``: tables and plots in one file, images inlined."""
    plots = write_plots(results, out)

    def table(columns: list[str], rows: list[list[str]]) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    images = []
    for path in plots:
        with open(os.path.join(out, path), "rb") as f:
            data = base64.b64encode(f.read()).decode()
        images.append(f'<img alt="{html.escape(path)}" src="data:image/png;base64,{data}">')
    untuned = "".join(f"<li>{html.escape(m)} untuned: {v:.4g} ms</li>" for m, v in results.get("untuned", {}).items())
    environment = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(_environment_line(results)))  # markdown code
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tunecore bench</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 14px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
th {{ background: #f3f3f3; }} td:nth-child(-n+3) {{ text-align: left; }}
img {{ max-width: 48%; margin: 0.5em 1% 0.5em 0; border: 1px solid #eee; }}
</style></head><body>
<h1>tunecore bench: {results['trials']} trials per cell</h1>
<p>{environment}</p>
<ul>{untuned}</ul>
<h2>Median over seeds</h2>
{table(MEDIAN_COLUMNS, median_rows(results))}
<h2>Best latency so far</h2>
{''.join(images)}
<h2>Cells</h2>
{table(CELL_COLUMNS, cell_rows(results))}
</body></html>
"""
    path = os.path.join(out, "report.html")
    with open(path, "w") as f:
        f.write(page)
    return path
