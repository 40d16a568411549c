"""Physics kernels against reference solvers on every shipped case.

References: PYPOWER (a line-by-line port of MATPOWER) on every case, and
pandapower's own networks where its conversion keeps MATPOWER semantics.
pandapower's case118 turns lines between voltage levels into transformers and
its case57 maps MATPOWER's tap ratios onto tap-changer steps, which changes
the AC solution (|V| differs from MATPOWER's by up to 0.2 p.u. on case57), so
for those AC cases (and case118's DC) PYPOWER alone is the reference.

Tolerances. float64 (x64): DC flows 1e-6 MW, AC |V| 1e-6 p.u., angles 1e-5 deg,
as the issue asks; both solvers converge to ~1e-10 p.u. mismatch so the real
gap is ~1e-9. float32: eps = 1.2e-7, and flows are sums over injections of up
to ~4000 MW (case118), so round-off bounds DC flows at ~5e-4 MW; we test
1e-3 MW (measured worst 1.1e-4) and angles 1e-4 deg (measured 1.1e-5). Newton
in float32 stalls at a mismatch of ~1e-5 p.u., which moves |V| by ~1e-5 and
angles by ~1e-4 deg: we test 2e-5 p.u. and 1e-3 deg (measured worst 4.9e-6 and
3.3e-4 deg).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ALL_CASES, bus_injection_mw, bus_injection_pu, ppc_of, pypower_opts

from evogrid import physics as ph
from evogrid.case import load_case
from evogrid.case.matpower import PF, PG, PT, VA, VG, VM

PANDAPOWER_AC = ["5", "9", "14", "30", "33bw", "141"]
PANDAPOWER_DC = ["5", "9", "14", "30", "57", "33bw"]
TOL = {  # dtype -> (DC flow MW, DC angle deg, |V| p.u., AC angle deg)
    "float64": (1e-6, 1e-6, 1e-6, 1e-5),
    "float32": (1e-3, 1e-4, 2e-5, 1e-3),
}


@pytest.fixture(params=["float64", "float32"])
def precision(request):
    with jax.enable_x64(request.param == "float64"):
        yield request.param


def _pypower(case, ac):
    from pypower.api import rundcpf, runpf

    result, ok = (runpf if ac else rundcpf)(ppc_of(case), pypower_opts())
    assert ok
    return result


def _dc(case):
    return ph.dc_power_flow(ph.make_dc_network(case), jnp.asarray(bus_injection_mw(case)))


def _ac(case, iters=10):
    """Newton-Raphson with the dtype's default tolerance (1e-8 p.u. in float64, 1e-4 in float32): it must
    report convergence on every solvable shipped case in both dtypes."""
    return ph.newton_raphson(ph.make_ac_network(case), jnp.asarray(bus_injection_pu(case)), iters=iters)


def test_a_case_without_phase_shifters_has_no_base_flow():
    """case118's reference angle is 30 degrees: its DC base point (no injections) has every bus at that angle
    and no flow. The base flows come from the angles relative to the reference: exactly zero, not the
    round-off of 30-degree differences (1e-12 MW, which another machine computes otherwise)."""
    case = load_case("118")
    with ph.host_float64():
        net = ph.make_dc_network(case)
    assert np.all(np.asarray(net.flow0) == 0.0)
    np.testing.assert_array_equal(np.asarray(net.angle0), np.deg2rad(30.0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_CASES)
def test_dc_power_flow_matches_pypower(name, precision):
    case = load_case(name)
    ref = _pypower(case, ac=False)
    va, flow, p_ref = _dc(case)
    tol_flow, tol_va, _, _ = TOL[precision]
    assert flow.dtype == jnp.dtype(precision)
    np.testing.assert_allclose(np.asarray(flow), ref["branch"][:, PF], atol=tol_flow)
    np.testing.assert_allclose(np.asarray(va), ref["bus"][:, VA], atol=tol_va)
    # slack balancing: the reference bus supplies what the other buses and shunts need
    slack_gens = np.flatnonzero(case.gen_bus == case.ref_bus)
    pg_slack = float(p_ref) + case.bus[case.ref_bus, 2] - case.gen[slack_gens[1:], PG].sum()
    np.testing.assert_allclose(pg_slack, ref["gen"][slack_gens[0], PG], atol=50 * tol_flow)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_CASES)
def test_ac_newton_raphson_matches_pypower(name, precision):
    if name == "141" and precision == "float32":
        # branch 86-87 has x = 6e-7 p.u. (|y| = 1.6e6 p.u.): float32 round-off in |V| (6e-8) times |y|
        # leaves a mismatch of ~0.1 p.u., so Newton cannot converge in float32. The feeder tasks solve
        # case141 with the backward/forward sweep, which works with z and is tested in float32 below.
        pytest.skip("float32 Newton-Raphson cannot resolve case141's near-zero-impedance branch")
    case = load_case(name)
    ref = _pypower(case, ac=True)
    v, converged, _ = _ac(case)
    _, _, tol_vm, tol_va = TOL[precision]
    assert bool(converged)
    np.testing.assert_allclose(np.abs(v), ref["bus"][:, VM], atol=tol_vm)
    np.testing.assert_allclose(np.rad2deg(np.angle(v)), ref["bus"][:, VA], atol=tol_va)
    s_from, s_to = ph.branch_flows(ph.make_ac_network(case), v)
    # MW flows: in float32 a |V| error of ~1e-6 p.u. times a branch admittance of ~1e3 p.u. moves a
    # flow by ~1e-3 MW (measured worst 1.04e-3 MW on a 126 MW line of case118): test 5e-3 MW
    scale = 1.0 if precision == "float64" else 5e3
    np.testing.assert_allclose(np.real(s_from), ref["branch"][:, PF], atol=1e-6 * scale)
    np.testing.assert_allclose(np.real(s_to), ref["branch"][:, PT], atol=1e-6 * scale)


@pytest.mark.parametrize("name", ["14", "118"])
def test_chord_method_reaches_the_newton_solution(name):
    """A fixed Jacobian (taken at the base case) under 20% more load still converges to PYPOWER's answer."""
    from pypower.api import runpf

    with jax.enable_x64(True):
        case = load_case(name)
        net = ph.make_ac_network(case)
        s = jnp.asarray(bus_injection_pu(case))
        v_base, _, _ = ph.newton_raphson(net, s)
        jinv = jnp.linalg.inv(ph.jacobian(net, v_base))
        ppc = ppc_of(case)
        ppc["bus"][:, 2:4] *= 1.2
        ppc["gen"][:, 1] *= 1.2
        ref, ok = runpf(ppc, pypower_opts())
        s_hi = jnp.asarray(bus_injection_pu(load_case(name)) * 1.2)
        v, converged, _ = ph.newton_raphson(net, s_hi, iters=25, jacobian_inverse=jinv)
        assert ok and bool(converged)
        np.testing.assert_allclose(np.abs(v), ref["bus"][:, VM], atol=1e-6)
        np.testing.assert_allclose(np.rad2deg(np.angle(v)), ref["bus"][:, VA], atol=1e-5)


