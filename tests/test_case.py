"""Case loading: shipped data equals its sources, MATPOWER semantics, and clear errors on bad input."""
import importlib

import numpy as np
import pytest

from evogrid.case import CaseFormatError, list_cases, load_case, parse_matpower
from evogrid.case.matpower import BR_STATUS, GEN_STATUS

SMALL = """function mpc = tiny
mpc.baseMVA = 100;
mpc.bus = [
  1 3 0 0 0 0 1 1 0 230 1 1.1 0.9;
  2 1 50 10 0 0 1 1 0 230 1 1.1 0.9;   % a comment
  3 1 40 5 0 0 1 1 0 230 1 1.1 0.9
  4 4 0 0 0 0 1 1 0 230 1 1.1 0.9;
];
mpc.gen = [
  1 0 0 100 -100 1 100 1 200 0;
  3 0 0 100 -100 1 100 0 200 0;
  4 0 0 100 -100 1 100 1 200 0;
];
mpc.branch = [
  1 2 0.01 0.1 0 0 0 0 0 0 1;
  2 3 0.01 0.1 0 150 0 0 0.98 0 1;
  1 3 0.01 0.1 0 0 0 0 0 0 0;
  3 4 0.01 0.1 0 0 0 0 0 0 1;
];
mpc.gencost = [
  2 0 0 3 0.01 20 0 0;
  2 0 0 2 30 0 0 0;
  1 0 0 2 0 0 100 2000;
];
"""


def test_list_and_names():
    assert list_cases() == ["118", "1354pegase", "14", "141", "2000goc", "2869pegase", "30", "33bw", "5", "57", "9",
                            "9241pegase"]
    assert load_case(14).n_bus == load_case("case14").n_bus == 14
    c = load_case("5")
    assert (c.n_bus, c.n_units, c.n_branch) == (5, 5, 6)


@pytest.mark.parametrize("name", ["9", "14", "30", "57", "118"])
def test_shipped_cases_equal_pypower_source(name):
    """The .m text holds exactly PYPOWER's numbers (its transcription of MATPOWER)."""
    ppc = getattr(importlib.import_module(f"pypower.case{name}"), f"case{name}")()
    c = load_case(name)
    np.testing.assert_array_equal(c.bus, ppc["bus"])
    np.testing.assert_array_equal(c.gen[:, : ppc["gen"].shape[1]], ppc["gen"])
    np.testing.assert_array_equal(c.branch, ppc["branch"])
    np.testing.assert_array_equal(c.gencost, ppc["gencost"])


def test_case33bw_matches_pandapower_network():
    """Our unit-converted file gives pandapower's own case33bw loads and impedances."""
    import pandapower.networks as pn

    net = pn.case33bw()
    c = load_case("33bw")
    np.testing.assert_allclose(np.sort(c.bus[1:, 2]), np.sort(net.load.p_mw.values), rtol=1e-12)
    zbase = 12.66**2 / 10.0
    line = net.line[net.line.in_service]
    np.testing.assert_allclose(np.sort(c.branch[:, 2] * zbase), np.sort(line.r_ohm_per_km.values * line.length_km.values), rtol=1e-9)


def test_unknown_case_lists_known():
    with pytest.raises(ValueError, match=r"unknown case 'case7'.*118, 1354pegase, 14, 141, 2000goc, 2869pegase, 30, 33bw, 5, 57, 9, 9241pegase"):
        load_case("case7")


def test_matpower_semantics_isolated_out_of_service_zero_rating():
    c = parse_matpower(SMALL, "tiny")
    # bus 4 is isolated (type 4): dropped with the generator on it and the branch to it
    assert c.n_bus == 3 and list(c.bus_ids) == [1, 2, 3]
    # generator 2 is out of service, generator 3 sits on the isolated bus
    assert c.n_units == 1 and list(c.gen_rows) == [0] and np.all(c.gen[:, GEN_STATUS] > 0)
    # branch 3 is out of service, branch 4 touches the isolated bus
    assert c.n_branch == 2 and list(c.branch_rows) == [0, 1] and np.all(c.branch[:, BR_STATUS] > 0)
    assert np.isinf(c.rate_a[0]) and c.rate_a[1] == 150.0  # RATE_A 0 = unlimited
    np.testing.assert_array_equal(c.tap, [1.0, 0.98])  # TAP 0 = 1
    assert c.gencost.shape[0] == 1 and c.gencost[0, 5] == 20  # cost rows follow their generators
    assert c.branch.shape[1] == 13 and c.branch[0, 12] == 360  # missing ANGMIN/ANGMAX get defaults
    assert c.gen.shape[1] == 21


