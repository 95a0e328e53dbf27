"""`python -m harness` is `bench`."""

from harness.cli.app import app

app(prog_name="bench")
