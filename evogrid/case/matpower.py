"""MATPOWER-format case files: a parser that never evaluates the file, and `Case`.

Only numeric data is read: `mpc.baseMVA = <number>;` and the matrices
`mpc.bus`, `mpc.gen`, `mpc.branch`, `mpc.gencost` written as `[ ... ];` blocks
(rows end with `;` or a newline, `%` starts a comment). Anything else in the
file (functions, other fields, unit-conversion code) is ignored, so a file that
relies on code to finish its data must be converted first (see
`data/PROVENANCE.md` for case33bw).

`Case` applies MATPOWER's own semantics when it indexes the data (as `ext2int`
does): isolated buses (type 4) are dropped with every generator and branch
that touches them, out-of-service generators and branches are dropped, a tap
ratio of 0 means 1, and a rating (RATE_A) of 0 means unlimited.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

# Column indices (0-based) of the MATPOWER matrices, as in MATPOWER's idx_bus/idx_gen/idx_brch.
BUS_I, BUS_TYPE, PD, QD, GS, BS, BUS_AREA, VM, VA, BASE_KV, ZONE, VMAX, VMIN = range(13)
PQ, PV, REF, NONE = 1, 2, 3, 4
GEN_BUS, PG, QG, QMAX, QMIN, VG, MBASE, GEN_STATUS, PMAX, PMIN = range(10)
RAMP_AGC, RAMP_10, RAMP_30 = 16, 17, 18
F_BUS, T_BUS, BR_R, BR_X, BR_B, RATE_A, RATE_B, RATE_C, TAP, SHIFT, BR_STATUS, ANGMIN, ANGMAX = range(13)
PF, QF, PT, QT = 13, 14, 15, 16  # power-flow result columns (MW, MVAr), as written by MATPOWER solvers
PW_LINEAR, POLYNOMIAL = 1, 2

_MIN_COLS = {"bus": 13, "gen": 10, "branch": 11}
_FULL_COLS = {"bus": 13, "gen": 21, "branch": 13}
_BLOCK = re.compile(r"^\s*mpc\.(\w+)\s*=\s*(.*)$")


class CaseFormatError(ValueError):
    """A case file that does not follow the MATPOWER format (message names the line)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Case:
    """A power-system case in MATPOWER units (MW, MVAr, p.u., degrees), internally indexed.

    `bus`, `gen`, `branch` hold only what is in service (MATPOWER's `ext2int`):
    buses are numbered 0..n_bus-1 in file order (`bus_ids` keeps the original
    numbers), `gen_bus`, `f_bus`, `t_bus` are internal bus indices, and
    `gen_rows`/`branch_rows` give each kept row's position in the file.
    `gen` has 21 columns and `branch` 13 (missing trailing columns are filled
    with MATPOWER's defaults); `gencost` has one row per kept generator or is
    None when the file has no cost data.
    """

    name: str
    base_mva: float
    bus: np.ndarray
    gen: np.ndarray
    branch: np.ndarray
    gencost: np.ndarray | None
    bus_ids: np.ndarray
    gen_rows: np.ndarray
    branch_rows: np.ndarray

    @property
    def n_bus(self) -> int:
        return self.bus.shape[0]

    @property
    def n_units(self) -> int:
        """In-service generating units."""
        return self.gen.shape[0]

    @property
    def n_branch(self) -> int:
        """In-service branches (lines and transformers)."""
        return self.branch.shape[0]

    @property
    def gen_bus(self) -> np.ndarray:
        return self._index(self.gen[:, GEN_BUS])

    @property
    def f_bus(self) -> np.ndarray:
        return self._index(self.branch[:, F_BUS])

    @property
    def t_bus(self) -> np.ndarray:
        return self._index(self.branch[:, T_BUS])

    @property
    def ref_bus(self) -> int:
        """Internal index of the (first) reference bus."""
        return int(np.flatnonzero(self.bus[:, BUS_TYPE] == REF)[0])

    @property
    def tap(self) -> np.ndarray:
        """Off-nominal tap ratio of each branch (MATPOWER: 0 means 1)."""
        tap = self.branch[:, TAP].copy()
        tap[tap == 0] = 1.0
        return tap

    @property
    def rate_a(self) -> np.ndarray:
        """Long-term rating in MVA; MATPOWER's 0 (unlimited) becomes inf."""
        rate = self.branch[:, RATE_A].copy()
        rate[rate <= 0] = np.inf
        return rate

    def _index(self, ids: np.ndarray) -> np.ndarray:
        lookup = {int(b): i for i, b in enumerate(self.bus_ids)}
        return np.array([lookup[int(b)] for b in ids], dtype=np.int32)

    def __repr__(self) -> str:
        return f"Case({self.name!r}, n_bus={self.n_bus}, n_units={self.n_units}, n_branch={self.n_branch})"


