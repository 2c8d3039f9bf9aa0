"""nbval settings: compare stdout and results exactly, but not stderr (progress bars, kernel paths)."""


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)
