"""Plot a week of the shipped real profiles (evogrid.data) next to the synthetic days, per season.

    .venv/bin/python examples/plot_profiles.py [OUT.png]     # default docs/profiles_week.png, ~3 s

Top row: the test week of January and of July (Monday to Sunday) of the transmission-bus load of
tso-case14-real (all buses summed, share of the case's total Pd) against the synthetic days of
tso-case14; SimBench PV (PV1) and the TMY PV and temperature used by dcmg-real.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from evogrid import data  # noqa: E402
from evogrid.case import load_case  # noqa: E402
from evogrid.case.matpower import PD  # noqa: E402
from evogrid.envs.profiles import daily_load_profiles  # noqa: E402


def main(out: str = "docs/profiles_week.png") -> None:
    dt = 0.5
    pd_ = load_case("14").bus[:, PD]
    test = data.calendar_days("test")
    weeks = {"January": test[:7], "July": test[14:21]}
    synthetic = daily_load_profiles(pd_, 7, 48, dt, seed=0).sum(-1).ravel() / pd_.sum()
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5), sharex=True)
    hours = np.arange(7 * 48) * dt / 24.0
    for col, (month, days) in enumerate(weeks.items()):
        load = data.bus_loads(pd_, "transmission", days, 48, dt).sum(-1).ravel() / pd_.sum()
        ax = axes[0, col]
        ax.plot(hours, load, label="real (SimBench HV/MV mix, tso-case14-real)")
        ax.plot(hours, synthetic, ls="--", alpha=0.7, label="synthetic (tso-case14)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"test week from {data.calendar(days[:1])[0][0]} ({month}): load")
        ax.set_ylabel("load / case Pd")
        ax.legend(fontsize=8, loc="lower right")
        pv = data.load_profiles("pv", days, dt, names=["PV1"]).values.ravel()
        tmy = data.load_profiles("tmy", days, dt).values.reshape(-1, 2)
        ax = axes[1, col]
        ax.plot(hours, pv, label="PV1 (SimBench, dso/ders-real)")
        ax.plot(hours, tmy[:, 0], label="PV, TMY Greensboro via pvlib (dcmg-real)")
        ax.set_ylabel("share of rating")
        ax.set_xlabel("day of the week (0 = Monday 00:00)")
        twin = ax.twinx()
        twin.plot(hours, tmy[:, 1], color="tab:red", lw=0.8, label="temperature, TMY (degC)")
        twin.set_ylabel("degC")
        lines = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper right")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="docs/profiles_week.png", help="the PNG to write")
    main(ap.parse_args().out)
