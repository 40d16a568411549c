"""Figures of a run (matplotlib, imported lazily; no figure when it is missing)."""
from __future__ import annotations

import sys
from pathlib import Path

RETURN_KEYS = ("return", "return_mean")     # the un-penalised return, whichever the workflow reports


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("evogrid: matplotlib not installed; no figure written", file=sys.stderr)
        return None
    return plt


def learning_curve(out: Path, history: list[dict], title: str, return_unit: str = "", cost_units: dict | None = None):
    """learning_curve.png: return (left) and each cost channel (right) against generation, with
    cumulative env steps on a secondary x axis when the workflow reports them."""
    plt = _pyplot()
    if plt is None or not history:
        return None
    last = history[-1]
    gens = [r["generation"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    key = next((k for k in RETURN_KEYS if k in last), None)
    if key is not None:
        ax1.plot(gens, [r[key] for r in history], label="mean episode return")
    if "return_max" in last:
        ax1.plot(gens, [r["return_max"] for r in history], label="best individual's return", alpha=0.7)
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
