"""Grid case data: `load_case(name_or_path)` and `list_cases()`.

Shipped cases (see `data/PROVENANCE.md`): transmission 5, 9, 14, 30, 57, 118;
distribution feeders 33bw and 141. Names may be given as "14" or "case14".
"""
from __future__ import annotations

from pathlib import Path

from evogrid.case.matpower import Case, CaseFormatError, parse_matpower, read_case_file

_DATA = Path(__file__).parent / "data"

__all__ = ["Case", "CaseFormatError", "list_cases", "load_case", "parse_matpower"]


def list_cases() -> list[str]:
    """Names of the shipped cases, e.g. ['118', '14', '30', '33bw', '5', '57', '9']."""
    return sorted(p.stem.removeprefix("case") for p in _DATA.glob("case*.m"))


def load_case(name_or_path: str | int | Path) -> Case:
    """Load a shipped case by name ("14", "case14", 14) or a MATPOWER `.m` file by path."""
    key = str(name_or_path)
    path = Path(key)
    if path.suffix == ".m" or path.exists():
        if path.is_dir():
            raise ValueError(f"{path} is a directory; pass a MATPOWER .m case file or a shipped case name "
                             f"({', '.join(list_cases())})")
        if not path.is_file():
            raise FileNotFoundError(f"case file {path} does not exist")
        return read_case_file(path)
    short = key.lower().removeprefix("case")
    if short not in list_cases():
        raise ValueError(f"unknown case {key!r}; shipped cases are {', '.join(list_cases())} (or pass a path to a MATPOWER .m file)")
    return read_case_file(_DATA / f"case{short}.m")