@pytest.mark.parametrize(
    "edit, message",
    [
        (("1 2 0.01 0.1 0 0 0 0 0 0 1;", "1 2 0.01 0.1 zero 0 0 0 0 0 1;"), r"line 15: expected a number, found 'zero'"),
        (("  2 3 0.01 0.1 0 150 0 0 0.98 0 1;", "  2 3 0.01 0.1 0 150;"), r"line 16: mpc.branch row has 6 columns, expected 11"),
        (("  4 4 0 0 0 0 1 1 0 230 1 1.1 0.9;\n];", "  4 4 0 0 0 0 1 1 0 230 1 1.1 0.9;\n"), r"never closed"),
        (("mpc.baseMVA = 100;", "mpc.baseMVA = -1;"), r"line 2: mpc.baseMVA must be one positive number"),
        (("  1 2 0.01 0.1 0 0 0 0 0 0 1;", "  1 9 0.01 0.1 0 0 0 0 0 0 1;"), r"refers to bus 9, which is not in mpc.bus"),
        (("  1 3 0 0 0 0", "  1 1 0 0 0 0"), r"no reference bus"),
        (("  2 1 50 10", "  2 7 50 10"), r"bus 2 has type 7"),
        (("  1 0 0 100 -100 1 100 1 200 0;\n", ""), r"gencost has 3 rows, expected 2"),
        (("2 0 0 3 0.01 20 0 0;", "2 0 0 5 0.01 20 0 0;"), r"declares n=5 but needs 9 columns"),
        (("  2 3 0.01 0.1 0 150 0 0 0.98 0 1;", "  2 3 0.01 0.1 0 150 0 0 0.98 0 0;"), r"bus 3 .* cannot reach the reference bus"),
        (("mpc.gen = [", "mpc.generators = ["), r"no 'mpc.gen = \.\.\.' found"),
    ],
)
def test_malformed_files_name_line_and_expectation(edit, message):
    old, new = edit
    assert old in SMALL
    with pytest.raises(CaseFormatError, match=message):
        parse_matpower(SMALL.replace(old, new, 1), "tiny")


def test_parser_never_evaluates_code(tmp_path):
    """Code in a case file is skipped as text; only the numeric blocks are read."""
    marker = tmp_path / "was_run"
    text = SMALL + f"\nsystem('touch {marker}');\nmpc.extra = eval('1+1');\n"
    path = tmp_path / "evil.m"
    path.write_text(text)
    c = load_case(path)
    assert c.n_bus == 3 and not marker.exists()


def test_missing_or_binary_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_case(tmp_path / "nope.m")
    bad = tmp_path / "bad.m"
    bad.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(CaseFormatError, match="not a text file"):
        load_case(bad)


def test_case141_totals_and_power_factor():
    """MATPOWER's case141 (v2): 14,052.5 kVA of load at power factor 0.85 = 11.944625 MW, 7.4026 MVAr;
    the papers quote 11.94 MW and 7.40 MVAr. Radial: 140 branches for 141 buses."""
    c = load_case("141")
    assert (c.n_bus, c.n_branch, c.n_units) == (141, 140, 1)
    np.testing.assert_allclose(c.bus[:, 2].sum(), 0.85 * 14.0525, rtol=1e-12)
    loaded = c.bus[:, 2] > 0
    np.testing.assert_allclose(c.bus[loaded, 3] / c.bus[loaded, 2], np.tan(np.arccos(0.85)), rtol=1e-9)
