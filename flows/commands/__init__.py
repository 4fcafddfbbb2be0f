"""The `bertpipe` commands, grouped by what they do to a run; each is one typed function and
its docstring is the help. flows/cli.py puts them on the app, one line each.

May import: typer, the rest of flows/, pipelines and bertcore, but anything heavy (torch,
Ray, Prefect, matplotlib) only inside a command's body, so `bertpipe --help` and the
commands that only read answer at once. Must not import: flows.cli (it imports them).
"""