def parse_matpower(text: str, name: str = "case") -> Case:
    """Parse MATPOWER-format text into a `Case` (raises `CaseFormatError` naming the line)."""
    raw = _read_blocks(text, name)
    for key in ("baseMVA", "bus", "gen", "branch"):
        if key not in raw:
            raise CaseFormatError(f"{name}: no 'mpc.{key} = ...' found; a MATPOWER case needs baseMVA, bus, gen and branch")
    base_line, base = raw["baseMVA"]
    if not isinstance(base, float) or not base > 0:
        raise CaseFormatError(f"{name}, line {base_line}: mpc.baseMVA must be one positive number")
    mats = {}
    for key in ("bus", "gen", "branch"):
        line, rows = raw[key]
        mats[key] = _as_matrix(rows, key, line, name, _MIN_COLS[key], _FULL_COLS[key])
    gencost = None
    if "gencost" in raw:
        line, rows = raw["gencost"]
        gencost = _as_matrix(rows, "gencost", line, name, 4, None)
        _check_gencost(gencost, mats["gen"].shape[0], line, name)
    return _index_case(name, base, mats["bus"], mats["gen"], mats["branch"], gencost, raw)


def _read_blocks(text: str, name: str) -> dict:
    """Map field -> (line number, value): a float for scalars, rows (line, [floats]) for matrices."""
    out: dict = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        code = lines[i].split("%", 1)[0]
        m = _BLOCK.match(code)
        i += 1
        if not m:
            continue
        field, rest = m.group(1), m.group(2).strip()
        start = i
        if not rest.startswith("["):
            if field == "baseMVA":
                out[field] = (start, _number(rest.rstrip(";").strip(), start, name))
            continue
        rows: list = []
        body, closed = rest[1:], False
        line_no = start
        while True:
            if "]" in body:
                body, closed = body.split("]", 1)[0], True
            for chunk in body.split(";"):
                tokens = chunk.replace(",", " ").split()
                if tokens:
                    rows.append((line_no, [_number(t, line_no, name) for t in tokens]))
            if closed or i >= len(lines) or _BLOCK.match(lines[i].split("%", 1)[0]):
                break
            body = lines[i].split("%", 1)[0]
            i += 1
            line_no = i
        if not closed:
            raise CaseFormatError(f"{name}, line {start}: matrix mpc.{field} opened with '[' is never closed with '];'")
        out[field] = (start, rows)
    return out


def _number(token: str, line: int, name: str) -> float:
    try:
        return float(token.replace("Inf", "inf").replace("NaN", "nan"))
    except ValueError:
        raise CaseFormatError(f"{name}, line {line}: expected a number, found {token!r}") from None


def _as_matrix(rows, key, line, name, min_cols, full_cols) -> np.ndarray:
    if not rows:
        raise CaseFormatError(f"{name}, line {line}: mpc.{key} is empty")
    width = len(rows[0][1])
    for row_line, values in rows:
        if len(values) != width:
            raise CaseFormatError(
                f"{name}, line {row_line}: mpc.{key} row has {len(values)} columns, expected {width} like its first row"
            )
    if width < min_cols:
        raise CaseFormatError(f"{name}, line {line}: mpc.{key} has {width} columns, expected at least {min_cols}")
    mat = np.array([values for _, values in rows], dtype=np.float64)
    if full_cols and width < full_cols:
        pad = np.zeros((mat.shape[0], full_cols - width))
        if key == "branch":  # ANGMIN, ANGMAX default to -360, 360
            pad[:, ANGMIN - width :] = [-360.0, 360.0][ANGMIN - width :]
        mat = np.hstack([mat, pad])
    return mat


def _check_gencost(gencost, n_gen, line, name):
    if gencost.shape[0] not in (n_gen, 2 * n_gen):
        raise CaseFormatError(f"{name}, line {line}: mpc.gencost has {gencost.shape[0]} rows, expected {n_gen} (one per generator)")
    for k, row in enumerate(gencost):
        model, n = int(row[0]), int(row[3])
        need = 4 + (2 * n if model == PW_LINEAR else n)
        if model not in (PW_LINEAR, POLYNOMIAL):
            raise CaseFormatError(f"{name}, line {line + k + 1}: gencost model must be 1 (piecewise linear) or 2 (polynomial), got {row[0]:g}")
        if n < 1 or need > row.shape[0]:
            raise CaseFormatError(f"{name}, line {line + k + 1}: gencost row declares n={n} but needs {need} columns, has {row.shape[0]}")


