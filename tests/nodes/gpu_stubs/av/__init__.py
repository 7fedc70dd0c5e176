"""Stub of PyAV for import only (gpu_nodes_check.py on a machine without it)."""


class _Anything:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("PyAV is not installed here (import stub)")


def __getattr__(name):
    return _Anything
