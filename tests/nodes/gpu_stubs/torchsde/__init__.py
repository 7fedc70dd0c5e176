"""Stub of torchsde for import only (gpu_nodes_check.py on a machine without it)."""


class BrownianTree:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchsde is not installed here (import stub)")
