"""Pure numeric power-system kernels: plain functions of arrays, no env state, no RL.

Each `make_*` runs once at set-up in NumPy (float64) and returns a pytree of
arrays in JAX's default float dtype (float32, or float64 with x64 enabled);
the solvers are jit/vmap-safe functions of those arrays.
"""
from evogrid.physics._common import as_float, host_float64, host_setup, to_compute
from evogrid.physics.ac import (
    ACNetwork,
    ChordQLimits,
    branch_flows,
    bus_injections,
    chord_q_limits,
    jacobian,
    make_ac_network,
    newton_raphson,
    newton_raphson_q_limits,
    make_chord_q_limits,
)
from evogrid.physics.battery import Battery, battery_limits, battery_step, make_battery
from evogrid.physics.cost import (
    GenCost,
    economic_dispatch,
    generation_cost,
    make_gen_cost,
)
from evogrid.physics.dc import DCNetwork, dc_line_flows, dc_power_flow, injection_flows, make_dc_network
from evogrid.physics.radial import (
    RadialNetwork,
    backward_forward_sweep,
    make_radial_network,
)
from evogrid.physics.security import (
    OutageModel,
    contingency_flows,
    lodf,
    make_outage_model,
    n1_flows,
    outage_flows,
)

__all__ = [
    "ACNetwork", "Battery", "as_float", "host_float64", "host_setup", "to_compute", "DCNetwork", "GenCost", "OutageModel", "RadialNetwork",
    "backward_forward_sweep", "battery_limits", "battery_step", "branch_flows", "bus_injections", "contingency_flows", "dc_line_flows", "dc_power_flow", "economic_dispatch", "generation_cost", "injection_flows", "jacobian", "lodf",
    "make_ac_network", "make_battery", "make_dc_network", "make_gen_cost", "make_outage_model", "make_radial_network", "n1_flows",
    "newton_raphson", "newton_raphson_q_limits", "chord_q_limits", "make_chord_q_limits", "ChordQLimits", "outage_flows",
]
