"""Safety layers: controllers between a policy and a grid task that read only the observation.

    from evogrid.safety import shield
    env, params = make("tso-case14")
    safe_env = shield(env, params)          # the security redispatch between any policy and the env

See `layers` for what each layer does and why it is a controller, not part of the environment.
"""
from evogrid.safety.layers import (
    MARGINS,
    SAFETY_CHOICES,
    RedispatchLayer,
    ScheduleLayer,
    Shielded,
    ShieldedState,
    VoltageLayer,
    make_layer,
    redispatch_layer,
    schedule_layer,
    shield,
    voltage_layer,
)

__all__ = ["MARGINS", "SAFETY_CHOICES", "RedispatchLayer", "ScheduleLayer", "Shielded", "ShieldedState", "VoltageLayer",
           "make_layer", "redispatch_layer", "schedule_layer", "shield", "voltage_layer"]
