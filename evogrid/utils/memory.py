"""Will a run's batch fit the device's memory? Answered by the run's own program, compiled before it starts.

A population (or env batch) too large for a chip's memory otherwise ends in XLA's RESOURCE_EXHAUSTED after
the set-up and a long compile. The CLI compiles the run's program ahead of the run (nothing is allocated; JAX's
persistent compilation cache keeps it, so the run does not compile it again) and reads the bytes it needs
(`memory_analysis`: arguments, outputs and temporaries). Only where those exceed the device's memory (or the
compile itself runs out of it) does `check_batch` compile the program at two smaller batches (a sixteenth
and an eighth of the asked one, at least 64 and 128: below that the batch-independent parts, such as the
validation days' rollout, hide the per-member part), extrapolate linearly and refuse the batch in one line
that names the largest that fits.
"""
from __future__ import annotations

import os
import re

import jax

GIB = 2**30
SMALLEST = 64     # the smaller probe's floor (the larger one is twice it)
HEADROOM = 0.95   # the batch named as fitting is aimed at this share of the memory (the line is an estimate: its
                  # figure at 8x the larger probe was 0.5% short on tso-case5)
_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def device_memory(device=None) -> int | None:
    """Bytes the device can hold: EVOGRID_DEVICE_MEMORY where set (bytes, or e.g. "16GiB", "500MB"; "off": None,
    no check), else the device's own report (a GPU's or TPU's `bytes_limit`); None where neither says (a CPU)."""
    text = os.environ.get("EVOGRID_DEVICE_MEMORY", "").strip()
    if text.lower() == "off":
        return None
    if text:
        m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", text)
        if not m or m.group(2).upper() not in _UNITS:
            raise ValueError(f"EVOGRID_DEVICE_MEMORY={text!r}: give bytes, or a number with KiB, MiB, GiB, KB, MB or GB")
        return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    device = device or jax.local_devices()[0]   # (jax.devices()[0] may be another process's)
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def program_bytes(lowered) -> int:
    """Device bytes a lowered program needs when it runs: its arguments, outputs and temporaries (less the
    outputs that reuse an argument's buffer)."""
    m = lowered.compile().memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def check_batch(need: int | None, batch: int, limit: int, bytes_at, what: str, context: str = "",
                multiple: int = 1) -> None:
    """Raise ValueError in one line where `batch` needs more than `limit` bytes.

    `need`: the bytes of the run's program at `batch` (`program_bytes`), or None where its compile ran out
    of memory. Where it does not fit, `bytes_at(n)` (the bytes of the program at batch n) is asked at two
    smaller batches; their line extended names the largest batch that fits (and the need, where unknown).
    `what` names the batch as the user set it (e.g. "--pop"), `context` follows it in the message; every
    batch asked and named is a multiple of `multiple`."""
    if need is not None and need <= limit:
        return
    n1 = max(SMALLEST, batch // 16) // multiple * multiple
    if 2 * n1 < batch:
        fixed, per = memory_line(bytes_at, n1)
        need = need if need is not None else fixed + per * batch
        fits = min(largest_batch(fixed, per, limit, multiple), batch - multiple)   # the line is an estimate
        hint = (f"the largest {what} that fits is about {fits:,}" if fits >= 1
                else "not even 1 fits (the shared data alone is too large)")
    else:
        hint = f"a smaller {what} may fit"
    amount = f"about {_size(need)}" if need is not None else "more"
    raise ValueError(f"{what} {batch:,}{context} needs {amount} of device memory and the device holds "
                     f"{_size(limit)}: {hint}")


def memory_line(bytes_at, n1: int) -> tuple[float, float]:
    """(fixed bytes, bytes per member) of a program: the line through its need at `n1` and `2 * n1` members."""
    b1, b2 = bytes_at(n1), bytes_at(2 * n1)
    per = max((b2 - b1) / n1, 1.0)
    return b1 - per * n1, per


def largest_batch(fixed: float, per: float, limit: int, multiple: int = 1) -> int:
    """The largest multiple of `multiple` members whose need on `memory_line` stays within HEADROOM of
    `limit` (0 where not one fits)."""
    return max(int((HEADROOM * limit - fixed) // per) // multiple * multiple, 0)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"
