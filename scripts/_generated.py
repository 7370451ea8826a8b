"""Shared by the scripts that write generated docs: write the files, or with --check report whether they are current."""

from __future__ import annotations

from pathlib import Path


def write_or_check(files: dict[Path, str], check: bool, root: Path, how: str) -> int:
    """Write each path's text, or (check=True) compare; returns the exit code (1 when any file is stale)."""
    if check:
        stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
        print(f"stale: {', '.join(str(p.relative_to(root)) for p in stale)} -- run {how}" if stale else "current")
        return 1 if stale else 0
    for path, text in files.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(root)}")
    return 0


def generated_main(description: str, files, root: Path, how: str, argv: list[str] | None = None) -> int:
    """The command line of a generating script: ``--check`` compares, else writes. ``files()`` gives
    {path: text}, built only when called."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale, instead of writing")
    args = parser.parse_args(argv)
    return write_or_check(files(), args.check, root, how)