def test_newton_raphson_reports_divergence():
    """Ten times the load of case14 has no solution near nominal voltage: the flag says so."""
    with jax.enable_x64(True):
        case = load_case("14")
        v, converged, mismatch = ph.newton_raphson(ph.make_ac_network(case), jnp.asarray(10 * bus_injection_pu(case)), iters=10)
        assert not bool(converged) and float(mismatch) > 1e-3


def _pandapower(name, ac):
    import pandapower as pp
    import pandapower.networks as pn

    if hasattr(pn, f"case{name}"):
        net = getattr(pn, f"case{name}")()
    else:  # pandapower does not ship this case: convert our MATPOWER data with pandapower's own converter
        from pandapower.converter.pypower import from_ppc

        net = from_ppc(ppc_of(load_case(name)), f_hz=50, validate_conversion=False)
    if ac:
        pp.runpp(net, tolerance_mva=1e-8, init="flat", numba=False)  # 1e-8 MVA: see pypower_opts (case141)
    else:
        pp.rundcpp(net)
    return net


@pytest.mark.parametrize("name", PANDAPOWER_AC)
def test_ac_matches_pandapower(name):
    with jax.enable_x64(True):
        net = _pandapower(name, ac=True)
        v, converged, _ = _ac(load_case(name))
        assert bool(converged)
        np.testing.assert_allclose(np.abs(v), net.res_bus.vm_pu.values, atol=1e-6)
        np.testing.assert_allclose(np.rad2deg(np.angle(v)), net.res_bus.va_degree.values, atol=1e-5)


