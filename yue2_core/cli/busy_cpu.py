"""The note a CPU run prints when other jobs already keep the CPU busy and OMP_NUM_THREADS is not set."""
from __future__ import annotations

import os
import re
import sys
import time


BUSY_SAMPLE_S = 0.2  # how long the per-core counters of /proc/stat are watched below a full load
# Other jobs holding about one core of the cores this process may use are enough for the note: PyTorch runs one
# thread per usable core, and the thread that shares its core with the other job holds up every parallel step
# (new-user review, stop 47: one busy loop beside `bash scripts/song.sh` on 2 idle cores — load 1.2 — sampled
# 11–15 tokens/s, 38 with OMP_NUM_THREADS=1, and no note, when the rule wanted 1.5 of the 2 cores busy)
OTHER_JOB_CORES = 0.8
SAMPLE_FROM_LOAD = 0.5  # below this 1-minute load no job has run for long: no /proc/stat sample (0.2 s) is taken


def _cpu_ticks(path: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """Each CPU's (busy, total) clock ticks since boot from /proc/stat's `cpuN` lines (busy: all but idle and
    iowait; steal counts as busy, time the hypervisor gave to others); {} where the file cannot be read."""
    ticks = {}
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"cpu(\d+)\s+(.*)", line)
                if m:
                    v = [int(x) for x in m.group(2).split()[:8]]  # user nice system idle iowait irq softirq steal
                    idle = v[3] + (v[4] if len(v) > 4 else 0)
                    ticks[int(m.group(1))] = (sum(v) - idle, sum(v))
    except (OSError, ValueError, IndexError):
        return {}
    return ticks


def _busy_share(cpus: set[int]) -> float | None:
    """The share of `cpus`' time that other jobs took over BUSY_SAMPLE_S (this process's own CPU time taken out),
    from /proc/stat; None where that cannot be read. A container whose /proc/stat lists only its own cores,
    renumbered (lxcfs), is read whole when it lists as many cores as the affinity mask holds."""
    import resource

    def sample():
        ticks = _cpu_ticks()
        if cpus <= ticks.keys():
            ticks = {c: ticks[c] for c in cpus}
        elif len(ticks) != len(cpus):  # neither the host's numbering nor a container's own list of its cores
            return None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return (sum(b for b, _ in ticks.values()), sum(t for _, t in ticks.values()), usage.ru_utime + usage.ru_stime)

    first = sample()
    if first is None:
        return None
    time.sleep(BUSY_SAMPLE_S)
    second = sample()
    if second is None or second[1] <= first[1]:
        return None
    (busy0, total0, own0), (busy1, total1, own1) = first, second
    try:
        hz = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        hz = 100
    return min(1.0, max(0.0, (busy1 - busy0 - (own1 - own0) * hz) / (total1 - total0)))


def _note_busy_cpu() -> None:
    """The NOTE of `busy_cpu_reason` on stderr, before a command's work."""
    said = busy_cpu_reason()
    if said:
        print(f"NOTE: this CPU is busy ({said}) and OMP_NUM_THREADS is not set: PyTorch's threads then compete with "
              "the other jobs, which can make sampling several times slower; put OMP_NUM_THREADS=1 before the "
              "command (README, \"A CPU another job shares?\")", file=sys.stderr)


def busy_cpu_reason(own_load: bool = False) -> str | None:
    """Why this CPU counts as busy ("load 3.3 on 2 cores", "other jobs kept the 2 cores 50% busy; load 1.2"), or
    None. On a CPU other jobs already keep busy, without OMP_NUM_THREADS: say that PyTorch's threads will fight them
    (new-user finding, stop 45: `bash scripts/song.sh` beside the test suite sampled 6 tokens/s, 221 s for the
    default song, with nothing pointing at the README's `OMP_NUM_THREADS=1`, which makes it several times faster).
    Read before this run's work, so it counts the other jobs only.

    The 1-minute load average counts the runnable tasks of the whole host (a container's too), so it is compared
    with the host's cores (`os.cpu_count`). Under an affinity limit (`taskset`, a cpuset such as `docker
    --cpuset-cpus`: `os.sched_getaffinity` smaller than the host) a load below the host's cores says nothing of the
    cores this process may use — 3 jobs on a 64-core host may run on them or on the 62 others — so their own
    counters in /proc/stat are watched for BUSY_SAMPLE_S instead (leftover of stop 46: the load compared with the
    2 usable cores printed a false note in a container pinned to 2 of 64 cores whenever the host ran 2 jobs). Below
    a full load those counters decide on a whole machine too (new-user review, stop 47: one other job on 2 cores,
    load 1.2, made sampling 2.5–4 times slower without a note); the load alone could be this user's previous run.

    own_load: the load may be this process's own earlier work (a ComfyUI server that ran songs back to back, where
    the load reaches the cores by itself), so the counters decide at any load, this process's own time taken out
    (new-user review, stop 48: a ComfyUI server beside other jobs sampled 3–5 tokens/s, 33 with OMP_NUM_THREADS=1,
    and nothing said so)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform
        return None
    host = os.cpu_count() or 1
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        cpus = set()
    whole = not cpus or len(cpus) >= host
    if load >= host and not own_load:  # every core of the host is busy, so are this process's
        return (f"load {load:.1f} on {host} cores" if whole else
                f"load {load:.1f} on the host's {host} cores, {len(cpus)} of which this process may use")
    if len(cpus) < 2 or (whole and load < SAMPLE_FROM_LOAD):
        return None  # no per-core counters (macOS, Windows), one core (one thread: nothing to gain), nothing ran long
    # a load below the cores, or one this process may have made: other jobs, or this user's own work? The cores'
    # counters tell
    share = _busy_share(cpus)
    if share is None or share * len(cpus) < OTHER_JOB_CORES:
        return None
    return (f"other jobs kept the {len(cpus)} cores {share:.0%} busy; load {load:.1f}" if whole else
            f"other jobs kept the {len(cpus)} cores this process may use {share:.0%} busy; load {load:.1f} on "
            f"the host's {host} cores")
