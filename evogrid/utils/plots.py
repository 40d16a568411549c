"""Figures of a run (matplotlib, imported lazily; no figure when it is missing)."""
from __future__ import annotations

import sys
from pathlib import Path


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("evogrid: matplotlib not installed; no figure written", file=sys.stderr)
        return None
    return plt


def learning_curve(out: Path, history: list[dict], title: str, return_unit: str = "", cost_units: dict | None = None,
                   test_return: float | None = None):
    """learning_curve.png: return (left) and each cost channel (right) against generation, with
    cumulative env steps on a secondary x axis when the workflow reports them; the chosen policy's
    validation return where the workflow reports it, and its test-day return at the end when given."""
    plt = _pyplot()
    if plt is None or not history:
        return None
    last = history[-1]
    gens = [r["generation"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    if "return" in last:
        ax1.plot(gens, [r["return"] for r in history], label="mean episode return")
    if "return_max" in last:
        ax1.plot(gens, [r["return_max"] for r in history], label="best individual's return", alpha=0.7)
    if "val_return" in last:
        val = [(g, r["val_return"]) for g, r in zip(gens, history) if abs(r.get("val_return", float("inf"))) < float("inf")]
        if val:
            ax1.plot(*zip(*val), drawstyle="steps-post", marker=".", markersize=3, label="chosen policy, validation days")
    if test_return is not None:
        ax1.plot([gens[-1]], [test_return], "k*", markersize=10, label="chosen policy, test days")
    ax1.set_xlabel("generation"), ax1.set_ylabel(f"return{f' ({return_unit})' if return_unit else ''}")
    if ax1.lines:
        ax1.legend(fontsize=8)
    channels = [k for k in last if k.startswith("cost_channels:")]
    for k in channels:
        name = k.split(":", 1)[1]
        unit = (cost_units or {}).get(name, "")
        ax2.plot(gens, [r[k] for r in history], label=f"{name}{f' ({unit})' if unit else ''}")
    ax2.set_xlabel("generation"), ax2.set_ylabel("summed cost per episode")
    if channels:
        ax2.legend(fontsize=8)
    if "env_steps" in last and last["env_steps"] and gens[-1] > gens[0]:
        per_gen = (last["env_steps"] - history[0]["env_steps"]) / (gens[-1] - gens[0])
        for ax in (ax1, ax2):
            top = ax.secondary_xaxis("top", functions=(lambda g, s=per_gen: g * s, lambda e, s=per_gen: e / s))
            top.set_xlabel("env steps", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(out) / "learning_curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def grid_day(path: Path, trace: dict, title: str, cost_names=(), hours_per_step: float = 1.0):
    """One test day of a policy as a grid operator sees it (`Workflow.trace_day`): the dispatch stack
    against load, the five most loaded branches, the bus-voltage range against its band, battery charge,
    room temperature (whichever the task has), and each cost channel per step."""
    import numpy as np

    plt = _pyplot()
    if plt is None:
        return None
    trace = {k: np.asarray(v) for k, v in trace.items()}
    hours = np.arange(1, trace["reward"].shape[0] + 1) * hours_per_step
    panels = []
    if "dispatch_mw" in trace or "load_mw" in trace:
        panels.append("power")
    panels += [k for k in ("loading_pct", "vm_pu", "soc", "temperature_c") if k in trace] + ["costs"]
    cols = 2 if len(panels) > 1 else 1
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.ravel(), panels):
        if panel == "power":
            if "dispatch_mw" in trace:
                d = trace["dispatch_mw"]
                ax.stackplot(hours, d.T, labels=[f"unit {i}" for i in range(d.shape[1])], alpha=0.8)
            if "load_mw" in trace:
                ax.plot(hours, trace["load_mw"], "k--", label="load")
            ax.set_ylabel("MW"), ax.set_title("dispatch against load" if "dispatch_mw" in trace else "load")
            ax.legend(fontsize=6, ncol=2, loc="upper left")
        elif panel == "loading_pct":
            loading = trace["loading_pct"]
            peak = np.nan_to_num(loading.max(0), posinf=0.0)
            top = [b for b in np.argsort(-peak)[:5] if peak[b] > 0]  # unrated branches (loading 0) left out
            for b in top:
                ax.plot(hours, loading[:, b], label=f"branch {b}")
            ax.axhline(100.0, color="r", lw=0.8, ls=":")
            ax.set_ylabel("% of rating"), ax.set_title("five most loaded branches")
            ax.legend(fontsize=6)
        elif panel == "vm_pu":
            vm = trace["vm_pu"]
            ax.fill_between(hours, vm.min(1), vm.max(1), alpha=0.4, label="bus |V| range")
            if "v_band" in trace:
                for limit in trace["v_band"][0]:
                    ax.axhline(limit, color="r", lw=0.8, ls=":")
            ax.set_ylabel("p.u."), ax.set_title("bus voltages against their band")
        elif panel == "soc":
            ax.plot(hours, trace["soc"].reshape(len(hours), -1))
            ax.set_ylim(0, 1), ax.set_ylabel("share of capacity"), ax.set_title("battery state of charge")
        elif panel == "temperature_c":
            ax.plot(hours, trace["temperature_c"])
            ax.set_ylabel("degC"), ax.set_title("room temperature")
        else:
            costs = trace["costs"].reshape(len(hours), -1)
            for i, name in enumerate(cost_names or range(costs.shape[1])):
                ax.plot(hours, costs[:, i], label=str(name))
            ax.set_ylabel("cost per step (channel units)"), ax.set_title("cost channels")
            if costs.shape[1]:
                ax.legend(fontsize=6)
        ax.set_xlabel("hour of the day")
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def archive_map(path: Path, test_return, feasible_days, n_days: int, bins: int, names, ranges, title: str):
    """A quality-diversity archive (`bins` cells per descriptor, flat) over its first and last descriptor (a row for one
    descriptor; more than two: the best cell over the others): each filled cell coloured by its test-day
    return, the cells within every limit on all `n_days` test days outlined. Returns the path, or None."""
    import numpy as np

    plt = _pyplot()
    if plt is None:
        return None
    shape = (bins,) * len(names)
    ret = np.asarray(test_return, float).reshape(shape)
    days = np.asarray(feasible_days).reshape(shape)
    while ret.ndim > 2:
        ret, days = np.nanmax(ret, axis=-1), days.max(axis=-1)
    ret, days = np.atleast_2d(ret.T), np.atleast_2d(days.T)
    fig, ax = plt.subplots(figsize=(6, 5))
    (x0, x1), (y0, y1) = ranges[0], ranges[-1] if ret.shape[0] > 1 else (0, 1)
    image = ax.imshow(ret, origin="lower", extent=(x0, x1, y0, y1), aspect="auto", cmap="viridis")
    for i, j in zip(*np.nonzero(days == n_days)):
        w, h = (x1 - x0) / ret.shape[1], (y1 - y0) / ret.shape[0]
        ax.add_patch(plt.Rectangle((x0 + j * w, y0 + i * h), w, h, fill=False, edgecolor="red", linewidth=1.2))
    fig.colorbar(image, label="test-day return")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[-1] if len(names) > 1 else "")
    ax.set_title(title)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def pareto_front(path: Path, x, y, every_day, names, title: str):
    """A front's members over two objectives (`x`, `y`), those within every limit on every test day
    (`every_day`) in colour. Returns the path, or None."""
    import numpy as np

    plt = _pyplot()
    if plt is None:
        return None
    x, y, full = np.asarray(x, float), np.asarray(y, float), np.asarray(every_day, bool)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter(x[~full], y[~full], c="0.6", label="misses a limit on some test day")
    ax.scatter(x[full], y[full], c="tab:red", label="every test day within limits")
    ax.set_xlabel(f"{names[0]} (test days)")
    ax.set_ylabel(f"{names[1]} (test days)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return Path(path)