@pytest.mark.parametrize("name", PANDAPOWER_DC)
def test_dc_matches_pandapower(name):
    with jax.enable_x64(True):
        net = _pandapower(name, ac=False)
        va, flow, _ = _dc(load_case(name))
        np.testing.assert_allclose(np.asarray(va), net.res_bus.va_degree.values, atol=1e-6)
        # pandapower's lines carry the same DC flows as our matching branches (f, t in file order)
        case = load_case(name)
        ours = {}
        for k, (f, t) in enumerate(zip(case.f_bus, case.t_bus)):
            ours.setdefault((f, t), []).append(float(flow[k]))
        on = net.line.in_service.values
        for f, t, p in zip(net.line.from_bus[on], net.line.to_bus[on], net.res_line.p_from_mw[on]):
            assert ours[(f, t)].pop(0) == pytest.approx(p, abs=1e-6)


def test_dc_tap_enters_susceptance():
    """A transformer with tap 0.95 carries x*tap in the DC model: B = 1/(x*tap) (MATPOWER's makeBdc)."""
    with jax.enable_x64(True):
        case = load_case("14")
        k = int(np.flatnonzero(case.tap != 1.0)[0])
        va, flow, _ = _dc(case)
        f, t = case.f_bus[k], case.t_bus[k]
        expected = np.deg2rad(float(va[f] - va[t])) / (case.branch[k, 3] * case.tap[k]) * case.base_mva
        np.testing.assert_allclose(float(flow[k]), expected, rtol=1e-12)


@pytest.mark.parametrize("name", ["33bw", "141"])
@pytest.mark.parametrize("precision_name, tol", [("float64", 1e-6), ("float32", 1e-6)])
def test_radial_sweep_matches_pypower_and_pandapower(name, precision_name, tol):
    with jax.enable_x64(precision_name == "float64"):
        case = load_case(name)
        ref = _pypower(case, ac=True)
        v, i_branch, converged = ph.backward_forward_sweep(ph.make_radial_network(case), jnp.asarray(-bus_injection_pu(case)))
        np.testing.assert_allclose(np.abs(v), ref["bus"][:, VM], atol=tol)
        np.testing.assert_allclose(np.rad2deg(np.angle(v)), ref["bus"][:, VA], atol=10 * tol)
        assert bool(converged)
        net = _pandapower(name, ac=True)
        np.testing.assert_allclose(np.abs(v), net.res_bus.vm_pu.values, atol=tol)
        # losses: sum |I|^2 r over branches equals pandapower's total line losses (MW)
        losses = float(np.sum(np.abs(i_branch) ** 2 * case.branch[:, 2])) * case.base_mva
        np.testing.assert_allclose(losses, net.res_line.pl_mw.sum(), rtol=1e-5)


def test_radial_sweep_from_warm_starts_keeps_1e6_in_float32():
    """The sweeps stop on an estimate of their error: from the base case's voltages, 64 seeded load
    scalings (0.3-1.7 x per bus) on case141 in float32 land within 1e-6 p.u. of a 1e-14 float64 solve."""
    case = load_case("141")
    s0 = -bus_injection_pu(case)
    loads = s0 * np.random.default_rng(0).uniform(0.3, 1.7, (64, len(s0)))
    with jax.enable_x64(True):
        net64 = ph.make_radial_network(case)
        v0, _, _ = ph.backward_forward_sweep(net64, jnp.asarray(s0), iters=200, tol=1e-14)
        ref = jax.vmap(lambda s: ph.backward_forward_sweep(net64, s, v0, iters=200, tol=1e-14)[0])(jnp.asarray(loads))
        ref, v0 = np.asarray(ref), np.asarray(v0)
    net = ph.make_radial_network(case)
    v, _, converged = jax.vmap(lambda s: ph.backward_forward_sweep(net, s, jnp.asarray(v0, jnp.complex64)))(
        jnp.asarray(loads, jnp.complex64))
    assert bool(jnp.all(converged))
    np.testing.assert_allclose(np.abs(np.asarray(v)), np.abs(ref), atol=1e-6)


