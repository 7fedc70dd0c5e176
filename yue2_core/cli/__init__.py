"""The command line's parts (`python -m yue2_core`, in `yue2_core/__main__.py`): one concern a module."""