def _index_case(name, base, bus, gen, branch, gencost, raw) -> Case:
    line = lambda key: raw[key][0]  # noqa: E731
    ids = bus[:, BUS_I]
    if np.any(ids != np.round(ids)) or np.any(ids <= 0) or len(np.unique(ids)) != len(ids):
        raise CaseFormatError(f"{name}, line {line('bus')}: bus numbers must be unique positive integers")
    types = bus[:, BUS_TYPE]
    bad = ~np.isin(types, (PQ, PV, REF, NONE))
    if bad.any():
        raise CaseFormatError(f"{name}, line {line('bus')}: bus {ids[bad][0]:g} has type {types[bad][0]:g}; types are 1 PQ, 2 PV, 3 ref, 4 isolated")
    if not np.any(types == REF):
        raise CaseFormatError(f"{name}: no reference bus (type 3) in mpc.bus")
    known = set(ids.tolist())
    for key, mat, cols in (("gen", gen, [GEN_BUS]), ("branch", branch, [F_BUS, T_BUS])):
        for c in cols:
            missing = [b for b in mat[:, c] if b not in known]
            if missing:
                raise CaseFormatError(f"{name}, line {line(key)}: mpc.{key} refers to bus {missing[0]:g}, which is not in mpc.bus")
    isolated = set(ids[types == NONE].tolist())
    gen_on = (gen[:, GEN_STATUS] > 0) & ~np.isin(gen[:, GEN_BUS], list(isolated))
    br_on = (branch[:, BR_STATUS] > 0) & ~np.isin(branch[:, F_BUS], list(isolated)) & ~np.isin(branch[:, T_BUS], list(isolated))
    keep_bus = types != NONE
    gen_rows, branch_rows = np.flatnonzero(gen_on), np.flatnonzero(br_on)
    case = Case(
        name=name,
        base_mva=float(base),
        bus=bus[keep_bus],
        gen=gen[gen_rows],
        branch=branch[branch_rows],
        gencost=None if gencost is None else gencost[: gen.shape[0]][gen_rows],
        bus_ids=ids[keep_bus].astype(np.int64),
        gen_rows=gen_rows,
        branch_rows=branch_rows,
    )
    _check_connected(case)
    for key, mat, rows in (("bus", case.bus, np.arange(case.n_bus)), ("gen", case.gen, case.gen_rows),
                           ("branch", case.branch, case.branch_rows)):
        bad = np.argwhere(np.isnan(mat))
        if bad.size:
            r, c = bad[0]
            raise CaseFormatError(f"{name}, line {line(key)}: mpc.{key} row {int(rows[r]) + 1}, column {c + 1} is NaN; "
                                  "every entry must be a number")
    pmin, pmax = case.gen[:, PMIN], case.gen[:, PMAX]
    bad = np.flatnonzero(~np.isfinite(pmax) | ~np.isfinite(pmin) | (pmin > pmax))
    if bad.size:
        k = bad[0]
        raise CaseFormatError(f"{name}, line {line('gen')}: generator row {int(case.gen_rows[k]) + 1} has Pmin {pmin[k]:g} "
                              f"and Pmax {pmax[k]:g} MW; both must be finite with Pmin <= Pmax")
    if np.any(case.branch[:, BR_X] == 0):
        k = int(case.branch_rows[np.flatnonzero(case.branch[:, BR_X] == 0)[0]])
        raise CaseFormatError(f"{name}, line {line('branch')}: branch row {k + 1} has zero reactance x; DC power flow needs x != 0")
    return case


def _check_connected(case: Case) -> None:
    """Every kept bus must reach the reference bus through in-service branches."""
    n = case.n_bus
    adj = [[] for _ in range(n)]
    for f, t in zip(case.f_bus, case.t_bus):
        adj[f].append(t)
        adj[t].append(f)
    seen, stack = {case.ref_bus}, [case.ref_bus]
    while stack:
        for nb in adj[stack.pop()]:
            if nb not in seen:
                seen.add(nb)
                stack.append(nb)
    if len(seen) != n:
        lost = sorted(set(range(n)) - seen)
        raise CaseFormatError(
            f"{case.name}: bus {case.bus_ids[lost[0]]} (and {len(lost) - 1} more) cannot reach the reference bus through "
            "in-service branches; mark such buses isolated (type 4) or restore a branch"
        )


def read_case_file(path: str | Path) -> Case:
    """A MATPOWER `.m` file, or one compressed with gzip (`.m.gz`)."""
    import gzip

    path = Path(path)
    try:
        text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError):
        raise CaseFormatError(f"{path}: not a text file; expected MATPOWER-format text (or gzip of it)") from None
    return parse_matpower(text, name=path.name.split(".")[0])
