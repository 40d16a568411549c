"""Write PYPOWER's transcriptions of MATPOWER cases as MATPOWER-format text.

Provenance tool, run once by hand (needs the `pypower` package):

    python tools/export_pypower_cases.py evogrid/case/data

PYPOWER (BSD licence) is a line-by-line port of MATPOWER whose case files
carry MATPOWER's numbers unchanged; this writes them back in the `.m` syntax
that `evogrid.case` parses. Only the data matrices are written.
"""
import importlib
import sys
from pathlib import Path

CASES = ["case9", "case14", "case30", "case57", "case118"]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.12g}"


def _matrix(name: str, rows) -> str:
    body = "\n".join("\t" + "\t".join(_fmt(v) for v in row) + ";" for row in rows)
    return f"mpc.{name} = [\n{body}\n];\n"


def export(name: str, out: Path) -> None:
    ppc = getattr(importlib.import_module(f"pypower.{name}"), name)()
    text = [
        f"function mpc = {name}\n",
        f"%{name.upper()}  MATPOWER case data, exported from PYPOWER's {name}.py by tools/export_pypower_cases.py\n\n",
        "mpc.version = '2';\n",
        f"mpc.baseMVA = {_fmt(ppc['baseMVA'])};\n\n",
    ]
    for key in ("bus", "gen", "branch", "gencost"):
        if key in ppc:
            text.append(_matrix(key, ppc[key]) + "\n")
    (out / f"{name}.m").write_text("".join(text))


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "evogrid/case/data")
    for case in CASES:
        export(case, target)
        print("wrote", target / f"{case}.m")
