"""Battery energy storage: state of charge with efficiencies and SOC-dependent power limits.

Sign convention: power p > 0 discharges into the grid, p < 0 charges from it (MW).
Over an interval of dt hours, with capacity E (MWh) and efficiencies eta_c, eta_d:

    soc' = soc + dt * (eta_c * max(-p, 0) - max(p, 0) / eta_d) / E

Power limits depend on the state of charge in two ways:
* energy headroom: the interval may not take soc outside [soc_min, soc_max]:
      p_dis_max = (soc - soc_min) * E * eta_d / dt,   p_ch_max = (soc_max - soc) * E / (eta_c * dt);
* taper (constant-current/constant-voltage behaviour): within `taper` of a bound
  the rated power derates linearly to zero, e.g. p_ch_rated = p_max * min(1, (soc_max - soc) / taper).
A request outside the limits is clipped; the clipped magnitude is returned so an
environment can report it. Shared by the DERs and data-centre microgrid tasks.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.physics._common import as_float


@struct.dataclass
class Battery:
    """Arrays of shape [n_batteries]: capacity_mwh, p_max_mw (rated charge and discharge power),
    eta_charge, eta_discharge (in (0, 1]), soc_min, soc_max (fractions of capacity),
    taper (SOC band where the rated power derates to zero; 0 = no taper)."""

    capacity_mwh: jnp.ndarray
    p_max_mw: jnp.ndarray
    eta_charge: jnp.ndarray
    eta_discharge: jnp.ndarray
    soc_min: jnp.ndarray
    soc_max: jnp.ndarray
    taper: jnp.ndarray


def make_battery(n: int, *, mw, mwh, eta_charge: float, eta_discharge: float, soc_min: float, soc_max: float,
                 soc_init: float, taper: float):
    """`n` batteries (sizes scalar or one per battery) and their initial SOC [n], after checking the
    numbers make sense. Shared by the DERs and DCMG parameter builders."""
    if not 0.0 <= soc_min <= soc_init <= soc_max <= 1.0:
        raise ValueError(f"need 0 <= soc_min <= soc_init <= soc_max <= 1, got {soc_min}, {soc_init}, {soc_max}")
    if not (0.0 < eta_charge <= 1.0 and 0.0 < eta_discharge <= 1.0):
        raise ValueError(f"efficiencies must lie in (0, 1], got eta_charge={eta_charge}, eta_discharge={eta_discharge}")
    mw, mwh = (np.broadcast_to(np.asarray(v, float), (n,)) for v in (mw, mwh))
    if np.any(mwh <= 0) or np.any(mw < 0):
        raise ValueError("battery_mwh must be > 0 and battery_mw >= 0")
    full = lambda v: as_float(np.full(n, v))  # noqa: E731
    battery = Battery(capacity_mwh=as_float(mwh), p_max_mw=as_float(mw), eta_charge=full(eta_charge),
                      eta_discharge=full(eta_discharge), soc_min=full(soc_min), soc_max=full(soc_max), taper=full(taper))
    return battery, full(soc_init)


def _derate(room, taper):
    return jnp.where(taper > 0, jnp.clip(room / jnp.where(taper > 0, taper, 1.0), 0.0, 1.0), 1.0)


def battery_limits(bat: Battery, soc, dt):
    """(p_charge_max, p_discharge_max) in MW, both >= 0, at this state of charge."""
    room_up, room_down = jnp.maximum(bat.soc_max - soc, 0.0), jnp.maximum(soc - bat.soc_min, 0.0)
    p_ch = jnp.minimum(bat.p_max_mw * _derate(room_up, bat.taper), room_up * bat.capacity_mwh / (bat.eta_charge * dt))
    p_dis = jnp.minimum(bat.p_max_mw * _derate(room_down, bat.taper), room_down * bat.capacity_mwh * bat.eta_discharge / dt)
    return p_ch, p_dis


def battery_step(bat: Battery, soc, p_request, dt):
    """Apply a power request for one interval: returns (soc_next, p_applied, clipped_mw)."""
    p_ch, p_dis = battery_limits(bat, soc, dt)
    p = jnp.clip(p_request, -p_ch, p_dis)
    soc_next = soc + dt * (bat.eta_charge * jnp.maximum(-p, 0.0) - jnp.maximum(p, 0.0) / bat.eta_discharge) / bat.capacity_mwh
    return jnp.clip(soc_next, bat.soc_min, bat.soc_max), p, jnp.abs(p_request - p)
