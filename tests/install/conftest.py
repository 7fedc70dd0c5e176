"""Install-safety tests: they build throwaway virtual environments (no fixtures shared with the other folders)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes tens of seconds (a real package install); included in the suite")
