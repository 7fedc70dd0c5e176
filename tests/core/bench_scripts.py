"""The benchmark scripts under bench/ imported as modules by their path (they are scripts, not a package), for the
CPU tests of their pure parts."""
import importlib.util
import pathlib

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    """bench/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
