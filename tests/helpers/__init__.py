"""Code the test modules share: import it as `from helpers.<module> import ...`.

pyproject.toml puts tests/ on pytest's `pythonpath`, so `helpers` is importable from every test
module and from conftest.py. A test module never imports another test module: what two of them
need lives here (fixtures live in conftest.py).
"""