def test_radial_sweep_derivative_is_the_fixed_points():
    """d sum|V| / d (load scale) on 33bw (float64) by the implicit derivative equals central finite
    differences to 1e-6 relative (the derivative of one sweep alone is 7.5% off here)."""
    with jax.enable_x64(True):
        case = load_case("33bw")
        net = ph.make_radial_network(case)
        s0 = jnp.asarray(-bus_injection_pu(case))

        def total(a):
            return jnp.sum(jnp.abs(ph.backward_forward_sweep(net, s0 * a)[0]))

        h = 1e-6
        fd = (total(1.0 + h) - total(1.0 - h)) / (2 * h)
        np.testing.assert_allclose(float(jax.grad(total)(1.0)), float(fd), rtol=1e-6)


def test_radial_sweep_converges_under_heavy_load_and_flags_no_solution():
    """33bw with loads x3 still has a solution (min |V| 0.66; PYPOWER finds it, the sweeps reach it to 1e-6 p.u.);
    with loads x4 or x8 there is none (PYPOWER fails too): the flag says so instead of a voltage profile."""
    from pypower.api import runpf

    with jax.enable_x64(True):
        case = load_case("33bw")
        net = ph.make_radial_network(case)
        ppc = ppc_of(case)
        ppc["bus"][:, 2:4] *= 3.0
        ref, ok = runpf(ppc, pypower_opts())
        assert ok
        v, _, converged = ph.backward_forward_sweep(net, jnp.asarray(-3.0 * bus_injection_pu(case)), iters=300)
        assert bool(converged)
        np.testing.assert_allclose(np.abs(v), ref["bus"][:, VM], atol=1e-6)
        for scale in (4.0, 8.0):
            _, _, converged = ph.backward_forward_sweep(net, jnp.asarray(-scale * bus_injection_pu(case)), iters=300)
            assert not bool(converged)


def test_two_units_on_one_bus_take_the_last_set_point_as_matpower():
    """case5 bus 1 holds two units with VG 1.00 and 1.03 (made different here); MATPOWER's runpf (and PYPOWER)
    hold the bus at the last unit's set-point."""
    from pypower.api import runpf

    with jax.enable_x64(True):
        case = load_case("5")
        on_bus0 = np.flatnonzero(case.gen_bus == case.gen_bus[0])
        assert len(on_bus0) == 2
        case.gen[on_bus0, VG] = [1.00, 1.03]
        v, converged, _ = _ac(case)
        ref, ok = runpf(ppc_of(case), pypower_opts())
        assert ok and bool(converged)
        np.testing.assert_allclose(abs(complex(v[case.gen_bus[0]])), 1.03, atol=1e-12)
        np.testing.assert_allclose(np.abs(v), ref["bus"][:, VM], atol=1e-6)


def test_radial_sweep_refuses_meshed_case():
    with pytest.raises(ValueError, match="not radial: 20 in-service branches for 14 buses"):
        ph.make_radial_network(load_case("14"))


@pytest.mark.parametrize("name", ALL_CASES)
def test_polynomial_cost_matches_pypower(name):
    from pypower.totcost import totcost

    case = load_case(name)
    pg = case.gen[:, 8] * np.linspace(0.1, 0.9, case.n_units)
    with jax.enable_x64(True):
        ours = ph.generation_cost(ph.make_gen_cost(case), jnp.asarray(pg))
    np.testing.assert_allclose(np.asarray(ours), totcost(case.gencost, pg), rtol=1e-12)


