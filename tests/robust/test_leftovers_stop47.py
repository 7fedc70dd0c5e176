"""Leftovers of the stop-46 reviews, fixed in stop 47 (docs/bad_inputs.md §28): the busy-CPU note compared the
host-wide load average with the cores of this process's affinity mask."""
from __future__ import annotations

import pytest

# ---------------------------------------------------------------------------------------------- the busy-CPU note

def _stat(*cores) -> str:
    """A /proc/stat of the given (busy, idle) ticks per CPU (busy as user time)."""
    lines = [f"cpu  {sum(b for b, _ in cores)} 0 0 {sum(i for _, i in cores)} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {b} 0 0 {i} 0 0 0 0 0 0" for n, (b, i) in enumerate(cores)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 5"]) + "\n"


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """The busy-CPU note's inputs, set per test: load, host cores, affinity mask, and two /proc/stat samples."""
    import yue2_core.__main__ as cli
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cli, "BUSY_SAMPLE_S", 0)
    state = {"samples": []}
    real = cli._cpu_ticks
    monkeypatch.setattr(cli, "_cpu_ticks", lambda path="/proc/stat": (
        real(state["samples"].pop(0)) if state["samples"] else pytest.fail("/proc/stat read more than twice")))

    def setup(load, host, affinity, samples=()):
        monkeypatch.setattr(cli.os, "getloadavg", lambda: (load, load, load))
        monkeypatch.setattr(cli.os, "cpu_count", lambda: host)
        monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: set(affinity), raising=False)
        files = []
        for n, text in enumerate(samples):
            path = tmp_path / f"stat{n}"
            path.write_text(text)
            files.append(str(path))
        state["samples"] = files
        return cli
    return setup


def test_host_load_on_other_cores_is_no_busy_note_in_a_pinned_container(cpu, capsys):
    """A container pinned to 2 of a 64-core host's cores: the load average counts the whole host, so 3 jobs on its
    other cores made "this CPU is busy (load 3.0 on 2 cores)" though the 2 cores were idle. Now the 2 cores' own
    counters decide: idle → no note."""
    idle = [(100, 900)] * 64
    later = [(100, 920)] * 2 + [(120, 900)] * 3 + [(100, 900)] * 59  # cpus 0,1 idle; 2-4 busy
    cli = cpu(3.0, 64, {0, 1}, [_stat(*idle), _stat(*later)])
    cli._note_busy_cpu()
    assert capsys.readouterr().err == ""


def test_busy_pinned_cores_get_the_note_naming_both_numbers(cpu, capsys):
    cli = cpu(3.0, 64, {0, 1}, [_stat(*[(100, 900)] * 64), _stat(*[(120, 900)] * 2, *[(100, 920)] * 62)])
    cli._note_busy_cpu()
    assert capsys.readouterr().err.startswith(
        "NOTE: this CPU is busy (other jobs kept the 2 cores this process may use 100% busy; load 3.0 on the host's 64 "
        "cores) and OMP_NUM_THREADS is not set")


def test_a_saturated_host_is_busy_for_any_affinity_without_sampling(cpu, capsys):
    cli = cpu(70.0, 64, {0, 1})  # no /proc/stat read: every core of the host is busy
    cli._note_busy_cpu()
    assert capsys.readouterr().err.startswith(
        "NOTE: this CPU is busy (load 70.0 on the host's 64 cores, 2 of which this process may use) and")


@pytest.mark.parametrize("load, said", [(2.0, True), (1.2, False)])
def test_a_whole_machine_compares_the_load_with_its_cores(cpu, capsys, load, said):
    """Without an affinity limit (a VM, a laptop: affinity = os.cpu_count()) the load is compared with the cores, as
    before; no /proc/stat sampling."""
    cli = cpu(load, 2, {0, 1})
    cli._note_busy_cpu()
    err = capsys.readouterr().err
    assert err.startswith(f"NOTE: this CPU is busy (load {load:.1f} on 2 cores)") if said else err == ""


def test_the_own_process_time_is_not_counted_as_other_jobs(cpu, capsys, monkeypatch):
    """The sample runs before this run's work, but this process's own CPU time in it (a thread) is taken out."""
    import resource
    times = iter([0.0, 0.4])  # 0.4 s of our own CPU = 40 ticks at 100 Hz: all the busy ticks of the two cores
    usage = lambda who: type("U", (), {"ru_utime": next(times), "ru_stime": 0.0})()  # noqa: E731
    monkeypatch.setattr(resource, "getrusage", usage)
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    cli = cpu(3.0, 64, {0, 1}, [_stat(*[(100, 900)] * 64), _stat(*[(120, 900)] * 2, *[(100, 920)] * 62)])
    assert cli._busy_share({0, 1}) == 0.0


def test_a_container_proc_stat_of_its_own_cores_is_read(cpu, capsys):
    """lxcfs shows a container only its cores, renumbered cpu0…: an affinity of {10, 11} then reads those two lines;
    a /proc/stat that fits neither numbering gives no note (unknown, so nothing said)."""
    cli = cpu(3.0, 64, {10, 11}, [_stat((100, 900), (100, 900)), _stat((120, 900), (120, 900))])
    cli._note_busy_cpu()
    assert "other jobs kept the 2 cores this process may use 100% busy" in capsys.readouterr().err
    cli = cpu(3.0, 64, {10, 11}, [_stat(*[(100, 900)] * 3), _stat(*[(120, 900)] * 3)])
    cli._note_busy_cpu()
    assert capsys.readouterr().err == ""


def test_proc_stat_is_read_per_cpu(tmp_path):
    from yue2_core.__main__ import _cpu_ticks
    path = tmp_path / "stat"
    path.write_text("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 40 5 6 7 8 0 0\ncpu1 1 0 0 10\nintr 5\n")
    assert _cpu_ticks(str(path)) == {0: (1 + 2 + 3 + 6 + 7 + 8, 72), 1: (1, 11)}
    assert _cpu_ticks(str(tmp_path / "missing")) == {}
