"""Grid case data: `load_case(name_or_path)` and `list_cases()`.

Shipped cases (see `data/PROVENANCE.md`): transmission 5, 9, 14, 30, 57, 118 and pglib-opf's
1354pegase, 2000goc, 2869pegase and 9241pegase (gzip-compressed, as pglib-opf v23.07 ships them);
distribution feeders 33bw and 141. Names may be given as "14" or "case14".
"""
from __future__ import annotations

from pathlib import Path

from evogrid.case.matpower import Case, CaseFormatError, parse_matpower, read_case_file

_DATA = Path(__file__).parent / "data"

__all__ = ["Case", "CaseFormatError", "LARGE_CASES", "list_cases", "load_case", "parse_matpower"]

# pglib-opf's grids of real size (1,354 to 9,241 buses): DC dispatch tasks only (docs/tasks/transmission.md)
LARGE_CASES = ("1354pegase", "2000goc", "2869pegase", "9241pegase")


def list_cases() -> list[str]:
    """Names of the shipped cases, e.g. ['118', '1354pegase', '14', '30', '33bw', '5', '57', '9', ...]."""
    return sorted(p.name.split(".")[0].removeprefix("case") for p in _DATA.glob("case*.m*"))


def load_case(name_or_path: str | int | Path) -> Case:
    """Load a shipped case by name ("14", "case14", 14) or a MATPOWER `.m` file by path."""
    key = str(name_or_path)
    path = Path(key)
    if path.suffix == ".m" or path.name.endswith(".m.gz") or path.exists():
        if path.is_dir():
            raise ValueError(f"{path} is a directory; pass a MATPOWER .m case file or a shipped case name "
                             f"({', '.join(list_cases())})")
        if not path.is_file():
            raise FileNotFoundError(f"case file {path} does not exist")
        return read_case_file(path)
    short = key.lower().removeprefix("case")
    if short not in list_cases():
        raise ValueError(f"unknown case {key!r}; shipped cases are {', '.join(list_cases())} (or pass a path to a MATPOWER .m file)")
    return read_case_file(next(_DATA.glob(f"case{short}.m*")))