def test_piecewise_linear_cost_matches_pypower():
    """Convex PWL rows, evaluated inside and beyond their end points, and mixed with a polynomial row."""
    from pypower.totcost import totcost

    gencost = np.array([
        [1, 0, 0, 3, 0, 0, 50, 1000, 100, 3000, 0, 0],
        [1, 0, 0, 4, 10, 100, 20, 300, 40, 900, 60, 2000],
        [2, 0, 0, 3, 0.02, 15, 100, 0, 0, 0, 0, 0],
    ])
    pg = np.array([[25.0, 15.0, 40.0], [75.0, 50.0, 80.0], [120.0, 70.0, 10.0], [0.0, 10.0, 0.0]])
    with jax.enable_x64(True):
        ours = ph.generation_cost(ph.make_gen_cost(gencost), jnp.asarray(pg))
    # by hand: unit 0 at 25 MW is on the first segment, 20 $/MWh -> 500 $/h; at 120 MW beyond the last
    # point it extends the 40 $/MWh segment -> 3000 + 20 * 40 = 3800 $/h
    assert float(ours[0, 0]) == pytest.approx(500.0) and float(ours[2, 0]) == pytest.approx(3800.0)
    for row in range(pg.shape[0]):
        np.testing.assert_allclose(np.asarray(ours[row]), totcost(gencost, pg[row]), rtol=1e-12)


def _scaled_case(name, scale):
    """Case `name` with every load scaled by `scale`, and each bus's reactive limits net of its load (p.u.,
    NumPy float64: [n_bus] q_min, q_max as `newton_raphson_q_limits` takes them)."""
    from evogrid.case.matpower import QD, QMAX, QMIN

    case = load_case(name)
    case = dataclasses.replace(case, bus=case.bus.copy())
    case.bus[:, [2, 3]] *= scale
    qmin, qmax = np.zeros(case.n_bus), np.zeros(case.n_bus)
    np.add.at(qmin, case.gen_bus, case.gen[:, QMIN])
    np.add.at(qmax, case.gen_bus, case.gen[:, QMAX])
    return case, (qmin - case.bus[:, QD]) / case.base_mva, (qmax - case.bus[:, QD]) / case.base_mva


def _base_point_chord(name):
    """`chord_q_limits`'s matrices at case `name`'s own solved operating point (as the AC tasks build them)."""
    base = ph.make_ac_network(load_case(name))
    return ph.make_chord_q_limits(base, ph.newton_raphson(base, jnp.asarray(bus_injection_pu(load_case(name))))[0])


def _bfloat16_correction(matrix, x):
    """`physics.ac._correction` as a TPU's matrix unit runs it at DEFAULT precision: both operands rounded
    to bfloat16, their products summed in the operands' own dtype."""
    r = lambda a: a.astype(jnp.bfloat16).astype(a.dtype)  # noqa: E731
    return r(matrix) @ r(x)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["newton", "chord", "chord, bfloat16 corrections"])
