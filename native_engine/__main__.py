"""`python -m native_engine serve ...`: the same command as `bench serve`."""

import typer

from native_engine.cli import serve

app = typer.Typer(add_completion=False, help="The built-in numpy serving engine.")


@app.callback()
def main() -> None:
    """Keeps `serve` a named subcommand even though it is the only one."""


app.command("serve")(serve)

if __name__ == "__main__":
    app()
