"""Population sharding over devices and hosts with `jax.sharding` (no pmap, no process pools).

A workflow holds a one-axis `Mesh` named "pop" over every device JAX sees (all hosts'
devices after `jax.distributed.initialize`). The run state is replicated on it; inside
the compiled generation `shard_map` gives each device its slice of the population
(`P("pop")`) to play, and an explicit all-gather hands every device all per-individual
results before any reduction over the population (fitness shaping, the ES update,
observation statistics). Every reduction therefore sees the whole array in the same
order on every device, which is what makes results independent of the device count.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

POP_AXIS = "pop"


def population_mesh(devices=None) -> Mesh:
    """A 1-D mesh over `devices` (default: every device of every process) with axis "pop"."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.array(devices), (POP_AXIS,))


def check_divisible(pop_size: int, mesh: Mesh) -> None:
    n = mesh.devices.size
    if pop_size % n:
        lower, upper = pop_size - pop_size % n, pop_size + n - pop_size % n
        raise ValueError(f"pop_size {pop_size} cannot be split evenly over the {n} devices of the mesh: use a multiple of "
                         f"{n} (e.g. {lower or upper} or {upper}), or pass mesh=population_mesh(jax.devices()[:k]) with k "
                         "dividing pop_size")


def replicate(tree, mesh: Mesh):
    """Place every array of `tree` replicated on `mesh`; works across processes (each process
    passes the same values, as it does when every process computes the same `init`)."""
    sharding = NamedSharding(mesh, P())

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree_util.tree_map(put, tree)


def gather(tree, mesh: Mesh):
    """Inside jit: make every leaf replicated (an all-gather of the population slices)."""
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, P()))


def split_and_gather(fn, mesh: Mesh, sharded, *replicated):
    """Inside jit: `fn(slice, *replicated)` on each device of `mesh` for its slice of `sharded`'s leading axis
    (`shard_map`), then an explicit all-gather: `fn`'s results for the whole axis, in order, on every device.
    `replicated` are passed whole to every device (differentiating through them sums their cotangents over
    the devices). `fn` holds no other collective, so check_vma=False lets replicated inputs and closed-over
    values (keys, statistics) seed per-device scans."""
    in_specs = (P(POP_AXIS),) + (P(),) * len(replicated)
    return jax.shard_map(lambda part, *rest: jax.lax.all_gather(fn(part, *rest), POP_AXIS, tiled=True), mesh=mesh,
                         in_specs=in_specs, out_specs=P(), check_vma=False)(sharded, *replicated)


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Start JAX's distributed runtime before any computation.

    Arguments left as None come from EVOGRID_COORDINATOR, EVOGRID_NUM_PROCESSES and
    EVOGRID_PROCESS_ID when set, and otherwise from JAX's own cluster detection
    (SLURM, Open MPI, TPU pods). On CPU, cross-process collectives use gloo.
    """
    env = os.environ
    coordinator = coordinator or env.get("EVOGRID_COORDINATOR")
    if num_processes is None and "EVOGRID_NUM_PROCESSES" in env:
        num_processes = int(env["EVOGRID_NUM_PROCESSES"])
    if process_id is None and "EVOGRID_PROCESS_ID" in env:
        process_id = int(env["EVOGRID_PROCESS_ID"])
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