@pytest.mark.parametrize("name, scale", [("14", 1.2), ("14", 1.4), ("30", 1.4)])
def test_q_limits_match_pandapower(name, scale, solver, monkeypatch):
    """PV -> PQ switching (`newton_raphson_q_limits`, and `chord_q_limits` with its matrices at the unscaled
    case's solution) against pandapower's `enforce_q_lims=True` with every load scaled up until generators
    hit their reactive limits (case14 x1.2: 2 units, x1.4: 4 units; case30 x1.4: 1 unit; the reference unit
    is not limited in either): |V| within 1e-6 p.u., angles 1e-5 degrees, the same buses switched, float64.
    The chord method also with its corrections' products rounded as a TPU's one bfloat16 pass rounds them
    (`CORRECTION_PRECISION`): the path moves, the solution does not."""
    import pandapower as pp
    import pandapower.networks as pn

    if "bfloat16" in solver:
        monkeypatch.setattr(ph.ac, "_correction", _bfloat16_correction)

    net = getattr(pn, f"case{name}")()
    net.load.p_mw *= scale
    net.load.q_mvar *= scale
    pp.runpp(net, tolerance_mva=1e-9, init="flat", numba=False, enforce_q_lims=True)
    with jax.enable_x64(True):
        case, qmin, qmax = _scaled_case(name, scale)
        acn = ph.make_ac_network(case)
        s, limits = jnp.asarray(bus_injection_pu(case)), (jnp.asarray(qmin), jnp.asarray(qmax))
        if solver == "newton":
            v, converged, _, switched = jax.jit(ph.newton_raphson_q_limits)(acn, s, *limits)
        elif "bfloat16" in solver:   # not jax.jit: its cache would serve the exact products' trace
            v, converged, _, switched = ph.chord_q_limits(acn, s, *limits, _base_point_chord(name))
        else:
            v, converged, _, switched = jax.jit(ph.chord_q_limits)(acn, s, *limits, _base_point_chord(name))
        plain, _, _ = ph.newton_raphson(acn, s)
    assert bool(converged)
    at_limit = net.gen.bus.values[np.isclose(net.res_gen.q_mvar.values, net.gen.max_q_mvar.values)
                                  | np.isclose(net.res_gen.q_mvar.values, net.gen.min_q_mvar.values)]
    assert sorted(np.flatnonzero(np.asarray(switched)).tolist()) == sorted(at_limit.tolist()) and at_limit.size
    np.testing.assert_allclose(np.abs(v), net.res_bus.vm_pu.values, atol=1e-6)
    np.testing.assert_allclose(np.rad2deg(np.angle(v)), net.res_bus.va_degree.values, atol=1e-5)
    assert np.max(np.abs(np.abs(np.asarray(plain)) - np.abs(np.asarray(v)))) > 1e-3  # the limits changed the answer


def test_a_failed_solve_switches_no_bus():
    """As MATPOWER's runpf (`if success && qlim`), PV -> PQ switching follows a converged solve only: with
    case14's loads x6 the first Newton solve fails (so does the one without limits), and no bus is switched
    from its unsolved reactive injections (the rounds after it do no iteration)."""
    with jax.enable_x64(True):
        case, qmin, qmax = _scaled_case("14", 6.0)
        acn = ph.make_ac_network(case)
        s = jnp.asarray(bus_injection_pu(case))
        _, converged, _, switched = jax.jit(ph.newton_raphson_q_limits)(acn, s, jnp.asarray(qmin), jnp.asarray(qmax))
        _, plain_converged, _ = ph.newton_raphson(acn, s)
    assert not bool(plain_converged) and not bool(converged)
    assert not np.asarray(switched).any()


def test_fewer_derivative_iterations_keep_the_values_and_a_close_derivative():
    """`chord_q_limits(derivative_iters=10)` (the voltage schedule's flow) returns the default 30's voltages
    (to rounding) and d|V| / d(set-points) within 1e-3 of it (float64, case14 loads x1.4, units at their limits);
    1 iteration's derivative is further off (the count is what carries it)."""
    with jax.enable_x64(True):
        case, qmin, qmax = _scaled_case("14", 1.4)
        qmin, qmax = jnp.asarray(qmin), jnp.asarray(qmax)
        acn, chord = ph.make_ac_network(case), _base_point_chord("14")
        s = jnp.asarray(bus_injection_pu(case))
        held = np.flatnonzero(np.isin(np.arange(case.n_bus), np.asarray(acn.pq), invert=True))

        def vm(vset, live):
            v0 = acn.v0.at[held].set(vset * jnp.exp(1j * jnp.angle(acn.v0[held])))
            return jnp.abs(ph.chord_q_limits(acn, s, qmin, qmax, chord, v0, v_set=v0, derivative_iters=live)[0])

        x = jnp.abs(acn.v0[held])
        v30, v10 = vm(x, 30), vm(x, 10)
        j30, j10, j1 = (jax.jit(jax.jacfwd(lambda y, n=n: vm(y, n)))(x) for n in (30, 10, 1))
    np.testing.assert_allclose(np.asarray(v10), np.asarray(v30), rtol=0, atol=1e-12)   # the same iterations, to rounding
    assert np.abs(np.asarray(j10) - np.asarray(j30)).max() < 1e-3   # measured 1.6e-4 (20: 1e-8, 5: 1.7e-2)
    assert np.abs(np.asarray(j1) - np.asarray(j30)).max() > 0.1


@pytest.mark.parametrize("limits", [False, True, "chord"])
def test_newton_derivative_with_respect_to_the_set_points(limits):
    """d|V| / d(voltage set-points) through both Newton solvers and the chord method with reactive limits
    equals central finite differences (float64, 1e-7), the reference bus's set-point included (its magnitude
    is held from the start point, whose derivative the loops drop). With reactive limits (case14 loads x1.4:
    units at their limits) a limited unit's set-point moves nothing."""
    with jax.enable_x64(True):
        case, qmin, qmax = _scaled_case("14", 1.4 if limits else 1.0)
        qmin, qmax = jnp.asarray(qmin), jnp.asarray(qmax)
        acn = ph.make_ac_network(case)
        s = jnp.asarray(bus_injection_pu(case))
        held = np.flatnonzero(np.isin(np.arange(case.n_bus), np.asarray(acn.pq), invert=True))   # ref and PV buses

        if limits == "chord":
            chord = _base_point_chord("14")

        def vm(vset):
            v0 = acn.v0.at[held].set(vset * jnp.exp(1j * jnp.angle(acn.v0[held])))
            if limits == "chord":
                return jnp.abs(ph.chord_q_limits(acn, s, qmin, qmax, chord, v0, v_set=v0)[0])
            if limits:
                return jnp.abs(ph.newton_raphson_q_limits(acn, s, qmin, qmax, v0, v_set=v0)[0])
            return jnp.abs(ph.newton_raphson(acn, s, v0)[0])

        x = jnp.abs(acn.v0[held])
        jac = np.asarray(jax.jit(jax.jacfwd(vm))(x))
        h = 1e-6
        fd = np.stack([(vm(x.at[i].add(h)) - vm(x.at[i].add(-h))) / (2 * h) for i in range(x.shape[0])], 1)
    np.testing.assert_allclose(jac, fd, atol=1e-7)
    ref = held.tolist().index(int(np.flatnonzero(np.isin(np.arange(case.n_bus), np.asarray(acn.pvpq), invert=True))[0]))
    assert np.abs(jac[:, ref]).max() > 0.05   # the reference bus's set-point moves the load buses
    limited = np.abs(jac[held, np.arange(held.size)]) < 1e-9   # a unit whose |V| its set-point does not hold
    assert limited.any() == bool(limits)


@pytest.mark.parametrize("breakdown", [None, pytest.param(0.0, marks=pytest.mark.xfail(strict=True, reason="without it"))])
def test_ac_steps_solve_with_the_chips_rounding(breakdown, monkeypatch):
    """tso-case14-ac under random actions (32 envs x 48 steps, seeded) with the chord's corrections rounded as a
    TPU's one bfloat16 pass rounds them: the same steps solved and the same returns (1e-4) as with exact products.
    GMRES on the switched block took the products' rounding, once its Krylov space held the block, for a new
    direction (`GMRES_BREAKDOWN`); on the chip 23 of 320 cost sums flipped against the host, returns 7.6e-2 apart."""
    from evogrid.envs import make
    from evogrid.rollout import make_random_rollout

    if breakdown is not None:
        monkeypatch.setattr(ph.ac, "GMRES_BREAKDOWN", breakdown)
    env, params = make("tso-case14-ac")
    exact = make_random_rollout(env, params, 32, 48)(jax.random.key(0))
    monkeypatch.setattr(ph.ac, "_correction", _bfloat16_correction)
    rounded = make_random_rollout(env, params, 32, 48)(jax.random.key(0))
    (reward, _, _, info), (reward_r, _, _, info_r) = jax.device_get((exact, rounded))
    assert np.all(info["converged"] > 0.5) and np.all(info_r["converged"] > 0.5)
    np.testing.assert_allclose(reward_r.sum(-1), reward.sum(-1), rtol=1e-4)
